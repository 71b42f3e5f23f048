"""Held-out scoring of trees fitted to collected data, and one verdict for the tree to deploy.

A tree fitted to a collection is scored in-sample on the very positions it was fitted to, which
flatters it: the hindsight tree is, by construction, the static tree with the most accepted draft
tokens summed over EVERY position there, so its in-sample tau_all is the ceiling of static trees'
tau_all (not a tree to deploy). It is no ceiling of the run-trajectory tau scored here: the positions
a run visits depend on the tree, and another tree's trajectory may skip the positions where it
accepts little (notebook 01's cpu run: Sequoia's tree 4.55 against hindsight's 4.41 at 16 tokens).
Held out (k-fold cross-validation over prompts, Stone 1974): the prompts are shuffled with a seed
and dealt into k = min(k, prompts) folds; each fold's prompts are replayed with the trees fitted on
the other folds, so every prompt is scored once by a tree that never saw it, and tau is pooled as
everywhere (tokens over steps, run trajectory). Prompts, not positions, are the unit (positions of
one prompt are not independent; `analysis.spread`). Presets are fitted to nothing: their held-out tau is their tau.

    DESIGNERS    the rules that fit trees to a collection, one per budget: "sequoia" (Sequoia's
                 programme under the acceptance vector), "medusa" (Medusa's search under the
                 per-depth acceptance), "hindsight" (the best static tree of the training prompts,
                 used as a design)
    folds        the seeded split of prompt ids into k test folds
    score        in-sample and held-out tau of every preset and design (`HeldOut`)
    choose       the tree and budget to deploy by expected tokens/s with held-out tau (cost model),
                 with an interval and a verdict (`Choice`)
    versus_runner_up   the choice against the next tree, their speed-ups' difference paired on the same prompts
    selection    the choice itself held out: made on each fold's training prompts, scored on the fold
    measurement_prediction   what a run of the choice on k prompts should measure, priced on the
                 points timed while it ran, with the interval of a k-prompt mean

The verdict's interval: the chosen tree's held-out tau at the ends of its 95% bootstrap interval
over prompts, priced with the cost curves at their measured quartiles, the pessimistic pairing at
each end (low: slow steps against a fast baseline). "pays off" where the interval lies above 1,
"does not pay off" below 1, "cannot tell" where it holds 1 or there is none (fewer than
`spread.MIN_PROMPTS` prompts).

Pure: a collection and tables in, tables out; no model, no disk. tau includes the bonus token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from ..core.trees import Tree
from . import replay, spread, tree_design
from .collection import Collection
from .cost_model import StepCost, step_cost

MEDUSA_DEPTH = 8  # depths of the per-depth acceptance a Medusa-style design reads
HINDSIGHT_NOTE = (
    "in-sample: the best static tree by tau_all (every position) on these prompts, not a tree to deploy; "
    "its run-trajectory tau here is no ceiling"
)

Designer = Callable[[Collection, Sequence[int]], dict[int, Tree]]  # (collection, budgets) -> budget -> tree


def sequoia_design(collection: Collection, budgets: Sequence[int]) -> dict[int, Tree]:
    """Sequoia's tree of each budget under the collection's per-rank acceptance vector."""
    trees = tree_design.sequoia_trees(replay.acceptance_vector(collection), max(budgets))
    return {n: trees[n] for n in budgets}


def medusa_design(collection: Collection, budgets: Sequence[int]) -> dict[int, Tree]:
    """Medusa's tree search (`tree_design.medusa_tree`) under the per-depth acceptance
    (`replay.rank_accuracy_by_depth`, MEDUSA_DEPTH depths at most)."""
    accuracy = replay.rank_accuracy_by_depth(collection, min(max(budgets), MEDUSA_DEPTH))
    return {n: tree_design.medusa_tree(accuracy, n) for n in budgets}


def hindsight_design(collection: Collection, budgets: Sequence[int]) -> dict[int, Tree]:
    """The best static tree of each budget on the collection (`tree_design.hindsight_trees`)."""
    return tree_design.hindsight_trees(replay.prefix_counts(collection), budgets)


DESIGNERS: dict[str, Designer] = {"sequoia": sequoia_design, "medusa": medusa_design, "hindsight": hindsight_design}


def folds(prompt_ids: Sequence[str], k: int, seed: int) -> tuple[tuple[str, ...], ...]:
    """The test folds: the ids shuffled with `seed` and dealt into min(k, len) folds as even as
    can be, each in the given order. Fewer than 2 prompts (or k < 2): no folds, nothing held out."""
    ids = list(prompt_ids)
    k = min(int(k), len(ids))
    if k < 2:
        return ()
    order = np.random.default_rng(seed).permutation(len(ids))
    return tuple(tuple(ids[i] for i in sorted(part.tolist())) for part in np.array_split(order, k))


def subset(collection: Collection, prompt_ids: Sequence[str]) -> Collection:
    """The collection of these prompts only (in the collection's order)."""
    keep = set(prompt_ids)
    return replace(collection, prompts=tuple(p for p in collection.prompts if p.prompt_id in keep))


@dataclass(frozen=True)
class HeldOut:
    """In-sample and held-out scores of presets and designs on one collection (`score`)."""

    table: pd.DataFrame  # one row per (shape, budget): tau_in_sample, tau_heldout and its interval, fitted, note
    per_prompt: pd.DataFrame  # shape, budget, prompt_id, fold, scored (in_sample|heldout|train), tokens, steps
    trees: dict[tuple[str, int], Tree]  # presets, and designs fitted on every prompt: what one would deploy
    splits: tuple[tuple[str, ...], ...]  # the test folds' prompt ids
    k: int  # folds requested
    seed: int  # the split's seed

    def record(self) -> dict:
        """The split as JSON: k asked, folds made, the seed, each fold's prompt ids."""
        return {"k": self.k, "folds": len(self.splits), "seed": self.seed, "splits": [list(f) for f in self.splits]}


def score(
    collection: Collection,
    presets: Mapping[tuple[str, int], Tree],
    budgets: Sequence[int],
    k: int = 3,
    seed: int = 0,
    designers: Mapping[str, Designer] | None = None,
) -> HeldOut:
    """In-sample tau (fitted on every prompt) and held-out tau (module docstring) of each design at
    each budget, beside every preset's tau, on the run trajectory. The folds' trees are also scored
    on their own training prompts (scored "train": what `selection` chooses by)."""
    designers = DESIGNERS if designers is None else designers
    ids = [p.prompt_id for p in collection.prompts]
    splits = folds(ids, k, seed)
    fitted = {(name, n): t for name, design in designers.items() for n, t in design(collection, budgets).items()}
    trees = {**presets, **fitted}
    parts = [_per_prompt(collection, trees, "in_sample", -1)]
    for i, test in enumerate(splits):
        train = subset(collection, [p for p in ids if p not in set(test)])
        mine = {(name, n): t for name, design in designers.items() for n, t in design(train, budgets).items()}
        rows = _per_prompt(collection, mine, "heldout", i)
        rows.loc[~rows["prompt_id"].isin(test), "scored"] = "train"
        parts.append(rows)
    per_prompt = pd.concat(parts, ignore_index=True)
    return HeldOut(_table(per_prompt, trees, set(fitted), ids, bool(splits)), per_prompt, trees, splits, k, seed)


def _per_prompt(collection: Collection, trees: Mapping[tuple[str, int], Tree], scored: str, fold: int) -> pd.DataFrame:
    rows = replay.replay(collection, trees, mode="trajectory", per_prompt=True)
    out = rows[["shape", "budget", "prompt_id", "tokens", "steps"]].copy()
    out["fold"], out["scored"] = fold, scored
    return out


def _table(
    per_prompt: pd.DataFrame, trees: Mapping[tuple[str, int], Tree], fitted: set, ids: list[str], split: bool
) -> pd.DataFrame:
    rows = []
    for (shape, budget), tree in trees.items():
        mine = per_prompt[(per_prompt["shape"] == shape) & (per_prompt["budget"] == budget)]
        inside = by_prompt(mine[mine["scored"] == "in_sample"], ids)
        is_fitted = (shape, budget) in fitted
        held = by_prompt(mine[mine["scored"] == "heldout"], ids) if is_fitted else inside
        tau_in, tau_out = pooled_tau(inside), (pooled_tau(held) if split or not is_fitted else float("nan"))
        low, high = spread.ratio_interval(held["tokens"], held["steps"]) if tau_out == tau_out else (np.nan, np.nan)
        rows.append(
            {
                "shape": shape,
                "budget": int(budget),
                "nodes": tree.num_nodes,
                "depth": tree.depth,
                "fitted": is_fitted,
                "prompts": len(ids),
                "tau_in_sample": tau_in,
                "tau_heldout": tau_out,
                "tau_heldout_ci_low": low,
                "tau_heldout_ci_high": high,
                "heldout_over_in_sample": tau_out / tau_in,
                "note": HINDSIGHT_NOTE if shape == "hindsight" else "",
            }
        )
    return pd.DataFrame(rows)


def by_prompt(rows: pd.DataFrame, ids: list[str]) -> pd.DataFrame:
    """tokens and steps per prompt id, in `ids`' order (0 for a prompt without rows)."""
    return rows.groupby("prompt_id")[["tokens", "steps"]].sum().reindex(ids, fill_value=0)


def pooled_tau(rows: pd.DataFrame) -> float:
    steps = float(rows["steps"].sum())
    return float(rows["tokens"].sum()) / steps if steps else float("nan")


def from_table(table: pd.DataFrame) -> pd.DataFrame:
    """The held-out table of a collection that cannot be refitted (a cross-tokenizer pair: no draft
    ranks of the target's tokens, so no designs; `replay_study.replay_table`'s rows): presets only,
    held-out tau = tau, its interval the table's."""
    presets = table[~table["shape"].isin([*DESIGNERS, "dynamic", "oracle"])]
    nan = pd.Series(np.nan, index=presets.index)
    return pd.DataFrame(
        {
            "shape": presets["shape"],
            "budget": presets["budget"].astype(int),
            "nodes": presets.get("nodes", presets["budget"]),
            "depth": presets.get("depth", nan),
            "fitted": False,
            "prompts": presets.get("prompts", nan),
            "tau_in_sample": presets["tau"],
            "tau_heldout": presets["tau"],
            "tau_heldout_ci_low": presets.get("tau_ci_low", nan),
            "tau_heldout_ci_high": presets.get("tau_ci_high", nan),
            "heldout_over_in_sample": 1.0,
            "note": "",
        }
    ).reset_index(drop=True)


def preset_gaps(table: pd.DataFrame) -> pd.DataFrame:
    """Per fitted design and budget: its held-out tau against the best preset's tau at that budget
    (`beats_best_preset`), for the readings to say where a design does not beat the presets."""
    presets = table[~table["fitted"]]
    best = presets.loc[presets.groupby("budget")["tau_heldout"].idxmax()].set_index("budget")
    rows = []
    for r in table[table["fitted"]].itertuples():
        if r.budget not in best.index or r.tau_heldout != r.tau_heldout:
            continue
        rows.append(
            {
                "shape": r.shape,
                "budget": int(r.budget),
                "tau_in_sample": r.tau_in_sample,
                "tau_heldout": r.tau_heldout,
                "best_preset": best.loc[r.budget, "shape"],
                "best_preset_tau": float(best.loc[r.budget, "tau_heldout"]),
                "beats_best_preset": bool(r.tau_heldout > best.loc[r.budget, "tau_heldout"]),
            }
        )
    return pd.DataFrame(rows)


PAYS = ("pays off", "does not pay off", "cannot tell", "cannot tell")  # `spread.verdict`'s words for a tree


@dataclass(frozen=True)
class Choice:
    """The tree and budget to deploy, its held-out tau and speed-up with intervals, and the verdict."""

    shape: str
    budget: int
    tree: Tree  # fitted on every prompt when a design (what one deploys); the preset otherwise
    fitted: bool
    tau: float  # held-out tau (bonus included)
    tau_low: float
    tau_high: float
    speedup: float  # expected tokens/s over the target alone's, by the cost model (median curves)
    speedup_low: float
    speedup_high: float
    verdict: str  # "pays off", "does not pay off" or "cannot tell"


def choose(
    table: pd.DataFrame, trees: Mapping[tuple[str, int], Tree], curve: pd.DataFrame, target: str, draft: str
) -> tuple[pd.DataFrame, Choice | None]:
    """Expected tokens/s of every tree in the held-out table with its held-out tau
    (`tree_design.recommend_budget`; the hindsight tree's in-sample tau is never used), best first, with
    the speed-up interval of each row (module docstring); and the best row as a `Choice` (None when
    no row has a held-out tau)."""
    usable = table[table["tau_heldout"].notna()]
    if usable.empty:
        return pd.DataFrame(), None
    speed = tree_design.recommend_budget(usable.assign(tau=usable["tau_heldout"]), trees, curve, target, draft)
    keyed = usable.set_index(["shape", "budget"])
    fast, slow = quartile_costs(curve, target, draft)
    lows, highs, tau_lows, tau_highs = [], [], [], []
    for r in speed.itertuples():
        row, tree = keyed.loc[(r.shape, r.budget)], trees[(r.shape, r.budget)]
        tau_lows.append(float(row["tau_heldout_ci_low"]))
        tau_highs.append(float(row["tau_heldout_ci_high"]))
        low, high = _speedup_interval(tree, tau_lows[-1], tau_highs[-1], fast, slow)
        lows.append(low)
        highs.append(high)
    speed = speed.assign(
        fitted=[bool(keyed.loc[(s, b), "fitted"]) for s, b in zip(speed["shape"], speed["budget"])],
        tau_in_sample=[float(keyed.loc[(s, b), "tau_in_sample"]) for s, b in zip(speed["shape"], speed["budget"])],
        tau_ci_low=tau_lows,
        tau_ci_high=tau_highs,
        speedup_ci_low=lows,
        speedup_ci_high=highs,
    )
    speed["verdict"] = [
        spread.verdict(lo, hi, PAYS) for lo, hi in zip(speed["speedup_ci_low"], speed["speedup_ci_high"])
    ]
    best = speed.iloc[0]
    key = (str(best["shape"]), int(best["budget"]))
    choice = Choice(
        key[0],
        key[1],
        trees[key],
        bool(best["fitted"]),
        float(best["expected_tau"]),
        float(best["tau_ci_low"]),
        float(best["tau_ci_high"]),
        float(best["speedup"]),
        float(best["speedup_ci_low"]),
        float(best["speedup_ci_high"]),
        str(best["verdict"]),
    )
    return speed, choice


def versus_runner_up(held: HeldOut, speed: pd.DataFrame) -> pd.DataFrame:
    """The choice against the runner-up (`choose`'s first two rows, each an expected speed-up = its
    held-out tau x a cost factor from the curves), paired on the same prompts: the difference of the two
    speed-ups, each prompt's tokens and target calls resampled together for both (`spread.paired_difference`
    on the tokens scaled by each tree's cost factor), and "ahead" or "tied" (the interval holds 0). One
    row; empty without a runner-up, and without an interval where per-prompt counts are missing (a
    cross-tokenizer pair's presets)."""
    if len(speed) < 2:
        return pd.DataFrame()
    first, second = speed.iloc[0], speed.iloc[1]
    sums = []
    for row in (first, second):
        mine = scored_rows(held, str(row["shape"]), int(row["budget"]))
        sums.append(mine.groupby("prompt_id")[["tokens", "steps"]].sum())
    both = sums[0].index.intersection(sums[1].index)
    factors = [float(r["speedup"]) / float(r["expected_tau"]) for r in (first, second)]
    diff, low, high = float(first["speedup"] - second["speedup"]), float("nan"), float("nan")
    if len(both):
        a, b = sums[0].loc[both], sums[1].loc[both]
        diff, low, high = spread.paired_difference(
            a["tokens"] * factors[0], a["steps"], b["tokens"] * factors[1], b["steps"]
        )
    return pd.DataFrame(
        [
            {
                "choice": f"{first['shape']}:{int(first['budget'])}",
                "runner_up": f"{second['shape']}:{int(second['budget'])}",
                "choice_speedup": float(first["speedup"]),
                "runner_up_speedup": float(second["speedup"]),
                "difference": diff,
                "difference_ci_low": low,
                "difference_ci_high": high,
                "prompts": len(both),
                "verdict": "cannot tell" if low != low else ("tied" if spread.tie(low, high) else "ahead"),
            }
        ]
    )


def scored_rows(held: HeldOut, shape: str, budget: int) -> pd.DataFrame:
    """A tree's per-prompt rows as its held-out tau counts them: a design's held out, a preset's in-sample."""
    pp = held.per_prompt
    if pp.empty:
        return pd.DataFrame(columns=["prompt_id", "tokens", "steps"])
    mine = pp[(pp["shape"] == shape) & (pp["budget"] == budget)]
    scored = "heldout" if (shape, budget) in _fitted(held) else "in_sample"
    return mine[mine["scored"] == scored]


def _speedup_interval(
    tree: Tree, tau_low: float, tau_high: float, fast: StepCost, slow: StepCost
) -> tuple[float, float]:
    """The speed-up interval of `tree` (module docstring): each end of the tau interval priced with
    the pessimistic pairing of the quartile costs (low: slow steps against a fast baseline)."""
    low = tau_low * slow.row(tree, 1.0)["speedup"] * fast.t_verify(0) / slow.t_verify(0)
    high = tau_high * fast.row(tree, 1.0)["speedup"] * slow.t_verify(0) / fast.t_verify(0)
    return low, high


def measurement_prediction(
    held: HeldOut, choice: Choice, points: pd.DataFrame, target: str, draft: str, prompts: int
) -> dict[str, Any]:
    """What a run of `choice` on `prompts` prompts should measure, priced on `points` (the cost model's
    points timed while that run ran, `bench.verify_curve.StepPoints`; curve rows): the held-out tau,
    the step's draft, verify and decode seconds, and the steady-state speed-up (the steps after each
    prompt's first, which carries its prefill), tau and speed-up with the 95% interval of a mean over
    `prompts` prompts (the choice's per-prompt taus, held out for a design, resampled `prompts` at a
    time: `spread.ratio_interval`'s draws), priced at the points' quartiles; without per-prompt taus
    (a cross-tokenizer pair's presets), the choice's own interval, of the mean over every prompt
    (narrower than a few prompts' would be; "interval" says which)."""
    pp = held.per_prompt
    rows = (
        pp[
            (pp["shape"] == choice.shape)
            & (pp["budget"] == choice.budget)
            & (pp["scored"] == ("heldout" if choice.fitted else "in_sample"))
        ]
        if not pp.empty
        else pp
    )
    if len(rows):
        tau_low, tau_high = spread.ratio_interval(rows["tokens"], rows["steps"], draws=prompts)
        interval = f"that of a mean over {prompts} prompts"
    else:
        tau_low, tau_high = choice.tau_low, choice.tau_high
        interval = "the mean's over every prompt (no per-prompt taus: narrower than a few prompts' would be)"
    cost = step_cost(points, target, draft)
    fast, slow = quartile_costs(points, target, draft)
    row = cost.row(choice.tree, choice.tau)
    low, high = _speedup_interval(choice.tree, tau_low, tau_high, fast, slow)
    return {
        "tau": choice.tau,
        "tau_low": tau_low,
        "tau_high": tau_high,
        "t_draft_s": float(row["t_draft_s"]),
        "t_verify_s": float(row["t_verify_s"]),
        "t_decode_s": cost.t_verify(0),
        "speedup": float(row["speedup"]),
        "speedup_low": low,
        "speedup_high": high,
        "interval": interval,
    }


def quartile_costs(curve: pd.DataFrame, target: str, draft: str) -> tuple[StepCost, StepCost]:
    """(fast, slow): the step-time model from the curves' first and third quartiles (the median
    where a curve has no quartiles)."""
    out = []
    for col in ("q25_s", "q75_s"):
        values = curve[col].fillna(curve["median_s"]) if col in curve else curve["median_s"]
        out.append(step_cost(curve.assign(median_s=values), target, draft))
    return out[0], out[1]


def selection(held: HeldOut, curve: pd.DataFrame, target: str, draft: str) -> pd.DataFrame:
    """The choice held out: on each fold, every preset and design (fitted on the other folds) priced
    by the cost model with its tau on the training prompts, the fastest picked and replayed on the
    fold's prompts. One row per fold (chosen shape and budget, training tau, the fold's tokens,
    steps and tau, its expected speed-up there); empty without folds."""
    cost = step_cost(curve, target, draft)
    pp = held.per_prompt
    rows = []
    for i, test in enumerate(held.splits):
        presets = pp[(pp["scored"] == "in_sample") & ~pp[["shape", "budget"]].apply(tuple, axis=1).isin(_fitted(held))]
        train = pd.concat(
            [presets[~presets["prompt_id"].isin(test)], pp[(pp["fold"] == i) & (pp["scored"] == "train")]]
        )
        pooled = train.groupby(["shape", "budget"])[["tokens", "steps"]].sum()
        speed = {key: cost.row(held.trees[key], t / s)["tokens_per_s"] for key, (t, s) in pooled.iterrows() if s > 0}
        key = max(speed, key=lambda k: (speed[k], -k[1]))
        test_rows = pp[(pp["shape"] == key[0]) & (pp["budget"] == key[1]) & pp["prompt_id"].isin(test)]
        test_rows = test_rows[test_rows["scored"] == ("heldout" if key in _fitted(held) else "in_sample")]
        tokens, steps = float(test_rows["tokens"].sum()), float(test_rows["steps"].sum())
        tau = tokens / steps if steps else float("nan")
        row = cost.row(held.trees[key], tau)
        rows.append(
            {
                "fold": i,
                "prompts": len(test),
                "shape": key[0],
                "budget": int(key[1]),
                "tau_train": float(pooled.loc[key, "tokens"] / pooled.loc[key, "steps"]),
                "tokens": tokens,
                "steps": steps,
                "tau_heldout": tau,
                "t_step_s": row["t_step_s"],
                "speedup": row["speedup"],
            }
        )
    return pd.DataFrame(rows)


def _fitted(held: HeldOut) -> set[tuple[str, int]]:
    return {(r.shape, int(r.budget)) for r in held.table.itertuples() if r.fitted}
