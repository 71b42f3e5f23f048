"""Notebook 01's trees priced where notebooks 03 and 06 measure (`io.tree_results.acceptance_from`
reads them): 03 puts them in its cost model on its own curves, 06 replays them on its prompts and
prices them at every batch size. A row's shape is "01:<name>" so it never merges with a preset's.
tau includes the bonus token."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from ..analysis.cost_model import batch_cost_table, step_cost
from ..io.tree_results import Earlier
from .batch_study import replayed_runs

PREFIX = "01:"
DEFAULT_TOP_K = 16  # ranks `batch_study.replayed_runs` keeps for preset trees


def add_cost_rows(cost: pd.DataFrame, earlier: Earlier, curve: pd.DataFrame, target: str, draft: str) -> pd.DataFrame:
    """`cost` (a `cost_model.cost_table`) with rows for 01's trees on the same curves, each at the tau
    01 measured (held out; in-sample where nothing was), those within the curve's measured sizes
    only; `cost` itself without trees from 01."""
    if not earlier.trees:
        return cost
    model = step_cost(curve, target, draft)
    largest = int(model.verify_s.index.max())
    tau = earlier.heldout_tau()
    rows = [
        {"shape": PREFIX + name, **model.row(tree, tau[(name, budget)])}
        for (name, budget), tree in earlier.trees.items()
        if 0 < tree.num_nodes <= largest and (name, budget) in tau
    ]
    return pd.concat([cost, pd.DataFrame(rows)[list(cost.columns)]], ignore_index=True) if rows else cost


def batch_rows(
    earlier: Earlier,
    folder: Path,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: Sequence[tuple[str, str, torch.Tensor]],
    curve: pd.DataFrame,
    batches: Sequence[int],
    max_new_tokens: int,
    target_label: str,
    draft_label: str,
) -> pd.DataFrame:
    """`cost_model.batch_cost_table` rows of 01's trees, replayed on these prompts from the collection
    in `folder` (`batch_study.replayed_runs`, resumed when the notebook made it with the same
    settings); empty without trees from 01."""
    if not earlier.trees:
        return pd.DataFrame()
    trees = {(PREFIX + name, budget): tree for (name, budget), tree in earlier.trees.items()}
    if (
        max(max(t.ranks, default=0) for t in trees.values()) >= DEFAULT_TOP_K
    ):  # the notebook's collection keeps fewer ranks
        folder = Path(folder).with_name(Path(folder).name + "_01")
    _, runs = replayed_runs(folder, target, draft, prompts, trees, max_new_tokens)
    return batch_cost_table(curve, trees, runs, batches, target_label, draft_label)
