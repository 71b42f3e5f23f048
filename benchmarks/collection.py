"""Collection throughput: the target's continuations decoded in batches against one prompt at a time.

Both paths collect the same prompts into a collection folder of their own, one file per prompt
(`replay_study.collect_pair`), and both files hold what replay reads (the continuation, the draft's
rank of every token, and with --super the super-trees):

    one prompt at a time   each prompt's continuation from an exact speculative chain:4 run (the path
                           every collection took before), then its ranks and super-trees
    batched                the target's own greedy decoding, --batch prompts at once
                           (`experiments.continuations`), then the same ranks and super-trees

In one process, one after the other, so both see the machine alike.
Printed: per path, target tokens collected per second, without super-trees and with them on every
prompt (--super), the continuations compared token for token (equal, or different only from a
reported near tie), and the machine's decode step of the target (`notebook.estimate.decode_ms`: the
scale for another machine).

And a floor, measured in the same run: every prompt and its continuation through the target in one
forward (batch 1; the LM head on as many positions as decoding computes), the least arithmetic
any path that passes every token through the target once does, plus the batched path's own draft work
(ranks). Where the target's arithmetic, not its weights' reads, bounds a step, no batching beats it; the
one-prompt path's time over it estimates the most batching could gain on this machine (one timing of
each: a shared machine's speed moves between them). The last line:
`collection_speedup=<x> with_super_trees=<y> bound=<z> continuations_equal=<n>/<N> ties=<k> decode_ms=<d>`.

    python benchmarks/collection.py            # 26 Spec-Bench prompts (two per category), 128 tokens
    python benchmarks/collection.py --quick    # 8 prompts, 32 tokens, super-trees on 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from options import model_arguments

from specnb.analysis.quality import compare_greedy
from specnb.core.cache import new_cache
from specnb.core.forward import forward
from specnb.drafters.methods import trees_for
from specnb.experiments.pairs import Pair, PairModels
from specnb.experiments.replay_study import PairCollectConfig, collect_pair
from specnb.io.models import load_pair
from specnb.io.prompts import load_prompts
from specnb.notebook.estimate import decode_ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(ap, "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    ap.add_argument("--prompts", type=int, default=26, help="Spec-Bench prompts, categories taken in turn")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32, help="prompts decoded at once on the batched path (01 and 02: 32)")
    ap.add_argument("--super", type=int, default=4, help="prompts with super-trees (size 16, 8 children, depth 6)")
    ap.add_argument("--quick", action="store_true", help="8 prompts, 32 tokens, super-trees on 2")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens, args.super = 8, 32, 2
    pair = Pair(args.target, args.draft, args.target_quantization, args.draft_quantization, cpu_linear=args.cpu_linear)
    ms, how = decode_ms(
        {"target": args.target, "target_quantization": args.target_quantization, "cpu_linear": args.cpu_linear}
    )
    print(f"decode step of the target: {ms if ms is None else round(ms, 1)} ms ({how})", flush=True)
    target, draft, tokenizer = load_pair(
        pair.target, pair.draft, pair.target_quantization, pair.draft_quantization, cpu_linear=pair.cpu_linear
    )
    models = PairModels(pair.label, target, draft, tokenizer)
    prompts = load_prompts("spec_bench", per_category=(args.prompts + 12) // 13, limit=args.prompts)
    trees = trees_for(["chain", "kary2"], [4, 8, 16], {})
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for supers in (0, args.super):
            config = PairCollectConfig(
                args.max_new_tokens,
                super_k=8 if supers else 0,
                dynamic_budgets=(16,),
                super_prompts=supers or None,
                batch=args.batch,
            )
            for path in ("one prompt at a time", "batched"):
                root = Path(tmp) / f"{path}-{supers}"
                start = time.perf_counter()
                report = collect_pair(
                    root,
                    models,
                    prompts,
                    trees,
                    config,
                    continuations=root / "continuations" if path == "batched" else None,
                )
                seconds = time.perf_counter() - start
                tokens = sum(len(p.tokens) for p in report.collection.prompts)
                rows[(path, supers)] = (tokens, seconds, report)
                print(
                    f"{path}, super-trees on {supers} prompts: {tokens} tokens in {seconds:.1f} s = "
                    f"{tokens / seconds:.2f} tokens/s",
                    flush=True,
                )
    one, batched = rows[("one prompt at a time", 0)], rows[("batched", 0)]
    target_s = sum(teacher_forced(target, p.prompt, p.tokens) for p in batched[2].collection.prompts)
    draft_s = sum(t for p in batched[2].collection.prompts for k, t in p.times.items() if k != "continuation")
    bound = one[1] / (target_s + draft_s)
    print(
        f"floor: every prompt and continuation through the target in one forward each {target_s:.1f} s, "
        f"the batched path's ranks {draft_s:.1f} s: the batched path takes {batched[1] / (target_s + draft_s):.2f}x "
        f"the floor; the one-prompt path's time over it, {bound:.2f}x, estimates the most batching could gain here",
        flush=True,
    )
    verdicts = [
        compare_greedy(b.tokens.tolist(), a.tokens.tolist(), report_margins(batched[2], b.prompt_id)).verdict
        for a, b in zip(one[2].collection.prompts, batched[2].collection.prompts)
    ]
    speedup = (batched[0] / batched[1]) / (one[0] / one[1])
    with_super = [rows[(p, args.super)] for p in ("one prompt at a time", "batched")]
    super_speedup = (with_super[1][0] / with_super[1][1]) / (with_super[0][0] / with_super[0][1])
    print(
        f"collection_speedup={speedup:.2f} with_super_trees={super_speedup:.2f} bound={bound:.2f} "
        f"continuations_equal={verdicts.count('exact')}/{len(verdicts)} ties={verdicts.count('tie')} "
        f"decode_ms={ms if ms is None else round(ms, 1)}"
    )
    return 0 if "mismatch" not in verdicts else 1


def teacher_forced(target: torch.nn.Module, prompt, tokens) -> float:
    """Seconds of one batch-1 forward of the target over a prompt and its continuation, the LM head on as
    many positions as the continuation has tokens (what decoding them computes)."""
    seq = torch.cat([torch.as_tensor(prompt), torch.as_tensor(tokens)]).long()
    start = time.perf_counter()
    forward(target, new_cache(target), seq, logits_to_keep=max(len(tokens), 1))
    return time.perf_counter() - start


def report_margins(report, prompt_id: str) -> list[float]:
    """The batched continuation's top-2 margins of a prompt (where a difference is a near tie)."""
    return report.continuations[prompt_id].margins.tolist()


if __name__ == "__main__":
    sys.exit(main())
