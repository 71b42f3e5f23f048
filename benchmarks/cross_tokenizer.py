"""Cross-tokenizer speculative decoding, greedy: specnb's CrossTokenizerDrafter against transformers'
universal assisted generation (UAG), same draft, same draft length, per Spec-Bench category.

Default pair: SmolLM2-135M (49k vocabulary) drafting for Qwen2.5-Coder-1.5B (151k). Rows, all in
this one process, on the same prompts, interleaved per prompt (each prompt runs every method
before the next starts, in an order rotated from prompt to prompt) after a warm-up:

    target alone        specnb.autoregressive_generate (the speed baseline and reference output)
    hf_uag k            transformers UAG: the draft drafts k of its own tokens per step (schedule
                        constant, confidence threshold 0), re-encoded to target tokens
    xtok chain:k        specnb: the draft's chain of k draft tokens, re-encoded (at most k target nodes)
    xtok <tree>         specnb: each tree of --trees (draft tokens; at most that many target nodes)

Per category: tokens/s (all tokens / all wall time, prefill included), speedup over the target
alone, tau (target tokens per target call, bonus INCLUDED), acceptance rate (accepted / drafted,
both in target tokens: the verified tree), draft tokens per accepted target token (the draft's
cost), greedy-equal count. Then the cost model of benchmarks/end_to_end.py (draft and verify cost
in target forwards, from the measured steps).

    python benchmarks/cross_tokenizer.py --quick
    python benchmarks/cross_tokenizer.py --per-category 2 --max-new-tokens 128

The last line is
    xtok_chain_over_hf_uag=<x> xtok_best_over_target=<y> greedy_outputs_equal=<n>/<m>
x: tokens/s of specnb's xtok chain:k over transformers' UAG at the same k, all prompts pooled (same
draft, same length: below 1 is specnb's overhead); y: tokens/s of the fastest specnb xtok method
(pooled) over the target alone; n/m: runs whose output equals the target's own greedy output.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from end_to_end import (
    TARGET_ALONE,
    Method,
    cost_report,
    measured_runs,
    per_category,
    pooled_speed,
    print_categories,
    write_csv,
)
from options import chosen_prompts, model_arguments, parsed, prompt_arguments

from specnb import autoregressive_generate, speculative_generate
from specnb.bench.baselines import hf_uag_generate
from specnb.drafters.methods import build_drafter, parse_method
from specnb.drafters.retokenize import TokenText
from specnb.io.models import load_pair, load_tokenizer
from specnb.kernels.cpu_linear import linear_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(ap, target="qwen2.5-coder-1.5b", draft="smollm2-135m")
    prompt_arguments(ap)
    ap.add_argument("--k", type=int, default=4, help="draft tokens per step of hf_uag and of the xtok chain")
    ap.add_argument(
        "--trees",
        nargs="*",
        default=["sparse:8", "dynamic:8"],
        help="xtok trees besides the chain, shape:budget (draft tokens; the target tree gets at most as many nodes)",
    )
    args = parsed(ap, argv)
    started = time.perf_counter()
    prompts = chosen_prompts(args)
    target, draft, target_tokenizer = load_pair(
        args.target,
        args.draft,
        args.target_quantization,
        args.draft_quantization,
        cross_tokenizer=True,
        cpu_linear=args.cpu_linear,
    )
    draft_tokenizer = load_tokenizer(args.draft)
    print(
        f"device={target.device} dtype={target.dtype} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"cpu_linear={linear_path(target)} pair={args.draft} -> {args.target} prompts={len(prompts)} "
        f"max_new_tokens={args.max_new_tokens} "
        f"load_s={time.perf_counter() - started:.0f}"
    )
    methods = build_methods(target, draft, target_tokenizer, draft_tokenizer, args)

    runs = measured_runs(methods, prompts, target_tokenizer, args)
    print_categories(
        per_category(runs, [m.name for m in methods]).drop(columns="perplexity"),
        "greedy; tokens/s = tokens / wall time incl. prefill; tau = target tokens per target call (bonus INCLUDED);"
        " acceptance = accepted / drafted (target tokens); draft_tokens_per_accepted = the draft's own tokens per"
        " accepted target token; speedup over the target alone in this run",
    )
    print()
    # draft forwards per step: k for the chains; the draft tree's depth for a static tree (a dynamic
    # tree's varies: no c for it)
    forwards = {m.name: m.depth for m in methods if m.kind == "model_draft" and "dynamic" not in m.name}
    print(cost_report(runs, methods, forwards))

    greedy = [r for r in runs if r["method"] != TARGET_ALONE]
    equal = sum(r["greedy_equal"] for r in greedy)
    xtok = [m.name for m in methods if m.name.startswith("xtok")]
    best = max(xtok, key=lambda name: pooled_speed(runs, name))
    x = pooled_speed(runs, f"xtok chain:{args.k}") / pooled_speed(runs, f"hf_uag {args.k}")
    y = pooled_speed(runs, best) / pooled_speed(runs, TARGET_ALONE)
    print(
        f"best xtok method: {best} ({pooled_speed(runs, best):.2f} tokens/s "
        f"against {pooled_speed(runs, TARGET_ALONE):.2f} "
        f"for the target alone: speculation {'pays' if y > 1 else 'does NOT pay'} here)"
    )
    write_csv(args.csv, runs)
    print(f"elapsed_s={time.perf_counter() - started:.0f}")
    print(f"xtok_chain_over_hf_uag={x:.3f} xtok_best_over_target={y:.3f} greedy_outputs_equal={equal}/{len(greedy)}")
    return 0 if equal == len(greedy) else 1


def build_methods(target, draft, target_tokenizer, draft_tokenizer, args: argparse.Namespace) -> list[Method]:
    """The target alone, transformers' UAG at k, and specnb's xtok chain at k and --trees (one
    drafter per method, each with its own draft cache; the vocabularies read once)."""
    k = args.k
    texts = (TokenText.of(target_tokenizer), TokenText.of(draft_tokenizer))
    methods = [
        Method(TARGET_ALONE, "target", lambda ids, n: autoregressive_generate(target, ids, max_new_tokens=n)),
        Method(
            f"hf_uag {k}",
            "model_draft",
            lambda ids, n: hf_uag_generate(
                target, draft, ids, (target_tokenizer, draft_tokenizer), num_assistant_tokens=k, max_new_tokens=n
            ),
            k,
            k,
        ),
    ]
    for spec in [f"chain:{k}"] + list(args.trees):
        method = parse_method(f"xtok/{spec}")
        drafter = build_drafter(method, target, draft, target_tokenizer=texts[0], draft_tokenizer=texts[1])
        tree = method.tree  # the draft's tree (a dynamic tree: its depth cap)
        methods.append(
            Method(
                f"xtok {spec}",
                "model_draft",
                lambda ids, n, d=drafter, t=tree: speculative_generate(target, d, ids, tree=t, max_new_tokens=n),
                tree.depth,
                method.budget,
            )
        )
    return methods


if __name__ == "__main__":
    sys.exit(main())
