"""Figures: one helper per figure kind, drawn with seaborn from the tidy tables of `experiments`.

Each helper returns the matplotlib Figure and, given `path`, saves it as PNG. Axis labels carry
units and titles carry the metric convention (tau includes the bonus token; acceptance length
does not; acceptance rate = accepted / drafted).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from .trees import Tree

TAU = "tau (tokens per target call, bonus included)"
RATE = "acceptance rate (accepted / drafted)"


def _save(fig: plt.Figure, path: str | Path | None) -> plt.Figure:
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def _spec(units: pd.DataFrame) -> pd.DataFrame:
    return units[units["shape"] != "autoregressive"]


def metric_vs_budget(units: pd.DataFrame, metric: str, label: str, title: str, path=None) -> plt.Figure:
    """A metric against the number of draft tokens, one line per shape (mean over prompts, +-sd)."""
    data = _spec(units)
    pairs = list(data["pair"].unique())
    fig, axes = plt.subplots(1, len(pairs), figsize=(6 * len(pairs), 4.2), squeeze=False)
    for ax, pair in zip(axes[0], pairs):
        sns.lineplot(data=data[data["pair"] == pair], x="budget", y=metric, hue="shape", marker="o",
                     errorbar="sd", ax=ax)
        ax.set_xscale("log", base=2)
        budgets = sorted(data["budget"].unique())
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("draft tokens in the tree (N)")
        ax.set_ylabel(label)
        ax.set_title(f"{pair}\n{title}", fontsize=10)
    return _save(fig, path)


def tau_vs_budget(units: pd.DataFrame, path=None) -> plt.Figure:
    return metric_vs_budget(units, "tau", TAU, "tau vs budget; mean over prompts, bars = sd", path)


def rate_vs_budget(units: pd.DataFrame, path=None) -> plt.Figure:
    return metric_vs_budget(units, "acceptance_rate", RATE, "acceptance rate vs budget; mean over prompts, bars = sd", path)


def depth_acceptance(depths: pd.DataFrame, path=None) -> plt.Figure:
    """Per-depth acceptance (steps accepting >= d draft tokens / steps), one panel per budget."""
    g = sns.relplot(data=depths, x="depth", y="acceptance", hue="shape", col="budget", kind="line",
                    marker="o", height=3.4, aspect=1.0, facet_kws={"sharex": False})
    g.set_axis_labels("depth d", "P(accepted >= d draft tokens)")
    g.figure.suptitle("per-depth acceptance (steps that accepted at least d draft tokens / steps)", y=1.02)
    return _save(g.figure, path)


def draw_tree(tree: Tree, frequency: dict, title: str = "", path=None) -> plt.Figure:
    """The tree, root at the top; each node coloured and labelled by how often it was accepted."""
    # x: leaves spread evenly in depth-first order, parents centred over their children
    x: dict[int, float] = {}
    order = 0.0

    def place(row: int) -> float:
        nonlocal order
        kids = tree.children[row]
        if not kids:
            pos, order = order, order + 1.0
        else:
            pos = sum(place(k + 1) for k in kids) / len(kids)
        x[row] = pos
        return pos

    place(0)
    width = max(order, 1.0)
    fig, ax = plt.subplots(figsize=(min(max(6.0, 2 + 0.45 * width), 18), 2.0 + 1.1 * max(tree.depth, 1)))
    cmap = plt.get_cmap("viridis")
    for i, parent in enumerate(tree.parents):
        ax.plot([x[parent + 1], x[i + 1]], [-tree.depths[i] + 1, -tree.depths[i]], color="0.7", lw=1, zorder=1)
    ax.scatter([x[0]], [0], s=160, color="black", zorder=2)
    ax.annotate("root", (x[0], 0), xytext=(0, 9), textcoords="offset points", ha="center", fontsize=8)
    freqs = [frequency.get(p, 0.0) for p in tree.paths]
    sc = ax.scatter([x[i + 1] for i in range(tree.num_nodes)], [-d for d in tree.depths], c=freqs,
                    cmap=cmap, vmin=0, vmax=1, s=160, edgecolors="black", zorder=3)
    if tree.num_nodes <= 40:
        for i, f in enumerate(freqs):
            ax.annotate(f"{f:.2f}", (x[i + 1], -tree.depths[i]), xytext=(0, -15), textcoords="offset points",
                        ha="center", fontsize=7)
    fig.colorbar(sc, ax=ax, label="accepted in this fraction of steps")
    ax.set_ylim(-tree.depth - 0.6, 0.7)
    ax.set_xlim(-0.7, width - 0.3)
    ax.set_yticks([-d for d in range(tree.depth + 1)], [str(d) for d in range(tree.depth + 1)])
    ax.set_ylabel("depth")
    ax.set_xticks([])
    ax.set_title(title or f"tree of {tree.num_nodes} draft tokens", fontsize=10)
    return _save(fig, path)


def speed_bars(table: pd.DataFrame, path=None) -> plt.Figure:
    """Speedup over the target alone (same run) per pair and tree."""
    data = table.assign(tree=table["shape"] + ":" + table["budget"].astype(str))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * data["tree"].nunique() + 3), 4.2))
    sns.barplot(data=data, x="tree", y="speedup", hue="pair", ax=ax)
    ax.axhline(1.0, color="black", lw=1, ls="--")
    ax.set_xlabel("tree (shape:draft tokens)")
    ax.set_ylabel("speedup over the target alone (x)")
    ax.set_title("wall-clock tokens/s relative to the target's own decoding, measured in the same run", fontsize=10)
    return _save(fig, path)


def category_bars(units: pd.DataFrame, metric: str = "tau", path=None) -> plt.Figure:
    """A metric per prompt category, per pair and tree."""
    data = _spec(units)
    data = data.assign(tree=data["shape"] + ":" + data["budget"].astype(str))
    g = sns.catplot(data=data, x="category", y=metric, hue="tree", col="pair", kind="bar", errorbar=None,
                    height=3.8, aspect=1.6)
    g.set_axis_labels("prompt category", TAU if metric == "tau" else metric)
    g.set_xticklabels(rotation=35, ha="right")
    return _save(g.figure, path)
