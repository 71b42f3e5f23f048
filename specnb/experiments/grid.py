"""The brief's grid (notebook 02): every draft -> target pair x every tree shape x every budget, with
acceptance rate, acceptance length and tau and their intervals, in one tidy table.

One collection per pair answers every tree of it by replay (`replay_study.replay_table`): the preset
shapes, the user's trees and shape rules, the data-fitted designs (Sequoia, Medusa-style,
hindsight; scored held out, `replay_study.heldout_scores`), dynamic trees and the oracle bound. A
pair of two tokenizers is re-drafted instead (exact too); the designs and the oracle need the
draft's rank of every target token, which such a draft does not have, so their rows say so in
`note` rather than being left out or empty. `pair_grid` measures one loaded pair, `grid_table`
stacks the pairs, `shape_ranking` compares every pair's trees per budget paired on the same prompts
(`analysis.ranking`), `best_per_budget` names the winner of each budget per pair and `rank_table`
gives each pair's acceptance by sibling rank (why the winners win)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..analysis import heldout, ranking, replay
from ..analysis.collection import Collection
from ..core.trees import Tree
from ..drafters.methods import CROSS, DYNAMIC, budget_axis, parse_method, trees_for
from ..io.prompts import Prompt
from ..io.storage import Sweep
from ..io.tree_spec import ShapeRule
from .collect import CollectReport
from .pairs import Pair, PairModels
from .redraft_study import Redrafter, redrafter
from .replay_study import PairCollectConfig, collect_pair, heldout_scores, replay_agreement, replay_table
from .tables import steps_frame

ORACLE = "oracle"
SAME_FAMILY, OTHER_TOKENIZER, SELF_DRAFT = "same tokenizer", "other tokenizer", "self-draft"
METRICS = ("acceptance_rate", "acceptance_length", "tau")  # each with _ci_low, _ci_high
# what the metrics pool, so each row can be checked: rate = accepted / drafted, acceptance length =
# accepted / steps, tau = tokens / steps = 1 + acceptance length - no_bonus_steps / steps (`analysis.replay`)
COUNTS = ("steps", "drafted", "accepted", "tokens", "cut_steps", "no_bonus_steps")
COLUMNS = [
    "pair",
    "kind",
    "shape",
    "budget",
    "nodes",
    "depth",
    "fitted",
    *[c for m in METRICS for c in (m, f"{m}_ci_low", f"{m}_ci_high")],
    *COUNTS,
    "tau_heldout",
    "tau_heldout_ci_low",
    "tau_heldout_ci_high",
    "prompts",
    "note",
]
ACROSS_TOKENIZERS = (
    "not measurable across tokenizers: {what} needs the draft's rank of every target token, and this "
    "draft has another vocabulary (its trees are re-drafted on the target's continuation instead)"
)
RANKS = 4  # sibling ranks whose acceptance `rank_table` lists
ORACLE_NOTE = "a bound, not a tree: per position the longest accepted prefix with draft ranks below top_k, capped at N"


@dataclass(frozen=True)
class GridConfig:
    """What `pair_grid` measures of every pair, built where a notebook reads its parameters."""

    shapes: tuple[str, ...]  # preset shapes (`Tree.preset`)
    budgets: tuple[int, ...]  # draft tokens per tree (N)
    collect: PairCollectConfig  # what one collection of a pair holds (its dynamic_budgets: the dynamic rows)
    oracle_k: int | None = None  # the oracle's rank limit; None: the collection's top_k
    heldout_folds: int = 3  # k of the held-out scoring of the designs
    seed: int = 0  # the held-out split's seed


@dataclass(frozen=True)
class PairGrid:
    """One pair's part of the grid: its rows (`COLUMNS`), its held-out scores and its collection."""

    table: pd.DataFrame
    held: heldout.HeldOut
    report: CollectReport
    ranks: tuple[float, ...] = ()  # share of positions whose next target token is the draft's rank-r token
    # per deployable tree and prompt: tokens and target calls on the run trajectory (a design's held
    # out), what `analysis.ranking` compares shapes by (`ranking.PER_PROMPT`)
    per_prompt: pd.DataFrame = field(default_factory=pd.DataFrame)
    # the pair's end-to-end runs of the trees the grid replays, checked against the replay step by
    # step (`replay_study.replay_agreement`: one row per method)
    agreement: pd.DataFrame = field(default_factory=pd.DataFrame)


def pair_kind(pair: Pair, cross: bool) -> str:
    """How the draft relates to the target: another tokenizer, the target itself (quantized or cut
    to its first layers) or another model of the same tokenizer."""
    if cross:
        return OTHER_TOKENIZER
    return SELF_DRAFT if pair.draft == pair.target else SAME_FAMILY


def pair_grid(
    models: PairModels,
    pair: Pair,
    prompts: Sequence[Prompt],
    custom: Mapping[str, Tree | ShapeRule],
    config: GridConfig,
    folder: str | Path,
    continuations: str | Path | None = None,
    runs: Sweep | None = None,
    run_tokens: int | None = None,
) -> PairGrid:
    """Every tree of one loaded pair from one collection of it (made, or resumed, under `folder`,
    `replay_study.collection_folder`; the target's continuations read from, or decoded into,
    `continuations`: `replay_study.collect_pair`):
    the presets and the user's shapes at every budget (a fixed tree at its node count), the
    designs fitted on every prompt (rows: in-sample) and scored held out (`tau_heldout`), dynamic
    trees and the oracle bound at the collection's dynamic budgets. A cross-tokenizer pair is
    re-drafted (`redraft_study`); its design and oracle rows carry the reason in `note`. runs: a sweep
    holding the pair's end-to-end runs (`sweeps.run_pairs`' store), of `run_tokens` tokens each: those
    of trees the grid answers (the draft model's, dynamic, or across tokenizers) are checked against
    the replay step by step (`agreement`)."""
    cross = models.draft_tokenizer is not None and models.draft_tokenizer.get_vocab() != models.tokenizer.get_vocab()
    config = for_pair(config, pair)
    prompts = prompts[: pair.grid_prompts] if pair.grid_prompts else prompts
    budgets = budget_axis(config.budgets, custom)
    trees = trees_for(config.shapes, budgets, custom)
    report = collect_pair(folder, models, prompts, trees, config.collect, pair=pair, continuations=continuations)
    collection = report.check().collection
    again = redrafter(models.draft, models.tokenizer, models.draft_tokenizer) if cross else None
    table, _ = replay_table(
        collection, trees, budgets, config.collect.dynamic_budgets, config.oracle_k, again, config.collect.super_prompts
    )
    held = heldout_scores(collection, trees, budgets, table, config.heldout_folds, config.seed)
    rows = _rows(table, held.table, fitted=set(heldout.DESIGNERS))
    if cross:
        rows = pd.concat([rows, _missing(budgets, config.collect.dynamic_budgets)], ignore_index=True)
    rows.insert(0, "kind", pair_kind(pair, cross))
    rows.insert(0, "pair", models.label)
    ranks = () if cross else replay.acceptance_vector(collection, RANKS)
    per_prompt = table.attrs["per_prompt"] if cross else _per_prompt(collection, held, config.collect.dynamic_budgets)
    per_prompt = per_prompt.assign(pair=models.label).reindex(columns=ranking.PER_PROMPT)
    agreement = _agreement(runs, models.label, collection, again, custom, run_tokens)
    return PairGrid(rows.reindex(columns=COLUMNS), held, report, ranks, per_prompt, agreement)


def _agreement(
    runs: Sweep | None,
    label: str,
    collection: Collection,
    again: Redrafter | None,
    custom: Mapping[str, Tree | ShapeRule],
    run_tokens: int | None,
) -> pd.DataFrame:
    """The pair's end-to-end runs in `runs` of trees its collection answers, against the replay."""
    if runs is None or not len(runs):
        return pd.DataFrame()
    steps = steps_frame(runs)
    real = steps["source"] != "replay" if "source" in steps else True  # units replayed from a collection: no runs
    mine = steps[(steps["pair"] == label) & real][["shape", "budget"]].drop_duplicates()
    fixed = {n: t for n, t in custom.items() if isinstance(t, Tree)}
    kinds = (CROSS,) if collection.config.cross_tokenizer else ("draft", DYNAMIC)
    specs = [f"{shape}:{int(budget)}" for shape, budget in zip(mine["shape"], mine["budget"])]
    specs = [s for s in specs if _drafter(s, fixed) in kinds]
    if not specs:
        return pd.DataFrame()
    return replay_agreement(runs, label, collection, specs, again, fixed, run_tokens)


def _drafter(spec: str, custom: Mapping[str, Tree]) -> str:
    """The drafter a stored unit's spec names ("" for the target alone and transformers' methods)."""
    try:
        return parse_method(spec, custom).drafter
    except ValueError:
        return ""


def for_pair(config: GridConfig, pair: Pair) -> GridConfig:
    """The grid of `pair`: the notebook's, with the shapes, budgets and dynamic budgets the pair sets."""
    dynamic = pair.dynamic_budgets if pair.dynamic_budgets is not None else config.collect.dynamic_budgets
    return dataclasses.replace(
        config,
        shapes=pair.shapes or config.shapes,
        budgets=pair.budgets or config.budgets,
        collect=dataclasses.replace(config.collect, dynamic_budgets=tuple(dynamic)),
    )


def _per_prompt(collection: Collection, held: heldout.HeldOut, dynamic_budgets: Sequence[int]) -> pd.DataFrame:
    """Per deployable tree and prompt, tokens and target calls on the run trajectory: the presets'
    and the user's, the designs' held out (each prompt scored by the trees of the fold that left it
    out), dynamic trees on their super-tree prompts; not the hindsight tree (in-sample) nor the oracle."""
    rows = held.per_prompt
    fitted = rows["shape"].isin(list(heldout.DESIGNERS))
    keep = (~fitted & (rows["scored"] == "in_sample")) | (fitted & (rows["scored"] == "heldout"))
    keep &= rows["shape"] != "hindsight"
    parts = [rows[keep]]
    if collection.has_super_trees and dynamic_budgets:
        parts.append(replay.replay_dynamic(collection, dynamic_budgets, mode="trajectory", per_prompt=True))
    out = pd.concat(parts, ignore_index=True)
    categories = {p.prompt_id: p.category for p in collection.prompts}
    return out.assign(category=out["prompt_id"].map(categories))[
        ["shape", "budget", "prompt_id", "category", "tokens", "steps"]
    ]


def per_prompt(parts: Sequence[PairGrid]) -> pd.DataFrame:
    """Every pair's deployable trees per prompt (`PairGrid.per_prompt`), stacked."""
    frames = [p.per_prompt for p in parts if not p.per_prompt.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ranking.PER_PROMPT)


def shape_ranking(parts: Sequence[PairGrid]) -> pd.DataFrame:
    """Every pair's deployable trees ranked per budget, paired on the same prompts (`analysis.ranking`)."""
    return ranking.paired_ranking(per_prompt(parts))


def category_winners(parts: Sequence[PairGrid]) -> pd.DataFrame:
    """Per pair, budget and category, the winning shape and the overall winner's tau there."""
    frame = per_prompt(parts)
    return ranking.category_winners(frame) if len(frame) else pd.DataFrame()


def agreement(parts: Sequence[PairGrid]) -> pd.DataFrame:
    """Every pair's end-to-end runs against the replay (`PairGrid.agreement`), one row per pair and method."""
    frames = [p.agreement.assign(pair=p.table["pair"].iloc[0]) for p in parts if len(p.agreement)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _rows(table: pd.DataFrame, held: pd.DataFrame, fitted: set[str]) -> pd.DataFrame:
    """The replay table's rows in the grid's columns, each design's held-out tau beside its
    in-sample one; a tree fitted to nothing has held-out tau = tau."""
    out = table.copy()
    out["fitted"] = out["shape"].isin(fitted)
    scored = held.set_index(["shape", "budget"])
    keys = list(zip(out["shape"], out["budget"].astype(int)))
    for col in ("tau_heldout", "tau_heldout_ci_low", "tau_heldout_ci_high"):
        source = col.replace("tau_heldout", "tau")
        out[col] = [
            scored.at[k, col] if k in scored.index else (math.nan if s == ORACLE else v)
            for k, s, v in zip(keys, out["shape"], out[source])
        ]
    notes = scored["note"] if "note" in scored else pd.Series(dtype=str)
    out["note"] = [ORACLE_NOTE if s == ORACLE else str(notes.get(k, "") or "") for k, s in zip(keys, out["shape"])]
    return out


def _missing(budgets: Sequence[int], dynamic_budgets: Sequence[int]) -> pd.DataFrame:
    """The rows a cross-tokenizer pair cannot have, each saying why."""
    rows = [
        {
            "shape": name,
            "budget": n,
            "nodes": n,
            "fitted": True,
            "note": ACROSS_TOKENIZERS.format(what=f"{name}'s design"),
        }
        for name in heldout.DESIGNERS
        for n in budgets
    ]
    rows += [
        {"shape": ORACLE, "budget": n, "nodes": n, "fitted": False, "note": ACROSS_TOKENIZERS.format(what="the oracle")}
        for n in dynamic_budgets
    ]
    return pd.DataFrame(rows)


def grid_table(parts: Sequence[PairGrid]) -> pd.DataFrame:
    """The pairs' rows stacked: one tidy table (`COLUMNS`), sorted by pair (in run order), budget, shape."""
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    table = pd.concat([p.table for p in parts], ignore_index=True)
    order = {label: i for i, label in enumerate(dict.fromkeys(table["pair"]))}
    table["budget"] = table["budget"].astype(int)
    return (
        table.sort_values(["pair", "budget", "shape"], key=lambda c: c.map(order) if c.name == "pair" else c)
        .reset_index(drop=True)
        .reindex(columns=COLUMNS)
    )


def rank_table(parts: Sequence[PairGrid]) -> pd.DataFrame:
    """Per pair and sibling rank r < RANKS: the share of positions whose next target token is the
    draft's rank-r token (Sequoia's acceptance vector, every position): why a chain or a wide tree
    wins. A pair across tokenizers has no draft rank of the target's tokens: one row saying so."""
    rows = []
    for part in parts:
        pair, kind = part.table["pair"].iloc[0], part.table["kind"].iloc[0]
        if not part.ranks:
            rows.append({"pair": pair, "kind": kind, "note": ACROSS_TOKENIZERS.format(what="a rank's acceptance")})
        rows += [{"pair": pair, "kind": kind, "rank": r, "share": a, "note": ""} for r, a in enumerate(part.ranks)]
    return pd.DataFrame(rows, columns=["pair", "kind", "rank", "share", "note"])


def best_per_budget(table: pd.DataFrame, headline: pd.DataFrame) -> pd.DataFrame:
    """Per pair and budget, the paired comparison's winner (`analysis.ranking.headline`: among the trees
    one could deploy, the presets, the user's, the held-out designs and dynamic trees; not the
    in-sample hindsight tree nor the oracle bound) with its row of the grid (held-out tau and its
    interval over its prompts, acceptance rate and length), the shapes that are the same tree on
    every prompt (`ranking.headline`), the runner-up and its tau on the prompts
    they were compared on, the winner's lead with its paired interval, the interval's width and verdict
    ("wins" / "tied"), the prompt that spreads the lead most (`ranking.headline`), and the oracle's tau at
    that budget."""
    rows = table.set_index(["pair", "shape", "budget"])
    oracle = table[table["shape"] == ORACLE].set_index(["pair", "budget"])["tau"]
    out = []
    for h in headline.itertuples(index=False):
        best = rows.loc[(h.pair, h.winner, h.budget)]
        out.append(
            {
                "pair": h.pair,
                "kind": best["kind"],
                "budget": int(h.budget),
                "best_shape": h.winner,
                "tau_heldout": best["tau_heldout"],
                "tau_heldout_ci_low": best["tau_heldout_ci_low"],
                "tau_heldout_ci_high": best["tau_heldout_ci_high"],
                "acceptance_rate": best["acceptance_rate"],
                "acceptance_length": best["acceptance_length"],
                "same_as_winner": h.same_as_winner,
                "runner_up": h.runner_up,
                "runner_up_tau": h.runner_up_tau,
                "winner_tau_compared": h.winner_tau,
                "lead": h.difference,
                "lead_ci_low": h.difference_ci_low,
                "lead_ci_high": h.difference_ci_high,
                "verdict": h.verdict,
                "prompts_compared": h.prompts,
                "interval_width": getattr(h, "interval_width", math.nan),
                "widest_prompt": getattr(h, "widest_prompt", None),
                "widest_category": getattr(h, "widest_category", None),
                "widest_lead": getattr(h, "widest_lead", math.nan),
                "oracle_tau": oracle.get((h.pair, h.budget), math.nan),
            }
        )
    return pd.DataFrame(out)
