"""One long generation with a chain draft, under StreamingLLM's bounded cache and under the full
cache: memory, speed, and exactness against the streaming target's own greedy decoding.

Runs, interleaved after a warm-up, on one prompt, greedy, all with the same draft model and chain:
    streaming speculative   speculative_generate(cache_policy=StreamingCache(sink, window)), the
                            draft's own cache bounded by the same policy
    full speculative        the same without a policy
    streaming target alone  autoregressive_generate with the policy: the reference output

Prints the KV bytes of the target's and draft's caches at the end (exact, from the tensors), the
peak inside a step, tokens/s, the cuts, tau (tokens per target call, bonus INCLUDED), and the
bound (sink + window + tree) / total length that the streaming cache must stay under. Last line:
    kv_bytes_ratio=<a> speed_ratio=<b> greedy_equal_streaming=<n>/<m>
a = streaming / full KV bytes at the end; b = streaming / full speculative tokens/s;
n/m = streaming speculative outputs equal to the streaming target's greedy output.

    python benchmarks/long_generation.py --quick      # 512 tokens, window 64 (< 10 min here)
    python benchmarks/long_generation.py              # 1024 tokens, window 128
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from specnb import ModelDrafter, autoregressive_generate, speculative_generate
from specnb.analysis.quality import compare_greedy, score
from specnb.core.streaming import StreamingCache
from specnb.drafters.methods import parse_method
from specnb.io.models import load_model, prompt_ids

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle, chapter by chapter."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--target-quantization", choices=["4bit"], default=None)
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument(
        "--draft-layers", type=int, default=24, help="keep the draft's first layers (default: SmolLM2's first 24)"
    )
    ap.add_argument("--draft-quantization", choices=["4bit"], default=None)
    ap.add_argument("--tree", default="chain:4", help="the draft model's tree, shape:budget")
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--positions", choices=["cache", "original"], default="cache")
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="512 tokens, window 64")
    args = ap.parse_args(argv)
    if args.quick:
        args.max_new_tokens, args.window = 512, 64
    tree = parse_method(args.tree).tree
    if args.max_new_tokens < 4 * args.window:
        print(f"note: {args.max_new_tokens} tokens is less than 4x the window ({args.window})")

    target, tokenizer = load_model(args.target, args.target_quantization)
    draft, _ = load_model(args.draft, args.draft_quantization, layers=args.draft_layers)
    policy = StreamingCache(args.sink, args.window, slack=tree.depth, positions=args.positions)
    ids = prompt_ids(tokenizer, PROMPT)
    print(
        f"device={target.device} dtype={target.dtype} threads={torch.get_num_threads()} prompt={ids.shape[1]} tokens "
        f"generating {args.max_new_tokens}; policy {policy.describe()}; tree {args.tree}"
    )
    runs = {
        "streaming speculative": lambda n: speculative_generate(
            target,
            ModelDrafter(draft, cache_policy=policy),
            ids,
            tree=tree,
            max_new_tokens=n,
            eos_token_id=(),
            cache_policy=policy,
        ),
        "full speculative": lambda n: speculative_generate(
            target, ModelDrafter(draft), ids, tree=tree, max_new_tokens=n, eos_token_id=()
        ),
        "streaming target alone": lambda n: autoregressive_generate(
            target, ids, max_new_tokens=n, eos_token_id=(), cache_policy=policy
        ),
    }
    for run in runs.values():  # warm-up
        run(8)
    results = {}
    for name, run in runs.items():
        start = time.perf_counter()
        results[name] = run(args.max_new_tokens)
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
    print("\ngreedy; KV = the target's and draft's caches (exact bytes); tau = tokens per target call, bonus INCLUDED")
    for name, r in results.items():
        tau = len(r.tokens) / len(r.steps)
        print(
            f"{name:>24}: {len(r.tokens)} tokens, {len(r.tokens) / r.total_time:.2f} tokens/s, "
            f"KV end {r.kv_bytes / 1e6:.2f} MB, "
            f"peak {r.kv_peak_bytes / 1e6:.2f} MB, cuts {r.evictions}, tau {tau:.2f}"
        )
    streaming, full = results["streaming speculative"], results["full speculative"]
    reference = results["streaming target alone"]
    total = ids.shape[1] + args.max_new_tokens
    bound = (args.sink + args.window + tree.num_nodes) / total
    a = streaming.kv_bytes / full.kv_bytes
    b = (len(streaming.tokens) / streaming.total_time) / (len(full.tokens) / full.total_time)
    margins = score(target, ids, streaming.tokens).margins
    verdict = compare_greedy(streaming.tokens, reference.tokens, margins, target.dtype)
    quality = {name: score(target, ids, results[name].tokens).perplexity for name in results}
    first = compare_greedy(reference.tokens, full.tokens).position
    print(
        "bound (sink + window + tree) / total length = "
        f"({args.sink} + {args.window} + {tree.num_nodes}) / {total} = {bound:.4f}"
    )
    print("perplexity under the full-cache target: " + ", ".join(f"{k} {v:.3f}" for k, v in quality.items()))
    print(f"the streaming output first differs from the full-cache output at token {first}")
    print(f"streaming speculative against the streaming target alone: {verdict.verdict}")
    print(f"kv_bytes_ratio={a:.4f} speed_ratio={b:.3f} greedy_equal_streaming={int(verdict.verdict == 'exact')}/1")
    return 0 if verdict.verdict == "exact" and a <= bound * 1.01 else 1


if __name__ == "__main__":
    sys.exit(main())
