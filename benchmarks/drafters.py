"""Acceptance of the drafters that need no second model, on one target, greedy.

n-gram lookup, early exit at a few depths, a 4-bit copy of the target, n-gram merged with early
exit, and adaptive draft length (transformers' +2/-1 schedule, a confidence threshold). Prints one
row per drafter and requested tree, pooled over the prompts: acceptance rate (accepted / drafted),
acceptance length (accepted draft tokens per step, bonus EXCLUDED), tau (tokens per target call,
bonus INCLUDED), draft ms per step, and the speed-up over the target's own decoding measured in
this run. Every output is checked token for token against that plain decoding.

    OMP_NUM_THREADS=1 python benchmarks/drafters.py --target smollm2-135m --max-new-tokens 48
"""

from __future__ import annotations

import argparse

from specnb import (
    AdaptiveLength,
    EarlyExitDrafter,
    MergedDrafter,
    NgramDrafter,
    Tree,
    autoregressive_generate,
    quantized_self_draft,
    speculative_generate,
    summarize,
)
from specnb.io.models import load_model, prompt_ids
from specnb.io.prompts import BUILTIN

REPEAT = "Repeat this list exactly, twice: apples, pears, plums, figs, dates, limes, kiwis."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--target-quantization", choices=["4bit"], default=None, help="load the target in 4-bit nf4")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="early-exit depths (default: 1/4, 1/2, 3/4)")
    ap.add_argument("--no-4bit", action="store_true", help="skip the 4-bit self-draft")
    args = ap.parse_args(argv)

    target, tokenizer = load_model(args.target, args.target_quantization)
    total = len(target.model.layers)
    layers = args.layers or [total // 4, total // 2, 3 * total // 4]
    mid = layers[len(layers) // 2]
    texts = {"repeat": REPEAT, **{p.id: p.text for p in BUILTIN if p.id in ("b05", "b10")}}
    prompts = {name: prompt_ids(tokenizer, text) for name, text in texts.items()}
    plain = {
        name: autoregressive_generate(target, ids, max_new_tokens=args.max_new_tokens) for name, ids in prompts.items()
    }
    plain_time = sum(r.total_time for r in plain.values())

    configs = [("ngram", NgramDrafter(), Tree.chain(8)), ("ngram", NgramDrafter(), Tree.kary(2, 8))]
    configs += [
        (f"early exit {n}/{total}", EarlyExitDrafter(target, n), tree)
        for tree in (Tree.chain(4), Tree.kary(2, 8))
        for n in layers
    ]
    if not args.no_4bit:
        four_bit = quantized_self_draft(args.target)
        configs += [("4-bit self", four_bit, Tree.chain(4)), ("4-bit self", four_bit, Tree.kary(2, 8))]
        configs += [("4-bit self, +2/-1 from 4", AdaptiveLength(four_bit, start=4), Tree.chain(8))]
    configs += [
        (
            f"ngram + early exit {mid}",
            MergedDrafter([(NgramDrafter(), Tree.kary(2, 8)), (EarlyExitDrafter(target, mid), Tree.chain(4))]),
            Tree.chain(8),
        ),
        (f"early exit {mid}, +2/-1 from 4", AdaptiveLength(EarlyExitDrafter(target, mid), start=4), Tree.chain(8)),
        (f"early exit {mid}, q < 0.4 stops", EarlyExitDrafter(target, mid, confidence_threshold=0.4), Tree.chain(8)),
    ]

    print(f"target {args.target} ({total} layers), prompts {list(prompts)}, {args.max_new_tokens} new tokens each")
    print(
        f"{'drafter':32s} {'requested tree':28s} {'acc.rate':>8s} {'acc.len':>8s} "
        f"{'tau':>6s} {'draft ms':>9s} {'speed-up':>8s}"
    )
    for name, drafter, tree in configs:
        results = []
        for pid, ids in prompts.items():
            result = speculative_generate(target, drafter, ids, tree=tree, max_new_tokens=args.max_new_tokens)
            if result.tokens.tolist() != plain[pid].tokens.tolist():
                print(f"{name} on {pid}: output differs from plain greedy decoding")
                return 1
            results.append(result)
        s = summarize(results)
        speedup = plain_time / sum(r.total_time for r in results)
        draft_ms = 1e3 * s.draft_time_s / s.num_steps
        print(
            f"{name:32s} {tree.describe():28s} {s.acceptance_rate:8.3f} {s.acceptance_length:8.2f} "
            f"{s.tau:6.2f} {draft_ms:9.1f} {speedup:8.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
