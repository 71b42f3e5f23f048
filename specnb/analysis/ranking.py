"""Tree shapes ranked the way the question is asked: paired, on the same prompts.

Every tree of a pair is replayed on the same prompts, so two shapes differ by a per-prompt
difference, not by two independent spreads: `paired_ranking` takes, per pair and budget, the shape of
highest tau and sets every other against it as a difference of pooled tau (tokens / target calls,
bonus INCLUDED) with a 95% paired bootstrap interval over the prompts both were measured on
(`spread.paired_difference`). An interval that holds 0 is a tie with the best: such shapes share
rank 1. `headline` is one row per pair and budget: the winner, the runner-up, their difference and
whether it is a tie, and the prompt whose own difference lies farthest from the pooled one (what an
interval wider than `WIDTH_GOAL` owes most to). `category_winners` asks whether the winner changes
with the prompt's Spec-Bench category (few prompts per category: the pooled tau only, no interval
below `spread.MIN_PROMPTS`).

Input: one row per (pair, shape, budget, prompt_id) with the prompt's tokens and target calls on the
run trajectory (`replay.replay(..., per_prompt=True)`, a design's held-out rows, dynamic trees on
their super-tree prompts, re-drafted trees across tokenizers), and its category.
"""

from __future__ import annotations

import math

import pandas as pd

from . import spread

KEYS = ["pair", "budget"]
PER_PROMPT = ["pair", "shape", "budget", "prompt_id", "category", "tokens", "steps"]
RANKING = [
    "pair",
    "budget",
    "rank",
    "shape",
    "tau",
    "prompts",
    "best",
    "compared_tau",
    "compared_best_tau",
    "difference",
    "difference_ci_low",
    "difference_ci_high",
    "tied_with_best",
    "widest_prompt",
    "widest_category",
    "widest_difference",
]
WIDTH_GOAL = 0.3  # tau: a paired interval wider than this names the prompt that spreads it most (`_widest`)


def paired_ranking(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """Per pair and budget, every shape against the best: the difference of tau (the shape's minus
    the best's, so <= 0) on the prompts both were measured on, its 95% paired interval, and whether
    that interval holds 0 ("tied_with_best"). Shapes measured on a subset of the prompts (dynamic trees,
    on the super-tree prompts) are compared on that subset, never on their own pooled tau against the
    others' on other prompts: the reference is the highest pooled tau among the shapes measured on
    every prompt, each shape is set against it on their common prompts, and the best is the one that
    beats it by most there (the reference itself if none does). Rows best first, in that order; tau is
    each shape's own pooled tau over its prompts. rank: 1 for the best and the shapes tied with it,
    then 2, 3, ... Columns `RANKING`."""
    rows = []
    for (pair, budget), part in per_prompt.groupby(KEYS, sort=False):
        sums = part.pivot_table(index="prompt_id", columns="shape", values=["tokens", "steps"], aggfunc="sum")
        counts = sums["tokens"].notna().sum()
        taus = sums["tokens"].sum() / sums["steps"].sum()
        reference = taus[counts == counts.max()].sort_values(ascending=False, kind="stable").index[0]
        against = {shape: _difference(sums, shape, reference)[0] for shape in taus.index}
        order = sorted(taus.index, key=lambda shape: (-against[shape], shape != reference, -taus[shape]))
        best, below = order[0], 1
        for shape in order:
            diff, low, high = (0.0, 0.0, 0.0) if shape == best else _difference(sums, shape, best)
            compared = sums.loc[_common(sums, shape, best)]
            tied = shape == best or spread.tie(low, high)
            widest = (None, None, math.nan) if shape == best else _widest(part, sums, shape, best, diff)
            below += not tied
            rows.append(
                {
                    "pair": pair,
                    "budget": int(budget),
                    "rank": 1 if tied else below,
                    "shape": shape,
                    "tau": float(taus[shape]),
                    "prompts": int(counts[shape] if shape == best else len(_common(sums, shape, best))),
                    "best": best,
                    "compared_tau": _tau(compared, shape),  # on the prompts compared with the best
                    "compared_best_tau": _tau(compared, best),
                    "difference": diff,
                    "difference_ci_low": low,
                    "difference_ci_high": high,
                    "tied_with_best": tied,
                    "widest_prompt": widest[0],
                    "widest_category": widest[1],
                    "widest_difference": widest[2],
                }
            )
    return pd.DataFrame(rows, columns=RANKING)


def _common(sums: pd.DataFrame, a: str, b: str) -> pd.Index:
    """The prompts both shapes were measured on."""
    return sums[[("tokens", a), ("tokens", b)]].dropna().index


def _widest(part: pd.DataFrame, sums: pd.DataFrame, shape: str, best: str, pooled: float) -> tuple:
    """(prompt, its category, its difference): of the prompts both shapes were measured on, the one
    whose own difference of tau (`shape`'s minus `best`'s) lies farthest from the pooled difference:
    the prompt that widens the paired interval most."""
    both = sums.loc[_common(sums, shape, best)]
    if not len(both):
        return None, None, math.nan
    own = both[("tokens", shape)] / both[("steps", shape)] - both[("tokens", best)] / both[("steps", best)]
    prompt = (own - pooled).abs().idxmax()
    category = part.loc[part["prompt_id"] == prompt, "category"].iloc[0] if "category" in part else None
    return prompt, category, float(own[prompt])


def _tau(sums: pd.DataFrame, shape: str) -> float:
    return float(sums[("tokens", shape)].sum() / sums[("steps", shape)].sum())


def _difference(sums: pd.DataFrame, shape: str, best: str) -> tuple[float, float, float]:
    """tau of `shape` minus tau of `best` on their common prompts, with its paired interval."""
    both = sums.loc[_common(sums, shape, best)]
    return spread.paired_difference(
        both[("tokens", shape)], both[("steps", shape)], both[("tokens", best)], both[("steps", best)]
    )


def headline(ranking: pd.DataFrame) -> pd.DataFrame:
    """One row per pair and budget: the winner, the runner-up, both taus on the prompts they were
    compared on, the winner's lead (winner minus runner-up) with its paired interval and the interval's
    width, the prompts compared, the verdict ("tied" where the interval holds 0, else "wins"), and how
    many other shapes are tied with the winner. The runner-up is the best shape that differs from the
    winner on some prompt: shapes that took the winner's tokens and target calls on every prompt (at a
    small budget several shapes are one tree: chain:2 is sequoia's and medusa's) are not a comparison,
    and are listed in "same_as_winner". "widest_prompt" (with its category and its own lead) is the
    prompt whose lead lies farthest from the pooled lead."""
    rows = []
    for (pair, budget), part in ranking.groupby(KEYS, sort=False):
        same = part.iloc[1:][_same_on_every_prompt(part.iloc[1:])]
        part = part.drop(index=same.index)
        first, second = part.iloc[0], part.iloc[1] if len(part) > 1 else None
        low, high = (
            (second["difference_ci_low"], second["difference_ci_high"]) if second is not None else (math.nan,) * 2
        )
        rows.append(
            {
                "pair": pair,
                "budget": int(budget),
                "winner": first["shape"],
                "winner_tau": first["tau"] if second is None else second["compared_best_tau"],
                "runner_up": "" if second is None else second["shape"],
                "runner_up_tau": math.nan if second is None else second["compared_tau"],
                "difference": math.nan if second is None else -second["difference"],  # winner minus runner-up
                "difference_ci_low": -high,
                "difference_ci_high": -low,
                "interval_width": high - low,
                "prompts": int(first["prompts"] if second is None else second["prompts"]),  # the prompts compared
                "verdict": "" if second is None else ("tied" if bool(second["tied_with_best"]) else "wins"),
                "tied_with_winner": int(part["tied_with_best"].sum()) - 1,
                "same_as_winner": ", ".join(same["shape"]),
                # the prompt that spreads the lead most (its own lead: the winner's minus the runner-up's)
                "widest_prompt": None if second is None else second["widest_prompt"],
                "widest_category": None if second is None else second["widest_category"],
                "widest_lead": math.nan if second is None else -second["widest_difference"],
            }
        )
    return pd.DataFrame(rows)


def _same_on_every_prompt(rows: pd.DataFrame) -> pd.Series:
    """Ranking rows whose difference from the best is 0 on every prompt: 0 with a paired interval of
    zero width (a bootstrap of per-prompt differences that are all 0)."""
    return (rows["difference"] == 0) & (rows["difference_ci_low"] == 0) & (rows["difference_ci_high"] == 0)


def category_winners(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """Per pair, budget and category: the shape of highest pooled tau on that category's prompts,
    its tau, the overall winner (highest pooled tau on every prompt) and its tau on the same
    prompts, whether the winner is the same, and the prompts in the category (the shapes' taus are
    pooled over them; no interval: a category holds few prompts). Only the shapes measured on every
    prompt of their pair and budget take part (dynamic trees on a subset of prompts do not), so each
    category's shapes answer the same prompts."""
    counts = per_prompt.groupby([*KEYS, "shape"])["prompt_id"].transform("nunique")
    most = counts.groupby([per_prompt[k] for k in KEYS]).transform("max")
    per_prompt = per_prompt[counts == most]
    overall = {
        k: part.groupby("shape")[["tokens", "steps"]].sum().pipe(lambda t: (t["tokens"] / t["steps"]).idxmax())
        for k, part in per_prompt.groupby(KEYS, sort=False)
    }
    rows = []
    for (pair, budget, category), part in per_prompt.groupby([*KEYS, "category"], sort=False):
        sums = part.groupby("shape")[["tokens", "steps"]].sum()
        taus = (sums["tokens"] / sums["steps"]).sort_values(ascending=False, kind="stable")
        best = overall[(pair, budget)]
        rows.append(
            {
                "pair": pair,
                "budget": int(budget),
                "category": category,
                "winner": taus.index[0],
                "winner_tau": float(taus.iloc[0]),
                "overall_winner": best,
                "overall_winner_tau": float(taus.get(best, math.nan)),
                "same_winner": taus.index[0] == best,
                "prompts": int(part["prompt_id"].nunique()),
            }
        )
    return pd.DataFrame(rows)
