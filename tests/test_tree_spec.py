"""Trees a user writes (paths, `choices` lists, branching widths) and the lines engines read."""

import pytest

from specnb.core.trees import Tree
from specnb.io.tree_spec import TreeSpecError, parse_custom_trees, parse_tree

PATHS = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]]


def test_paths_choices_and_branching_give_the_same_tree():
    by_paths = parse_tree("mine", {"paths": PATHS})
    assert parse_tree("mine", PATHS[::-1]) == by_paths  # a `choices` list, any order
    assert parse_tree("mine", str(PATHS)) == by_paths  # as a YAML string
    assert parse_tree("mine", {"branching": [3, 2]}) == by_paths == Tree.from_branching([3, 2])
    assert Tree.from_branching([3, 2, 1]).num_nodes == 3 + 6 + 6
    assert Tree.from_branching([1, 1, 1]) == Tree.chain(3)
    assert parse_tree("mine", [[0], [1.0], ["0", "0"]]) == Tree.from_paths([(0,), (1,), (0, 0)])  # whole numbers
    assert parse_tree("mine", [[r] for r in range(1024)]).num_nodes == 1024  # the limit itself is allowed


@pytest.mark.parametrize(
    "spec, message",
    [
        ([[0], [2]], "no sibling of rank 1"),
        ([[0], [1, 0]], "has no parent"),
        ([[0], [0]], "duplicate"),
        ([], "is empty"),
        ({"branching": [2, 0]}, ">= 1"),
        ({"paths": [[0]], "branching": [1]}, "one key"),
        ([["a"]], "rank paths"),
        ("abc", "is not a list of rank paths"),  # not Python: `-p custom_trees "{mine: abc}"`
        ("[[0], [1]", "is not a list of rank paths"),
        ([[0], [1.9]], "whole numbers"),  # not read as [1]
        ([[0], [True]], "whole numbers"),
        ({"branching": [2.5]}, "whole numbers"),
        ({"branching": [100, 99]}, "10,000 nodes, above the limit of 1024"),  # refused before it is built
        ({"branching": [10**6, 10**6]}, "above the limit of 1024"),
        ([[r] for r in range(1025)], "1,025 nodes, above the limit"),
    ],
)
def test_bad_specs_are_refused_with_what_to_change(spec, message):
    with pytest.raises(TreeSpecError, match=message):
        parse_tree("mine", spec)


@pytest.mark.parametrize("name", ["chain", "sparse", "kary2", "beams4", "wide"])
def test_a_name_that_is_a_presets_is_refused(name):
    with pytest.raises(TreeSpecError, match="preset"):
        parse_custom_trees({name: [[0]]})


def test_choices_load_as_medusas_trees_do():
    # a published Medusa tree's first entries, in Medusa's own list-of-lists form
    medusa = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3]]
    tree = Tree.from_paths(medusa)
    assert tree.to_choices() == sorted(medusa, key=lambda x: (len(x), x))  # Medusa sorts them so
    assert Tree.from_paths(tree.to_choices()) == tree
