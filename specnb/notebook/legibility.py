"""Is a figure legible? What a reader of a report appendix notices at once, checked from the
extents matplotlib's renderer gives every artist.

    problems(fig) -> list of sentences, empty when the figure is legible:
      - text on text: two visible texts (tick labels, axis labels, titles, legend entries,
        annotations) whose boxes overlap
      - a legend over plotted data: a point of a line, a scatter or a bar's box inside the legend
        (legends outside the axes, or in an empty corner, are fine)
      - text outside the canvas: a title or label cut at the figure's edge
      - indistinguishable series: two lines of one axes with the same colour, marker and line style
        (beyond 8 series colours repeat, so markers or styles must tell them apart)
      - an axis beyond the data: a limit more than twice `SLACK` of the data's span past the data
    saved_problems(path)  what `plots` found when it saved a PNG: every figure is checked as it is
                          saved, and its problems written into the PNG's text chunk "legibility"

The tests read them back from every figure the smoke profile draws, and
`python -m specnb.notebook.legibility [FOLDER...]` lists them for any run folder (default: where runs
are written, outputs/ or $SPECNB_OUTPUTS).
"""

from __future__ import annotations

import itertools

import matplotlib.colors as mcolors
import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from .places import default_outputs

SLACK = 0.25  # an axis may run this fraction of the data's span past it (margins, rounded ticks)
PAD = 1.0  # pixels two texts may share before they count as overlapping


def problems(fig: Figure) -> list[str]:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    out: list[str] = []
    texts = _texts(fig)
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        if _overlap(box_a, box_b) > PAD:
            out.append(f"text on text: {a.get_text()!r} overlaps {b.get_text()!r}")
    for t, box in boxes:
        if box.x0 < canvas.x0 - PAD or box.y0 < canvas.y0 - PAD or box.x1 > canvas.x1 + PAD or box.y1 > canvas.y1 + PAD:
            out.append(f"text outside the canvas: {t.get_text()!r}")
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison and not ax.get_children():
            continue
        out += _legend_over_data(ax, renderer)
        out += _indistinct_series(ax)
        out += _axis_beyond_data(ax)
    return out


def _texts(fig: Figure) -> list[Text]:
    """Every text matplotlib draws: visible, non-empty, and for a tick label, its tick among those
    inside the axis' view (ticks just outside it are laid out but not drawn)."""
    ticks = {}  # id(label) -> (axis, tick)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks[id(tick.label1)] = ticks[id(tick.label2)] = (ax, axis, tick)
    out = []
    for t in fig.findobj(lambda a: isinstance(a, Text) and a.get_visible() and a.get_text().strip() != ""):
        if id(t) in ticks:
            ax, axis, tick = ticks[id(t)]
            lo, hi = sorted(axis.get_view_interval())
            tol = 1e-9 * max(abs(lo), abs(hi), 1.0)
            if not (ax.get_visible() and ax.axison and tick.get_visible() and lo - tol <= tick.get_loc() <= hi + tol):
                continue
        elif t.axes is not None and not t.axes.get_visible():
            continue
        out.append(t)
    return out


def _overlap(a: Bbox, b: Bbox) -> float:
    """Side of the overlapping square region of two boxes in pixels (0 when apart)."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return min(w, h) if w > 0 and h > 0 else 0.0


def _data_points(ax: Axes) -> np.ndarray:
    """Display coordinates [n, 2] of what the axes plots: line vertices, scatter offsets, bar corners."""
    points = []
    for line in ax.get_lines():
        if line.get_visible() and line.get_label() != "_nolegend_" or line.get_visible():
            xy = line.get_xydata()
            if len(xy):
                points.append(ax.transData.transform(xy))
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_visible():
            offsets = coll.get_offsets()
            if len(offsets):
                points.append(coll.get_offset_transform().transform(offsets))
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_visible() and patch.get_height() != 0:
            corners = patch.get_patch_transform().transform([(0, 0), (1, 1), (0, 1), (1, 0)])
            points.append(ax.transData.transform(corners))
    points = [p[np.isfinite(p).all(1)] for p in points]
    return np.concatenate(points) if points else np.zeros((0, 2))


def _legend_over_data(ax: Axes, renderer) -> list[str]:
    legend = ax.get_legend()
    if not isinstance(legend, Legend) or not legend.get_visible():
        return []
    box = legend.get_window_extent(renderer)
    points = _data_points(ax)
    inside = (points[:, 0] > box.x0) & (points[:, 0] < box.x1) & (points[:, 1] > box.y0) & (points[:, 1] < box.y1)
    if inside.any():
        return [f"legend over data in {_name(ax)}: {int(inside.sum())} plotted points under it"]
    return []


def _indistinct_series(ax: Axes) -> list[str]:
    seen: dict[tuple, str] = {}
    out = []
    for line in ax.get_lines():
        label = line.get_label()
        if not line.get_visible() or label.startswith("_") or len(line.get_xydata()) < 2:
            continue
        style = (mcolors.to_hex(line.get_color()), str(line.get_marker()), str(line.get_linestyle()))
        if style in seen and seen[style] != label:
            out.append(
                f"indistinguishable series in {_name(ax)}: {seen[style]!r} and {label!r} share colour, marker and style"
            )
        seen.setdefault(style, label)
    return out


def _plotted(ax: Axes) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The data coordinates an axes shows: (x values, y values), from labelled lines, scatters and
    bands (fill_between); reference lines (axhline / axvline) give only their fixed coordinate."""
    from matplotlib.collections import PolyCollection

    xs, ys = [], []
    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = np.asarray(line.get_xydata(), dtype=float)
        if line.get_transform() == ax.transData:
            xs.append(xy[:, 0]), ys.append(xy[:, 1])
        elif line.get_transform() == ax.get_yaxis_transform():  # axhline: y in data
            ys.append(xy[:, 1])
        elif line.get_transform() == ax.get_xaxis_transform():  # axvline: x in data
            xs.append(xy[:, 0])
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection) and len(coll.get_offsets()):
            xy = np.asarray(coll.get_offsets(), dtype=float)
            xs.append(xy[:, 0]), ys.append(xy[:, 1])
        elif isinstance(coll, PolyCollection):
            for path in coll.get_paths():
                xs.append(path.vertices[:, 0]), ys.append(path.vertices[:, 1])
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_visible():
            x, y, w, h = patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()
            xs.append(np.array([x, x + w])), ys.append(np.array([y, y + h]))
    return xs, ys


def _axis_beyond_data(ax: Axes) -> list[str]:
    """A limit far past everything the axes (and the axes sharing that axis) plot."""
    out = []
    for axis, index, lim, scale, shared in (
        ("x", 0, ax.get_xlim(), ax.get_xscale(), ax.get_shared_x_axes()),
        ("y", 1, ax.get_ylim(), ax.get_yscale(), ax.get_shared_y_axes()),
    ):
        if not len(ax.get_xticks() if axis == "x" else ax.get_yticks()):
            continue  # an axis without ticks has no scale to read (a drawn tree's x): its limits are layout
        values = [v for sibling in shared.get_siblings(ax) for v in _plotted(sibling)[index]]
        values = np.concatenate(values) if values else np.zeros(0)
        values = values[np.isfinite(values)]
        if not len(values):
            continue
        lo, hi = sorted(lim)
        if scale == "log":
            values = np.log(values[values > 0])
            if not len(values) or lo <= 0:
                continue
            lo, hi = np.log(lo), np.log(hi)
        span = max(values.max() - values.min(), 0.5 * max(abs(values).max(), 1e-12))  # one value: half of it
        if scale == "log":
            span = max(span, np.log(2))  # one value on a log axis (log 1 = 0): a factor of 2
        baseline = scale != "log" and (lo == 0 and values.min() >= 0 or hi == 0 and values.max() <= 0)  # an axis from 0
        if (values.min() - lo > 2 * SLACK * span and not baseline) or hi - values.max() > 2 * SLACK * span:
            out.append(f"{axis} axis of {_name(ax)} runs past its data: limits {lim[0]:.3g}..{lim[1]:.3g}")
    return out


def _name(ax: Axes) -> str:
    return (
        repr(ax.get_title())
        if ax.get_title()
        else f"axes at {tuple(round(v, 2) for v in ax.get_position().bounds[:2])}"
    )


def saved_problems(path) -> list[str]:
    """The problems `plots` recorded in a saved PNG (None in the chunk: saved without a check)."""
    import json

    from PIL import Image

    with Image.open(path) as image:
        text = image.text.get("legibility")
    if text is None:
        raise ValueError(f"{path} was not saved by specnb.notebook.plots (no legibility record)")
    return json.loads(text)


def main(argv: list[str] | None = None) -> int:
    """`python -m specnb.notebook.legibility [FOLDER...]`: every PNG's recorded problems (default: where
    runs are written, `places.default_outputs`); exit 1 if any, 2 for a folder that is not there."""
    import sys
    from pathlib import Path

    folders = [Path(f) for f in (argv if argv is not None else sys.argv[1:])] or [default_outputs()]
    if missing := [str(f) for f in folders if not f.is_dir()]:
        print(f"no such folder: {', '.join(missing)} (give run folders, or set SPECNB_OUTPUTS)", file=sys.stderr)
        return 2
    bad = 0
    for folder in folders:
        for png in sorted(folder.rglob("*.png")):
            found = saved_problems(png)
            bad += bool(found)
            print(f"{'ok ' if not found else 'BAD'} {png}" + "".join(f"\n    {p}" for p in found))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
