"""End to end, greedy: specnb against transformers' own speculative decoders, per Spec-Bench category.

Rows, all in this one process, on the same prompts, interleaved per prompt (each prompt runs every
method before the next prompt starts, in an order rotated from prompt to prompt) after a warm-up:

    target alone          specnb.autoregressive_generate (the speed baseline and reference output)
    hf_assisted k         transformers assisted generation, the same draft, fixed k tokens a step
    specnb chain k        speculative_generate with Tree.chain(k) and the same draft (its LM head
                          ranked by `kernels.topk_head.TopKHead` where that pays: the same tokens)
    specnb chain k own head   the same with the draft's own float32 LM head (what TopKHead saves)
    specnb <best tree>    speculative_generate with --best-tree (default sparse:8)
    specnb adaptive k     specnb's AdaptiveLength: the chain length from k by transformers' +2 / -1
                          rule (reset per prompt), at most 2k deep
    hf_prompt_lookup L    transformers prompt lookup, L = --lookup-tokens
    specnb ngram chain L  specnb's NgramDrafter, one continuation (a chain) of up to L tokens
    specnb ngram tree L   specnb's NgramDrafter, several continuations in the same L-node budget

Per category: tokens/s (all tokens / all wall time, prefill included), speedup over the target
alone, tau (tokens per target call, bonus INCLUDED), draft tokens per accepted token, acceptance
rate (accepted / drafted), greedy-equal count, and the perplexity of the output under the target.
Then the cost model that says where speculation pays: c = one draft forward / one target decoding
forward, and the verify cost of each tree (verify step / target decoding step), both from the measured steps
(first steps excluded: transformers puts the prompt in them). A step costs about
verify_ratio + depth * c target forwards and yields tau tokens, so the predicted speedup is
tau / (verify_ratio + depth * c) (Leviathan et al. 2023, section 3.4).

    python benchmarks/end_to_end.py --quick
    python benchmarks/end_to_end.py --per-category 3 --max-new-tokens 128 --repeats 2

Per category also: the best specnb method against the best transformers method (tokens/s of the
fastest specnb row over the fastest of hf_assisted and hf_prompt_lookup in that category).

The last line is
    chain_over_hf_assisted=<x> ngram_over_hf_prompt_lookup=<y> greedy_outputs_equal=<n>/<m> best_over_hf_best=<z> rss_onednn_over_stock=<r>
x: tokens/s of specnb's chain over transformers assisted at the same k, all prompts pooled;
y: specnb's n-gram chain over transformers prompt lookup at the same length, on the
summarization and rag prompts (nan without an n-gram drafter or such prompts); n/m: greedy runs
whose output equals the target's own greedy output; z: the smallest, over categories, of the best
specnb method's tokens/s over the best transformers method's; r: resident memory of a fresh process
that loaded the pair on the oneDNN path over one that loaded it on the stock path.
"""  # noqa: E501 -- the last-line template above is one printed line, shown unbroken

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch
from options import chosen_prompts, model_arguments, parsed, prompt_arguments

from specnb import AdaptiveLength, Tree, autoregressive_generate, speculative_generate, summarize
from specnb.analysis.quality import greedy_equal, perplexity
from specnb.bench.baselines import hf_assisted_generate, hf_prompt_lookup_generate
from specnb.bench.timing import fastest_rounds
from specnb.core.drafting import ModelDrafter
from specnb.core.generation import GenerationResult
from specnb.drafters.methods import method_trees
from specnb.drafters.ngram import NgramDrafter
from specnb.io.models import load_pair, prompt_ids
from specnb.kernels.cpu_linear import linear_path

LOOKUP_CATEGORIES = ("summarization", "rag")  # where copying from the prompt is expected to pay
TARGET_ALONE = "target alone"


@dataclass(frozen=True)
class Method:
    name: str
    kind: str  # "target", "model_draft", "lookup": which comparison it belongs to
    run: Callable[[torch.Tensor, int], GenerationResult]  # (input ids, max new tokens) -> result
    depth: int = 0  # draft forwards per step (model drafts), for the cost model
    nodes: int = 0  # tree size verified per step (upper bound for lookup)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(ap, target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    prompt_arguments(ap)
    ap.add_argument("--k", type=int, default=4, help="draft length of hf_assisted and the specnb chain")
    ap.add_argument("--best-tree", default="sparse:8", help="specnb tree with the draft model, shape:budget")
    ap.add_argument(
        "--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens, and the n-gram chain length"
    )
    ap.add_argument("--ngram-size", type=int, default=2, help="max_matching_ngram_size of prompt lookup")
    args = parsed(ap, argv)
    started = time.perf_counter()
    prompts = chosen_prompts(args)
    # first, while this process holds no model: beside a loaded pair (~10 GB of this machine's 24) the kernel
    # most likely reclaimed the stock child's memory-mapped weight pages: its VmRSS read 9.03 GB, 10.25 alone
    rss = {
        path: resident_after_load(args.target, args.draft, args.target_quantization, args.draft_quantization, path)
        for path in ("stock", "onednn")
    }
    loading = time.perf_counter()
    target, draft, tokenizer = load_pair(
        args.target, args.draft, args.target_quantization, args.draft_quantization, cpu_linear=args.cpu_linear
    )
    print(
        f"device={target.device} dtype={target.dtype} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"cpu_linear={linear_path(target)} prompts={len(prompts)} max_new_tokens={args.max_new_tokens} "
        f"load_s={time.perf_counter() - loading:.0f}"
    )
    methods = build_methods(target, draft, args)

    runs = measured_runs(methods, prompts, tokenizer, args, score=lambda ids, out: perplexity(target, ids, out))
    table = per_category(runs, [m.name for m in methods])
    print_categories(
        table,
        "greedy; tokens/s = tokens / wall time incl. prefill; tau = tokens per target call (bonus INCLUDED);"
        " acceptance = accepted / drafted; draft_tokens_per_accepted = drafted / accepted; speedup over the target"
        " alone in this run",
    )
    best = best_per_category(table)
    print("\nbest specnb method / best transformers method, per category (tokens/s):")
    print(best.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print()
    print(cost_report(runs, methods))

    greedy = [r for r in runs if r["method"] != TARGET_ALONE]
    equal = sum(r["greedy_equal"] for r in greedy)
    chain, assisted = f"specnb chain {args.k}", f"hf_assisted {args.k}"
    x = pooled_speed(runs, chain) / pooled_speed(runs, assisted)
    ngram_chain = f"specnb ngram chain {args.lookup_tokens}"
    lookup = f"hf_prompt_lookup {args.lookup_tokens}"
    y = math.nan
    if not any(r["category"] in LOOKUP_CATEGORIES for r in runs):
        print(f"note: no {'/'.join(LOOKUP_CATEGORIES)} prompts: ngram_over_hf_prompt_lookup is nan")
    else:
        y = pooled_speed(runs, ngram_chain, LOOKUP_CATEGORIES) / pooled_speed(runs, lookup, LOOKUP_CATEGORIES)
    write_csv(args.csv, runs)
    own = pooled_speed(runs, f"{chain} own head") / pooled_speed(runs, assisted)
    print(
        f"chain {args.k} with the draft's own LM head over hf_assisted {args.k}: {own:.3f} (TopKHead: {x:.3f}); "
        f"drafts equal: {same_drafts(runs, chain, f'{chain} own head')}"
    )
    print(f"elapsed_s={time.perf_counter() - started:.0f}")
    z = best[best["category"] != "all"]["best_over_hf_best"].min()
    print(
        "resident memory of the pair, every weight read once, each path in a fresh process: "
        f"stock {rss['stock'] / 1e9:.2f} GB, "
        f"onednn {rss['onednn'] / 1e9:.2f} GB"
    )
    print(
        f"chain_over_hf_assisted={x:.3f} ngram_over_hf_prompt_lookup={y:.3f} "
        f"greedy_outputs_equal={equal}/{len(greedy)} "
        f"best_over_hf_best={z:.3f} rss_onednn_over_stock={rss['onednn'] / rss['stock']:.3f}"
    )
    return 0 if equal == len(greedy) else 1


def same_drafts(runs: list[dict], a: str, b: str) -> str:
    """How many prompts' runs of methods a and b drafted and accepted the same at every step."""
    steps = {
        (r["method"], r["prompt_id"]): [(s.num_drafted, s.num_accepted, s.accepted_ranks) for s in r["result"].steps]
        for r in runs
        if r["method"] in (a, b)
    }
    prompts = {p for m, p in steps if m == a}
    return f"{sum(steps[(a, p)] == steps.get((b, p)) for p in prompts)}/{len(prompts)}"


def resident_after_load(
    target: str, draft: str, target_quantization: str | None, draft_quantization: str | None, cpu_linear: str
) -> int:
    """Bytes resident (VmRSS) in a fresh Python process once it has loaded the pair on `cpu_linear`,
    read every parameter and buffer once (weights are memory-mapped from their file: a page never
    read is not resident yet, and a forward reads only a few rows of the embedding) and collected
    its garbage: what holding the two models costs on that path."""
    code = (
        "import gc, sys, torch\n"
        "from specnb.io.models import load_pair\n"
        "target, draft, _ = load_pair(*[a or None for a in sys.argv[1:5]], cpu_linear=sys.argv[5])\n"
        "with torch.inference_mode():\n"
        "    for t in [*target.parameters(), *target.buffers(), *draft.parameters(), *draft.buffers()]:\n"
        "        t.to_dense().sum() if t.layout != torch.strided else t.sum()\n"
        "gc.collect()\n"
        "print(next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')))\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            target,
            draft,
            str(target_quantization or ""),
            str(draft_quantization or ""),
            cpu_linear,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[-1])


def build_methods(target: torch.nn.Module, draft: torch.nn.Module, args: argparse.Namespace) -> list[Method]:
    k, lookup = args.k, args.lookup_tokens
    ((best_key, best_tree),) = method_trees([args.best_tree]).items()
    chain_drafter, tree_drafter = ModelDrafter(draft), ModelDrafter(draft)  # one cache per method
    own_head = ModelDrafter(draft, head=None)  # the same chain ranked by the draft's own float32 LM head
    adaptive = AdaptiveLength(ModelDrafter(draft), start=k, schedule="heuristic_transient")
    methods = [
        Method(TARGET_ALONE, "target", lambda ids, n: autoregressive_generate(target, ids, max_new_tokens=n)),
        Method(
            f"hf_assisted {k}",
            "model_draft",
            lambda ids, n: hf_assisted_generate(target, draft, ids, num_assistant_tokens=k, max_new_tokens=n),
            k,
            k,
        ),
        Method(
            f"specnb chain {k}",
            "model_draft",
            lambda ids, n: speculative_generate(target, chain_drafter, ids, tree=Tree.chain(k), max_new_tokens=n),
            k,
            k,
        ),
        Method(
            f"specnb chain {k} own head",
            "model_draft",
            lambda ids, n: speculative_generate(target, own_head, ids, tree=Tree.chain(k), max_new_tokens=n),
            k,
            k,
        ),
        Method(
            f"specnb {best_key[0]}:{best_key[1]}",
            "model_draft",
            lambda ids, n: speculative_generate(target, tree_drafter, ids, tree=best_tree, max_new_tokens=n),
            best_tree.depth,
            best_tree.num_nodes,
        ),
        Method(
            f"specnb adaptive {k}",
            "model_draft",
            lambda ids, n: speculative_generate(target, adaptive, ids, tree=Tree.chain(2 * k), max_new_tokens=n),
            2 * k,
            2 * k,
        ),
        Method(
            f"hf_prompt_lookup {lookup}",
            "lookup",
            lambda ids, n: hf_prompt_lookup_generate(
                target, ids, prompt_lookup_num_tokens=lookup, max_matching_ngram_size=args.ngram_size, max_new_tokens=n
            ),
            0,
            lookup,
        ),
    ]
    # specnb's n-gram drafter, matched to transformers' prompt lookup: the same n-gram sizes
    # (max_matching_ngram_size down to 1), earliest match first, one continuation (a chain) of up
    # to `lookup` tokens; the tree variant fills the same node budget with several continuations
    chain_lookup = NgramDrafter(max_ngram=args.ngram_size, min_ngram=1, max_branches=1)
    tree_lookup = NgramDrafter(max_ngram=args.ngram_size, min_ngram=1)
    methods += [
        Method(
            f"specnb ngram chain {lookup}",
            "lookup",
            lambda ids, n: speculative_generate(target, chain_lookup, ids, tree=Tree.chain(lookup), max_new_tokens=n),
            0,
            lookup,
        ),
        Method(
            f"specnb ngram tree {lookup}",
            "lookup",
            lambda ids, n: speculative_generate(target, tree_lookup, ids, tree=Tree.chain(lookup), max_new_tokens=n),
            0,
            lookup,
        ),
    ]
    return methods


def measured_runs(
    methods: list[Method],
    prompts: list,
    tokenizer,
    args: argparse.Namespace,
    score: Callable[[torch.Tensor, torch.Tensor], float] | None = None,
) -> list[dict]:
    """Every method on every prompt (`bench.timing.fastest_rounds`, after one warm-up run of each on a short
    prompt, so no measured call pays one-off costs), one record a run, a progress line a prompt;
    score(ids, output): the output's perplexity, once per distinct output (None: nan)."""
    warm = prompt_ids(tokenizer, "Say hello.")
    for m in methods:
        m.run(warm, 3)
    runs: list[dict] = []
    scored: dict[tuple[str, tuple[int, ...]], float] = {}
    by_name = {m.name: m for m in methods}
    for i, prompt in enumerate(prompts):
        ids = prompt_ids(tokenizer, prompt.text)
        results, _ = fastest_rounds(list(by_name), lambda n: by_name[n].run(ids, args.max_new_tokens), args.repeats, i)
        reference = results[TARGET_ALONE].tokens
        for m in methods:
            r = results[m.name]
            out = (prompt.id, tuple(r.tokens.tolist()))
            if out not in scored:
                scored[out] = score(ids, r.tokens) if score else math.nan
            runs.append(
                {
                    "category": prompt.category,
                    "prompt_id": prompt.id,
                    "prompt_tokens": ids.shape[1],
                    "method": m.name,
                    "kind": m.kind,
                    "depth": m.depth,
                    "nodes": m.nodes,
                    "result": r,
                    "greedy_equal": greedy_equal(r.tokens, reference),
                    "perplexity": scored[out],
                }
            )
        line = " ".join(f"{m.name}={summarize(results[m.name]).tokens_per_s:.2f}" for m in methods)
        print(
            f"[{i + 1}/{len(prompts)}] {prompt.category} #{prompt.id} ({ids.shape[1]} prompt tokens) tok/s: {line}",
            flush=True,
        )
    return runs


def print_categories(table: pd.DataFrame, header: str) -> None:
    """`per_category`'s table, one block a category, under `header` (the conventions)."""
    pd.set_option("display.width", 200)
    print("\n" + header)
    for category, t in table.groupby("category", sort=False):
        print(f"\n== {category}")
        print(t.drop(columns="category").to_string(index=False, float_format=lambda x: f"{x:.3f}"))


def write_csv(path: str | None, runs: list[dict]) -> None:
    """One row a run (`measured_runs`' records with the run's summary), if a path is given."""
    if path:
        flat = [{k: v for k, v in r.items() if k != "result"} | summarize(r["result"]).row() for r in runs]
        pd.DataFrame(flat).to_csv(path, index=False)


def per_category(runs: list[dict], order: list[str]) -> pd.DataFrame:
    """One row per (category, method), pooled over the category's prompts, plus an "all" block."""
    rows = []
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["category"], r["method"])].append(r)
        groups[("all", r["method"])].append(r)
    categories = list(dict.fromkeys(r["category"] for r in runs)) + ["all"]
    for category in categories:
        base = summarize([r["result"] for r in groups[(category, TARGET_ALONE)]]).tokens_per_s
        for method in order:
            rs = groups[(category, method)]
            s = summarize([r["result"] for r in rs])
            rows.append(
                {
                    "category": category,
                    "method": method,
                    "tokens_per_s": s.tokens_per_s,
                    "speedup": s.tokens_per_s / base,
                    "tau": s.tau,
                    "draft_tokens_per_accepted": s.draft_tokens_per_accepted,
                    "acceptance_rate": s.acceptance_rate,
                    "greedy_equal": f"{sum(r['greedy_equal'] for r in rs)}/{len(rs)}",
                    "perplexity": sum(r["perplexity"] for r in rs) / len(rs),
                    "draft_s": s.draft_time_s,
                    "verify_s": s.verify_time_s,
                    "prefill_s": sum(r["result"].prefill_time for r in rs),
                }
            )
    return pd.DataFrame(rows)


def best_per_category(table: pd.DataFrame) -> pd.DataFrame:
    """Per category: the fastest specnb method and the fastest transformers method, and the ratio."""
    rows = []
    for category, t in table.groupby("category", sort=False):
        ours = t[t["method"].str.startswith("specnb")]
        theirs = t[t["method"].str.startswith("hf_")]
        a, b = ours.loc[ours["tokens_per_s"].idxmax()], theirs.loc[theirs["tokens_per_s"].idxmax()]
        rows.append(
            {
                "category": category,
                "best_specnb": a["method"],
                "specnb_tokens_per_s": a["tokens_per_s"],
                "best_transformers": b["method"],
                "transformers_tokens_per_s": b["tokens_per_s"],
                "best_over_hf_best": a["tokens_per_s"] / b["tokens_per_s"],
            }
        )
    return pd.DataFrame(rows)


def pooled_speed(runs: list[dict], method: str, categories: tuple[str, ...] | None = None) -> float:
    chosen = [
        r["result"] for r in runs if r["method"] == method and (categories is None or r["category"] in categories)
    ]
    return summarize(chosen).tokens_per_s if chosen else math.nan


def cost_report(runs: list[dict], methods: list[Method], draft_forwards: dict[str, float] | None = None) -> str:
    """Draft and verify costs in units of one target decoding forward, from the measured steps
    (each run's first step left out: for transformers it carries the prompt), and the speedup
    they predict against the one measured. draft_forwards: draft forwards per step by method name,
    where the verified tree's depth is not it (a draft of another tokenizer); given, c is printed
    for the methods it names only."""

    def later_steps(method: str) -> list:
        return [s for r in runs if r["method"] == method for s in r["result"].steps[1:]]

    base_steps = later_steps(TARGET_ALONE)
    if not base_steps:
        return "cost model: too few steps (max_new_tokens 1)"
    t_target = sum(s.verify_time for s in base_steps) / len(base_steps)  # one decoding forward
    lines = [f"cost model (per step, first step excluded): target decoding forward = {t_target * 1e3:.0f} ms"]
    for m in methods:
        steps = later_steps(m.name)
        if m.kind == "target" or not steps:
            continue
        verify = sum(s.verify_time for s in steps) / len(steps) / t_target
        draft = sum(s.draft_time for s in steps) / len(steps) / t_target
        tau = sum(s.num_tokens for s in steps) / len(steps)
        nodes = sum(s.num_drafted for s in steps) / len(steps)
        measured = (
            summarize([r["result"] for r in runs if r["method"] == m.name]).tokens_per_s
            / summarize([r["result"] for r in runs if r["method"] == TARGET_ALONE]).tokens_per_s
        )
        depth = sum(s.tree_depth for s in steps) / len(steps)  # draft forwards per step (chains: the depth)
        if draft_forwards is not None:
            depth = draft_forwards.get(m.name, 0)
        per_forward = f", c = one draft forward / target forward = {draft / depth:.3f}" if m.depth and depth else ""
        verdict = "pays" if tau > verify + draft else "does NOT pay"
        lines.append(
            f"- {m.name}: verify {nodes + 1:.1f} tokens = {verify:.2f} target forwards, "
            f"draft = {draft:.2f}{per_forward}; "
            f"tau {tau:.2f} vs cost {verify + draft:.2f} -> predicted {tau / (verify + draft):.2f}x, "
            f"measured {measured:.2f}x (prefill included): speculation {verdict} here"
        )
    lines.append(
        "A step pays when tau (tokens it yields) exceeds its cost in target forwards: verify ratio + draft cost. "
        "The verify ratio is what one forward over the verified tokens costs against a one-token forward; "
        "the draft cost is depth x c for a draft model (c near 1 leaves no room), ~0 for n-gram lookup. "
        "Predicted and measured speedups differ by the prefill (in the measured one) and per-step overheads."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
