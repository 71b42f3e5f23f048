"""The tree gallery (`plots.tree_gallery`): presets and a shape rule's fills at three budgets drawn
one axes per tree, each panel titled with its node count and depth, saved as a legible PNG."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from specnb.core.trees import Tree
from specnb.io.tree_spec import ShapeRule
from specnb.notebook import plots
from specnb.notebook.legibility import saved_problems

BUDGETS = (4, 16, 64)


def gallery() -> dict[str, list[Tree]]:
    rule = ShapeRule((3, 2, 1))
    return {
        "sparse": [Tree.preset("sparse", n) for n in BUDGETS],
        "kary2": [Tree.preset("kary2", n) for n in BUDGETS],
        "beams4": [Tree.preset("beams4", n) for n in BUDGETS],
        "mine": [rule.fill(n) for n in BUDGETS],
    }


@pytest.mark.parametrize(
    "trees",
    [
        gallery(),
        {"wide": [Tree.wide(64)], "chain": [Tree.chain(4), Tree.chain(32)]},  # the widest and the deepest
        {"one": [Tree.chain(1)]},
    ],
    ids=["presets_and_rule", "wide_and_deep", "single"],
)
def test_the_gallery_draws_one_legible_panel_per_tree(tmp_path, trees):
    png = tmp_path / "gallery.png"
    fig = plots.tree_gallery(trees, png)
    drawn = [t for row in trees.values() for t in row]
    assert len(fig.axes) == len(drawn)
    for ax, (name, tree) in zip(fig.axes, [(n, t) for n, row in trees.items() for t in row]):
        nodes = "1 node" if tree.num_nodes == 1 else f"{tree.num_nodes} nodes"
        assert ax.get_title() == f"{name}, {nodes}, depth {tree.depth}"
        labels = sorted(t.get_text() for t in ax.texts)
        assert labels == sorted(str(r) for r in tree.ranks)  # every node labelled with its rank
    assert png.exists() and png.stat().st_size > 0
    assert saved_problems(png) == []
    plt.close(fig)


def test_the_gallery_refuses_an_empty_row():
    with pytest.raises(ValueError, match="at least one tree"):
        plots.tree_gallery({"mine": []})
