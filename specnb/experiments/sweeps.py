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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..analysis import replay
from ..analysis.heldout import Choice, HeldOut, measurement_prediction
from ..analysis.metrics import step_row, summarize
from ..analysis.quality import Score, compare_greedy, logit_gap, score
from ..bench.baselines import hf_assisted_generate, hf_prompt_lookup_generate, hf_uag_generate
from ..bench.timing import fastest_rounds
from ..bench.verify_curve import StepPoints
from ..core.drafting import Drafter
from ..core.generation import GenerationResult, autoregressive_generate, speculative_generate
from ..core.trees import Tree
from ..drafters.methods import (
    CROSS,
    DYNAMIC,
    DYNAMIC_MAX_DEPTH,
    DYNAMIC_TOP_K,
    Method,
    build_drafter,
    method_of,
    method_trees,
    parse_method,
)
from ..drafters.retokenize import TokenText
from ..io.models import check_pair, describe_model, load_model, load_tokenizer, prompt_format, prompt_ids
from ..io.prompts import Prompt
from ..io.sources import check_sources
from ..io.storage import Sweep
from .executors import LocalExecutor
from .pairs import Pair, PairModels, pair_keys
from .replay_study import PairCollectConfig, collect_pair
from .tables import BASELINE, shape_table, step_costs, steps_frame, unit_table

WARMUP_TOKENS = 4  # tokens of each method's untimed warm-up run (`run_sweep`)
GAP_TOKENS = 8  # tokens of the first prompt's output that `quality.logit_gap` decodes and verifies
UNIT_KEY = ("pair", "shape", "budget", "prompt_id")


@dataclass(frozen=True)
class SweepConfig:
    """How a sweep runs its units (`run_sweep`, `run_pairs`), built where a notebook reads its parameters."""

    max_new_tokens: int  # tokens generated per unit
    rounds: int = 1  # timed runs per prompt and method, interleaved in an order rotated per prompt; the fastest kept
    warmup: bool = True  # every method first runs once untimed (WARMUP_TOKENS tokens)
    dynamic: tuple[int, int] = (DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH)  # (children per node, depth) of dynamic trees
    progress: bool = True  # a progress bar per pair
    dtype: str | None = None  # run_pairs: the models' dtype (`io.models.model_dtype`); None: the device's default
    cpu_linear: str = "stock"  # run_pairs: a CPU float32 model's linear layers (`kernels.cpu_linear`)


def run_sweep(
    store: Sweep,
    pair: PairModels,
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    config: SweepConfig,
    baseline_of: str | None = None,
    drafters: dict[tuple[str, int], Drafter] | None = None,
) -> None:
    """Run every (prompt, tree) unit not yet in `store`. Timing is fair between methods: with
    `config.warmup` every method first runs once untimed (a few tokens); then per prompt the methods
    run interleaved, `config.rounds` times, in an order rotated from prompt to prompt, and each unit
    keeps its fastest round (greedy: every round gives the same tokens; a shared CPU's spikes only
    slow a run down) and records every round's seconds (`round_times`). The target alone is stored
    first per prompt: the reference of every method's output. A prompt's units are stored when its
    rounds are done (an interrupted run redoes that prompt only). `pair.draft_tokenizer` is needed
    by the cross-tokenizer methods (xtok, hf_uag) only. baseline_of: an earlier pair of the same
    target in `store`, whose target-alone units are copied (meta "baseline_of") instead of run
    again: same model, prompt and run. drafters: drafters built by the caller for some keys of
    `trees` (learned heads: `drafters.medusa`, `drafters.eagle`), whose labels then need not be
    method specs; `pair.draft` may be None when every key has one."""
    _sweep(store, _Units(pair, trees, config, drafters), prompts, baseline_of)


class _Units:
    """One pair's units: each key's method parsed once, each specnb method's drafter built once and
    reused across prompts, the two tokenizers read as `TokenText` once, when a method needs it."""

    def __init__(
        self,
        pair: PairModels,
        trees: dict[tuple[str, int], Tree],
        config: SweepConfig,
        drafters: dict[tuple[str, int], Drafter] | None = None,
        methods: dict[tuple[str, int], Method] | None = None,
    ) -> None:
        self.pair, self.trees, self.config = pair, trees, config
        self.drafters: dict = dict(drafters or {})  # by key: the caller's; by method spec: one built per method
        self.methods = methods or {k: method_of(k, t) for k, t in trees.items() if k not in self.drafters}
        self.gap: float | None = None  # the target's decode-vs-verify logit gap (`quality.logit_gap`), measured once
        self._texts = pair.texts

    def generate(self, ids: torch.Tensor, k: tuple[str, int] | None, max_new_tokens: int) -> GenerationResult:
        """One unit: the baseline (k None), a drafter the caller built for key k, a transformers
        method, or a specnb method (`methods`)."""
        target, draft = self.pair.target, self.pair.draft
        if k is None:
            return autoregressive_generate(target, ids, max_new_tokens=max_new_tokens)
        tree = self.trees[k]
        if k in self.drafters:
            return speculative_generate(target, self.drafters[k], ids, tree=tree, max_new_tokens=max_new_tokens)
        method = self.methods[k]
        if method.drafter == "hf_assisted":
            return hf_assisted_generate(
                target, draft, ids, num_assistant_tokens=method.budget, max_new_tokens=max_new_tokens
            )
        if method.drafter == "hf_uag":
            return hf_uag_generate(
                target,
                draft,
                ids,
                (self.pair.tokenizer, self.pair.draft_tokenizer),
                num_assistant_tokens=method.budget,
                max_new_tokens=max_new_tokens,
            )
        if method.drafter == "hf_prompt_lookup":
            return hf_prompt_lookup_generate(
                target, ids, prompt_lookup_num_tokens=method.budget, max_new_tokens=max_new_tokens
            )
        if method.spec not in self.drafters:
            texts = self.texts() if method.drafter == CROSS else (None, None)
            self.drafters[method.spec] = build_drafter(
                method, target, draft, dynamic=self.config.dynamic, target_tokenizer=texts[0], draft_tokenizer=texts[1]
            )
        return speculative_generate(target, self.drafters[method.spec], ids, tree=tree, max_new_tokens=max_new_tokens)

    def texts(self) -> tuple[TokenText, TokenText]:
        if self.pair.draft_tokenizer is None:
            raise ValueError("cross-tokenizer methods need the draft's tokenizer (PairModels(draft_tokenizer=...))")
        if self._texts is None:
            self._texts = (TokenText.of(self.pair.tokenizer), TokenText.of(self.pair.draft_tokenizer))
        return self._texts


def _sweep(store: Sweep, units: _Units, prompts: Sequence[Prompt], baseline_of: str | None) -> None:
    """`run_sweep` of units whose methods are parsed: warm-up, then per prompt its timed rounds and its units stored."""
    label, config = units.pair.label, units.config
    todo = {p.id: [k for k in [None, *units.trees] if _key(label, k, p) not in store] for p in prompts}
    ids_of = {p.id: prompt_ids(units.pair.tokenizer, p.text) for p in prompts}  # tokenize each prompt once
    if config.warmup and any(todo.values()):  # every method once, untimed: no timed run pays a first call's costs
        for k in [None, *units.trees]:
            units.generate(ids_of[prompts[0].id], k, min(WARMUP_TOKENS, config.max_new_tokens))
    bar = tqdm(total=sum(map(len, todo.values())), desc=label, disable=not config.progress)
    for i, prompt in enumerate(prompts):
        keys = todo[prompt.id]
        if None in keys and baseline_of is not None and _key(baseline_of, None, prompt) in store:
            earlier = _key(baseline_of, None, prompt)
            store.add(
                _key(label, None, prompt), store.rows(earlier), meta={**store.meta(earlier), "baseline_of": baseline_of}
            )
            keys = [k for k in keys if k is not None]
            bar.update()
        ids = ids_of[prompt.id]
        best, seconds = fastest_rounds(
            keys, lambda k: units.generate(ids, k, units.config.max_new_tokens), units.config.rounds, i
        )
        _store_prompt(store, units, prompt, ids, best, seconds)
        bar.update(len(keys))
    bar.close()


def _store_prompt(
    store: Sweep,
    units: _Units,
    prompt: Prompt,
    ids: torch.Tensor,
    best: dict[tuple[str, int] | None, GenerationResult],
    seconds: dict[tuple[str, int] | None, list[float]],
) -> None:
    """A prompt's units, the target alone first (the reference of every method's output): step rows
    and summary, each output scored under the target (equal outputs once) and checked against it."""
    target, label = units.pair.target, units.pair.label
    scores: dict[tuple[int, ...], Score] = {}
    reference: list[int] | None = None
    for k in sorted(seconds, key=lambda k: k is not None):
        result = best[k]
        output = tuple(result.tokens.tolist())
        if output not in scores:
            scores[output] = score(target, ids, result.tokens)
        if k is None:
            reference = result.tokens.tolist()
        expected = reference or _stored_tokens(store, label, prompt)
        if units.gap is None:
            units.gap = logit_gap(target, ids, (expected or result.tokens.tolist())[:GAP_TOKENS] or [0])
        tree = units.trees[k] if k else None
        summary = unit_row(result, prompt, expected, tree, scores[output], target.dtype, units.gap)
        store.add(
            _key(label, k, prompt),
            _step_rows(result),
            meta={**summary, "rounds": units.config.rounds, "round_times": " ".join(f"{t:.4f}" for t in seconds[k])},
        )


def run_pairs(
    store: Sweep,
    pairs: Sequence[Pair],
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    config: SweepConfig,
    collections: Path | None = None,
    measure: Sequence[str] = (),
    each_pair: Callable[[Pair, PairModels], None] | None = None,
) -> pd.DataFrame:
    """Sweep every pair, the models in `config.dtype` (`io.models.model_dtype`; None: the device's
    default), a CPU float32 model's linear layers on `config.cpu_linear` (`kernels.cpu_linear`),
    every measured method warmed up, then run `config.rounds` times per prompt interleaved with the
    others (`run_sweep`). Before any weights load, every model of every pair is resolved (access,
    licence, name: `io.sources`, one error listing every problem) and every pair's tokenizers are
    compared: on a pair whose vocabularies differ, the methods that need a shared one
    (`Method.shared_vocabulary`) are refused, the reason recorded (check_pair's message, which
    names the cross-tokenizer methods); the others (xtok, hf_uag, n-gram, early exit) run. Each
    model is loaded once and kept while a later pair still uses it (two drafts for one target load
    the target once), and measured alone once per target and prompt (later pairs of that target
    copy those units: `run_sweep(baseline_of=...)`).

    collections: a folder for one collection per pair; given, the methods a collection answers
    (`Method.replayable`: the draft model's static and dynamic trees) are replayed from it (exact
    acceptance, no wall clock: source "replay"), except those in `measure`, which run end to end
    like every other method. each_pair(pair, models): called for every pair that runs, after its
    methods, while its models are loaded (notebook 02's grid, `experiments.grid`). Returns one row
    per pair: label, status ("measured", "partial": some methods refused, "skipped": all refused),
    vocabulary ("shared" or "different"), reason, and for a pair that ran, the target and draft as
    loaded (`io.models.describe_model`: dtype, 4-bit layers, stand-in or not)."""
    check_sources({name for pair in pairs for name in (pair.target, pair.draft)})
    plans = {pair: _plan_pair(pair, trees) for pair in pairs}
    measure = _specs(measure, {n: t for pair in pairs for n, t in pair.custom_trees})
    runnable = [pair for pair in pairs if plans[pair].allowed]
    first_of_target: dict[tuple, str] = {}  # target -> the first pair that measured it alone
    loaded: dict[tuple, torch.nn.Module] = {}
    for i, pair in enumerate(runnable):
        plan = plans[pair]
        target, draft = _load_models(loaded, pair, runnable[i:], config)
        plan.status.update(target_loaded=describe_model(target), draft_loaded=describe_model(draft))
        models = PairModels(pair.label, target, draft, *plan.tokenizers, texts=plan.texts)
        replayed = (
            {}
            if collections is None
            else {
                k: t for k, t in plan.allowed.items() if plan.methods[k].replayable and f"{k[0]}:{k[1]}" not in measure
            }
        )
        first_of_target.setdefault(pair_keys(pair)[0], pair.label)
        measured = {k: t for k, t in plan.allowed.items() if k not in replayed}
        _sweep(
            store, _Units(models, measured, config, methods=plan.methods), prompts, first_of_target[pair_keys(pair)[0]]
        )
        if replayed:
            replay_units(store, models, collections, prompts, replayed, config.max_new_tokens)
        if each_pair is not None:
            each_pair(pair, models)
    return pd.DataFrame([plans[pair].status for pair in pairs])


def measure_choice(
    store: Sweep,
    pair: PairModels,
    prompts: Sequence[Prompt],
    choice: Choice | None,
    config: SweepConfig,
    cross: bool = False,
    names: tuple[str, str] = ("target", "draft"),
    prefix: int = 256,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The chosen tree run end to end against the target alone on `prompts` (`run_sweep`, `store` a
    sweep of its own), and before each prompt one round of the cost model's points that tree needs
    (`bench.verify_curve.StepPoints`, on caches of `prefix` tokens; `names`: the curve's names of
    target and draft), so that the prediction is priced on the machine as it was during these runs;
    each round is stored beside `store` (<name>_points.jsonl) once its prompt's runs are: a resumed
    run keeps both, never pairs old runs with new rounds.
    A design is drafted by the pair's draft model; a cross-tokenizer pair drafts across tokenizers
    (xtok). Returns (`tables.shape_table`'s row of the tree: tokens/s, speed-up and its interval; the
    points as curve rows); no choice: two empty tables."""
    if choice is None:
        return pd.DataFrame(), pd.DataFrame()
    key = (choice.shape, choice.budget)
    trees, drafters = {key: choice.tree}, None
    if cross:
        trees = method_trees([f"xtok/{key[0]}:{key[1]}"])
    elif choice.fitted:
        drafters = {key: build_drafter(parse_method("chain:1"), pair.target, pair.draft)}
    points = StepPoints(pair.target, pair.draft, choice.tree, prefix, names)
    rounds = Sweep(store.path.with_name(store.path.stem + "_points.jsonl"), key=("prompt_id",))
    desc = f"{key[0]}:{key[1]} and the target alone"
    for i, prompt in enumerate(tqdm(prompts, desc=desc, disable=not config.progress)):
        if {"prompt_id": prompt.id} in rounds:  # run with its round before an interruption: both kept
            continue
        timed_round = points.round()
        warm = replace(config, warmup=config.warmup and i == 0, progress=False)
        run_sweep(store, pair, [prompt], trees, warm, drafters=drafters)
        rounds.add({"prompt_id": prompt.id}, timed_round)
    return shape_table(unit_table(store)), points.table(rounds.frame().to_dict("records"))


CONFIRMED_WITHIN = 0.10  # `prediction_check`: the steady speed-up measured within 10% of the predicted one


def prediction_check(
    held: HeldOut,
    choice: Choice | None,
    points: pd.DataFrame,
    store: Sweep,
    measured: pd.DataFrame,
    names: tuple[str, str],
) -> pd.DataFrame:
    """The recommendation's prediction (`heldout.measurement_prediction`, priced on `points`, timed
    while it ran: `measure_choice`) against its run (`store`, `measured`: `measure_choice`'s), one row
    per quantity: tau; the step's draft and verify seconds and the target alone's seconds per token
    (steps after each prompt's first: `tables.step_costs`); the steady-state speed-up those give
    (what the cost model prices); the speed-up with each prompt's first step (its prefill), measured
    only. Columns predicted, low, high (the interval of a mean over the prompts run), measured,
    measured_over_predicted, inside; the steady speed-up's row has check "confirmed" where it is
    inside its interval and within CONFIRMED_WITHIN of the prediction, else how far off. Empty
    without a choice or a measurement."""
    if choice is None or measured.empty or points.empty:
        return pd.DataFrame()
    run = measured.iloc[0]
    p = measurement_prediction(held, choice, points, *names, int(run["prompts"]))
    cost = step_costs(steps_frame(store)).iloc[0]
    nan = float("nan")
    rows = [
        ("tau (bonus included)", p["tau"], p["tau_low"], p["tau_high"], run["tau"]),
        ("draft seconds per step", p["t_draft_s"], nan, nan, cost["draft_s_per_step"]),
        ("verify seconds per step", p["t_verify_s"], nan, nan, cost["verify_s_per_step"]),
        ("target alone, seconds per token", p["t_decode_s"], nan, nan, cost["target_s_per_token"]),
        ("speed-up, steady state", p["speedup"], p["speedup_low"], p["speedup_high"], cost["predicted_speedup"]),
        ("speed-up with each prompt's prefill", nan, nan, nan, run["speedup"]),
    ]
    out = pd.DataFrame(rows, columns=["quantity", "predicted", "low", "high", "measured"])
    out["measured_over_predicted"] = out["measured"] / out["predicted"]
    inside = [None if lo != lo else bool(lo <= m <= hi) for lo, hi, m in zip(out["low"], out["high"], out["measured"])]
    out["inside"] = inside
    off = float(out.loc[4, "measured_over_predicted"]) - 1
    out["check"] = ""
    out.loc[4, "check"] = (
        "confirmed"
        if abs(off) <= CONFIRMED_WITHIN and inside[4] is not False
        else f"off by {off:+.0%}" + (", outside the interval" if inside[4] is False else "")
    )
    out.insert(0, "prompts", int(run["prompts"]))
    out["interval"] = [p["interval"] if lo == lo else "" for lo in out["low"]]
    return out


@dataclass
class _PairPlan:
    """What `run_pairs` will run of one pair, found before any weights load."""

    status: dict  # the pair's row of run_pairs' table; the loaded models are added when it runs
    allowed: dict[tuple[str, int], Tree]  # the methods not refused
    methods: dict[tuple[str, int], Method]  # every method of the pair, parsed once
    tokenizers: tuple[Any, Any]  # (target's, draft's), loaded once
    texts: tuple[TokenText, TokenText] | None  # both read as bytes, when a cross-tokenizer method runs


def _plan_pair(pair: Pair, trees: dict[tuple[str, int], Tree]) -> _PairPlan:
    """The pair's methods (its own, or `trees`), those refused and why: the shared-vocabulary ones
    on a pair whose vocabularies differ, the cross-tokenizer ones when a tokenizer cannot be read as
    bytes (`retokenize`)."""
    own = trees if pair.methods is None else method_trees(pair.methods, pair.trees)
    methods = {k: method_of(k, t) for k, t in own.items()}
    tokenizers = (load_tokenizer(pair.target), load_tokenizer(pair.draft))
    reasons, refused = [], []
    try:
        check_pair(*tokenizers, pair.target, pair.draft)
        vocabulary = "shared"
    except ValueError as e:
        vocabulary = "different"
        refused = [k for k in own if methods[k].shared_vocabulary]
        if refused:
            reasons.append(f"refused {', '.join(f'{a}:{b}' for a, b in refused)}: {e}")
    cross = [k for k in own if k not in refused and methods[k].drafter == CROSS]
    texts = None
    if cross:  # both tokenizers must read as bytes (`retokenize`), checked before any weights load
        try:
            texts = (TokenText.of(tokenizers[0]), TokenText.of(tokenizers[1]))
        except ValueError as e:
            refused += cross
            reasons.append(f"refused {', '.join(f'{a}:{b}' for a, b in cross)}: {e}")
    allowed = {k: t for k, t in own.items() if k not in refused}
    status = {
        "pair": pair.label,
        "status": "measured" if not refused else "partial" if allowed else "skipped",
        "vocabulary": vocabulary,
        "reason": "; ".join(reasons),
        "prompt_format": prompt_format(pair.target, tokenizers[0]),
        "target_loaded": "",
        "draft_loaded": "",
    }
    return _PairPlan(status, allowed, methods, tokenizers, texts)


def _load_models(
    loaded: dict[tuple, torch.nn.Module], pair: Pair, remaining: Sequence[Pair], config: SweepConfig
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The pair's (target, draft) from `loaded`, loading what is missing after freeing every model no
    pair of `remaining` (this one first) uses."""
    import gc

    wanted = {key for later in remaining for key in pair_keys(later)}
    for key in [k for k in loaded if k not in wanted]:  # no later pair uses it: free it first
        del loaded[key]
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    for key in pair_keys(pair):
        if key not in loaded:
            loaded[key] = load_model(key[0], key[1], dtype=config.dtype, layers=key[2], cpu_linear=config.cpu_linear)[0]
    target_key, draft_key = pair_keys(pair)
    return loaded[target_key], loaded[draft_key]


def replay_units(
    store: Sweep,
    pair: PairModels,
    folder: Path,
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
) -> None:
    """Units of replayable methods from one collection of the pair (collected, or resumed, under
    `folder`: `replay_study.collection_folder`): the steps a real greedy run would make
    (`replay.replay_steps`), the output (the target's continuation) checked against the stored
    target-alone unit, times left empty.
    Needs the target-alone units of `run_sweep` in `store` first."""
    dynamic = [k[1] for k in trees if k[0] == DYNAMIC]
    static = {k: t for k, t in trees.items() if k[0] != DYNAMIC}
    settings = PairCollectConfig(
        max_new_tokens,
        super_k=DYNAMIC_TOP_K if dynamic else 0,
        super_depth=DYNAMIC_MAX_DEPTH,
        dynamic_budgets=tuple(dynamic),
    )
    models = replace(
        pair, draft_tokenizer=None
    )  # never a cross-tokenizer collection: replayed methods share a vocabulary
    collection = (
        collect_pair(folder, models, prompts, static, settings, executor=LocalExecutor(retries=0)).check().collection
    )
    data = {p.prompt_id: p for p in collection.prompts}
    for (label, budget), tree in trees.items():
        steps = replay.replay_steps(collection, budget if label == DYNAMIC else tree)
        for prompt in prompts:
            key = _key(pair.label, (label, budget), prompt)
            if key in store:
                continue
            mine = steps[prompt.id]
            tokens = torch.tensor(data[prompt.id].tokens[: sum(s.num_tokens for s in mine)])  # host
            result = GenerationResult(tokens, mine, len(data[prompt.id].prompt), math.nan, math.nan, None, "replay")
            quality = score(pair.target, torch.tensor(data[prompt.id].prompt), tokens)  # host: score moves them
            baseline = store.meta(_key(pair.label, None, prompt)) or {}
            summary = unit_row(
                result,
                prompt,
                _stored_tokens(store, pair.label, prompt),
                tree,
                quality,
                pair.target.dtype,
                float(baseline.get("logit_gap") or 0.0),
            )
            store.add(
                key, [{**r, "source": "replay"} for r in _step_rows(result)], meta={**summary, "source": "replay"}
            )


# ---- helpers --------------------------------------------------------------------------------


def _specs(specs: Sequence[str], custom: dict[str, Tree]) -> set[str]:
    """Method specs as keys write them: a custom tree's name alone ("mine") with its budget ("mine:6")."""
    out = set()
    for spec in specs:
        try:
            out.add(parse_method(spec, custom).spec)
        except ValueError:
            out.add(spec)
    return out


def _key(pair: str, k: tuple[str, int] | None, prompt: Prompt) -> dict:
    shape, budget = k if k is not None else (BASELINE, 0)
    return {"pair": pair, "shape": shape, "budget": budget, "prompt_id": prompt.id}


def _stored_tokens(store: Sweep, pair: str, prompt: Prompt) -> list[int] | None:
    meta = store.meta(_key(pair, None, prompt))
    return None if meta is None else [int(t) for t in str(meta["tokens"]).split() if t]


def _step_rows(result: GenerationResult) -> list[dict]:
    return [step_row(s) for s in result.steps]


def unit_row(
    result: GenerationResult,
    prompt: Prompt,
    reference: list[int] | None,
    tree: Tree | None,
    quality: Score,
    dtype: torch.dtype,
    gap: float = 0.0,
) -> dict:
    """A unit's one-row summary (`storage.Sweep` meta): its metrics (`metrics.summarize`), its output's
    greedy verdict against `reference` (`quality.compare_greedy`: exact, tie or mismatch, at the
    dtype's margin or twice the measured logit `gap`), perplexity and tokens."""
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
