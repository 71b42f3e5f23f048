"""The brief's grid (notebook 02): every draft -> target pair x every tree shape x every budget, with
acceptance rate, acceptance length and tau and their intervals, in one tidy table.

One collection per pair answers every tree of it by replay (`replay_study.replay_table`): the preset
shapes, the user's trees and shape rules, the data-fitted designs (Sequoia, Medusa-style,
hindsight; scored held out, `replay_study.heldout_scores`), dynamic trees and the oracle bound. A
pair of two tokenizers is re-drafted instead (exact too); the designs and the oracle need the
draft's rank of every target token, which such a draft does not have, so their rows say so in
`note` rather than being left out or empty. `pair_grid` measures one loaded pair, `grid_table`
stacks the pairs, `best_per_budget` names the best tree of each budget per pair and `rank_table`
gives each pair's acceptance by sibling rank (why the winners win)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..analysis import heldout, replay
from ..core.tree_spec import ShapeRule
from ..core.trees import Tree
from ..drafters.methods import budget_axis, trees_for
from ..io.prompts import Prompt
from .collect import CollectReport
from .pairs import Pair, PairModels
from .redraft_study import redrafter
from .replay_study import PairCollectConfig, collect_pair, collection_folder, heldout_scores, replay_table

ORACLE = "oracle"
SAME_FAMILY, OTHER_TOKENIZER, SELF_DRAFT = "same tokenizer", "other tokenizer", "self-draft"
METRICS = ("acceptance_rate", "acceptance_length", "tau")  # each with _ci_low, _ci_high
COLUMNS = [
    "pair",
    "kind",
    "shape",
    "budget",
    "nodes",
    "depth",
    "fitted",
    *[c for m in METRICS for c in (m, f"{m}_ci_low", f"{m}_ci_high")],
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
) -> PairGrid:
    """Every tree of one loaded pair from one collection of it (made, or resumed, in `folder`):
    the presets and the user's shapes at every budget (a fixed tree at its node count), the
    designs fitted on every prompt (rows: in-sample) and scored held out (`tau_heldout`), dynamic
    trees and the oracle bound at the collection's dynamic budgets. A cross-tokenizer pair is
    re-drafted (`redraft_study`); its design and oracle rows carry the reason in `note`."""
    cross = models.draft_tokenizer is not None and models.draft_tokenizer.get_vocab() != models.tokenizer.get_vocab()
    budgets = budget_axis(config.budgets, custom)
    trees = trees_for(config.shapes, budgets, custom)
    report = collect_pair(collection_folder(folder, models.label), models, prompts, trees, config.collect, pair=pair)
    collection = report.check().collection
    again = redrafter(models.draft, models.tokenizer, models.draft_tokenizer) if cross else None
    table, _ = replay_table(collection, trees, budgets, config.collect.dynamic_budgets, config.oracle_k, again)
    held = heldout_scores(collection, trees, budgets, table, config.heldout_folds, config.seed)
    rows = _rows(table, held.table, fitted=set(heldout.DESIGNERS))
    if cross:
        rows = pd.concat([rows, _missing(budgets, config.collect.dynamic_budgets)], ignore_index=True)
    rows.insert(0, "kind", pair_kind(pair, cross))
    rows.insert(0, "pair", models.label)
    ranks = () if cross else replay.acceptance_vector(collection, RANKS)
    return PairGrid(rows.reindex(columns=COLUMNS), held, report, ranks)


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


def best_per_budget(table: pd.DataFrame) -> pd.DataFrame:
    """Per pair and budget, the tree with the highest held-out tau among those one could deploy
    (presets, the user's, the held-out designs and dynamic trees; not the hindsight tree, which is
    in-sample, nor the oracle bound), with the runner-up's tau and the oracle's at that budget."""
    usable = table[~table["shape"].isin(["hindsight", ORACLE]) & table["tau_heldout"].notna()]
    oracle = table[table["shape"] == ORACLE].set_index(["pair", "budget"])["tau"]
    rows = []
    for (pair, budget), part in usable.groupby(["pair", "budget"], sort=False):
        ranked = part.sort_values("tau_heldout", ascending=False, kind="stable")  # ties: the first by shape name
        best = ranked.iloc[0]
        rows.append(
            {
                "pair": pair,
                "kind": best["kind"],
                "budget": int(budget),
                "best_shape": best["shape"],
                "tau_heldout": best["tau_heldout"],
                "tau_heldout_ci_low": best["tau_heldout_ci_low"],
                "tau_heldout_ci_high": best["tau_heldout_ci_high"],
                "acceptance_rate": best["acceptance_rate"],
                "acceptance_length": best["acceptance_length"],
                "runner_up": ranked.iloc[1]["shape"] if len(ranked) > 1 else "",
                "runner_up_tau": ranked.iloc[1]["tau_heldout"] if len(ranked) > 1 else math.nan,
                "oracle_tau": oracle.get((pair, budget), math.nan),
            }
        )
    return pd.DataFrame(rows)
