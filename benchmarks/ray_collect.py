"""Collection on Ray: one collection made by 1 and then by 2 actors of one local Ray instance, timed.

Each run is `collect_units` with `RayExecutor(workers=n)` into a fresh folder: the actors load the
pair by name (SmolLM2-135M, its first 24 of 30 layers as the draft), then take the prompts one at a
time (the continuation by exact chain:4 decoding and the draft's ranks; super-trees with --super-k).
Ray is started once, before both runs, with --cpus CPUs, so neither run pays for starting it. Per
run it prints the wall time, the start-up (until the first actor had loaded the pair), the time
after it and the mean time of one unit inside its actor (if it grows with the workers, they are
sharing cores); then the ratios 1 worker / 2 workers, and whether the two folders hold the same files
with byte-identical arrays (they must: the executor does not change what a unit computes).

    python benchmarks/ray_collect.py                 # 5 Spec-Bench prompts (one per category), 32 tokens
    python benchmarks/ray_collect.py --prompts 4 --max-new-tokens 16

Each actor runs torch on one thread (its one CPU), so on a machine with C free cores the time after
start-up can fall by at most min(workers, C); the load average before and after is printed, since
other jobs on the machine take cores from the actors.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from specnb.analysis.collection import CollectConfig, Collection
from specnb.experiments.collect import collect_units
from specnb.experiments.executors import RayExecutor, import_ray
from specnb.io.models import ModelPair, load_tokenizer, prompt_ids
from specnb.io.prompts import load_prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--draft-layers", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=5, help="Spec-Bench prompts, categories taken in turn")
    ap.add_argument(
        "--source", default="spec_bench", help="prompt source (load_prompts): spec_bench, builtin or a JSONL path"
    )
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--super-k", type=int, default=0, help="super-tree children per node (0: none)")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args(argv)

    ray = import_ray()
    pair = ModelPair(args.target, args.draft, draft_layers=args.draft_layers)
    tokenizer = load_tokenizer(pair.target)
    prompts = load_prompts(args.source, per_category=1, limit=args.prompts)
    ids = {p.id: prompt_ids(tokenizer, p.text) for p in prompts}
    config = CollectConfig(max_new_tokens=args.max_new_tokens, super_k=args.super_k, super_depth=4, super_size=16)
    describe = {"pair": f"{pair.draft}[:{pair.draft_layers} layers] -> {pair.target}", "draft_dtype": "float32"}
    print(
        f"{len(ids)} prompts ({', '.join(f'{p.id}: {ids[p.id].shape[1]} tokens' for p in prompts)}), "
        f"{args.max_new_tokens} new tokens, super_k {args.super_k}; Ray with {args.cpus} CPUs; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores",
        flush=True,
    )
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, object_store_memory=256 * 2**20)
    seconds: dict[int, tuple[float, float]] = {}
    folders: dict[int, Path] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in args.workers:
                folders[n] = Path(tmp) / f"workers{n}"
                report = collect_units(
                    folders[n],
                    pair,
                    ids,
                    config,
                    describe=describe,
                    executor=RayExecutor(workers=n, retries=0),
                    progress=False,
                ).check()
                o = report.outcome
                seconds[n] = (o.seconds, o.seconds - o.startup_s)
                loads = ", ".join(f"{w.load_s:.1f}" for w in o.workers)
                unit_s = sum(r["seconds"] for r in o.results.values()) / len(o.results)
                print(
                    f"workers={n} wall_s={o.seconds:.1f} startup_s={o.startup_s:.1f} "
                    f"after_startup_s={seconds[n][1]:.1f} unit_s={unit_s:.1f} "
                    f"(mean seconds per unit inside its worker; pair loaded in {loads} s per worker)",
                    flush=True,
                )
            same = _same_files(*(folders[n] for n in args.workers))
    finally:
        ray.shutdown()
    first, last = args.workers[0], args.workers[-1]
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"wall_ratio={seconds[first][0] / seconds[last][0]:.2f} "
        f"after_startup_ratio={seconds[first][1] / seconds[last][1]:.2f} "
        f"({first} worker(s) / {last}) same_files={same}"
    )
    return 0 if same else 1


def _same_files(*folders: Path) -> bool:
    """The same unit files in every folder, with byte-identical arrays."""
    names = [sorted(p.name for p in f.glob("*.npz")) for f in folders]
    if any(n != names[0] for n in names):
        return False
    loaded = [Collection.load(f) for f in folders]
    return all(
        a.arrays().keys() == b.arrays().keys()
        and all(v.tobytes() == b.arrays()[k].tobytes() for k, v in a.arrays().items())
        for c in loaded[1:]
        for a, b in zip(loaded[0].prompts, c.prompts)
    )


if __name__ == "__main__":
    sys.exit(main())
