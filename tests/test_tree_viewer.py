"""Notebook 01's tree viewer offers exactly the (shape, budget) pairs the sweep built
(`replay_study.tree_choices`): a custom tree only at its node count, even one that is no budget."""

from specnb.core.trees import Tree
from specnb.drafters.methods import budget_axis, trees_for
from specnb.experiments.replay_study import tree_choices
from specnb.io.tree_spec import parse_custom_trees


def test_viewer_offers_every_built_tree_and_nothing_else():
    mine = parse_custom_trees({"mine": [[0], [1], [2], [0, 0], [0, 1]]})  # 5 nodes: not one of the budgets
    budgets = budget_axis([2, 4], mine)
    trees = trees_for(["chain", "kary2"], budgets, mine)
    trees |= {("hindsight", n): Tree.chain(n) for n in budgets}  # designs: at the swept budgets only
    choices = tree_choices(trees)
    keys = [key for _, key in choices]
    assert sorted(keys) == sorted(trees) and len(set(keys)) == len(keys)
    assert ("mine", 5) in keys and ("mine", 2) not in keys
    assert all(trees[key] is not None for key in keys)  # every offered key is drawn without a KeyError
    assert dict(choices)["mine, 5 draft tokens"] == ("mine", 5)
    assert keys == sorted(keys)  # by shape, then budget
