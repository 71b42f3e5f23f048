"""Acceptance and speed of tree speculative decoding for one draft -> target pair, greedy.

For each prompt, the target's own greedy decoding runs first (the baseline and the reference
output), then each tree. Prints one row per tree: acceptance rate (accepted / drafted), acceptance
length (accepted draft tokens per step, bonus EXCLUDED), tau (tokens per target call, bonus
INCLUDED), tokens/s, speedup over the target alone measured in this same run, and how many outputs
equalled the target's plain greedy output.

    python benchmarks/pair_acceptance.py --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
        --trees chain:4 kary2:8 --prompts spec_bench --limit 6 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch
from options import model_arguments
from tqdm.auto import tqdm

from specnb import Tree, autoregressive_generate, speculative_generate, summarize
from specnb.drafters.methods import method_trees
from specnb.io.models import load_pair, prompt_ids
from specnb.io.prompts import load_prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(ap, target=None, draft=None, cpu_linear=False)
    ap.add_argument("--trees", nargs="+", default=["chain:4", "kary2:8"])
    ap.add_argument("--prompts", default="builtin", help="builtin, spec_bench, or a JSONL path")
    ap.add_argument("--per-category", type=int, default=None)
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--csv", default=None, help="also write the per-tree table here")
    args = ap.parse_args(argv)

    try:
        trees = {f"{shape}:{budget}": tree for (shape, budget), tree in method_trees(args.trees).items()}
    except ValueError as e:
        raise SystemExit(str(e)) from None
    prompts = load_prompts(args.prompts, per_category=args.per_category, limit=args.limit)
    target, draft, tokenizer = load_pair(args.target, args.draft, args.target_quantization, args.draft_quantization)
    print(f"device={target.device} dtype={target.dtype} torch={torch.__version__} prompts={len(prompts)}")

    # warm-up, so the first measured call does not pay one-off costs
    warm = prompt_ids(tokenizer, "Hello")
    autoregressive_generate(target, warm, max_new_tokens=2)
    speculative_generate(target, draft, warm, tree=Tree.chain(2), max_new_tokens=2)

    baseline, runs, equal = [], {s: [] for s in trees}, {s: 0 for s in trees}
    for prompt in tqdm(prompts, desc="prompts"):
        ids = prompt_ids(tokenizer, prompt.text)
        ref = autoregressive_generate(target, ids, max_new_tokens=args.max_new_tokens)
        baseline.append(ref)
        for spec, tree in trees.items():
            r = speculative_generate(target, draft, ids, tree=tree, max_new_tokens=args.max_new_tokens)
            runs[spec].append(r)
            equal[spec] += r.tokens.tolist() == ref.tokens.tolist()

    base = summarize(baseline)
    rows = [{"tree": "target alone", "nodes": 0, "depth": 0, **_cols(base, base), "greedy_equal": "-"}]
    for spec, tree in trees.items():
        s = summarize(runs[spec])
        rows.append(
            {
                "tree": spec,
                "nodes": tree.num_nodes,
                "depth": tree.depth,
                **_cols(s, base),
                "greedy_equal": f"{equal[spec]}/{len(prompts)}",
            }
        )
    table = pd.DataFrame(rows)
    print("greedy; acceptance_length excludes the bonus token, tau includes it")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if args.csv:
        table.to_csv(args.csv, index=False)
    ok = all(equal[s] == len(prompts) for s in trees)
    print(f"greedy_outputs_equal={sum(equal.values())}/{len(prompts) * len(trees)}")
    return 0 if ok else 1


def _cols(s, base) -> dict:
    return {
        "acceptance_rate": s.acceptance_rate,
        "acceptance_length": s.acceptance_length,
        "tau": s.tau,
        "tokens_per_s": s.tokens_per_s,
        "speedup": s.tokens_per_s / base.tokens_per_s,
        "draft_s": s.draft_time_s,
        "verify_s": s.verify_time_s,
    }


if __name__ == "__main__":
    sys.exit(main())
