"""Cross-tokenizer collections are re-drafted, not replayed (`analysis.redraft`): a collection of a
pair whose vocabularies differ holds the target's continuation only, and each tree is drafted again
in the draft's own tokens along it, every prompt at once. `redrafter` makes the drafting of a (shape,
budget, tree) for that many prompts: a preset, a custom tree (`io.tree_spec`) or "dynamic";
`steps_of` gives a tree's steps from any collection (replayed, or re-drafted);
`redraft_table` is the replay table of a cross-tokenizer collection, with the same intervals."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import pandas as pd
import torch

from ..analysis import replay, spread
from ..analysis.collection import Collection
from ..analysis.metrics import summarize
from ..analysis.redraft import Redrafted, redraft_rows
from ..core.generation import GenerationResult, RowDrafting
from ..core.trees import Tree
from ..drafters.cross_tokenizer import CrossTokenizerRows
from ..drafters.dynamic import DynamicTreeDrafter
from ..drafters.methods import DYNAMIC, DYNAMIC_MAX_DEPTH, DYNAMIC_TOP_K
from ..drafters.retokenize import TokenText
from ..io.models import load_tokenizer


def different_vocabularies(target: str, draft: str) -> bool:
    """Whether two models' tokenizers map tokens to ids differently (a cross-tokenizer pair:
    `load_pair(..., cross_tokenizer=True)`); reads the tokenizers only."""
    return load_tokenizer(target).get_vocab() != load_tokenizer(draft).get_vocab()


Redrafter = Callable[[str, int, Tree, int], RowDrafting]  # (shape, budget, tree, rows) -> the rows' drafting


def redrafter(draft: torch.nn.Module, target_tokenizer, draft_tokenizer) -> Redrafter:
    """(shape, budget, tree, rows) -> fresh cross-tokenizer drafting of `draft` for that many prompts
    at once (`CrossTokenizerRows`: every row's tree in one draft forward per depth): a static tree (a
    preset's or a custom one, `tree`), or "dynamic", each row's own dynamic tree of that budget
    (`dynamic.DynamicTreeDrafter`, with the xtok/dynamic method's children per node and depth); the
    vocabularies read once."""
    texts = (TokenText.of(target_tokenizer), TokenText.of(draft_tokenizer))

    def rows_of(shape: str, budget: int, tree: Tree, rows: int) -> RowDrafting:
        model = draft if shape != DYNAMIC else DynamicTreeDrafter(draft, budget, DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH)
        return CrossTokenizerRows(model, texts[1], texts[0], rows)

    return rows_of


def needs_redrafter(redraft_with: Redrafter | None) -> Redrafter:
    """`redraft_with`, refused with what to pass when it is missing."""
    if redraft_with is None:
        raise ValueError(
            "a cross-tokenizer collection is re-drafted: pass redraft_with=redrafter(draft model, "
            "target tokenizer, draft tokenizer)"
        )
    return redraft_with


def redrafts(
    collection: Collection,
    shape: str,
    tree: Tree,
    budget: int,
    redraft_with: Redrafter,
    max_new_tokens: int | None = None,
) -> dict[str, Redrafted]:
    """Per prompt, the re-drafted run of (shape, budget) whose requested tree is `tree`, generating
    `max_new_tokens` (default: the collected length): every prompt at once (`redraft.redraft_rows`)."""
    max_new = (
        collection.config.max_new_tokens
        if max_new_tokens is None
        else min(max_new_tokens, collection.config.max_new_tokens)
    )
    # rows of similar length side by side: a batch of a few long prompts reads fewer keys (`core.ragged.row_spans`)
    prompts = sorted(collection.prompts, key=lambda p: len(p.prompt) + len(p.tokens))
    drafting = redraft_with(shape, budget, tree, len(prompts))
    # the continuation holds a stop token only as its last token, when it stopped: the one stop
    # token that can cut a step
    eos = [frozenset(p.tokens[-1:].tolist()) if p.stopped else frozenset() for p in prompts]
    runs = redraft_rows(
        drafting, [p.prompt.tolist() for p in prompts], [p.tokens.tolist() for p in prompts], tree, max_new, eos
    )
    return {p.prompt_id: run for p, run in zip(prompts, runs)}


def steps_of(
    collection: Collection,
    shape: str,
    tree: Tree | int,
    redraft_with: Redrafter | None,
    budget: int | None = None,
    max_new_tokens: int | None = None,
    prompt_ids: Sequence[str] | None = None,
) -> dict[str, tuple]:
    """Per prompt (those of `prompt_ids`, default all), the steps of `tree` (an int: the dynamic tree
    of that budget) in a generation of `max_new_tokens` (default the collected length): replayed, or
    re-drafted for a cross-tokenizer collection."""
    if prompt_ids is not None:
        wanted = {str(p) for p in prompt_ids}
        collection = dataclasses.replace(
            collection, prompts=tuple(p for p in collection.prompts if p.prompt_id in wanted)
        )
    if not collection.config.cross_tokenizer:
        return replay.replay_steps(collection, tree, max_new_tokens)
    size = budget if budget is not None else tree.num_nodes  # type: ignore[union-attr]
    runs = redrafts(collection, shape, tree, size, needs_redrafter(redraft_with), max_new_tokens)  # type: ignore[arg-type]
    return {pid: run.steps for pid, run in runs.items()}


def redraft_table(
    collection: Collection,
    trees: dict[tuple[str, int], Tree],
    dynamic_budgets: Sequence[int],
    redraft_with: Redrafter,
    dynamic_prompts: int | None = None,
) -> pd.DataFrame:
    """Every shape x budget and "dynamic" re-drafted on the run trajectory (each distinct tree once:
    the same tree under two names takes the same steps), in the columns of
    `replay_study.replay_table` (tau_all and its ratios NaN: they need the draft's ranks of the
    target's tokens), with the intervals `replay` gives. The same per prompt (shape, budget,
    prompt_id, category, tokens, steps, drafted, accepted) in attrs["per_prompt"]. dynamic_prompts:
    dynamic trees on the first that many prompts only (each row its own tree, batched), as dynamic
    trees of a shared vocabulary are replayed on the super-tree prompts."""
    rows, per_prompt = [], []
    categories = {p.prompt_id: p.category for p in collection.prompts}
    max_new = collection.config.max_new_tokens
    keys = [(k, t) for k, t in trees.items()] + [((DYNAMIC, n), Tree.chain(DYNAMIC_MAX_DEPTH)) for n in dynamic_budgets]
    done: dict[tuple, dict[str, Redrafted]] = {}  # one re-draft per distinct static tree (kary2:2 is wide:2)
    for (shape, budget), tree in keys:
        same = (DYNAMIC, budget) if shape == DYNAMIC else tuple(sorted(tree.paths))
        if same not in done:
            some = shape == DYNAMIC and dynamic_prompts is not None
            on = dataclasses.replace(collection, prompts=collection.prompts[:dynamic_prompts]) if some else collection
            done[same] = redrafts(on, shape, tree, budget, redraft_with)
        runs = done[same]
        results = [
            GenerationResult(
                torch.tensor([], dtype=torch.long), run.steps, 0, math.nan, math.nan, None, "redraft"
            )  # host
            for run in runs.values()
        ]
        s = summarize(results).row()
        cut = [sum(tree.depth > max_new - st.position - 1 for st in run.steps) for run in runs.values()]
        no_bonus = [sum(st.num_tokens < st.num_accepted + 1 for st in run.steps) for run in runs.values()]
        for (pid, run), c, b in zip(runs.items(), cut, no_bonus):
            per_prompt.append(
                {
                    "shape": shape,
                    "budget": budget,
                    "prompt_id": pid,
                    "category": categories[pid],
                    "tokens": sum(st.num_tokens for st in run.steps),
                    "steps": len(run.steps),
                    "drafted": sum(st.num_drafted for st in run.steps),
                    "accepted": sum(st.num_accepted for st in run.steps),
                    "cut_steps": c,
                    "no_bonus_steps": b,
                }
            )
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
                "cut_steps": sum(cut),
                "no_bonus_steps": sum(no_bonus),
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
    table = pd.DataFrame(rows)
    table.attrs["per_prompt"] = pd.DataFrame(per_prompt)
    return table


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
