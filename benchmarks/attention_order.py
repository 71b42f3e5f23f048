"""Does a point of 03's attention grid depend on where it sits in the sweep?

Times notebook 03's grid (by default its cpu profile: Qwen2.5-Coder-1.5B heads, batch 1 and 4,
prefix 256 and 1024, 8, 32 and 64 draft tokens of the sparse tree, every implementation) three
times in one process, each into its own store:

    old        cheapest first, a fixed warm-up of `--warmup` calls per point (03 before this change)
    settled    cheapest first, each point warmed up until its calls settle (within 10%)
    shuffled   settled, and the points visited in a shuffled order (what 03 does now)

and prints, per implementation, each point's median in the three runs and the ratios old / shuffled
and settled / shuffled. A point whose time depends on its place in the sweep differs between two
orders; the same point timed the same way in two orders should not, beyond the machine's noise
(the last lines: the median and largest |ratio - 1| per comparison). Eager's 8-token points, the
first of each batch x prefix group in the cheapest-first order, are the ones to watch. A script,
not a test: nothing is asserted.

    python benchmarks/attention_order.py [--heads qwen2.5-coder-1.5b] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from specnb.bench.attention import CAUSAL, IMPLEMENTATIONS
from specnb.bench.attention_grid import GRID_KEY, GridConfig, grid, grid_table, head_shape, run_grid
from specnb.bench.timing import environment_row
from specnb.io.storage import Sweep

RUNS = {  # name -> (settle, order)
    "old": (None, None),
    "settled": (0.1, None),
    "shuffled": (0.1, 1),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="qwen2.5-coder-1.5b", help="the model whose head shape is timed (config only)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--prefixes", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--shapes", nargs="+", default=["sparse"])
    ap.add_argument("--impls", nargs="+", default=list(IMPLEMENTATIONS + (CAUSAL,)))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    heads = head_shape(args.heads)
    env = environment_row(device, dtype)
    points = grid(args.batches, args.prefixes, args.nodes, args.shapes)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} device={env['device']} dtype={env['dtype']} torch={env['torch']}")
    print(f"heads {heads}; {len(points)} points x {len(args.impls)} implementations, {args.repeats} timed rounds")
    medians = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, (settle, order) in RUNS.items():
            config = GridConfig(
                tuple(args.impls), dtype, device, args.warmup, args.repeats, settle=settle, order=order, progress=False
            )
            store = Sweep(Path(folder) / f"{name}.jsonl", GRID_KEY)
            start = time.perf_counter()
            run_grid(store, points, heads, config)
            table = grid_table(store)
            ok = table[table["status"] == "ok"]
            medians[name] = ok.set_index(["impl", *GRID_KEY])["median_ms"]
            warm = ok["warmup"].describe()
            print(
                f"{name}: {time.perf_counter() - start:.0f} s; warm-up rounds per point median {warm['50%']:.0f}, "
                f"max {warm['max']:.0f}"
            )
    table = pd.DataFrame(medians)
    table["old / shuffled"] = table["old"] / table["shuffled"]
    table["settled / shuffled"] = table["settled"] / table["shuffled"]
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(table.round(3).to_string())
    for column in ("old / shuffled", "settled / shuffled"):
        off = (table[column] - 1).abs()
        print(f"{column}: median |ratio - 1| = {off.median():.3f}, largest {off.max():.3f} at {off.idxmax()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
