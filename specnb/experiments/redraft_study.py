"""Cross-tokenizer collections are re-drafted, not replayed (`analysis.redraft`): a collection of a
pair whose vocabularies differ holds the target's continuation only, and each tree is drafted again
in the draft's own tokens along it. `redrafter` makes the drafter of a (shape, budget, tree): a
preset, a custom tree (`core.tree_spec`) or "dynamic";
`steps_of` gives a tree's steps from any collection (replayed, or re-drafted);
`redraft_table` is the replay table of a cross-tokenizer collection, with the same intervals."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd
import torch

from ..analysis import replay, spread
from ..analysis.collection import Collection
from ..analysis.metrics import summarize
from ..analysis.redraft import Redrafted, redraft
from ..core.drafting import Drafter
from ..core.generation import GenerationResult
from ..core.trees import Tree
from ..drafters.methods import DYNAMIC, DYNAMIC_MAX_DEPTH, build_drafter, method_of
from ..drafters.retokenize import TokenText
from ..io.models import load_tokenizer


def different_vocabularies(target: str, draft: str) -> bool:
    """Whether two models' tokenizers map tokens to ids differently (a cross-tokenizer pair:
    `load_pair(..., cross_tokenizer=True)`); reads the tokenizers only."""
    return load_tokenizer(target).get_vocab() != load_tokenizer(draft).get_vocab()


Redrafter = Callable[[str, int, Tree], Drafter]  # (shape, budget, tree) -> a drafter of it


def redrafter(draft: torch.nn.Module, target_tokenizer, draft_tokenizer) -> Redrafter:
    """(shape, budget, tree) -> a fresh cross-tokenizer drafter of `draft` for it ("dynamic": a
    dynamic tree of that budget; any other shape: `tree`, a preset's or a custom one), the
    vocabularies read once."""
    texts = (TokenText.of(target_tokenizer), TokenText.of(draft_tokenizer))
    return lambda shape, budget, tree: build_drafter(
        method_of((f"xtok/{shape}", budget), tree), None, draft, target_tokenizer=texts[0], draft_tokenizer=texts[1]
    )


def needs_redrafter(redraft_with: Redrafter | None) -> Redrafter:
    """`redraft_with`, refused with what to pass when it is missing."""
    if redraft_with is None:
        raise ValueError(
            "a cross-tokenizer collection is re-drafted: pass redraft_with=redrafter(draft model, "
            "target tokenizer, draft tokenizer)"
        )
    return redraft_with


def redrafts(
    collection: Collection, shape: str, tree: Tree, budget: int, redraft_with: Redrafter
) -> dict[str, Redrafted]:
    """Per prompt, the re-drafted run of (shape, budget) whose requested tree is `tree`."""
    drafter = redraft_with(shape, budget, tree)
    # the continuation holds a stop token only as its last token, when it stopped: the one stop
    # token that can cut a step
    return {
        p.prompt_id: redraft(
            drafter,
            p.prompt.tolist(),
            p.tokens.tolist(),
            tree,
            collection.config.max_new_tokens,
            frozenset(p.tokens[-1:].tolist()) if p.stopped else frozenset(),
        )
        for p in collection.prompts
    }


def steps_of(
    collection: Collection, shape: str, tree: Tree | int, redraft_with: Redrafter | None, budget: int | None = None
) -> dict[str, tuple]:
    """Per prompt, the steps of `tree` (an int: the dynamic tree of that budget): replayed, or
    re-drafted for a cross-tokenizer collection."""
    if not collection.config.cross_tokenizer:
        return replay.replay_steps(collection, tree)
    size = budget if budget is not None else tree.num_nodes  # type: ignore[union-attr]
    runs = redrafts(collection, shape, tree, size, needs_redrafter(redraft_with))  # type: ignore[arg-type]
    return {pid: run.steps for pid, run in runs.items()}


def redraft_table(
    collection: Collection, trees: dict[tuple[str, int], Tree], dynamic_budgets: Sequence[int], redraft_with: Redrafter
) -> pd.DataFrame:
    """Every shape x budget and "dynamic" re-drafted on the run trajectory (each distinct tree once:
    the same tree under two names takes the same steps), in the columns of
    `replay_study.replay_table` (tau_all and its ratios NaN: they need the draft's ranks of the
    target's tokens), with the intervals `replay` gives."""
    rows = []
    keys = [(k, t) for k, t in trees.items()] + [((DYNAMIC, n), Tree.chain(DYNAMIC_MAX_DEPTH)) for n in dynamic_budgets]
    done: dict[tuple, dict[str, Redrafted]] = {}  # one re-draft per distinct static tree (kary2:2 is wide:2)
    for (shape, budget), tree in keys:
        same = (DYNAMIC, budget) if shape == DYNAMIC else tuple(sorted(tree.paths))
        if same not in done:
            done[same] = redrafts(collection, shape, tree, budget, redraft_with)
        runs = done[same]
        results = [
            GenerationResult(
                torch.tensor([], dtype=torch.long), run.steps, 0, math.nan, math.nan, None, "redraft"
            )  # host
            for run in runs.values()
        ]
        s = summarize(results).row()
        rows.append(
            {
                "shape": shape,
                "budget": budget,
                "nodes": budget if shape == DYNAMIC else tree.num_nodes,
                "depth": tree.depth,
                "mode": "trajectory",
                "prompts": len(runs),
                "steps": s["num_steps"],
                "drafted": s["num_drafted"],
                "accepted": s["num_accepted"],
                "tokens": s["num_tokens"],
                **{
                    k: v
                    for k, v in s.items()
                    if k in ("acceptance_rate", "acceptance_length", "tau", "draft_tokens_per_accepted")
                    or k.startswith(("depth_", "rank_"))
                },
                **_intervals(runs.values()),
                "tau_all": math.nan,
                "tau_all_over_hindsight": math.nan,
                "tau_all_over_oracle": math.nan,
            }
        )
    return pd.DataFrame(rows)


def _intervals(runs) -> dict[str, float]:
    """tau, acceptance rate and acceptance length of re-drafted runs with their 95% bootstrap
    intervals over prompts (`analysis.spread`), as `replay` gives them."""
    sums = lambda field: [sum(getattr(s, field) for s in run.steps) for run in runs]  # noqa: E731
    steps = [len(run.steps) for run in runs]
    return {
        **spread.interval_columns("tau", sums("num_tokens"), steps),
        **spread.interval_columns("acceptance_rate", sums("num_accepted"), sums("num_drafted")),
        **spread.interval_columns("acceptance_length", sums("num_accepted"), steps),
    }
