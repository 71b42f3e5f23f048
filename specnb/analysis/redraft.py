"""Re-drafting against a collected continuation: the exact greedy steps of any drafter with no
target forward. It answers, for drafters that have no ranks of the target's tokens (a draft of
another tokenizer, `drafters.cross_tokenizer`), what `replay` answers from ranks.

Under greedy decoding the output of exact speculative decoding is the target's greedy
continuation c_0, c_1, ... whatever the drafter (`experiments.collect` stores it, in target tokens).
So a step can be re-run by the drafter alone: it drafts after the sequence so far; the target's
argmax at each verified row is read from the continuation (at the root c_t; at a node whose path is
c_t .. c_{t+d-1}, the token c_{t+d}; at any other node no child can be accepted, so its argmax does
not matter); the acceptance rule then picks the branch the real run picks, and the sequence advances
by the same tokens. It runs in the generation loop itself (`core.generation.Loop`: the same step, the
same cuts at EOS and max_new_tokens, the same `Step` records, times 0), with the continuation read
back as the target's side (`ContinuationRows`). The steps equal a real run's (a test checks it), at
the cost of the draft's forwards only.

What it cannot answer: sampling (a sampled continuation depends on the tree), wall clock, and
anything defined by draft ranks of target tokens (Sequoia's and the hindsight trees, the oracle).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.drafting import Drafter
from ..core.generation import DrafterRows, Loop, Meter, Request, RowDrafting, Step
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
    """`redraft` for B prompts at once, through the generation loop itself (`core.generation.Loop`):
    `drafting` drafts every row still going in one call (a batched drafter, e.g.
    `drafters.cross_tokenizer.CrossTokenizerRows`, drafts them in one forward per depth), the target's
    side is each row's continuation read back (`ContinuationRows`), and a row leaves the batch at its
    stop token, its max_new_tokens or its continuation's end. Each row drafts as it would alone (its
    tree cut to the tokens it has left), so its steps are its own `redraft`'s. drafting.drafters[r]:
    row r's own drafter (its draft-side accepted path)."""
    conts = [[int(c) for c in x] for x in continuations]
    state = ContinuationRows(conts)
    paths: list[list[tuple[int, ...]]] = [[] for _ in conts]

    def after(i: int, r: int, sequence: list[int], step: Step) -> None:
        paths[i].append(_draft_path(drafting.drafters[r], sequence, step.accepted_ranks))

    loop = Loop(
        None,
        state,
        drafting,
        Request(tree, max_new_tokens, GREEDY),
        [None] * len(conts),
        list(eos),
        Meter("cpu", sync=False, kv=False, timed=False),
    )
    _, steps = loop.run([[int(p) for p in x] for x in prompts], ends=[len(c) for c in conts], after=after)
    return [Redrafted(tuple(steps[i]), tuple(paths[i])) for i in range(len(conts))]


class ContinuationRows:
    """The target's side of a re-drafted step (a `core.generation.Rows`): each row's greedy
    continuation read back instead of a forward. `verify` gives the target's greedy token at each
    row's root and tree nodes (`_argmax`), `commit` advances each row by its accepted path and the
    bonus token (a row that stops there leaves the batch before its next step)."""

    def __init__(self, continuations: list[list[int]]) -> None:
        self.continuations = continuations
        self.made = [0] * len(continuations)  # tokens of each row's continuation behind its root
        self.rows = list(range(len(continuations)))  # the prompt of each row still in the batch

    def verify(self, target: object, roots: list[int], trees: list[Tree], tokens: torch.Tensor) -> torch.Tensor:
        """Long [B, N + 1]: each row's greedy token at its root and at each node of its tree."""
        width = max(t.num_nodes for t in trees) + 1
        out = torch.full((len(trees), width), -1, dtype=torch.long)  # host: read by the acceptance on the host
        for r, (i, tree) in enumerate(zip(self.rows, trees)):
            out[r, : tree.num_nodes + 1] = _argmax(tree, tokens[r].tolist(), self.continuations[i], self.made[i])
        return out

    def commit(self, paths: list[tuple[int, ...]]) -> None:
        for i, path in zip(self.rows, paths):
            self.made[i] += len(path) + 1

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def kv_bytes(self) -> int:
        return 0


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


def _draft_path(drafter: Drafter, seq: list[int], accepted_ranks: tuple[int, ...]) -> tuple[int, ...]:
    """The accepted rank path in the draft's own tree (cross-tokenizer drafters), else the step's."""
    if not isinstance(drafter, CrossTokenizerDrafter):
        return accepted_ranks
    last = drafter.last_draft
    drafter.draft_view(seq)  # what the next draft does first: it finds the draft nodes accepted
    if last is None or last.tree is None:
        return ()
    return tuple(last.tree.ranks[i] for i in drafter.accepted_nodes)
