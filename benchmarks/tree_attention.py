"""What one tree-attention call saves, what its mask costs, and what verification adds to a forward.

At one prefix length (default 1024) with Llama-2-7B's 32 heads x 128 head size, for batch 1 and 8
(every sequence with the same prefix length and tree), and for each tree (default: 64 nodes as
8 chains of 8 = 8 leaves, the case the issue's target names; then the 64-node Medusa-style sparse
tree, 31 leaves), prints each implementation's median time (all implementations timed round-robin
in one loop, so drift hits all alike) and three ratios measured in this run:

    (a) per_sequence_over_tree  one SDPA call per root-to-leaf sequence (over a view of the shared,
                                contiguous prefix cache) / one SDPA call with the tree mask
    (b) mask_overhead           the tree call / plain causal attention of as many query tokens
                                (one lower-right causal mask; a fused causal kernel on CUDA)
    (c) verify_overhead         one `specnb.core.verification.verify` of root + 64 nodes on a real model's
                                cache / one plain forward of the same 65 tokens on the same cache
                                (batch 1; the model is named in the output)

The last line is `per_sequence_over_tree=<a> mask_overhead=<b> verify_overhead=<c>` for batch 1 and
the first tree on this device. A script, not a test: nothing is asserted.

    python benchmarks/tree_attention.py [--prefix 1024] [--trees beams8:64 sparse:64] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch

from specnb import Tree
from specnb.bench.attention import CAUSAL, IMPLEMENTATIONS, TreeBatch, Unsupported, prepare, random_inputs
from specnb.bench.attention_grid import head_shape
from specnb.bench.timing import environment_row, measure_interleaved
from specnb.bench.verify_curve import prefilled_cache, verify_and_forward


def attention_rows(
    spec: str, batch: TreeBatch, heads: str, dtype: torch.dtype, device: torch.device, repeats: int
) -> list[dict]:
    shape = head_shape(heads)
    x = random_inputs(batch, shape.heads, shape.head_dim, shape.kv_heads, dtype, device)
    runs, notes = {}, {}
    for impl in IMPLEMENTATIONS + (CAUSAL,):
        try:
            runs[impl] = prepare(x, impl).run
        except Unsupported as e:
            notes[impl] = f"skipped: {e}"[:90]
    timings = measure_interleaved(runs, device, warmup=3, repeats=repeats)
    nan = float("nan")
    return [
        {
            "tree": spec,
            "batch": batch.batch_size,
            "impl": impl,
            "median_ms": timings[impl].median_s * 1e3 if impl in timings else nan,
            "q25_ms": timings[impl].q25_s * 1e3 if impl in timings else nan,
            "q75_ms": timings[impl].q75_s * 1e3 if impl in timings else nan,
            "note": notes.get(impl, ""),
        }
        for impl in IMPLEMENTATIONS + (CAUSAL,)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument(
        "--trees",
        nargs="+",
        default=["beams8:64", "sparse:64"],
        help="Tree.preset NAME:NODES; the first gives the last line (beams8:64 = 8 leaves of depth 8)",
    )
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument(
        "--heads",
        default="meta-llama/Llama-2-7b-hf",
        help="the model whose head shape is timed, read from its config (an embedded model, hub id or folder)",
    )
    ap.add_argument("--model", default="smollm2-135m", help="the real model for (c)")
    ap.add_argument("--quantization", choices=["4bit"], default=None, help="load that model in 4-bit nf4")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)

    trees = {spec: Tree.preset(spec.partition(":")[0], int(spec.partition(":")[2])) for spec in args.trees}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    env = environment_row(device, dtype)
    print(f"device={env['device']} dtype={env['dtype']} torch={env['torch']}")
    print(f"prefix {args.prefix}; heads {head_shape(args.heads)}; median of {args.repeats} round-robin runs")
    for spec, tree in trees.items():
        print(f"tree {spec}: {tree.describe()}")

    rows = []
    for spec, tree in trees.items():
        for b in args.batches:
            rows += attention_rows(
                spec, TreeBatch.uniform(args.prefix, tree, b), args.heads, dtype, device, args.repeats
            )
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_colwidth", 90):
        print(table.round(3).to_string(index=False))
    ratios = {}
    for (spec, b), t in table.groupby(["tree", "batch"], sort=False):
        ms = t.set_index("impl")["median_ms"]
        ratios[spec, b] = (ms["per_sequence"] / ms["sdpa"], ms["sdpa"] / ms[CAUSAL])
        print(
            f"{spec} batch {b}: (a) per_sequence / tree = {ratios[spec, b][0]:.2f} ({len(trees[spec].leaves)} leaves)  "
            f"(b) tree / causal = {ratios[spec, b][1]:.2f}  eager / tree = {ms['eager'] / ms['sdpa']:.2f}  "
            f"flex / tree = {ms['flex'] / ms['sdpa']:.2f}"
        )

    from specnb.io.models import load_model

    model, _ = load_model(args.model, args.quantization, device=device)
    cache = prefilled_cache(model, args.prefix)
    spec, tree = args.trees[0], trees[args.trees[0]]
    t = verify_and_forward(model, cache, tree, warmup=2, repeats=args.repeats)
    plain_n = verify_and_forward(model, cache, None, tree.num_nodes, warmup=2, repeats=args.repeats)["plain"]
    verify_overhead = t["verify"].median_s / t["plain"].median_s
    ms = lambda x: f"{x.median_s * 1e3:.1f} ms [{x.q25_s * 1e3:.1f}-{x.q75_s * 1e3:.1f}]"  # noqa: E731
    print(
        f"model {args.model} ({model.dtype}, {model.config._attn_implementation}), cache of {args.prefix} tokens, "
        f"tree {spec}: verify root + {tree.num_nodes} nodes {ms(t['verify'])}; plain forward of the same "
        f"{tree.num_nodes + 1} tokens {ms(t['plain'])}; of {tree.num_nodes} tokens {ms(plain_n)}"
    )
    print(
        f"(c) verify / plain forward of the same {tree.num_nodes + 1} tokens = {verify_overhead:.3f} "
        f"(/ plain forward of {tree.num_nodes} tokens = {t['verify'].median_s / plain_n.median_s:.3f})"
    )
    a, b = ratios[spec, args.batches[0]]
    print(f"per_sequence_over_tree={a:.2f} mask_overhead={b:.2f} verify_overhead={verify_overhead:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
