"""Figures: one helper per figure kind, drawn with seaborn from the tidy tables of `tables` and `replay_study`.

Each helper returns the matplotlib Figure and, given `path`, saves it as PNG. Axis labels carry
units and titles carry the metric convention (tau includes the bonus token; acceptance length
does not; acceptance rate = accepted / drafted).
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from ..core.trees import Tree
from .legibility import problems

TAU = "tau (tokens per target call, bonus included)"
RATE = "acceptance rate (accepted / drafted)"


def save(fig: plt.Figure, path: str | Path | None) -> plt.Figure:
    """Lay out, check legibility (`legibility.problems`), and save as PNG with the problems found
    recorded in the file (text chunk "legibility"; the tests require it empty)."""
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        found = problems(fig)
        fig.savefig(path, dpi=120, metadata={"legibility": json.dumps(found)})
    return fig


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")
LINESTYLES = ("-", "--", "-.", ":")


def styles(names) -> dict[str, dict]:
    """A distinct (colour, marker, line style) per name, in order: ten colours, then the markers and
    line styles change too, so series stay distinguishable past the palette (beyond 8 or 10)."""
    colours = sns.color_palette("tab10", 10)
    out = {}
    for i, name in enumerate(dict.fromkeys(names)):
        out[name] = {
            "color": colours[i % 10],
            "marker": MARKERS[i % len(MARKERS)],
            "linestyle": LINESTYLES[(i // 10) % len(LINESTYLES)],
        }
    return out


def legend_outside(ax: plt.Axes, title: str | None = None, panels: Sequence[plt.Axes] = (), **kwargs) -> None:
    """The legend to the right of the axes, never over the data; with `panels`, one entry per label
    drawn in any of them (a series missing from the last panel still has its entry)."""
    if len(panels):
        shown: dict[str, Any] = {}
        for panel in panels:
            for handle, label in zip(*panel.get_legend_handles_labels()):
                shown.setdefault(label, handle)
        kwargs.update(handles=list(shown.values()), labels=list(shown))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, title=title, **kwargs)


def depth_acceptance(depths: pd.DataFrame, path=None) -> plt.Figure:
    """Per-depth acceptance (steps that accepted at least d draft tokens / steps) against depth, one
    column of panels per budget, one series per shape, at most `PER_PANEL` shapes a row of panels
    (`shape_panels`, the highest first); depths past the last non-zero value are left out."""
    data = depths[depths["acceptance"] > 0]
    budgets = sorted(data["budget"].unique())
    groups = shape_panels(data, "acceptance")
    style = styles(sorted(data["shape"].unique(), key=lambda s: (s in DESIGNED, s)))
    fig, axes = plt.subplots(
        len(groups), len(budgets), figsize=(3.9 * len(budgets) + 1.8, 3.4 * len(groups)), squeeze=False, sharey=True
    )
    for row, (name, shapes) in zip(axes, groups):
        for ax, budget in zip(row, budgets):
            mine = data[(data["budget"] == budget) & data["shape"].isin(shapes)]
            for shape, d in mine.groupby("shape", sort=False):
                d = d.sort_values("depth")
                ax.plot(d["depth"], d["acceptance"], label=shape, lw=1.4, ms=4, **style[shape])
            ax.set_title(f"{budget} draft tokens" + (f", {name}" if len(groups) > 1 else ""), fontsize=9)
            ax.set_xlabel("depth d")
        row[0].set_ylabel("P(accepted >= d draft tokens)", fontsize=8)
        legend_outside(row[-1], "shape", row)
    fig.suptitle("per-depth acceptance: steps that accepted at least d draft tokens / steps", fontsize=10)
    return save(fig, path)


def _layout(tree: Tree) -> tuple[dict[int, float], int]:
    """x of each row of `tree.children` (0 = the root, i + 1 = node i) and the number of leaf slots:
    leaves spread evenly in depth-first rank order, a parent centred over its children."""
    x: dict[int, float] = {}
    slots = 0

    def place(row: int) -> float:
        nonlocal slots
        kids = tree.children[row]
        if kids:
            x[row] = sum(place(k + 1) for k in kids) / len(kids)
        else:
            x[row], slots = float(slots), slots + 1
        return x[row]

    place(0)
    return x, slots


def _node_link(ax: plt.Axes, tree: Tree, x: dict[int, float], root: float, **nodes) -> Any:
    """`tree` at the x of `_layout`, depth downward: its edges, the root (black, area `root`) and the
    nodes (`nodes`: scatter's keywords); the nodes' scatter."""
    for i, parent in enumerate(tree.parents):
        ax.plot([x[parent + 1], x[i + 1]], [1 - tree.depths[i], -tree.depths[i]], color="0.6", lw=0.8, zorder=1)
    ax.scatter([x[0]], [0], s=root, color="black", zorder=2)
    return ax.scatter([x[i + 1] for i in range(tree.num_nodes)], [-d for d in tree.depths], zorder=3, **nodes)


def draw_tree(tree: Tree, frequency: dict, title: str = "", path=None) -> plt.Figure:
    """The tree, root at the top; each node coloured and labelled by how often it was accepted."""
    x, slots = _layout(tree)
    width = max(float(slots), 1.0)
    fig, ax = plt.subplots(figsize=(min(max(6.0, 2 + 0.45 * width), 18), min(2.0 + 0.6 * max(tree.depth, 1), 10.0)))
    freqs = [frequency.get(p, 0.0) for p in tree.paths]
    sc = _node_link(ax, tree, x, 160, c=freqs, cmap="viridis", vmin=0, vmax=1, s=160, edgecolors="black")
    ax.annotate("root", (x[0], 0), xytext=(0, 9), textcoords="offset points", ha="center", fontsize=8)
    if tree.num_nodes <= 40:
        for i, f in enumerate(freqs):
            ax.annotate(
                f"{f:.2f}",
                (x[i + 1], -tree.depths[i]),
                xytext=(0, -15),
                textcoords="offset points",
                ha="center",
                fontsize=7,
            )
    fig.colorbar(sc, ax=ax, label="accepted in this fraction of steps")
    ax.set_ylim(-tree.depth - 0.45, 0.45)  # room for the labels above the root and below the leaves
    ax.set_xlim(-0.7, width - 0.3)
    ax.set_yticks([-d for d in range(tree.depth + 1)], [str(d) for d in range(tree.depth + 1)])
    ax.set_ylabel("depth")
    ax.set_xticks([])
    ax.set_title(title or f"tree of {tree.num_nodes} draft tokens", fontsize=10)
    return save(fig, path)


def tree_gallery(trees: Mapping[str, Sequence[Tree | tuple[str, Tree]]], path=None) -> plt.Figure:
    """Trees side by side: one row per shape name, one panel per tree (e.g. one shape at budgets 4, 8,
    16; or a row of several shapes, each given as (name, tree)), each a node-link diagram with the
    root at the top and depth increasing downward (the y axis), each node labelled with its sibling
    rank, the panel titled "<name>, N nodes, depth D".

    As in `draw_tree`, leaves are spread evenly in depth-first rank order and a parent is centred
    over its children, so nodes of one depth are at least one leaf slot apart and their labels never
    overlap; a column is as wide as its widest tree or title needs (`leaf` inches per leaf slot), a
    row as tall as its deepest tree (`depth_in` inches per level), and the panels of a row share the
    depth axis."""
    given = [(str(name), list(row)) for name, row in trees.items()]
    if not given or any(not row for _, row in given):
        raise ValueError(f"tree_gallery needs at least one tree per name, got {[(n, len(r)) for n, r in given]}")
    named = [[item if isinstance(item, tuple) else (name, item) for item in row] for name, row in given]
    rows = [(name, [tree for _, tree in row]) for (name, _), row in zip(given, named)]
    leaf, depth_in, title_char = 0.2, 0.3, 0.064  # inches per leaf slot, per depth level, per title character

    layouts = [[_layout(t) for t in row] for _, row in rows]
    titles = [
        [f"{name}, {t.num_nodes} node{'' if t.num_nodes == 1 else 's'}, depth {t.depth}" for name, t in row]
        for row in named
    ]
    columns = max(len(row) for _, row in rows)
    col_in = [
        max(
            max(len(titles[r][c]) * title_char + 0.3, layouts[r][c][1] * leaf + 0.3)
            for r in range(len(rows))
            if c < len(rows[r][1])
        )
        for c in range(columns)
    ]
    row_depth = [max(t.depth for t in row) for _, row in rows]
    row_in = [max(1.4, 0.5 + depth_in * (d + 1)) for d in row_depth]
    heading = "node labels: sibling rank (0 = the draft's top choice, shaded)"
    width = max(sum(col_in) + 0.75 * columns, len(heading) * 0.075 + 0.4)
    height = sum(row_in) + 0.45 * len(rows)
    fig = plt.figure(figsize=(width, height))
    grid = fig.add_gridspec(len(rows), columns, width_ratios=col_in, height_ratios=row_in)
    for r, (_, row) in enumerate(rows):
        first: plt.Axes | None = None
        for c, tree in enumerate(row):
            ax = fig.add_subplot(grid[r, c], sharey=first)
            first = first or ax
            x, slots = layouts[r][c]
            # a node's diameter in points: below the gap between leaf slots and between levels
            gap = 72 * min(col_in[c] / (slots + 0.2), row_in[r] / (row_depth[r] + 0.8))
            size = min(14.0, 0.8 * gap)
            shade = ["#c6dbef" if rank == 0 else "white" for rank in tree.ranks]
            _node_link(ax, tree, x, size**2 * 0.6, s=size**2, c=shade, edgecolors="0.3", linewidths=0.6)
            font = 7 if size >= 11 else 6 if size >= 8 else 5
            for i, rank in enumerate(tree.ranks):
                ax.text(x[i + 1], -tree.depths[i], str(rank), ha="center", va="center", fontsize=font, zorder=4)
            ax.set_xlim(-0.6, slots - 0.4)
            ax.set_xticks([])
            ax.set_title(titles[r][c], fontsize=8)
            ax.tick_params(axis="y", labelsize=7)
            if c == 0:
                step = math.ceil((row_depth[r] + 1) / 12)
                depths = range(0, row_depth[r] + 1, step)
                ax.set_yticks([-d for d in depths], ["root" if d == 0 else str(d) for d in depths])
                ax.set_ylim(-row_depth[r] - 0.4, 0.4)
                ax.set_ylabel("depth", fontsize=8)
    fig.suptitle(heading, fontsize=9, y=1 - 0.06 / height)  # at the top: tight_layout reserves only its height
    return save(fig, path)


def tree_mask(tree: Tree, prefix: int = 3, path=None) -> plt.Figure:
    """How one verification sees a tree (`core.masks`): left, the tree with each node's index and
    sibling rank; right, the attention mask of the root and the nodes over the cached prefix, the
    root and the nodes (filled: may attend), each row labelled with its position id (prefix + depth:
    siblings share one)."""
    from ..core.masks import prefix_tree_mask, rooted_ancestor_mask

    mask = prefix_tree_mask(rooted_ancestor_mask(tree.ancestor_mask()), prefix)[0, 0].numpy()  # [N+1, prefix+N+1]
    rows = ["root"] + [f"n{i}" for i in range(tree.num_nodes)]
    positions = [prefix] + [prefix + d for d in tree.depths]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(3.2 + 0.42 * mask.shape[1], 1.6 + 0.38 * mask.shape[0]), width_ratios=[1.0, 1.6]
    )
    x, slots = _layout(tree)
    _node_link(left, tree, x, 220, s=420, color="#c6dbef", edgecolors="0.3")
    for i, rank in enumerate(tree.ranks):
        left.text(x[i + 1], -tree.depths[i], f"n{i}\nr{rank}", ha="center", va="center", fontsize=6.5, zorder=4)
    left.set_xlim(-0.7, max(slots, 1) - 0.3)
    left.set_ylim(-tree.depth - 0.5, 0.5)
    left.set_xticks([])
    left.set_yticks([-d for d in range(tree.depth + 1)], ["root"] + [str(d) for d in range(1, tree.depth + 1)])
    left.set_ylabel("depth")
    left.set_title("the tree: node n<i>, sibling rank r<k>", fontsize=9)
    right.imshow(mask, cmap="Blues", vmin=0, vmax=1.4, aspect="equal")
    right.set_xticks(range(mask.shape[1]), [f"p{j}" for j in range(prefix)] + rows, rotation=90, fontsize=7)
    right.set_yticks(range(mask.shape[0]), [f"{r}  pos {p}" for r, p in zip(rows, positions)], fontsize=7)
    right.set_xlabel("keys: the cached prefix p0.., the root, the nodes")
    right.set_title("attention mask (filled: may attend)\nrows: queries with their position ids", fontsize=9)
    return save(fig, path)


def shapes_gallery(
    trees: Mapping[tuple[str, int], Tree], path=None, budgets: int = 1, largest: int = 16, per_row: int = 5
) -> plt.Figure:
    """`tree_gallery` of a sweep's trees keyed (shape, budget): each shape at up to `budgets` of its
    budgets no larger than `largest` nodes (the largest such; its smallest where it has none), so
    that every shape the sweep measures is seen before it is measured. With one budget a shape, the
    shapes are packed `per_row` to a row: a compact page, not a column of tall panels."""
    by_shape: dict[str, list[tuple[int, Tree]]] = {}
    for (shape, budget), tree in sorted(trees.items()):
        by_shape.setdefault(shape, []).append((budget, tree))
    shown = {shape: [t for b, t in rows if b <= largest][-budgets:] or [rows[0][1]] for shape, rows in by_shape.items()}
    if budgets > 1:
        return tree_gallery(shown, path)
    items = sorted(((shape, row[0]) for shape, row in shown.items()), key=lambda item: -item[1].depth)  # deep together
    return tree_gallery({f"row {i}": items[i : i + per_row] for i in range(0, len(items), per_row)}, path)


def speed_bars(table: pd.DataFrame, path=None) -> plt.Figure:
    """Speedup over the target alone (same run) per pair and method, as horizontal bars (method
    names never collide); replayed methods (no wall clock) are left out."""
    data = table[table["speedup"].notna()].assign(method=table["shape"] + ":" + table["budget"].astype(str))
    return _speedup_bars(
        data,
        "pair",
        "method (drafter/shape:draft tokens)",
        "wall-clock tokens/s relative to the target's own decoding, measured in the same run",
        path,
    )


def _speedup_bars(data: pd.DataFrame, hue: str, ylabel: str, title: str, path) -> plt.Figure:
    """Column "speedup" as horizontal bars, one per "method" (side by side per `hue` where a method
    has several), the 1x line dashed; with columns "speedup_ci_low" / "speedup_ci_high" (one row
    per method), their interval as error bars."""
    methods = list(dict.fromkeys(data["method"]))
    hues = list(dict.fromkeys(data[hue]))
    dodge = data.groupby("method")[hue].nunique().max() > 1
    height = 0.8 / len(hues) if dodge else 0.8
    fig, ax = plt.subplots(figsize=(8.8, max(2.6, 0.32 * len(methods) * (len(hues) if dodge else 1) + 1.6)))
    colours = dict(zip(hues, sns.color_palette("tab10", len(hues))))
    for j, name in enumerate(hues):
        d = data[data[hue] == name]
        offset = (j - (len(hues) - 1) / 2) * height if dodge else 0.0
        y = [methods.index(m) + offset for m in d["method"]]  # each bar's centre: its error bar on it
        xerr = None
        if "speedup_ci_low" in d and d["speedup_ci_low"].notna().any():
            low = (d["speedup"] - d["speedup_ci_low"]).fillna(0).clip(lower=0)
            high = (d["speedup_ci_high"] - d["speedup"]).fillna(0).clip(lower=0)
            xerr = [low, high]
        ax.barh(
            y,
            d["speedup"],
            height=height,
            color=colours[name],
            label=str(name),
            xerr=xerr,
            error_kw={"ecolor": "black", "elinewidth": 1, "capsize": 2},
        )
    ax.set_yticks(range(len(methods)), methods)
    ax.invert_yaxis()  # the first method on top
    ax.axvline(1.0, color="black", lw=1, ls="--")
    ax.set_ylabel(ylabel)
    ax.set_xlabel("speedup over the target alone (x)")
    ax.set_title(title, fontsize=10)
    legend_outside(ax, hue)
    return save(fig, path)


def category_winners(winners: pd.DataFrame, budgets: Sequence[int] = (4, 8, 16), path=None) -> plt.Figure:
    """Per prompt category (rows) and pair (columns), at each of `budgets` (a panel each, those the
    table has): the tau of the shape that wins on that category's prompts, written with its name, the
    colour its tau (`analysis.ranking.category_winners`). A cell whose winner is not the pair's overall
    winner at that budget is framed in black: where the answer changes with the task."""
    shown = [b for b in budgets if b in set(winners["budget"])] or sorted(set(winners["budget"]))[-1:]
    pairs = list(dict.fromkeys(winners["pair"]))
    categories = list(dict.fromkeys(winners["category"]))
    fig, axes = plt.subplots(
        1,
        len(shown) + 1,
        figsize=(2.6 + 2.6 * len(pairs) * len(shown), 1.8 + 0.45 * len(categories)),
        squeeze=False,
        gridspec_kw={"width_ratios": [len(pairs)] * len(shown) + [0.12]},
    )
    low, high = winners["winner_tau"].min(), winners["winner_tau"].max()
    for ax, budget in zip(axes[0][:-1], shown):
        d = winners[winners["budget"] == budget]
        tau = d.pivot(index="category", columns="pair", values="winner_tau").reindex(index=categories, columns=pairs)
        image = ax.imshow(tau.to_numpy(dtype=float), cmap="viridis", vmin=low, vmax=high, aspect="auto")
        for r in d.itertuples():
            i, j = categories.index(r.category), pairs.index(r.pair)
            bright = (r.winner_tau - low) > 0.6 * (high - low)  # viridis turns yellow: dark text there
            ax.text(
                j,
                i,
                f"{r.winner}\n{r.winner_tau:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="black" if bright else "white",
            )
            if not r.same_winner:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
        ax.set_xticks(range(len(pairs)), [textwrap.fill(p, 18) for p in pairs], fontsize=7)
        ax.set_yticks(range(len(categories)), categories, fontsize=8)
        ax.set_title(f"{budget} draft tokens", fontsize=9)
    fig.colorbar(image, cax=axes[0][-1], label="tau (bonus included)")
    title = (
        "The winning shape per prompt category (framed: not the pair's overall winner); "
        f"{int(winners['prompts'].max())} prompts per category, no interval"
    )
    fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)), fontsize=9)  # ~11 characters an inch at 9 pt
    return save(fig, path)


IMPL_ORDER = ("eager", "per_sequence", "sdpa", "flex", "causal")
IMPL_LABEL = {
    "eager": "eager (reference)",
    "per_sequence": "per-sequence (one call per leaf)",
    "sdpa": "SDPA + tree mask (one call)",
    "flex": "FlexAttention + BlockMask",
    "causal": "plain causal (no tree)",
}


def _machine(table: pd.DataFrame) -> str:
    row = table.iloc[0]
    return f"{row['device']}, {row['dtype']}, torch {row['torch']}"


def _ok(grid: pd.DataFrame) -> pd.DataFrame:
    data = grid[grid["status"] == "ok"].copy()
    data["implementation"] = data["impl"].map(IMPL_LABEL).fillna(data["impl"])
    return data


def _swept_shape(table: pd.DataFrame) -> str:
    """The shape timed at the most tree sizes (a custom tree has one size): the grid figures' default."""
    sizes = table.groupby("shape", sort=False)["nodes"].nunique()
    return str(sizes.idxmax())


def _nearest(values, target: float):
    values = sorted(set(values))
    return min(values, key=lambda v: (abs(v - target), v))


def _timed_lines(ax: plt.Axes, data: pd.DataFrame, x: str) -> None:
    """Median per implementation with its interquartile band."""
    palette = dict(zip(IMPL_ORDER, sns.color_palette("tab10", len(IMPL_ORDER))))
    for impl in [i for i in IMPL_ORDER if i in set(data["impl"])] + sorted(set(data["impl"]) - set(IMPL_ORDER)):
        d = data[data["impl"] == impl].sort_values(x)
        color = palette.get(impl)
        ax.plot(
            d[x],
            d["median_ms"],
            marker="o",
            color=color,
            label=IMPL_LABEL.get(impl, impl),
            ls="--" if impl == "causal" else "-",
        )
        ax.fill_between(d[x], d["q25_ms"], d["q75_ms"], color=color, alpha=0.2, lw=0)


def _log_y(ax: plt.Axes) -> None:
    """Log-scaled y axis labelled in plain numbers (0.05, 2, 30) rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_yscale("log")
    plain = FuncFormatter(lambda y, _: f"{y:g}")
    ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)


def _log2_ticks(ax: plt.Axes, values) -> None:
    """A log2 x axis ticked at `values` only, labelled as plain integers."""
    values = sorted(set(int(v) for v in values))
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.minorticks_off()


def attention_time_vs_nodes(
    grid: pd.DataFrame, batch: int | None = None, shape: str | None = None, path=None
) -> plt.Figure:
    """Time of one attention call against draft tokens, one line per implementation, one panel per
    prefix length (at the smallest batch and the first tree shape unless given)."""
    data = _ok(grid)
    batch = batch if batch is not None else int(data["batch"].min())
    shape = shape or _swept_shape(data)
    data = data[(data["batch"] == batch) & (data["shape"] == shape)]
    prefixes = sorted(data["prefix"].unique())
    cols = min(len(prefixes), 3)
    rows = -(-len(prefixes) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows + 0.6), squeeze=False)
    for ax, prefix in zip(axes.flat, prefixes):
        _timed_lines(ax, data[data["prefix"] == prefix], "nodes")
        _log2_ticks(ax, data["nodes"])
        _log_y(ax)
        ax.set_xlabel("draft tokens in the tree (N)")
        ax.set_ylabel("time per attention call (ms)")
        ax.set_title(f"prefix {prefix} tokens", fontsize=10)
    for ax in list(axes.flat)[len(prefixes) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(
        f"one tree-attention call, batch {batch}, {shape} trees\nmedian, band = interquartile range\n{_machine(data)}",
        fontsize=9,
    )
    return save(fig, path)


def tree_speedup(speed: pd.DataFrame, shape: str | None = None, path=None) -> plt.Figure:
    """per-sequence time / one-tree-call time against draft tokens, one line per prefix length,
    one panel per batch size; the dashed line is the number of leaves (the calls one tree replaces)."""
    shape = shape or _swept_shape(speed)
    data = speed[speed["shape"] == shape]
    batches = sorted(data["batch"].unique())
    fig, axes = plt.subplots(1, len(batches), figsize=(4.6 * len(batches), 4.0), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        d = data[data["batch"] == batch]
        sns.lineplot(data=d, x="nodes", y="per_sequence_over_tree", hue="prefix", marker="o", palette="viridis", ax=ax)
        leaves = d.groupby("nodes")["leaves"].first()
        ax.plot(leaves.index, leaves.values, color="black", ls="--", lw=1, label="leaves (calls replaced)")
        ax.axhline(1.0, color="grey", lw=1)
        _log2_ticks(ax, d["nodes"])
        _log_y(ax)
        ax.set_xlabel("draft tokens in the tree (N)")
        ax.set_ylabel("per-sequence time / tree time (x)")
        ax.set_title(f"batch {batch}", fontsize=10)
        ax.legend(title="prefix (tokens)", fontsize=8)
    fig.suptitle(
        f"speedup of one tree call over one call per root-to-leaf sequence ({shape} trees)\n{_machine(speed)}",
        fontsize=9,
    )
    return save(fig, path)


def attention_time_vs_prefix_and_batch(
    grid: pd.DataFrame, nodes: int | None = None, shape: str | None = None, path=None
) -> plt.Figure:
    """Two panels: time against prefix length (smallest batch) and against batch size (longest
    prefix), one line per implementation, at `nodes` draft tokens (default: nearest to 64)."""
    data = _ok(grid)
    shape = shape or _swept_shape(data)
    data = data[data["shape"] == shape]
    nodes = nodes if nodes is not None else _nearest(data["nodes"], 64)
    data = data[data["nodes"] == nodes]
    batch, prefix = int(data["batch"].min()), int(data["prefix"].max())
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    _timed_lines(left, data[data["batch"] == batch], "prefix")
    _log2_ticks(left, data["prefix"])
    left.set_xlabel("prefix length (tokens; the longest in the batch)")
    left.set_title(f"batch {batch}", fontsize=10)
    _timed_lines(right, data[data["prefix"] == prefix], "batch")
    _log2_ticks(right, data["batch"])
    right.set_xlabel("batch size (sequences, each its own prefix length and tree)")
    right.set_title(f"prefix {prefix}", fontsize=10)
    for ax in (left, right):
        _log_y(ax)
        ax.set_ylabel("time per attention call (ms)")
    left.legend(fontsize=8)
    fig.suptitle(f"{nodes}-node {shape} trees; median, band = interquartile range\n{_machine(data)}", fontsize=9)
    return save(fig, path)


def verify_cost(curve: pd.DataFrame, cost: pd.DataFrame, path=None) -> plt.Figure:
    """Left: one target verification against tree nodes, beside a plain forward of the same tokens.
    Right: expected tokens/s of each tree shape from the cost model, against the target alone."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 4.3))
    target = curve[curve["role"] == "target"]
    for kind, label, ls in (
        ("verify", "verify: root + N nodes, tree mask", "-"),
        ("plain", "plain forward of N + 1 tokens", "--"),
    ):
        d = target[target["kind"] == kind].sort_values("nodes")
        if not d.empty:
            left.plot(d["nodes"], d["median_ms"], marker="o", ls=ls, label=label)
            left.fill_between(d["nodes"], d["q25_s"] * 1e3, d["q75_s"] * 1e3, alpha=0.2, lw=0)
    left.set_xlabel("draft tokens in the tree (N)")
    left.set_ylabel("time of one target forward (ms)")
    left.set_title(
        f"{target['model'].iloc[0]}, {target['prefix'].iloc[0]} tokens cached; {_machine(target)}", fontsize=9
    )
    left.set_ylim(bottom=0)
    left.legend(fontsize=8)
    sns.lineplot(data=cost, x="nodes", y="tokens_per_s", hue="shape", marker="o", ax=right)
    right.axhline(cost["baseline_tokens_per_s"].iloc[0], color="black", ls="--", lw=1, label="target alone")
    best = cost.loc[cost["tokens_per_s"].idxmax()]
    right.scatter(
        [best["nodes"]],
        [best["tokens_per_s"]],
        s=160,
        facecolors="none",
        edgecolors="red",
        zorder=5,
        label=f"best: {best['shape']} {int(best['nodes'])}",
    )
    _log2_ticks(right, cost["nodes"])
    right.set_xlabel("draft tokens in the tree (N)")
    right.set_ylabel("expected tokens/s")
    right.set_title(
        f"draft {cost['draft'].iloc[0]}: tau / (draft time + verify time);\n"
        "tau = expected tokens per target call, bonus included",
        fontsize=9,
    )
    right.legend(fontsize=8)
    return save(fig, path)


# ---- replay (notebook 01): tables from `replay_study.replay_table` ----------------------------

DESIGNED = ("sequoia", "medusa", "hindsight", "dynamic", "oracle")


def replay_vs_budget(
    table: pd.DataFrame, metric: str = "tau", label: str = TAU, title: str = "", path=None
) -> plt.Figure:
    """A replayed metric against the budget: preset shapes thin, data-driven trees bold; with
    `<metric>_ci_low` / `_ci_high` columns, their band (95% bootstrap interval over prompts). At most
    `PER_PANEL` shapes a panel (`shape_panels`: the highest first), a shared y axis; the oracle, a
    bound, in a panel of its own beside the best shape, so that it never squashes the others."""
    data = table.dropna(subset=[metric])
    panels = shape_panels(data, metric)
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(3.6 * len(panels) + 1.6, 4.2),
        squeeze=False,
        sharex=True,
        sharey=not _has_oracle(panels),
    )
    style = _shape_styles(data)
    for ax, (name, shapes) in zip(axes[0], panels):
        _budget_lines(ax, data[data["shape"].isin(shapes)], metric, style)
        _log2_ticks(ax, data["budget"])  # every panel on the figure's budgets (a panel may hold one)
        ax.set_title(name, fontsize=8.5)
        legend_below(ax)
    axes[0][0].set_ylabel(label)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


def grid_vs_budget(
    table: pd.DataFrame, metric: str = "tau", label: str = TAU, title: str = "", path=None
) -> plt.Figure:
    """`replay_vs_budget` for many pairs (`experiments.grid.grid_table`): one row of panels per pair
    (at most `PER_PANEL` shapes a panel, the oracle in its own), each shape in the same style in
    every panel; rows without the metric (a design across tokenizers, whose note says why) are left
    out of the lines."""
    data = table.dropna(subset=[metric])
    pairs = list(dict.fromkeys(table["pair"]))
    rows = {pair: shape_panels(data[data["pair"] == pair], metric) for pair in pairs}
    columns = max((len(p) for p in rows.values()), default=1)
    fig, axes = plt.subplots(
        len(pairs), columns, figsize=(3.6 * columns + 1.2, 3.5 * len(pairs) + 0.6), squeeze=False, sharex="row"
    )
    style = _shape_styles(data)
    for r, pair in enumerate(pairs):
        kind = table.loc[table["pair"] == pair, "kind"].iloc[0] if "kind" in table else ""
        for c in range(columns):
            ax = axes[r][c]
            if c >= len(rows[pair]):
                ax.set_visible(False)
                continue
            name, shapes = rows[pair][c]
            _budget_lines(ax, data[(data["pair"] == pair) & data["shape"].isin(shapes)], metric, style)
            _log2_ticks(ax, data.loc[data["pair"] == pair, "budget"])  # the pair's budgets (a panel may hold one)
            heading = f"{pair} ({kind})" if kind else pair  # not `title`: that is the figure's
            ax.set_title("\n".join(textwrap.wrap(heading, 44) + [name]), fontsize=7.5)
            legend_below(ax)
        axes[r][0].set_ylabel(label, fontsize=8)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


def best_per_pair(best: pd.DataFrame, path=None) -> plt.Figure:
    """The pairs compared (`experiments.grid.best_per_budget`): per pair (a colour), the held-out
    tau of the best deployable tree at each budget with its 95% interval, each point's marker the
    shape that won it; the oracle bound of the pair dotted where it exists."""
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(8.6, 4.6))
    colour = {pair: sns.color_palette("tab10", 10)[i % 10] for i, pair in enumerate(dict.fromkeys(best["pair"]))}
    marker = {shape: MARKERS[i % len(MARKERS)] for i, shape in enumerate(sorted(set(best["best_shape"])))}
    for pair, b in best.groupby("pair", sort=False):
        b = b.sort_values("budget")
        ax.plot(b["budget"], b["tau_heldout"], lw=2, color=colour[pair])
        ax.fill_between(
            b["budget"], b["tau_heldout_ci_low"], b["tau_heldout_ci_high"], color=colour[pair], alpha=0.12, lw=0
        )
        if b["oracle_tau"].notna().any():
            ax.plot(b["budget"], b["oracle_tau"], color=colour[pair], lw=1, linestyle=":", alpha=0.8)
        for shape, points in b.groupby("best_shape"):
            ax.scatter(
                points["budget"], points["tau_heldout"], marker=marker[shape], s=46, color=colour[pair], zorder=3
            )
    handles = [Line2D([], [], color=c, lw=2, label=pair) for pair, c in colour.items()]
    handles += [Line2D([], [], color="0.3", marker=m, lw=0, label=f"best: {shape}") for shape, m in marker.items()]
    handles.append(Line2D([], [], color="0.3", lw=1, linestyle=":", label="oracle bound"))
    _log2_ticks(ax, best["budget"])
    ax.set_xlabel("draft tokens in the tree (N)")
    ax.set_ylabel("held-out tau of the best tree\n(bonus included)")
    ax.set_title("The best tree per budget, per pair", fontsize=10)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)
    return save(fig, path)


PER_PANEL = 6  # series in one panel of a budget figure, at most
ORACLE = "oracle"


def shape_panels(table: pd.DataFrame, metric: str, per_panel: int = PER_PANEL) -> list[tuple[str, list[str]]]:
    """The shapes of `table` in panels of at most `per_panel`, highest `metric` (mean over budgets)
    first: [("best 6", [...]), ("next 6", [...]), ..., ("oracle (a bound) and the best", [oracle, best])]."""
    means = table[table["shape"] != ORACLE].groupby("shape")[metric].mean().sort_values(ascending=False)
    shapes = list(means.index)
    panels = [
        (("highest " if i == 0 else "next ") + f"{len(shapes[i : i + per_panel])}", shapes[i : i + per_panel])
        for i in range(0, len(shapes), per_panel)
    ]
    if (table["shape"] == ORACLE).any():
        panels.append(("the oracle (a bound) and the best", [ORACLE, *shapes[:1]]))
    return panels or [("", [])]


def _has_oracle(panels: list[tuple[str, list[str]]]) -> bool:
    return any(ORACLE in shapes for _, shapes in panels)


def legend_below(ax: plt.Axes) -> None:
    """The panel's legend under its axes, two columns: never over the data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=7, frameon=False)


def _shape_styles(table: pd.DataFrame) -> dict[str, dict]:
    return styles(sorted(table["shape"].unique(), key=lambda s: (s in DESIGNED, s)))


def _budget_lines(ax: plt.Axes, table: pd.DataFrame, metric: str, style: dict[str, dict]) -> None:
    """One line per shape of `metric` against the budget, with its interval band where there is one."""
    for shape, t in table.groupby("shape", sort=False):
        t = t.sort_values("budget")
        bold = shape in DESIGNED
        kw = {**style[shape], "linestyle": "--" if shape == "oracle" else style[shape]["linestyle"]}
        ax.plot(t["budget"], t[metric], lw=2.6 if bold else 1.2, ms=5, label=shape, alpha=1.0 if bold else 0.8, **kw)
        if f"{metric}_ci_low" in t and t[f"{metric}_ci_low"].notna().any():
            ax.fill_between(
                t["budget"], t[f"{metric}_ci_low"], t[f"{metric}_ci_high"], color=kw["color"], alpha=0.12, lw=0
            )
    _log2_ticks(ax, table["budget"])
    ax.set_xlabel("draft tokens in the tree (N)")


# ---- long generations (notebook 04): tables from `long_generation` --------------------------------


def _window_label(window: int) -> str:
    return "full cache" if not window else f"window {window}"


def long_vs_position(frame: pd.DataFrame, column: str, label: str, title: str, methods=None, path=None) -> plt.Figure:
    """A per-position quantity (binned by tokens generated), one panel per method, one line per
    cache policy."""
    data = frame if methods is None else frame[frame["method"].isin(methods)]
    methods = list(dict.fromkeys(data["method"]))
    fig, axes = plt.subplots(1, len(methods), figsize=(4.6 * len(methods), 3.9), squeeze=False, sharey=True)
    for ax, method in zip(axes[0], methods):
        d = data[data["method"] == method]
        for window, w in d.groupby("window", sort=True):
            ax.plot(w["position"], w[column], marker=".", label=_window_label(window))
        ax.set_title(method, fontsize=10)
        ax.set_xlabel("tokens generated")
    axes[0][0].set_ylabel(label)
    axes[0][-1].legend(fontsize=8, title="cache", loc="best")
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


def long_quality(table: pd.DataFrame, path=None) -> plt.Figure:
    """Left: perplexity of each output under the full-cache target against the window; right: the
    first position where it differs from the full-cache target's greedy output."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 3.9))
    bounded = table[table["window"] > 0]
    for method, t in bounded.groupby("method", sort=False):
        left.plot(t["window"], t["perplexity"], marker="o", label=method)
        right.plot(t["window"], t["first_difference"], marker="o", label=method)
    full = table[table["window"] == 0]
    if len(full):
        left.axhline(full["perplexity"].mean(), color="black", ls="--", lw=1, label="full cache")
    for ax in (left, right):
        _log2_ticks(ax, bounded["window"])
        if bounded["window"].nunique() == 1:  # one window: a narrow, centred axis
            w = float(bounded["window"].iloc[0])
            ax.set_xlim(w / 1.3, w * 1.3)
        ax.set_xlabel("window (positions kept after the sinks)")
    left.set_ylabel("perplexity under the full-cache target")
    right.set_ylabel("first token differing from full-cache greedy")
    legend_outside(right, "method")
    fig.suptitle("what the bounded cache costs in quality (greedy)", fontsize=10)
    return save(fig, path)


# ---- Medusa heads (notebook 05) ----------------------------------------------------------------


def depth_accuracy(accuracy: pd.DataFrame, ks: tuple[int, ...] = (1, 5), path=None) -> plt.Figure:
    """Top-k accuracy against depth, one panel per k, a line per drafter (`learned_study.depth_accuracy`)."""
    ks = [k for k in ks if k in set(accuracy["k"])]
    fig, axes = plt.subplots(1, len(ks), figsize=(4.6 * len(ks) + 1.8, 4.0), sharey=True, squeeze=False)
    style = styles(accuracy["drafter"].unique())
    for ax, k in zip(axes[0], ks):
        for drafter, t in accuracy[accuracy["k"] == k].groupby("drafter", sort=False):
            t = t.sort_values("depth")
            ax.plot(t["depth"], t["top_k_accuracy"], lw=1.8, label=drafter, **style[drafter])
        ax.set_xticks(sorted(accuracy["depth"].unique()))
        ax.set_xlabel("depth in the tree (the token d after the root)")
        ax.set_title(f"top-{k}", fontsize=10)
    axes[0][0].set_ylabel("share of steps whose depth-d token\nis in the drafter's top k")
    legend_outside(axes[0][-1], "drafter", axes[0])
    fig.suptitle("accuracy by depth along the accepted path, on the held-out test prompts (greedy)", fontsize=10)
    return save(fig, path)


def learned_drafters(taus: pd.DataFrame, path=None) -> plt.Figure:
    """tau against the budget, a line per drafter, one panel per kind of tree: the best preset
    static tree at each budget, the designed trees (Sequoia's per-depth tree), the dynamic trees."""
    panels = [
        ("best preset tree", taus[taus["kind"] == "preset"].groupby(["drafter", "budget"], sort=False)["tau"].max()),
        (
            "Sequoia's tree (per-depth accuracies)",
            taus[taus["shape"] == "sequoia_per_depth"].groupby(["drafter", "budget"], sort=False)["tau"].max(),
        ),
        (
            "dynamic tree (top-N by cumulative log q)",
            taus[taus["kind"] == "dynamic"].groupby(["drafter", "budget"], sort=False)["tau"].max(),
        ),
    ]
    panels = [(title, s.reset_index()) for title, s in panels if len(s)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) + 2.2, 4.2), sharey=True, squeeze=False)
    style = styles(taus["drafter"].unique())
    budgets = sorted(taus["budget"].unique())
    for ax, (title, t) in zip(axes[0], panels):
        for drafter, d in t.groupby("drafter", sort=False):
            d = d.sort_values("budget")
            ax.plot(d["budget"], d["tau"], lw=1.8, label=drafter, **style[drafter])
        _log2_ticks(ax, budgets)
        ax.set_xlabel("draft tokens in the tree (N)")
        ax.set_title(title, fontsize=10)
    axes[0][0].set_ylabel(TAU)
    legend_outside(axes[0][-1], "drafter", axes[0])
    fig.suptitle("learned drafters vs the draft model: the same target and held-out prompts (greedy)", fontsize=10)
    return save(fig, path)


def tau_by_shape(table: pd.DataFrame, path=None) -> plt.Figure:
    """Replayed tau against the budget for every tree, one panel per drafter; designed trees bold."""
    drafters = list(table["drafter"].unique())
    fig, axes = plt.subplots(1, len(drafters), figsize=(4.6 * len(drafters) + 1.8, 4.3), sharey=True, squeeze=False)
    style = styles(sorted(table["shape"].unique()))
    for ax, drafter in zip(axes[0], drafters):
        for shape, t in table[table["drafter"] == drafter].groupby("shape", sort=False):
            t = t.sort_values("budget")
            bold = shape in ("medusa", "sequoia_per_depth")
            ax.plot(t["budget"], t["tau"], lw=2.6 if bold else 1.2, label=shape, **style[shape])
        _log2_ticks(ax, table["budget"])
        ax.set_xlabel("draft tokens in the tree (N)")
        ax.set_title(drafter, fontsize=10)
    axes[0][0].set_ylabel(TAU)
    legend_outside(axes[0][-1], "shape", axes[0])
    fig.suptitle("every tree by drafter: the same target, prompts and trees (greedy)", fontsize=10)
    return save(fig, path)


def learned_speed(speed: pd.DataFrame, path=None) -> plt.Figure:
    """Speedup over the target alone of each measured drafter and tree, with its 95% interval over
    prompts (paired bootstrap), as horizontal bars."""
    data = speed.assign(method=speed["drafter"] + " " + speed["tree"] + ":" + speed["budget"].astype(str))
    return _speedup_bars(
        data,
        "drafter",
        "drafter and tree (shape:draft tokens)",
        "wall clock against the target alone, measured in the same run\n"
        "(error bars: 95% interval over prompts; none below 3 prompts)",
        path,
    )


def typical_vs_lossless(quality: pd.DataFrame, path=None) -> plt.Figure:
    """Per prompt: tau (left) and perplexity under the target (right) of typical acceptance (LOSSY)
    and lossless sampling."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.2, 4.0))
    sns.barplot(quality, x="rule", y="tau", ax=left, errorbar=("ci", 95))
    sns.barplot(quality, x="rule", y="perplexity", ax=right, errorbar=("ci", 95))
    left.set_ylabel(TAU)
    right.set_ylabel("perplexity under the target")
    for ax in (left, right):
        ax.set_xlabel("acceptance rule (typical_lossy is LOSSY)")
    fig.suptitle(
        f"typical acceptance (lossy) vs lossless sampling at T={quality['temperature'].iloc[0]:g} "
        "(bars: mean over prompts, 95% interval)",
        fontsize=10,
    )
    return save(fig, path)


# ---- batch size (notebook 06): tables from `batch_study` -----------------------------------------


def batch_speed(measured: pd.DataFrame, versus: pd.DataFrame | None = None, path=None) -> plt.Figure:
    """Left: tokens/s of the whole batch against batch size, one line per method (transformers'
    assisted generation at batch 1 only: it refuses more). Middle: the same per row. Right:
    speedup over the target alone batched, measured (solid, prefill included) and, dashed, the cost
    model's prediction for the same tree over the target alone's decoding steps (`versus`)."""
    data = measured[measured["status"] == "measured"]
    style = styles(list(dict.fromkeys(data["method"])))
    fig, axes = plt.subplots(1, 3, figsize=(15.5, 4.2))
    for method, d in data.groupby("method", sort=False):
        d = d.sort_values("batch")
        for ax, column in zip(axes[:2], ("tokens_per_s", "tokens_per_s_row")):
            ax.plot(d["batch"], d[column], label=method, lw=1.4, ms=5, **style[method])
        axes[2].plot(d["batch"], d["speedup"], label=method, lw=1.4, ms=5, **style[method])
    if versus is not None and len(versus):  # the prediction is of the decoding steps: against the measured ones
        alone = data[data["method"] == "autoregressive"].set_index("batch")["decode_tokens_per_s"]
        for method, d in versus.groupby("method", sort=False):
            d = d.sort_values("batch")
            axes[2].plot(
                d["batch"],
                d["predicted_tokens_per_s"] / d["batch"].map(alone),
                color=style[method]["color"],
                ls="--",
                lw=1.0,
                marker="x",
                label=f"{method}, predicted (decoding steps)",
            )
    axes[2].axhline(1.0, color="black", lw=0.8, ls=":")
    titles = ("tokens/s of the whole batch", "tokens/s per row", "speedup over the target alone at the same batch")
    for ax, title, label in zip(axes, titles, ("tokens/s (all rows)", "tokens/s per row", "speedup (x)")):
        _log2_ticks(ax, data["batch"])
        ax.set_xlabel("batch size (rows)")
        ax.set_ylabel(label)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
    legend_outside(axes[2], "method")
    fig.suptitle("greedy; every row a different prompt; interleaved runs in one process", fontsize=10)
    return save(fig, path)


def best_budget_vs_batch(cost: pd.DataFrame, path=None) -> plt.Figure:
    """Left: the cost model's best budget per tree shape against batch size. Right: expected total
    tokens/s against the budget, one line per batch size, each relative to the target alone at
    that batch (the speedup): where a larger batch moves the peak."""
    best = cost.loc[cost.groupby(["batch", "shape"])["tokens_per_s"].idxmax()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.2))
    style = styles(sorted(cost["shape"].unique()))
    for shape, d in best.groupby("shape"):
        d = d.sort_values("batch")
        left.plot(d["batch"], d["budget"], label=shape, lw=1.4, ms=5, **style[shape])
    _log2_ticks(left, cost["batch"])
    left.set_yscale("log", base=2)
    chosen = sorted(best["budget"].unique())  # ticks at the budgets chosen: other ticks would widen the axis
    left.set_yticks(chosen, [str(b) for b in chosen])
    left.set_ylim(min(chosen) / 1.3, max(chosen) * 1.3)
    left.set_xlabel("batch size (rows)")
    left.set_ylabel("best budget (draft tokens per row)")
    left.set_title("the budget of the highest expected tokens/s", fontsize=9)
    legend_outside(left, "shape")
    batches = sorted(cost["batch"].unique())
    bstyle = styles([f"batch {b}" for b in batches])
    top = cost.loc[cost.groupby(["batch", "budget"])["speedup"].idxmax()]
    for b, d in top.groupby("batch"):
        d = d.sort_values("budget")
        right.plot(d["budget"], d["speedup"], label=f"batch {b}", lw=1.4, ms=5, **bstyle[f"batch {b}"])
    right.axhline(1.0, color="black", lw=0.8, ls=":")
    _log2_ticks(right, cost["budget"])
    right.set_xlabel("draft tokens per row (the best shape at each budget)")
    right.set_ylabel("expected speedup (x)")
    right.set_title(
        "expected speedup over the target alone at the same batch;\n"
        "tau per row replayed (bonus included), costs measured at each batch",
        fontsize=9,
    )
    legend_outside(right, "batch")
    return save(fig, path)
