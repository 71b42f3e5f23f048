"""The command-line options the benchmarks share: a draft -> target pair (`model_arguments`) and a
per-category prompt set run interleaved (`prompt_arguments`, `parsed`, `chosen_prompts`)."""

from __future__ import annotations

import argparse
from collections import defaultdict

from specnb.io.prompts import Prompt, load_prompts

QUICK_CATEGORIES = ("coding", "summarization", "rag")


def model_arguments(
    ap: argparse.ArgumentParser, target: str | None, draft: str | None, cpu_linear: bool = True
) -> None:
    """The pair's options (the benchmarks share them): --target and --draft (None: required), each
    loaded in 4-bit nf4 on request, and where `cpu_linear`, a CPU float32 model's linear layers."""
    ap.add_argument("--target", default=target, required=target is None)
    ap.add_argument("--draft", default=draft, required=draft is None)
    ap.add_argument(
        "--target-quantization",
        choices=["4bit"],
        default=None,
        help="load the target in 4-bit nf4 (bitsandbytes; a 7B target on a 15 GB T4 needs it)",
    )
    ap.add_argument("--draft-quantization", choices=["4bit"], default=None, help="load the draft in 4-bit nf4")
    if cpu_linear:
        ap.add_argument(
            "--cpu-linear",
            choices=("stock", "onednn"),
            default="onednn",
            help="a CPU float32 model's linear layers (specnb.kernels.cpu_linear): torch's stock path or oneDNN "
            "prepacked (the notebooks' default)",
        )


def prompt_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of a per-category, interleaved run (`chosen_prompts`, `timing.fastest_rounds`)."""
    ap.add_argument("--prompts", default="spec_bench", help="spec_bench, builtin, or a JSONL path")
    ap.add_argument("--categories", nargs="*", default=None, help="default: all (--quick: coding summarization rag)")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--pick",
        choices=("first", "shortest"),
        default="first",
        help="which prompts of a category: Spec-Bench file order, or the shortest texts",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="coding, summarization, rag: the shortest prompt of each, 32 tokens (< 10 min on 2 idle cores)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of every (prompt, method), interleaved; the fastest is kept "
        "(a shared CPU's spikes only slow runs down)",
    )
    ap.add_argument("--csv", default=None, help="also write the per-run table here")


def parsed(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The options, --quick's settings applied (its categories unless others are given, one prompt
    each, the shortest, 32 tokens)."""
    args = ap.parse_args(argv)
    if args.quick:
        args.categories = args.categories or list(QUICK_CATEGORIES)
        args.per_category, args.max_new_tokens, args.pick = 1, 32, "shortest"
    return args


def chosen_prompts(args: argparse.Namespace) -> list[Prompt]:
    """The prompts `prompt_arguments`' options choose (after `parsed`)."""
    prompts = pick(load_prompts(args.prompts, categories=args.categories), args.per_category, args.pick)
    if not prompts:
        raise SystemExit(f"no prompts in categories {args.categories}")
    return prompts


def pick(prompts: list[Prompt], per_category: int, how: str) -> list[Prompt]:
    """`per_category` prompts of each category, the first in file order or the shortest texts."""
    by_category: dict[str, list[Prompt]] = defaultdict(list)
    for p in prompts:
        by_category[p.category].append(p)
    if how == "shortest":
        by_category = {c: sorted(ps, key=lambda p: len(p.text)) for c, ps in by_category.items()}
    return [p for ps in by_category.values() for p in ps[:per_category]]
