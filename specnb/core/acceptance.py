"""Acceptance rules: which branch of a verified tree the target keeps, and its next token.

Pure functions of (tree, tokens, p, q, random generator); no model, no disk. Rows are indexed as in
verification: row 0 is the root, row i + 1 is tree node i.

- `greedy_accept`: walk down from the root while some child's token equals the target's argmax at
  the parent; the argmax after the last accepted node is the bonus token. The result is the
  target's own greedy continuation, token for token.
- `speculative_accept`: lossless sampling for chains and trees. Children of a node are drawn
  *without replacement* from q at that node (rank r = the r-th draw), and checked one by one with
  multi-round rejection (SpecInfer, Miao et al. 2024, Alg. 2, in the without-replacement form of
  Sequoia, Chen et al. 2024, Alg. 1): child x is accepted with probability min(1, p(x) / q(x));
  on rejection p <- norm(max(p - q, 0)) and q <- norm(q with x removed). If every child is
  rejected, the next token is drawn from the final residual p. For a chain (one child per node)
  this is exactly the rule of Leviathan et al. 2023 / Chen et al. 2023. Each round is a Leviathan
  step with proposal q_i, which emits a sample of p_i for any q_i, so the token emitted at a node is
  distributed exactly as p at that node: the output follows the target's distribution.
  With `q=None` the children are *deterministic* proposals (n-gram matches, top-k dynamic trees,
  merged drafts): a proposal is a draw from the one-hot distribution at its token, so the same
  rounds become: accept x with probability p(x); on rejection p <- norm(p with x zeroed). Any set
  of distinct or repeated tokens, chosen without looking at the target, is then lossless (a repeat
  of a rejected token has p = 0 and is rejected), and sibling ranks may have gaps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample
from .trees import Tree


@dataclass(frozen=True)
class Acceptance:
    path: tuple[int, ...]  # accepted node indices, depth 1 downward
    next_token: int  # the target's token after the path: bonus if it extends the path, else correction

    @property
    def num_accepted(self) -> int:
        return len(self.path)


def greedy_accept(tree: Tree, tokens: torch.Tensor, target_argmax: torch.Tensor) -> Acceptance:
    """tokens: long [N] draft tokens; target_argmax: long [N + 1], the target's argmax per row."""
    toks = tokens.tolist()
    choice = target_argmax.tolist()
    path: list[int] = []
    row = 0
    while True:
        want = choice[row]
        child = next((c for c in tree.children[row] if toks[c] == want), None)
        if child is None:
            return Acceptance(tuple(path), want)
        path.append(child)
        row = child + 1


def speculative_accept(
    tree: Tree,
    tokens: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Acceptance:
    """tokens: long [N]; p: target probabilities [N + 1, V]; q: draft probabilities [N + 1, V]
    (rows of leaves are not read). Children must have been drawn without replacement from q at
    their parent, in rank order, with no rank gaps (see `Tree.has_rank_gaps`).
    q=None: the children are deterministic proposals (see the module docstring); gaps allowed."""
    if q is None:
        return _deterministic_accept(tree, tokens, p, generator)
    if tree.has_rank_gaps:
        raise ValueError(
            "lossless tree sampling needs sibling ranks 0..k-1 without gaps when children are drawn "
            "from q; use a gap-free tree, or a drafter that proposes deterministically (q=None)"
        )
    toks = tokens.tolist()
    path: list[int] = []
    row = 0
    while True:
        p_row = p[row]
        q_row = q[row]
        accepted = None
        for child in tree.children[row]:
            x = toks[child]
            qx = float(q_row[x])
            if qx <= 0.0:  # a draw past q's support is no draw from q: skip it, p unchanged
                continue
            u = float(torch.rand((), generator=generator, device=p_row.device))
            if u * qx < float(p_row[x]):
                accepted = child
                break
            residual = (p_row - q_row).clamp_min(0.0)
            mass = float(residual.sum())
            # mass == 0 means p == q, where rejection has probability 0; keep p if rounding got here
            p_row = residual / mass if mass > 0.0 else p_row
            q_row = q_row.clone()
            q_row[x] = 0.0
            q_mass = float(q_row.sum())
            if q_mass <= 0.0:
                break
            q_row = q_row / q_mass
        if accepted is None:
            return Acceptance(tuple(path), sample(p_row, generator))
        path.append(accepted)
        row = accepted + 1


def _deterministic_accept(
    tree: Tree, tokens: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None
) -> Acceptance:
    """Multi-round rejection with one-hot proposals: accept x w.p. p(x), else zero x in p."""
    toks = tokens.tolist()
    path: list[int] = []
    row = 0
    while True:
        p_row = p[row]
        accepted = None
        for child in tree.children[row]:
            x = toks[child]
            px = float(p_row[x])
            u = float(torch.rand((), generator=generator, device=p_row.device))
            if u < px:
                accepted = child
                break
            if px > 0.0:
                p_row = p_row.clone()
                p_row[x] = 0.0
                mass = float(p_row.sum())
                if mass <= 0.0:  # only rounding can get here (px < 1 was rejected)
                    break
                p_row = p_row / mass
        if accepted is None:
            return Acceptance(tuple(path), sample(p_row, generator))
        path.append(accepted)
        row = accepted + 1
