"""Figures a reader can use (`notebook.legibility`): the check finds each defect of a deliberately
bad figure, passes a clean one, and every figure the plotting helpers draw from realistic tables
(eleven shapes, long method names, a category per pair) is saved with no problem recorded. The
smoke run's own PNGs are checked in tests/test_notebooks.py."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from specnb.notebook import plots
from specnb.notebook.legibility import main, problems, saved_problems

SHAPES = ["chain", "kary2", "kary3", "kary4", "wide", "beams2", "beams4", "sparse", "sequoia", "hindsight", "dynamic"]


def bad_figure() -> plt.Figure:
    """Every defect issue 12 names: a title cut at the top, a legend over the data, twelve series
    in one colour, an x axis running far past the data, and tick labels written over each other."""
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(6, 3))
    x = np.arange(1, 6)
    for i in range(12):
        ax.plot(x, 0.9 ** (x + i), color="tab:blue", label=f"shape {i}")
    ax.legend(loc="upper left", fontsize=7)
    ax.set_xlim(0, 40)
    labels = ["confidence0.4/chain:8", "early_exit24/chain:4", "merged/kary2:8"]
    bars.bar(range(3), [1.1, 0.9, 1.2])
    bars.set_xticks(range(3), labels, fontsize=11)
    fig.suptitle("depth acceptance", y=1.04)
    return fig


def test_the_check_finds_every_defect_of_a_bad_figure():
    found = problems(bad_figure())
    kinds = {p.split(":")[0].split(" in ")[0].split(" of ")[0] for p in found}
    assert any(p.startswith("text on text") and "chain:8" in p for p in found), found
    assert any(p.startswith("legend over data") for p in found), found
    assert any(p.startswith("indistinguishable series") for p in found), found
    assert any(p.startswith("x axis") and "runs past its data" in p for p in found), found
    assert any(p.startswith("text outside the canvas") and "depth acceptance" in p for p in found), found
    assert len(kinds) >= 5


def test_the_check_passes_a_clean_figure():
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = np.arange(1, 6)
    for name, style in plots.styles(SHAPES).items():
        ax.plot(x, 0.9 ** (x + SHAPES.index(name)), label=name, **style)
    plots.legend_outside(ax, "shape")
    ax.set_title("acceptance by depth")
    fig.tight_layout()
    assert problems(fig) == []


def test_styles_stay_distinct_past_the_palette():
    style = plots.styles([f"s{i}" for i in range(25)])
    assert len({(str(v["color"]), v["marker"], v["linestyle"]) for v in style.values()}) == 25


@pytest.fixture(scope="module")
def tables():
    """Realistic tables: a replay table with eleven shapes and six budgets (intervals included),
    per-depth acceptance to depth 40 with trailing zeros, speedups with long method names."""
    rng = np.random.default_rng(0)
    rows = []
    for i, shape in enumerate(SHAPES + ["oracle"]):
        for budget in (2, 4, 8, 16, 32, 64):
            tau = 1 + min(budget, 6) * 0.25 + 0.02 * i
            rate = 0.8 / (1 + 0.2 * budget) + 0.01 * i
            rows.append(
                {
                    "shape": shape,
                    "budget": budget,
                    "tau": tau,
                    "tau_ci_low": tau - 0.2,
                    "tau_ci_high": tau + 0.2,
                    "acceptance_rate": rate,
                    "acceptance_rate_ci_low": rate * 0.9,
                    "acceptance_rate_ci_high": rate * 1.1,
                    "tau_all_over_hindsight": 0.7 + 0.02 * i,
                }
            )
    replay = pd.DataFrame(rows)
    depths = pd.DataFrame(
        [
            {"shape": s, "budget": b, "depth": d, "acceptance": max(0.0, 0.8**d - 0.3) if d < 30 else 0.0}
            for s in SHAPES
            for b in (16, 32, 64)
            for d in range(1, 41)
        ]
    )
    methods = ["chain:4", "kary2:8", "confidence0.4/chain:8", "early_exit24/chain:4", "merged/kary2:8", "hf_assisted:4"]
    speed = pd.DataFrame(
        [
            {"pair": pair, "shape": m.split(":")[0], "budget": int(m.split(":")[1]), "speedup": 0.6 + rng.random()}
            for pair in ("A -> B", "C -> B")
            for m in methods
        ]
    )
    categories = ["coding", "math", "rag", "summarization", "writing"]
    category = pd.DataFrame(
        [
            {
                "pair": pair,
                "budget": budget,
                "category": c,
                "winner": "kary2" if k % 3 else "chain",
                "winner_tau": 2.0 + 0.1 * k + 0.05 * budget,
                "overall_winner": "kary2",
                "overall_winner_tau": 2.0 + 0.1 * k,
                "same_winner": bool(k % 3),
                "prompts": 2,
            }
            for pair in ("Qwen2.5-Coder-0.5B -> Qwen2.5-Coder-1.5B", "SmolLM2-135M -> Qwen2.5-Coder-1.5B")
            for budget in (4, 8, 16)
            for k, c in enumerate(categories)
        ]
    )
    return replay, depths, speed, category


def test_every_helper_saves_a_legible_figure(tmp_path, tables):
    replay, depths, speed, category = tables
    plots.replay_vs_budget(replay, "tau", plots.TAU, "tau on the run trajectory", tmp_path / "tau.png")
    plots.replay_vs_budget(
        replay[replay["shape"] != "oracle"], "acceptance_rate", plots.RATE, "rate", tmp_path / "rate.png"
    )
    plots.depth_acceptance(depths, tmp_path / "depth.png")
    plots.speed_bars(speed, tmp_path / "speed.png")
    plots.category_winners(category, path=tmp_path / "category.png")
    for png in sorted(tmp_path.glob("*.png")):
        assert saved_problems(png) == [], png.name
    assert main([str(tmp_path)]) == 0


def test_budget_figures_hold_at_most_six_series_a_panel_and_the_oracle_apart(tables):
    replay = tables[0]
    assert replay["shape"].nunique() > 6 and (replay["shape"] == "oracle").any()
    grid = pd.concat([replay.assign(pair=p, kind="same tokenizer") for p in ("A -> B", "C -> B")])
    for fig in (plots.replay_vs_budget(replay, "tau"), plots.grid_vs_budget(grid, "tau")):
        shown = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
        series = [{line.get_label() for line in ax.lines} for ax in shown]
        assert all(len(s) <= plots.PER_PANEL for s in series), series
        with_oracle = [s for s in series if "oracle" in s]
        assert with_oracle and all(len(s) == 2 for s in with_oracle), "the oracle beside the best shape only"
        drawn = set().union(*series) - {"oracle"}
        assert drawn == set(replay["shape"]) - {"oracle"}, "every shape in some panel"
        plt.close(fig)


def test_the_grid_figure_is_legible_with_long_pair_names(tmp_path, tables):
    long = "smollm2-135m[:24 layers] -> smollm2-135m"  # the smoke profile's self-draft pair
    grid = pd.concat(
        [tables[0].assign(pair=p, kind=k) for p, k in ((long, "self-draft"), ("A -> B", "same tokenizer"))]
    )
    fig = plots.grid_vs_budget(grid, "tau", plots.TAU, "tau per pair", tmp_path / "grid.png")
    assert saved_problems(tmp_path / "grid.png") == []
    assert fig._suptitle.get_text() == "tau per pair", "the figure's title, not the last panel's pair"
    plt.close(fig)
    # a panel whose shapes hold one budget only (the smoke run's self-draft): on the pair's budget axis
    means = grid[grid["shape"] != "oracle"].groupby("shape")["tau"].mean().sort_values(ascending=False)
    lowest = means.index[-1]
    kept = grid[grid["shape"].isin([*means.index[:6], lowest])]  # a second panel holding the lowest shape alone
    one = kept[(kept["shape"] != lowest) | (kept["budget"] == kept["budget"].min())]
    plots.grid_vs_budget(one[one["shape"] != "oracle"], "tau", plots.TAU, "tau per pair", tmp_path / "one.png")
    plots.replay_vs_budget(one[one["pair"] == long], "tau", plots.TAU, "tau", tmp_path / "one_replay.png")
    assert saved_problems(tmp_path / "one.png") == [] and saved_problems(tmp_path / "one_replay.png") == []


def test_speed_bars_error_bars_sit_on_their_bars(tables):
    speed = tables[2].copy()
    speed["speedup_ci_low"], speed["speedup_ci_high"] = speed["speedup"] - 0.1, speed["speedup"] + 0.1
    fig = plots.speed_bars(speed)
    ax = fig.axes[0]
    bars = [(round(p.get_y() + p.get_height() / 2, 6), round(p.get_width(), 6)) for p in ax.patches]
    caps = set()
    for collection in ax.collections:  # the error bars' segments: (x low, y) to (x high, y)
        for segment in collection.get_segments():
            (x0, y0), (x1, y1) = segment
            if y0 == y1:
                caps.add((round(y0, 6), round((x0 + x1) / 2, 6)))
    assert len(bars) == len(speed) and set(bars) == caps, "every error bar centred on its bar"
    plt.close(fig)


def test_a_panel_figures_legend_names_the_series_of_every_panel(tables):
    """One legend beside the last panel, one entry per series of any panel: a shape the last panel
    lacks (no steps at that budget) is still named."""
    _, depths, _, _ = tables
    fig = plots.depth_acceptance(depths[(depths["budget"] != 64) | (depths["shape"] != SHAPES[0])])
    legends = [ax for ax in fig.axes if ax.get_legend() is not None]  # one a row of panels, at most six shapes each
    entries = [t.get_text() for ax in legends for t in ax.get_legend().get_texts()]
    assert sorted(entries) == sorted(SHAPES) and all(len(ax.get_legend().get_texts()) <= 6 for ax in legends)
    assert SHAPES[0] not in [line.get_label() for ax in legends for line in ax.lines], "named though not drawn there"
    plt.close(fig)


def test_a_bad_figure_is_recorded_and_reported(tmp_path, capsys):
    plots.save(bad_figure(), tmp_path / "bad.png")
    assert saved_problems(tmp_path / "bad.png")
    assert main([str(tmp_path)]) == 1
    assert "BAD" in capsys.readouterr().out
    plt.figure().savefig(tmp_path / "foreign.png")
    with pytest.raises(ValueError, match="no legibility record"):
        saved_problems(tmp_path / "foreign.png")


def test_the_command_reads_where_runs_are_written_and_refuses_a_missing_folder(tmp_path, monkeypatch, capsys):
    """No folder given: $SPECNB_OUTPUTS (else the project's outputs/), wherever it is run from; a folder
    that is not there is an error (exit 2), never an empty all-clear."""
    plots.save(bad_figure(), tmp_path / "run" / "bad.png")
    monkeypatch.setenv("SPECNB_OUTPUTS", str(tmp_path))
    monkeypatch.chdir(tmp_path / "run")
    assert main([]) == 1 and "BAD" in capsys.readouterr().out
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["spread", "one budget", "two budgets"])
def test_the_best_budget_figure_is_legible_whatever_budgets_win(tmp_path, case):
    """The left panel's ticks are the budgets chosen; a budget tried but never best (CI's smoke run:
    best 1 and 2 of 1, 2, 4) or a single best budget on the log axis must not widen it."""
    rows = []
    for batch in (1, 2, 4):
        for shape in ("chain", "kary2"):
            for budget in (1, 2, 4, 8, 16):
                peak = {"spread": 3 - np.log2(batch), "one budget": 0, "two budgets": 1 if shape == "chain" else 0}[
                    case
                ]
                score = -abs(np.log2(budget) - peak)
                rows.append(
                    {
                        "batch": batch,
                        "shape": shape,
                        "budget": budget,
                        "tokens_per_s": 10 + score,
                        "speedup": 1 + score / 10,
                    }
                )
    plots.best_budget_vs_batch(pd.DataFrame(rows), tmp_path / "best.png")
    assert saved_problems(tmp_path / "best.png") == []
