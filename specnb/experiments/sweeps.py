"""Experiments the notebooks run: sweeps of tree shapes x budgets x prompts for draft -> target
pairs, stored resumably, and the tidy tables computed from them.

A unit of work is one generation: (pair, shape, budget, prompt), where (shape, budget) names a
method (`methods`: "chain:4" is the draft model filling a chain of 4, "ngram/kary2:8" the n-gram
drafter filling a binary tree of 8, "dynamic:16" a dynamic tree). The target's own greedy decoding
of each prompt is the unit with shape "autoregressive" and budget 0; it is the reference output
(greedy equality is checked for every speculative unit) and the speed baseline of the same run.
transformers' own speculative decoders run as units too, on the same prompts in the same process
(`bench.baselines`): "hf_assisted" (the pair's draft, budget = its fixed draft length) and
"hf_prompt_lookup" (budget = `prompt_lookup_num_tokens`), their tree recorded as a chain of that
length, and "hf_uag" (universal assisted generation, a draft of another tokenizer; budget = draft
tokens per step). Every unit also gets the perplexity of its output under the target and its
greedy verdict against the target's own output: "exact", "tie" (a numerical tie of the target's top
two logits at the first difference) or "mismatch" (`analysis.quality`). Each unit stores its
per-step rows and a one-row summary (`storage.Sweep`).

Metric conventions (`metrics`): acceptance_rate = accepted / drafted; acceptance_length = accepted
draft tokens per step, bonus EXCLUDED; tau = tokens per target call, bonus INCLUDED.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..analysis import replay
from ..analysis.metrics import step_row, summarize
from ..analysis.quality import Score, compare_greedy, logit_gap, score
from ..bench.baselines import hf_assisted_generate, hf_prompt_lookup_generate, hf_uag_generate
from ..core.drafting import Drafter
from ..core.generation import GenerationResult, autoregressive_generate, speculative_generate
from ..core.trees import Tree
from ..drafters.methods import DYNAMIC, DYNAMIC_MAX_DEPTH, DYNAMIC_TOP_K, build_drafter, method_trees, parse_method
from ..drafters.retokenize import TokenText
from ..io.models import check_pair, describe_model, load_model, load_tokenizer, prompt_format, prompt_ids
from ..io.prompts import Prompt
from ..io.sources import check_sources
from ..io.storage import Sweep
from .pairs import Pair, pair_keys
from .replay_study import collect_pair
from .tables import BASELINE

WARMUP_TOKENS = 4  # tokens of each method's untimed warm-up run (`run_sweep`)
GAP_TOKENS = 8  # tokens of the first prompt's output that `quality.logit_gap` decodes and verifies
UNIT_KEY = ("pair", "shape", "budget", "prompt_id")


def run_sweep(
    store: Sweep,
    pair_label: str,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    tokenizer,
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
    progress: bool = True,
    dynamic: tuple[int, int] = (DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH),
    draft_tokenizer=None,
    baseline_of: str | None = None,
    texts: tuple[TokenText, TokenText] | None = None,
    rounds: int = 1,
    warmup: bool = True,
    drafters: dict[tuple[str, int], Drafter] | None = None,
) -> None:
    """Run every (prompt, tree) unit not yet in `store`. Timing is fair between methods: with
    `warmup` every method first runs once untimed (a few tokens); then per prompt the methods run
    interleaved, `rounds` times, in an order rotated from prompt to prompt, and each unit keeps its
    fastest round (greedy: every round gives the same tokens; a shared CPU's spikes only slow a
    run down) and records every round's seconds (`round_times`). The target alone is stored first
    per prompt: the reference of every method's output. A prompt's units are stored when its rounds
    are done (an interrupted run redoes that prompt only). dynamic:
    (children per node, depth) of dynamic trees (`methods.build_drafter`). `tokenizer` is the
    target's; draft_tokenizer, the draft's, is needed by the cross-tokenizer methods (xtok, hf_uag)
    only. baseline_of: an earlier pair of the same target in `store`, whose target-alone units are
    copied (meta "baseline_of") instead of run again: same model, prompt and run. texts: the two
    tokenizers read as bytes (`TokenText`), when already made. drafters: drafters built by the
    caller for some keys of `trees` (learned heads: `drafters.medusa`, `drafters.eagle`), whose
    labels then need not be method specs; `draft` may be None when every key has one."""
    drafters = dict(drafters or {})  # by key: the caller's; by method spec: one built per method, reused across prompts
    vocabularies = _Vocabularies(tokenizer, draft_tokenizer, texts)
    todo = {p.id: [k for k in [None, *trees] if _key(pair_label, k, p) not in store] for p in prompts}
    references: dict[str, list[int]] = {}
    ids_of = {p.id: prompt_ids(tokenizer, p.text) for p in prompts}  # tokenize each prompt once
    scores: dict[tuple[str, tuple[int, ...]], Score] = {}  # equal outputs are scored once
    gap: list[float] = []  # the target's decode-vs-verify logit gap (`quality.logit_gap`), measured once
    if warmup and any(todo.values()):  # every method once, untimed: no timed run pays a first call's costs
        for k in [None, *trees]:
            _generate(
                target,
                draft,
                drafters,
                ids_of[prompts[0].id],
                k,
                trees[k] if k else None,
                min(WARMUP_TOKENS, max_new_tokens),
                vocabularies,
                dynamic,
            )
    bar = tqdm(total=sum(map(len, todo.values())), desc=pair_label, disable=not progress)
    for i, prompt in enumerate(prompts):
        keys, ids = todo[prompt.id], ids_of[prompt.id]
        if None in keys and baseline_of is not None and _key(baseline_of, None, prompt) in store:
            earlier = _key(baseline_of, None, prompt)
            store.add(
                _key(pair_label, None, prompt),
                store.rows(earlier),
                meta={**store.meta(earlier), "baseline_of": baseline_of},
            )
            keys = [k for k in keys if k is not None]
            bar.update()
        best: dict = {}  # per method, its fastest round (greedy: every round gives the same tokens)
        rounds_s: dict = {k: [] for k in keys}
        order = keys[i % len(keys) :] + keys[: i % len(keys)] if keys else []  # rotated: no method always first
        for _ in range(rounds):
            for k in order:
                result = _generate(
                    target, draft, drafters, ids, k, trees[k] if k else None, max_new_tokens, vocabularies, dynamic
                )
                rounds_s[k].append(result.total_time)
                if k not in best or result.total_time < best[k].total_time:
                    best[k] = result
        for k in sorted(keys, key=lambda k: k is not None):  # the target alone first: the reference
            result = best[k]
            output = (prompt.id, tuple(result.tokens.tolist()))
            if output not in scores:
                scores[output] = score(target, ids, result.tokens)
            if k is None:
                references[prompt.id] = result.tokens.tolist()
            reference = references.get(prompt.id) or _stored_tokens(store, pair_label, prompt)
            if not gap:
                gap.append(logit_gap(target, ids, (reference or result.tokens.tolist())[:GAP_TOKENS] or [0]))
            summary = _unit_summary(
                result, prompt, reference, trees[k] if k else None, scores[output], target.dtype, gap[0]
            )
            store.add(
                _key(pair_label, k, prompt),
                _step_rows(result),
                meta={**summary, "rounds": rounds, "round_times": " ".join(f"{t:.4f}" for t in rounds_s[k])},
            )
            bar.update()
    bar.close()


def _generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    drafters: dict,
    ids: torch.Tensor,
    k: tuple[str, int] | None,
    tree: Tree | None,
    max_new_tokens: int,
    vocabularies: _Vocabularies,
    dynamic: tuple[int, int] = (DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH),
) -> GenerationResult:
    """One unit: the baseline (k None), a drafter the caller built for key k, a transformers
    method, or a specnb method (`methods`)."""
    if k is None:
        return autoregressive_generate(target, ids, max_new_tokens=max_new_tokens)
    if k in drafters:
        return speculative_generate(target, drafters[k], ids, tree=tree, max_new_tokens=max_new_tokens)
    method = parse_method(f"{k[0]}:{k[1]}")
    if method.drafter == "hf_assisted":
        return hf_assisted_generate(
            target, draft, ids, num_assistant_tokens=method.budget, max_new_tokens=max_new_tokens
        )
    if method.drafter == "hf_uag":
        return hf_uag_generate(
            target,
            draft,
            ids,
            vocabularies.target,
            vocabularies.draft,
            num_assistant_tokens=method.budget,
            max_new_tokens=max_new_tokens,
        )
    if method.drafter == "hf_prompt_lookup":
        return hf_prompt_lookup_generate(
            target, ids, prompt_lookup_num_tokens=method.budget, max_new_tokens=max_new_tokens
        )
    if method.spec not in drafters:
        texts = vocabularies.texts() if method.drafter == "xtok" else (None, None)
        drafters[method.spec] = build_drafter(
            method, target, draft, dynamic=dynamic, target_tokenizer=texts[0], draft_tokenizer=texts[1]
        )
    return speculative_generate(target, drafters[method.spec], ids, tree=tree, max_new_tokens=max_new_tokens)


class _Vocabularies:
    """A sweep's two tokenizers (target, draft), read as `TokenText` once, when a method needs it."""

    def __init__(self, target, draft, texts: tuple[TokenText, TokenText] | None = None) -> None:
        self.target, self.draft = target, draft
        self._texts = texts

    def texts(self) -> tuple[TokenText, TokenText]:
        if self.draft is None:
            raise ValueError("cross-tokenizer methods need the draft's tokenizer (run_sweep(..., draft_tokenizer=...))")
        if self._texts is None:
            self._texts = (TokenText.of(self.target), TokenText.of(self.draft))
        return self._texts


def run_pairs(
    store: Sweep,
    pairs: Sequence[Pair],
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
    progress: bool = True,
    collections: Path | None = None,
    measure: Sequence[str] = (),
    dtype: str | None = None,
    cpu_linear: str = "stock",
    rounds: int = 1,
) -> pd.DataFrame:
    """Sweep every pair, the models in `dtype` (`io.models.model_dtype`; None: the device's default),
    a CPU float32 model's linear layers on `cpu_linear` (`kernels.cpu_linear`), every measured method
    warmed up, then run `rounds` times per prompt interleaved with the others (`run_sweep`).
    Before any weights load, every model of every pair is resolved (access, licence, name:
    `io.sources`, one error listing every problem) and every pair's tokenizers are compared: on a
    pair whose vocabularies differ, the methods that need a shared one (`Method.shared_vocabulary`)
    are refused, the reason recorded (check_pair's message, which names the cross-tokenizer
    methods); the others (xtok, hf_uag, n-gram, early exit) run. Each model is loaded once and kept
    while a later pair still uses it (two drafts for one target load the target once), and measured
    alone once per target and prompt (later pairs of that target copy those units:
    `run_sweep(baseline_of=...)`).

    collections: a folder for one collection per pair; given, the methods a collection answers
    (`Method.replayable`: the draft model's static and dynamic trees) are replayed from it (exact
    acceptance, no wall clock: source "replay"), except those in `measure`, which run end to end
    like every other method. Returns one row per pair: label, status ("measured", "partial": some
    methods refused, "skipped": all refused), vocabulary ("shared" or "different"), reason, and for
    a pair that ran, the target and draft as loaded (`io.models.describe_model`: dtype, 4-bit
    layers, stand-in or not)."""
    import gc

    check_sources({name for pair in pairs for name in (pair.target, pair.draft)})
    status: dict[Pair, dict] = {}
    allowed: dict[Pair, dict[tuple[str, int], Tree]] = {}
    texts: dict[Pair, tuple[TokenText, TokenText]] = {}
    for pair in pairs:
        own = trees if pair.methods is None else method_trees(pair.methods)
        reasons, refused = [], []
        try:
            check_pair(load_tokenizer(pair.target), load_tokenizer(pair.draft), pair.target, pair.draft)
            vocabulary = "shared"
        except ValueError as e:
            vocabulary = "different"
            refused = [k for k in own if parse_method(f"{k[0]}:{k[1]}").shared_vocabulary]
            if refused:
                reasons.append(f"refused {', '.join(f'{a}:{b}' for a, b in refused)}: {e}")
        cross = [k for k in own if k not in refused and parse_method(f"{k[0]}:{k[1]}").drafter == "xtok"]
        if cross:  # both tokenizers must read as bytes (`retokenize`), checked before any weights load
            try:
                texts[pair] = (TokenText.of(load_tokenizer(pair.target)), TokenText.of(load_tokenizer(pair.draft)))
            except ValueError as e:
                refused += cross
                reasons.append(f"refused {', '.join(f'{a}:{b}' for a, b in cross)}: {e}")
        allowed[pair] = {k: t for k, t in own.items() if k not in refused}
        state = "measured" if not refused else "partial" if allowed[pair] else "skipped"
        status[pair] = {
            "pair": pair.label,
            "status": state,
            "vocabulary": vocabulary,
            "reason": "; ".join(reasons),
            "prompt_format": prompt_format(pair.target, load_tokenizer(pair.target)),
            "target_loaded": "",
            "draft_loaded": "",
        }
    runnable = [pair for pair in pairs if allowed[pair]]
    first_of_target: dict[tuple, str] = {}  # target -> the first pair that measured it alone
    loaded: dict[tuple, torch.nn.Module] = {}
    for i, pair in enumerate(runnable):
        wanted = {key for later in runnable[i:] for key in (pair_keys(later))}
        for key in [k for k in loaded if k not in wanted]:  # no later pair uses it: free it first
            del loaded[key]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        target_key, draft_key = pair_keys(pair)
        for key in (target_key, draft_key):
            if key not in loaded:
                loaded[key] = load_model(key[0], key[1], dtype=dtype, layers=key[2], cpu_linear=cpu_linear)[0]
        status[pair].update(
            target_loaded=describe_model(loaded[target_key]), draft_loaded=describe_model(loaded[draft_key])
        )
        target, draft, tokenizer = loaded[target_key], loaded[draft_key], load_tokenizer(pair.target)
        own = allowed[pair]
        replayed = (
            {}
            if collections is None
            else {
                k: t
                for k, t in own.items()
                if parse_method(f"{k[0]}:{k[1]}").replayable and f"{k[0]}:{k[1]}" not in measure
            }
        )
        first_of_target.setdefault(target_key, pair.label)
        run_sweep(
            store,
            pair.label,
            target,
            draft,
            tokenizer,
            prompts,
            {k: t for k, t in own.items() if k not in replayed},
            max_new_tokens,
            progress,
            draft_tokenizer=load_tokenizer(pair.draft),
            baseline_of=first_of_target[target_key],
            texts=texts.get(pair),
            rounds=rounds,
        )
        if replayed:
            folder = Path(collections) / re.sub(r"[^A-Za-z0-9_.-]+", "_", pair.label)
            replay_units(store, pair.label, folder, target, draft, tokenizer, prompts, replayed, max_new_tokens)
    return pd.DataFrame([status[pair] for pair in pairs])


def replay_units(
    store: Sweep,
    pair_label: str,
    folder: Path,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    tokenizer,
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
) -> None:
    """Units of replayable methods from one collection of the pair (collected, or resumed, in
    `folder`): the steps a real greedy run would make (`replay.replay_steps`), the output (the
    target's continuation) checked against the stored target-alone unit, times left empty.
    Needs the target-alone units of `run_sweep` in `store` first."""
    dynamic = [k[1] for k in trees if k[0] == DYNAMIC]
    static = {k: t for k, t in trees.items() if k[0] != DYNAMIC}
    report = collect_pair(
        folder,
        target,
        draft,
        tokenizer,
        prompts,
        static,
        max_new_tokens,
        super_k=DYNAMIC_TOP_K if dynamic else 0,
        super_depth=DYNAMIC_MAX_DEPTH,
        dynamic_budgets=dynamic,
        describe={"pair": pair_label},
        retries=0,
    )
    collection = report.check().collection
    data = {p.prompt_id: p for p in collection.prompts}
    for (label, budget), tree in trees.items():
        steps = replay.replay_steps(collection, budget if label == DYNAMIC else tree)
        for prompt in prompts:
            key = _key(pair_label, (label, budget), prompt)
            if key in store:
                continue
            mine = steps[prompt.id]
            tokens = torch.tensor(data[prompt.id].tokens[: sum(s.num_tokens for s in mine)])  # host
            result = GenerationResult(tokens, mine, len(data[prompt.id].prompt), math.nan, math.nan, None, "replay")
            quality = score(target, torch.tensor(data[prompt.id].prompt), tokens)  # host: score moves them
            baseline = store.meta(_key(pair_label, None, prompt)) or {}
            summary = _unit_summary(
                result,
                prompt,
                _stored_tokens(store, pair_label, prompt),
                tree,
                quality,
                target.dtype,
                float(baseline.get("logit_gap") or 0.0),
            )
            store.add(
                key, [{**r, "source": "replay"} for r in _step_rows(result)], meta={**summary, "source": "replay"}
            )


# ---- helpers --------------------------------------------------------------------------------


def _key(pair: str, k: tuple[str, int] | None, prompt: Prompt) -> dict:
    shape, budget = k if k is not None else (BASELINE, 0)
    return {"pair": pair, "shape": shape, "budget": budget, "prompt_id": prompt.id}


def _stored_tokens(store: Sweep, pair: str, prompt: Prompt) -> list[int] | None:
    meta = store.meta(_key(pair, None, prompt))
    return None if meta is None else [int(t) for t in str(meta["tokens"]).split() if t]


def _step_rows(result: GenerationResult) -> list[dict]:
    return [step_row(s) for s in result.steps]


def _unit_summary(
    result: GenerationResult,
    prompt: Prompt,
    reference: list[int] | None,
    tree: Tree | None,
    quality: Score,
    dtype: torch.dtype,
    gap: float = 0.0,
) -> dict:
    s = summarize(result)
    tokens = result.tokens.tolist()
    equality = compare_greedy(tokens, reference, quality.margins, dtype, gap)
    return {
        "category": prompt.category,
        "num_nodes": tree.num_nodes if tree else 0,
        "depth": tree.depth if tree else 0,
        "num_steps": s.num_steps,
        "num_drafted": s.num_drafted,
        "num_draft_tokens": s.num_draft_tokens,
        "num_accepted": s.num_accepted,
        "num_tokens": s.num_tokens,
        "acceptance_rate": s.acceptance_rate,
        "acceptance_length": s.acceptance_length,
        "tau": s.tau,
        "ttft_s": s.ttft_s,
        "tpot_s": s.tpot_s,
        "tokens_per_s": s.tokens_per_s,
        "total_time": result.total_time,
        "draft_time_s": s.draft_time_s,
        "verify_time_s": s.verify_time_s,
        "peak_memory_bytes": s.peak_memory_bytes,
        "source": "measured",  # or "replay": acceptance replayed from a collection, no wall clock
        "greedy": equality.verdict,  # exact, tie (numerical) or mismatch (a bug)
        "greedy_equal": equality.verdict == "exact",
        "first_difference": equality.position,
        "difference_margin": equality.margin,
        "tie_margin": equality.threshold,  # max(the dtype's convention, 2 x logit_gap)
        "logit_gap": gap,  # the target's measured decode-vs-verify logit gap on this device
        "perplexity": quality.perplexity,
        "tokens": " ".join(map(str, tokens)),
    }
