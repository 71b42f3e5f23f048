"""Shapes ranked paired (`analysis.ranking`): per pair and budget the best, every other shape's
difference from it on the prompts both have with a paired interval, ties sharing rank 1; a shape
measured on a subset of the prompts compared on that subset only; the headline's winner and
runner-up; and whether the winner changes with the category."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specnb.analysis.ranking import category_winners, headline, paired_ranking


def frame(gains: dict[str, float], prompts: int = 26, subset: dict[str, int] | None = None, noise: float = 0.0):
    """One pair, budget 4: prompt p takes 128 tokens in base_p / gain target calls per shape
    (base_p spread widely), a shape in `subset` measured on the first n prompts only."""
    bases, jitter = np.random.default_rng(0).uniform(30, 90, size=prompts), np.random.default_rng(1)
    rows = []
    for p, base in enumerate(bases):
        for shape, gain in gains.items():
            if p >= (subset or {}).get(shape, prompts):
                continue
            g = gain * (1 + noise * jitter.normal())
            rows.append(
                dict(
                    pair="A",
                    shape=shape,
                    budget=4,
                    prompt_id=f"p{p:02d}",
                    category=f"c{p % 13}",
                    tokens=128.0,
                    steps=base / g,
                )
            )
    return pd.DataFrame(rows)


def test_a_clear_winner_ranks_first_and_a_near_twin_ties_with_it():
    # kary2 is 5% ahead of chain on every prompt: separated; beams is kary2 with per-prompt noise: a tie
    df = frame({"chain": 1.0, "kary2": 1.05, "beams4": 1.05, "wide": 0.8}, noise=0.0)
    noisy = frame({"beams4": 1.04}, noise=0.08)
    df = pd.concat([df[df["shape"] != "beams4"], noisy])
    ranking = paired_ranking(df)
    assert ranking["shape"].iloc[0] == "kary2" and ranking["rank"].iloc[0] == 1
    row = ranking.set_index("shape")
    assert row.at["beams4", "tied_with_best"] and row.at["beams4", "rank"] == 1
    assert not row.at["chain", "tied_with_best"] and row.at["chain", "difference_ci_high"] < 0
    assert row.at["wide", "rank"] > row.at["chain", "rank"] > 1
    # the difference is tau's: the shape's pooled tau minus the best's on the same prompts
    tau = lambda s: df[df["shape"] == s]["tokens"].sum() / df[df["shape"] == s]["steps"].sum()  # noqa: E731
    assert row.at["chain", "difference"] == pytest.approx(tau("chain") - tau("kary2"))
    top = headline(ranking).iloc[0]
    assert top["winner"] == "kary2" and top["runner_up"] in ("beams4", "chain")
    assert top["difference"] == pytest.approx(top["winner_tau"] - top["runner_up_tau"])
    assert top["difference_ci_low"] <= top["difference"] <= top["difference_ci_high"]


def test_a_shape_on_a_subset_of_prompts_is_compared_on_that_subset():
    """dynamic (on the first 13 prompts) is 1% ahead of kary2 on every prompt it has. Its own pooled
    tau over its 13 prompts is below kary2's over 26 (they are harder prompts), yet it is the best:
    compared on the same 13 prompts, it is ahead there."""
    df = frame({"chain": 1.0, "kary2": 1.05, "dynamic": 1.0605}, subset={"dynamic": 13})
    df.loc[df["prompt_id"] < "p13", "steps"] *= 1.3  # the subset is harder for every shape
    ranking = paired_ranking(df)
    row = ranking.set_index("shape")
    assert row.at["dynamic", "tau"] < row.at["kary2", "tau"]  # its own pool is lower...
    assert ranking["shape"].iloc[0] == "dynamic"  # ...but it wins where both were measured
    assert row.at["kary2", "prompts"] == 13 and row.at["chain", "prompts"] == 13
    assert row.at["kary2", "difference"] == pytest.approx(
        row.at["kary2", "compared_tau"] - row.at["kary2", "compared_best_tau"]
    )
    top = headline(ranking).iloc[0]
    assert top["winner"] == "dynamic" and top["runner_up"] == "kary2" and top["verdict"] == "wins"
    assert top["winner_tau"] > top["runner_up_tau"] and top["prompts"] == 13


def test_a_shape_equal_to_the_winner_on_every_prompt_is_not_its_runner_up():
    """At a small budget several shapes are one tree (chain:2 is medusa's): a runner-up that took the
    winner's steps on every prompt is no comparison (a lead of 0 [0, 0]); the next shape is, and the
    twins are named."""
    df = frame({"chain": 1.05, "kary2": 1.0, "wide": 0.8})
    twin = df[df["shape"] == "chain"].assign(shape="medusa")
    ranking = paired_ranking(pd.concat([df, twin]))
    top = headline(ranking).iloc[0]
    assert top["winner"] in ("chain", "medusa") and top["same_as_winner"] in ("chain", "medusa")
    assert top["runner_up"] == "kary2" and top["verdict"] == "wins" and top["difference"] > 0
    assert headline(paired_ranking(df)).iloc[0]["same_as_winner"] == ""


def test_a_wide_interval_names_the_prompt_that_spreads_it():
    """kary2 leads chain by 5% on every prompt but p07, where chain accepts twice as much: p07's own
    lead is the one farthest from the pooled lead, and the headline names it with its category."""
    df = frame({"chain": 1.0, "kary2": 1.05})
    odd = (df["prompt_id"] == "p07") & (df["shape"] == "chain")
    df.loc[odd, "steps"] /= 2
    ranking = paired_ranking(df)
    top = headline(ranking).iloc[0]
    tau = lambda s: float(df[(df["shape"] == s) & (df["prompt_id"] == "p07")].eval("tokens / steps").iloc[0])  # noqa: E731
    assert top["widest_prompt"] == "p07" and top["widest_category"] == "c7"
    assert top["widest_lead"] == pytest.approx(tau(top["winner"]) - tau(top["runner_up"]))
    assert top["difference_ci_high"] - top["difference_ci_low"] > 0  # the outlier widens the interval
    rest = headline(paired_ranking(df[df["prompt_id"] != "p07"])).iloc[0]  # without p07: a narrower interval
    width = lambda r: r["difference_ci_high"] - r["difference_ci_low"]  # noqa: E731
    assert width(rest) < width(top) / 4
    assert pd.isna(ranking.set_index("shape").at[ranking["best"].iloc[0], "widest_prompt"])  # the best: none


def test_the_winner_per_category_and_whether_it_changes():
    df = frame({"chain": 1.0, "kary2": 1.05})
    # on category c3's prompts chain is the faster one
    c3 = (df["category"] == "c3") & (df["shape"] == "chain")
    df.loc[c3, "steps"] /= 1.2
    table = category_winners(df).set_index("category")
    assert table.at["c3", "winner"] == "chain" and not table.at["c3", "same_winner"]
    assert table.drop("c3")["same_winner"].all() and set(table["overall_winner"]) == {"kary2"}
    assert (table["prompts"] == 2).all()
