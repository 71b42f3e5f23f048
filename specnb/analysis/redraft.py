"""Re-drafting against a collected continuation: the exact greedy steps of any drafter with no
target forward. It answers, for drafters that have no ranks of the target's tokens (a draft of
another tokenizer, `drafters.cross_tokenizer`), what `replay` answers from ranks.

Under greedy decoding the output of exact speculative decoding is the target's greedy
continuation c_0, c_1, ... whatever the drafter (`experiments.collect` stores it, in target tokens).
So a step can be re-run by the drafter alone: it drafts after the sequence so far; the target's
argmax at each verified row is read from the continuation (at the root c_t; at a node whose path is
c_t .. c_{t+d-1}, the token c_{t+d}; at any other node no child can be accepted, so its argmax does
not matter); `greedy_accept` then picks the branch the real run picks, and the sequence advances by
the same tokens, cut at EOS and at max_new_tokens as the loop cuts them. The steps equal a real
run's (a test checks it), at the cost of the draft's forwards only.

What it cannot answer: sampling (a sampled continuation depends on the tree), wall clock, and
anything defined by draft ranks of target tokens (Sequoia's and the hindsight trees, the oracle).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.acceptance import greedy_accept
from ..core.drafting import Drafter
from ..core.generation import DrafterRows, RowDrafting, Step
from ..core.runtime import cut_at_eos
from ..core.sampling import SamplingConfig
from ..core.trees import Tree
from ..drafters.cross_tokenizer import CrossTokenizerDrafter

GREEDY = SamplingConfig()


@dataclass(frozen=True)
class Redrafted:
    """One prompt's re-drafted run."""

    steps: tuple[Step, ...]  # as `speculative_generate` records them, times 0
    # per step, the rank path in the DRAFT's tree of the draft nodes whose text the target accepted
    # (a cross-tokenizer drafter; `Step.accepted_ranks` are ranks in the verified target-token tree),
    # else the accepted ranks themselves
    draft_paths: tuple[tuple[int, ...], ...]


def redraft(
    drafter: Drafter,
    prompt: Sequence[int],
    continuation: Sequence[int],
    tree: Tree,
    max_new_tokens: int,
    eos: frozenset[int] = frozenset(),
) -> Redrafted:
    """The steps `speculative_generate(target, drafter, prompt, tree, max_new_tokens)` takes when
    the target's greedy output is `continuation` (module docstring). eos: the stop tokens."""
    drafter.reset()
    return redraft_rows(DrafterRows([drafter]), [prompt], [continuation], tree, max_new_tokens, [eos])[0]


def redraft_rows(
    drafting: RowDrafting,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    tree: Tree,
    max_new_tokens: int,
    eos: Sequence[frozenset[int]],
) -> list[Redrafted]:
    """`redraft` for B prompts at once: `drafting` drafts every row still going in one call (a
    batched drafter, e.g. `drafters.cross_tokenizer.CrossTokenizerRows`, drafts them in one forward per
    depth), each row accepts against its own continuation, and a row that has its tokens leaves the
    batch. Each row drafts as it would alone (its tree cut to the tokens it has left: `depths`), so its
    steps are its own `redraft`'s. drafting.drafters[r]: row r's own drafter (its draft-side accepted path)."""
    rows = len(prompts)
    conts = [[int(c) for c in x] for x in continuations]
    seqs = [[int(p) for p in x] for x in prompts]
    made = [0] * rows
    steps: list[list[Step]] = [[] for _ in range(rows)]
    paths: list[list[tuple[int, ...]]] = [[] for _ in range(rows)]
    active = [i for i in range(rows) if min(max_new_tokens, len(conts[i]))]
    if len(active) < rows:
        drafting.keep_rows(active)
    while active:
        caps = [max_new_tokens - made[i] - 1 for i in active]
        request = tree.truncated(max(caps))
        drafts = drafting.draft_rows([seqs[i] for i in active], request, GREEDY, [None] * len(active), caps)
        trees, results = [], []
        for i, draft, cap in zip(active, drafts, caps):
            drafted = (draft.tree if draft.tree is not None else request).truncated(cap)
            tokens = draft.tokens[: drafted.num_nodes]
            trees.append(drafted)
            results.append(greedy_accept(drafted, tokens, _argmax(drafted, tokens.tolist(), conts[i], made[i])))
        drafting.observe_rows(drafts, results)
        stay = []
        for r, (i, draft, drafted, result) in enumerate(zip(active, drafts, trees, results)):
            added, stopped = cut_at_eos(list(result.tokens) + [result.next_token], eos[i])
            steps[i].append(_step(made[i], drafted, result.path[: len(added)], len(added), draft.draft_tokens))
            seqs[i] += added
            made[i] += len(added)
            paths[i].append(_draft_path(drafting.drafters[r], seqs[i], steps[i][-1]))
            if not stopped and made[i] < min(max_new_tokens, len(conts[i])):
                stay.append(r)
        if len(stay) < len(active):
            drafting.keep_rows(stay)
            active = [active[r] for r in stay]
    return [Redrafted(tuple(steps[i]), tuple(paths[i])) for i in range(rows)]


def _argmax(tree: Tree, tokens: list[int], continuation: list[int], made: int) -> torch.Tensor:
    """The target's argmax at the root and at each node, read from its continuation: c_t at the root,
    c_{t+d} at a node whose path is c_t .. c_{t+d-1}, -1 (no child accepted) anywhere else."""
    argmax = [continuation[made]] + [-1] * tree.num_nodes
    for k in range(tree.num_nodes):
        path = tree.node_path(k)
        end = made + len(path)
        if end < len(continuation) and [tokens[j] for j in path] == continuation[made:end]:
            argmax[k + 1] = continuation[end]
    return torch.tensor(argmax)  # host: as the tokens


def _step(position: int, tree: Tree, path: tuple[int, ...], added: int, draft_tokens: int | None) -> Step:
    """The `Step` the loop records (`generation`): the path is already cut at EOS."""
    rows = (0,) + tuple(i + 1 for i in path)
    return Step(
        position=position,
        num_drafted=tree.num_nodes,
        num_accepted=len(path),
        num_tokens=added,
        draft_time=0.0,
        verify_time=0.0,
        tree_depth=tree.depth,
        accepted_ranks=tuple(tree.ranks[i] for i in path),
        child_counts=tuple(len(tree.children[r]) for r in rows),
        draft_tokens=draft_tokens,
    )


def _draft_path(drafter: Drafter, seq: list[int], step: Step) -> tuple[int, ...]:
    """The accepted rank path in the draft's own tree (cross-tokenizer drafters), else the step's."""
    if not isinstance(drafter, CrossTokenizerDrafter):
        return step.accepted_ranks
    last = drafter.last_draft
    drafter.draft_view(seq)  # what the next draft does first: it finds the draft nodes accepted
    if last is None or last.tree is None:
        return ()
    return tuple(last.tree.ranks[i] for i in drafter.accepted_nodes)
