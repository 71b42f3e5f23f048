"""Batch size: specnb's batched speculative generation against the target alone batched, and the cost
model's prediction, for one pair (notebook 06's steps, `specnb.experiments.batch_study`).

Default pair: Qwen2.5-Coder-0.5B -> 1.5B on the notebooks' default linear path (oneDNN prepacked),
Spec-Bench prompts of mixed categories and lengths (categories in turn, one each), 32 tokens per
row, greedy. In this one process:
  1. each prompt's tokens and steps for every shape x budget, replayed from one collection of the
     prompts (greedy: a row's steps do not depend on the rows beside it, so they hold at every
     batch size); every row generates the full length (EOS ignored);
  2. the batched cost curves at every batch size (the target's verify of B x (n + 1) tokens, the
     draft's forward of B x w tokens);
  3. the cost model: expected tokens/s of every shape x budget x batch, the best budget per batch;
  4. real batched runs at every batch size on the first B prompts, interleaved after a warm-up: the
     target alone batched, transformers' generate batched (left padding), chain:k and the cost
     model's best tree at that batch (transformers' assisted generation at batch 1: it refuses more).

    python benchmarks/batch.py --quick        batches 1 and 4 (< 10 min on 2 idle cores)
    python benchmarks/batch.py                batches 1, 2, 4, 8

Last line:
    speedup_b1=<a> speedup_b4=<b> best_budget_b1=<n1> best_budget_b4=<n4> predicted_over_measured=<r> target_b4_over_b1=<t> greedy_rows_equal=<x>/<y>
a, b: the best measured speculative method's total tokens/s over the batched target alone at batch
1 and 4; n1, n4: the cost model's best budgets (draft tokens per row); r: predicted over measured
decoding tokens/s (after the prefill) of the model's best tree at batch 4; t: the batched target alone's total tokens/s
at batch 4 over batch 1; x/y: rows of specnb's batched runs (target alone and speculative, every
batch) whose greedy output equals that prompt's own batch-1 greedy output, ties counted as not equal.
"""  # noqa: E501 -- the last-line template above is one printed line, shown unbroken

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from specnb.analysis import cost_model
from specnb.bench.batch_curve import BATCH_CURVE_KEY
from specnb.drafters.methods import trees_for
from specnb.experiments import batch_study as bs
from specnb.io.models import load_pair
from specnb.io.storage import Sweep
from specnb.kernels.cpu_linear import linear_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--cpu-linear", choices=("stock", "onednn"), default="onednn")
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--shapes", nargs="*", default=["chain", "kary2", "sparse"])
    ap.add_argument("--budgets", nargs="*", type=int, default=[2, 4, 8, 16])
    ap.add_argument("--k", type=int, default=4, help="the chain measured beside the best tree")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--curve-prefix", type=int, default=128)
    ap.add_argument("--curve-repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="batches 1 and 4, budgets 2, 4, 8 (< 10 min on 2 idle cores)")
    ap.add_argument("--csv", default=None, help="also write the measured runs here")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.budgets = [1, 4], [2, 4, 8]
    if 4 not in args.batches or 1 not in args.batches:
        raise SystemExit("the last line compares batch 1 and batch 4: --batches must include both")

    started = time.perf_counter()
    target, draft, tokenizer = load_pair(args.target, args.draft, cpu_linear=args.cpu_linear)
    prompts = bs.batch_prompts(tokenizer, "spec_bench", 1, max(args.batches), args.max_prompt_tokens, args.batches)
    rows = [ids for _, _, ids in prompts]
    print(
        f"device={target.device} dtype={target.dtype} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"cpu_linear={linear_path(target)} batches={args.batches} prompts={[(c, len(ids)) for _, c, ids in prompts]} "
        f"max_new_tokens={args.max_new_tokens} load_s={time.perf_counter() - started:.0f}",
        flush=True,
    )
    trees = trees_for(args.shapes, args.budgets)
    with tempfile.TemporaryDirectory() as tmp:
        table, runs = bs.replayed_runs(Path(tmp) / "collection", target, draft, prompts, trees, args.max_new_tokens)
        store = Sweep(Path(tmp) / "curves.jsonl", key=BATCH_CURVE_KEY)
        curve = bs.measure_curves(
            store,
            (target, draft),
            (args.target, args.draft),
            args.curve_prefix,
            args.batches,
            list(trees.values()),
            args.curve_repeats,
        )
    print(
        "tau per row (replayed, bonus included):\n"
        f"{table.pivot(index='budget', columns='shape', values='tau').round(3)}"
    )
    print(
        "batched curves (median ms):\n"
        f"{curve.pivot_table(index=['role', 'nodes'], columns='batch', values='median_ms').round(1)}"
    )
    cost = cost_model.batch_cost_table(curve, trees, runs, args.batches, args.target, args.draft)
    best = cost_model.best_budgets(cost)
    pd.set_option("display.width", 200)
    print("best budget at each batch (cost model):")
    print(
        best[["batch", "shape", "budget", "tau", "steps", "t_draft_s", "t_verify_s", "tokens_per_s", "speedup"]]
        .round(3)
        .to_string(index=False)
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    methods = bs.BatchMethods(target, draft, pad, args.k)
    measured = bs.measure_batches(
        methods, rows, args.batches, bs.best_specs(best, args.k), args.max_new_tokens, args.rounds
    )
    versus = bs.predicted_vs_measured(cost, measured)
    print(
        "\nmeasured (greedy; tokens/s in all = every row's tokens / the batch's wall clock; "
        "tau per row, bonus included):"
    )
    print(measured.round(3).to_string(index=False))
    print("\npredicted against measured:")
    print(versus.round(3).to_string(index=False))
    if args.csv:
        measured.to_csv(args.csv, index=False)

    ok = measured[measured["status"] == "measured"]
    spec = ok[~ok["method"].isin([bs.TARGET_ALONE, bs.HF_BATCH]) & ~ok["method"].str.startswith(bs.HF_ASSISTED)]
    speedup = {b: float(spec[spec["batch"] == b]["speedup"].max()) for b in (1, 4)}
    budget = {b: int(best[best["batch"] == b]["budget"].iloc[0]) for b in (1, 4)}
    chosen = best[best["batch"] == 4].iloc[0]
    at4 = versus[(versus["batch"] == 4) & (versus["method"] == f"{chosen['shape']}:{int(chosen['budget'])}")]
    r = float(at4["predicted_over_measured"].iloc[0]) if len(at4) else float("nan")
    alone = ok[ok["method"] == bs.TARGET_ALONE].set_index("batch")["tokens_per_s"]
    ours = ok[~ok["method"].isin([bs.HF_BATCH]) & ~ok["method"].str.startswith(bs.HF_ASSISTED)]
    hf = ok[ok["method"] == bs.HF_BATCH]
    print(
        f"transformers' generate batched (left padding): rows equal to batch-1 greedy {int(hf['greedy_equal'].sum())}/"
        f"{int(hf['rows'].sum())}; elapsed_s={time.perf_counter() - started:.0f}"
    )
    equal, total = int(ours["greedy_equal"].sum()), int(ours["rows"].sum())
    print(
        f"speedup_b1={speedup[1]:.3f} speedup_b4={speedup[4]:.3f} "
        f"best_budget_b1={budget[1]} best_budget_b4={budget[4]} "
        f"predicted_over_measured={r:.3f} target_b4_over_b1={alone[4] / alone[1]:.3f} greedy_rows_equal={equal}/{total}"
    )
    return 0 if equal == total else 1


if __name__ == "__main__":
    sys.exit(main())
