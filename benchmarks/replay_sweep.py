"""Collect once, replay many: a sweep of tree shapes x budgets from one collection, against running
every shape end to end. Greedy.

1. Collect (`specnb.experiments.collect.collect`): per prompt, the target's continuation by exact speculative
   decoding (chain:4) and one teacher-forced draft forward (the continuation's draft ranks);
   optionally super-trees (dynamic trees, oracle), timed apart: the static sweep does not need them.
2. Design and replay: Sequoia's DP trees (measured acceptance vector) and the hindsight-best static
   trees, then every shape x budget on the run trajectory (and on all positions), dynamic trees and
   the oracle when super-trees were collected.
3. End to end: a few (shape, budget) pairs run with `speculative_generate` on the same prompts,
   timed, their per-step accepted counts compared with the replay step by step.
4. Extrapolation, said in the output: the end-to-end time of every other pair is estimated as
   prompts x mean prefill + replayed steps x t_step(tree), with t_step from `timing`'s cost model
   (the target's verify-cost curve and the draft's per-level forward time, measured here; not
   counted on either side), scaled by measured / predicted time on the measured pairs.

The last line is `replay_speedup=<x> identical_steps=<matched>/<compared>`, where x = estimated
end-to-end time of the whole static sweep / (collection without super-trees + all replay work).

    python benchmarks/replay_sweep.py            # 13 Spec-Bench prompts (one per category), 48 tokens
    python benchmarks/replay_sweep.py --quick    # 4 prompts, 24 tokens, fewer measured pairs

--quick took 7 min (81 s of it loading the pair) with --threads 1 on this 2-core CPU while other
jobs kept it busy; there, torch's default 2 threads competing with them ran a model ~10x slower.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import pandas as pd
import torch
from options import model_arguments

from specnb import Tree, speculative_generate
from specnb.analysis.collection import CollectConfig
from specnb.analysis.cost_model import draft_widths, step_cost
from specnb.analysis.replay import acceptance_vector, oracle, prefix_counts, replay, replay_dynamic, replay_steps
from specnb.analysis.tree_design import hindsight_trees, recommend_budget, sequoia_trees
from specnb.bench.verify_curve import CURVE_KEY, CurveConfig, curve_table, verify_curve
from specnb.experiments.collect import collect
from specnb.io.models import load_pair, prompt_ids
from specnb.io.prompts import load_prompts
from specnb.io.storage import Sweep
from specnb.notebook.readings import recommendation

PRESETS = [
    "chain",
    "wide",
    "sparse",
    "kary2",
    "kary3",
    "kary4",
    "kary5",
    "kary6",
    "kary8",
    "beams2",
    "beams3",
    "beams4",
    "beams5",
    "beams6",
    "beams8",
    "beams12",
    "beams16",
]
DESIGNED = ["sequoia", "sequoia_d3", "sequoia_d5", "hindsight"]  # made from the collection


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(ap, target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", cpu_linear=False)
    ap.add_argument("--prompts", default="spec_bench", help="builtin, spec_bench, or a JSONL path")
    ap.add_argument("--limit", type=int, default=13, help="prompts, one category after another")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument(
        "--measure",
        nargs="+",
        default=["chain:8", "sparse:16", "kary2:32", "sparse:64"],
        help="shape:budget pairs run end to end",
    )
    ap.add_argument(
        "--super",
        type=int,
        nargs=3,
        default=[4, 6, 64],
        metavar=("K", "D", "M"),
        help="super-tree children, depth, size; K = 0: none",
    )
    ap.add_argument("--store", default=None, help="collection folder (default: a new temporary one)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--csv", default=None, help="also write the sweep table here")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="4 prompts, 24 tokens, budgets 4 8 16 32, 3 measured pairs, super-trees 4 4 32",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.limit, args.max_new_tokens, args.budgets = 4, 24, [4, 8, 16, 32]
        args.measure, args.super = ["chain:4", "sparse:8", "kary2:16"], [4, 4, 32]
    if args.threads:
        torch.set_num_threads(args.threads)

    start = time.perf_counter()
    target, draft, tokenizer = load_pair(args.target, args.draft, args.target_quantization, args.draft_quantization)
    prompts = load_prompts(args.prompts, limit=args.limit)
    ids = {p.id: prompt_ids(tokenizer, p.text) for p in prompts}
    print(
        f"device={target.device} dtype={target.dtype} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"prompts={len(prompts)} "
        f"(lengths {min(len(i[0]) for i in ids.values())}-{max(len(i[0]) for i in ids.values())}) "
        f"max_new_tokens={args.max_new_tokens}; loading took {time.perf_counter() - start:.0f} s (not counted)"
    )
    warm = prompt_ids(tokenizer, "Hello")
    speculative_generate(target, draft, warm, tree=Tree.sparse(8), max_new_tokens=3)

    # 1. collect
    k, depth, size = args.super
    config = CollectConfig(
        max_new_tokens=args.max_new_tokens, top_k=max(args.budgets), super_k=k, super_depth=depth, super_size=size
    )
    folder = args.store or tempfile.mkdtemp(prefix="replay_sweep_")
    wall = time.perf_counter()
    c = collect(
        folder,
        target,
        draft,
        ids,
        config,
        categories={p.id: p.category for p in prompts},
        describe={"target": args.target, "draft": args.draft, "prompts": args.prompts},
        progress=True,
    )
    wall = time.perf_counter() - wall
    stage = c.times()
    base_s = stage.get("continuation", 0.0) + stage.get("ranks", 0.0)
    super_s = stage.get("super_tree", 0.0)
    print(
        f"collection in {folder}: continuation {stage.get('continuation', 0):.1f} s "
        f"+ ranks {stage.get('ranks', 0):.1f} s"
        f" + super-trees {super_s:.1f} s (recorded per prompt; this call's wall clock {wall:.1f} s)"
    )

    # 2. design trees and replay
    t0 = time.perf_counter()
    trees = {(s, n): Tree.preset(s, n) for s in PRESETS for n in args.budgets}
    vector = acceptance_vector(c)
    for name, depth in (("sequoia", None), ("sequoia_d3", 3), ("sequoia_d5", 5)):
        designed = sequoia_trees(vector, max(args.budgets), depth)
        trees |= {(name, n): designed[n] for n in args.budgets if n in designed}
    trees |= {("hindsight", n): t for n, t in hindsight_trees(prefix_counts(c), args.budgets).items()}
    trajectory = replay(c, trees, mode="trajectory")
    everywhere = replay(c, trees, mode="all")
    replay_s = time.perf_counter() - t0
    extra = []
    if c.has_super_trees:
        t1 = time.perf_counter()
        budgets = [n for n in args.budgets if n <= size]
        extra = [replay_dynamic(c, budgets, mode="trajectory"), oracle(c, budgets, mode="trajectory")]
        super_replay_s = time.perf_counter() - t1
    print(
        f"replay: {len(trees)} trees ({len(PRESETS) + len(DESIGNED)} shapes x {len(args.budgets)} budgets, "
        f"designed trees included) on the trajectory and on all positions in {replay_s:.2f} s"
    )

    # 3. end to end, the measured pairs
    measured = {}
    matched = compared = 0
    for spec in args.measure:
        shape, _, n = spec.partition(":")
        tree = trees.get((shape, int(n))) or Tree.preset(shape, int(n))
        replayed = replay_steps(c, tree)
        t_run = time.perf_counter()
        runs = {
            pid: speculative_generate(target, draft, x, tree=tree, max_new_tokens=args.max_new_tokens)
            for pid, x in ids.items()
        }
        elapsed = time.perf_counter() - t_run
        m = cmp = 0
        for pid, r in runs.items():
            real = [_step(s) for s in r.steps]
            rep = [_step(s) for s in replayed[pid]]
            cmp += max(len(real), len(rep))
            m += sum(a == b for a, b in zip(real, rep))
        matched, compared = matched + m, compared + cmp
        measured[(shape, int(n))] = {
            "time_s": elapsed,
            "prefill_s": sum(r.prefill_time for r in runs.values()),
            "steps": sum(len(r.steps) for r in runs.values()),
        }
        print(
            f"end to end {spec}: {elapsed:.1f} s, {measured[(shape, int(n))]['steps']} steps, identical steps {m}/{cmp}"
        )

    # 4. extrapolate with the cost model, calibrated on the measured pairs
    t2 = time.perf_counter()
    curve_store = Sweep(f"{folder}/curve.jsonl", CURVE_KEY)
    prefix = int(sum(len(x[0]) for x in ids.values()) / len(ids)) + args.max_new_tokens // 2
    quick = CurveConfig(warmup=1, repeats=2, progress=False)
    verify_curve(curve_store, target, args.target, prefix, [0] + list(args.budgets), config=quick)
    widths = draft_widths(Tree.preset(s, n) for s in PRESETS for n in args.budgets)
    verify_curve(curve_store, draft, args.draft, prefix, widths, "draft", quick)
    curve = curve_table(curve_store)
    cost = step_cost(curve, args.target, args.draft)
    curve_s = time.perf_counter() - t2
    prefill_per_prompt = sum(v["prefill_s"] for v in measured.values()) / max(1, len(measured) * len(ids))
    table = trajectory[
        ["shape", "budget", "nodes", "depth", "steps", "acceptance_rate", "acceptance_length", "tau"]
    ].copy()
    table["tau_all_positions"] = everywhere["tau"].to_numpy()
    table["predicted_s"] = [
        len(ids) * prefill_per_prompt
        + r.steps * (cost.t_draft(trees[(r.shape, r.budget)]) + cost.t_verify(trees[(r.shape, r.budget)].num_nodes))
        for r in table.itertuples()
    ]
    keys = list(zip(table["shape"], table["budget"]))
    is_measured = [k in measured for k in keys]
    scale = sum(measured[k]["time_s"] for k in measured) / sum(
        p for p, k in zip(table["predicted_s"], keys) if k in measured
    )
    table["end_to_end_s"] = [
        measured[k]["time_s"] if k in measured else p * scale for k, p in zip(keys, table["predicted_s"])
    ]
    table["source"] = ["measured" if m else "estimated" for m in is_measured]
    cost_rows = recommend_budget(trajectory, trees, curve, args.target, args.draft)
    table = table.merge(cost_rows[["shape", "budget", "tokens_per_s", "speedup"]], on=["shape", "budget"])
    table = table.rename(columns={"tokens_per_s": "model_tokens_per_s", "speedup": "model_speedup"})

    pd.set_option("display.width", 250)
    print(
        "\nGreedy. acceptance_length excludes the bonus token, tau includes it; trajectory = positions a real run "
        "visits; end_to_end_s measured or estimated (see below); model_* = expected speed from the cost model"
    )
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if extra:
        print(
            "\nReplay only (no end-to-end drafter here): dynamic = top-n of the super-tree by cumulative draft "
            "log-prob; oracle = longest accepted prefix inside the super-tree, capped at n"
        )
        cols = ["shape", "budget", "steps", "acceptance_length", "tau"]
        print(pd.concat(extra)[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("\n" + recommendation(cost_rows))
    if args.csv:
        table.to_csv(args.csv, index=False)

    acc = acceptance_vector(c, 4)
    e2e_total = float(table["end_to_end_s"].sum())
    replay_side = base_s + replay_s
    print(f"\nacceptance vector (ranks 0-3): {', '.join(f'{a:.3f}' for a in acc)}")
    print(
        f"collection + replay: {base_s:.1f} s + {replay_s:.2f} s = {replay_side:.1f} s "
        f"for {len(trees)} (shape, budget) pairs"
        + (
            f"; super-trees {super_s:.1f} s + {super_replay_s:.2f} s more for the dynamic and oracle rows"
            if extra
            else ""
        )
    )
    print(
        f"end to end: {len(measured)} pairs measured ({sum(v['time_s'] for v in measured.values()):.1f} s); the other "
        f"{len(trees) - len(measured)} estimated as prompts x mean prefill + replayed steps x (t_draft(tree) + "
        f"t_verify(nodes)) from the cost model (curves measured in {curve_s:.0f} s, counted on neither side), times "
        f"{scale:.2f} = measured / predicted on the measured pairs; whole sweep {e2e_total:.0f} s"
    )
    if extra:
        print(
            "ratio with the super-trees counted on the replay side: "
            f"{e2e_total / (replay_side + super_s + super_replay_s):.1f}x"
        )
    print(f"replay_speedup={e2e_total / replay_side:.1f} identical_steps={matched}/{compared}")
    return 0


def _step(s) -> tuple:
    return (s.position, s.num_drafted, s.num_accepted, s.num_tokens, s.tree_depth, s.accepted_ranks, s.child_counts)


if __name__ == "__main__":
    sys.exit(main())
