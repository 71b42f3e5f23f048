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

Both sampling rules are computed for every row at once (`sibling_alphas`, `one_hot_alphas`): alpha_i
= the probability that child i is accepted given that children 0..i-1 were rejected depends only
on the row's p, q and children, not on the rounds' outcome. Drawing one uniform u_i per child and
taking the first child with u_i < alpha_i is the sequential rule, exactly; so a step reads the
device twice (the accepted children, then the corrected token), however many nodes the tree has.
`experiments.collect` stores the same alphas to replay sampled trees.

- `typical_accept` (LOSSY, opt-in): Medusa's typical acceptance, `sampling.TypicalAcceptance`.

`accept` is the one entry point every generation loop calls: it picks the rule from the sampling
settings and returns the accepted path with its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import SamplingConfig, TypicalAcceptance, match_vocab, probabilities, sample
from .trees import Tree


def accept(
    tree: Tree,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    q: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Acceptance:
    """The branch the target keeps: greedy when `sampling.greedy`, else Medusa's LOSSY typical rule
    when `sampling.typical` is set, else lossless speculative sampling.

    tokens: long [N] in the tree's canonical order; logits: the target's [N + 1, V] (row 0 the root),
    or, for a target known only by its greedy tokens (`analysis.redraft`), long [N + 1] its greedy
    token at each row (greedy sampling only); q: the draft's probabilities [N + 1, V_draft] (None:
    deterministic proposals)."""
    if not logits.is_floating_point():
        if not sampling.greedy:
            raise ValueError("a target known only by its greedy tokens accepts greedily: sampling must be greedy")
        return greedy_accept(tree, tokens, logits)
    if sampling.greedy:
        return greedy_accept(tree, tokens, logits.argmax(-1))
    p = probabilities(logits, sampling)
    if sampling.typical is not None:
        return typical_accept(tree, tokens, p, logits.argmax(-1), sampling.typical)
    return speculative_accept(tree, tokens, p, None if q is None else match_vocab(q, p), generator)


@dataclass(frozen=True)
class Acceptance:
    path: tuple[int, ...]  # accepted node indices, depth 1 downward
    next_token: int  # the target's token after the path: bonus if it extends the path, else correction
    tokens: tuple[int, ...] = field(default=(), compare=False)  # the accepted nodes' tokens

    @property
    def num_accepted(self) -> int:
        return len(self.path)


def greedy_accept(tree: Tree, tokens: torch.Tensor, target_argmax: torch.Tensor) -> Acceptance:
    """tokens: long [N] draft tokens; target_argmax: long [N + 1], the target's argmax per row."""
    toks, choice = tokens.tolist(), target_argmax.tolist()
    path, row = [], 0
    while (child := next((c for c in tree.children[row] if toks[c] == choice[row]), None)) is not None:
        path.append(child)
        row = child + 1  # the child's row: its target argmax is the next token wanted
    return Acceptance(tuple(path), choice[row], tuple(toks[i] for i in path))


def speculative_accept(
    tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None, generator: torch.Generator | None
) -> Acceptance:
    """tokens: long [N]; p: target probabilities [N + 1, V]; q: draft probabilities [N + 1, V]
    (rows of leaves are not read). Children must have been drawn without replacement from q at
    their parent, in rank order, with no rank gaps (see `Tree.has_rank_gaps`).
    q=None: the children are deterministic proposals (see the module docstring); gaps allowed."""
    if q is not None and tree.has_rank_gaps:
        raise ValueError(
            "lossless tree sampling needs sibling ranks 0..k-1 without gaps when children are drawn "
            "from q; use a gap-free tree, or a drafter that proposes deterministically (q=None)"
        )
    rows = [r for r, kids in enumerate(tree.children) if kids]  # rows with children to check
    if not rows:
        return Acceptance((), sample(p[0], generator))
    width = max(len(tree.children[r]) for r in rows)
    # children[j, i] = the node index of row rows[j]'s i-th child (order of checking), -1 = none
    children = [list(tree.children[r]) + [-1] * (width - len(tree.children[r])) for r in rows]
    index = torch.tensor(children, dtype=torch.long, device=tokens.device)
    child_tokens = torch.where(index >= 0, tokens[index.clamp_min(0)], -1)  # [R, K]
    row_index = torch.tensor(rows, dtype=torch.long, device=p.device)
    if q is None:
        alpha, residual = one_hot_alphas(p[row_index], child_tokens.to(p.device))
    else:
        alpha, residual = sibling_alphas(p[row_index], q.to(p.device)[row_index], child_tokens.to(p.device))
    u = torch.rand(alpha.shape, generator=generator, device=generator.device if generator is not None else p.device)
    accepted = u.to(alpha.device) < alpha
    first = torch.where(accepted.any(-1), accepted.int().argmax(-1), -1)  # [R]: the accepted child, -1 none
    chosen = child_tokens.to(first.device).gather(-1, first.clamp_min(0)[:, None])[:, 0]  # its token
    first, chosen = torch.stack([first, chosen]).tolist()  # one read
    slot = {r: j for j, r in enumerate(rows)}
    path: list[int] = []
    toks: list[int] = []
    row = 0
    while row in slot and first[slot[row]] >= 0:
        node = children[slot[row]][first[slot[row]]]
        path.append(node)
        toks.append(chosen[slot[row]])
        row = node + 1
    if row in slot:  # every child of this row was rejected: the correction, from the residual
        next_token = sample(residual[slot[row]], generator)
    else:  # a leaf (or the root of an empty tree): the bonus token, from p
        next_token = sample(p[row], generator)
    return Acceptance(tuple(path), next_token, tuple(toks))


def sibling_alphas(p: torch.Tensor, q: torch.Tensor, children: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-round rejection over draws without replacement from q, for every row at once.

    p, q: [B, V] at each row (any float dtype; computed in it); children: long [B, K], the child
    tokens in draw order, -1 = no child. Returns (alpha [B, K], residual p [B, V]): alpha[b, i] =
    probability that child i is accepted given children 0..i-1 were rejected, alpha_i =
    min(1, p_i(x) / q_i(x)), with p <- norm(max(p_i - q_i, 0)) and q <- norm(q_i without x) after each
    rejection; residual = p after every child was rejected (the correction token's distribution).
    A draw outside q's support is skipped (alpha 0, residuals unchanged); once q has no mass left
    the later children are never checked (alpha 0). mass == 0 for the p residual means p == q,
    where a rejection has probability 0: p is kept as it is if rounding gets there.
    """
    p, q = p.clone(), q.clone()
    alpha = torch.zeros(children.shape, dtype=p.dtype, device=p.device)
    live = torch.ones(children.shape[0], dtype=torch.bool, device=p.device)
    rows = torch.arange(children.shape[0], device=p.device)
    for i in range(children.shape[1]):
        x = children[:, i].clamp_min(0)
        qx, px = q[rows, x], p[rows, x]
        checked = live & (children[:, i] >= 0) & (qx > 0)
        alpha[:, i] = torch.where(checked, torch.clamp(px / qx.clamp_min(torch.finfo(q.dtype).tiny), max=1.0), 0.0)
        residual = (p - q).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        p = torch.where(checked[:, None] & (mass > 0), residual / mass.clamp_min(torch.finfo(p.dtype).tiny), p)
        q_rest = q.clone()
        q_rest[rows, x] = 0.0
        q_mass = q_rest.sum(-1, keepdim=True)
        live = live & ~(checked & (q_mass[:, 0] <= 0))
        q = torch.where(checked[:, None] & (q_mass > 0), q_rest / q_mass.clamp_min(torch.finfo(q.dtype).tiny), q)
    return alpha, p


def one_hot_alphas(p: torch.Tensor, children: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rounds with deterministic proposals (one-hot q): accept x with probability p_i(x),
    on rejection p <- norm(p with x zeroed). A repeat of a rejected token has probability 0.

    p: [B, V]; children: long [B, K], -1 = no child. Returns (alpha [B, K], residual p [B, V])."""
    valid = children >= 0
    x = children.clamp_min(0)
    px = p.gather(-1, x) * valid  # [B, K]
    k = children.shape[1]
    earlier = torch.ones(k, k, dtype=torch.bool, device=p.device).tril(-1)  # j < i
    repeat = ((children[:, :, None] == children[:, None, :]) & earlier & valid[:, None, :]).any(-1)  # [B, K]
    fresh = px * ~repeat  # each distinct token's mass counted once, at its first proposal
    removed = torch.cumsum(fresh, -1) - fresh  # mass zeroed before child i
    alpha = torch.where(valid & ~repeat, px / (1.0 - removed).clamp_min(torch.finfo(p.dtype).tiny), 0.0).clamp(max=1.0)
    proposed = torch.zeros_like(p).scatter_add(-1, x, valid.to(p.dtype)) > 0  # [B, V]
    residual = p.masked_fill(proposed, 0.0)
    mass = residual.sum(-1, keepdim=True)
    # mass 0: every token with probability was proposed and all were rejected, which only rounding
    # allows (a proposal with p = 1 is always accepted); keep p then
    residual = torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(p.dtype).tiny), p)
    return alpha, residual


def typical_thresholds(p: torch.Tensor, rule: TypicalAcceptance) -> torch.Tensor:
    """Float [R]: min(epsilon, delta * exp(-H(p_r))) per row of p [R, V] (Medusa's 1e-5 in the log)."""
    entropy = -(p * torch.log(p + 1e-5)).sum(-1)
    return torch.clamp(rule.delta * torch.exp(-entropy), max=rule.epsilon)


def typical_accept(
    tree: Tree,
    tokens: torch.Tensor,
    p: torch.Tensor,
    target_argmax: torch.Tensor,
    rule: TypicalAcceptance = TypicalAcceptance(),
) -> Acceptance:
    """LOSSY typical acceptance (`TypicalAcceptance`). tokens: long [N]; p: target probabilities
    [N + 1, V] (rows as in verification); target_argmax: long [N + 1], the next token's source."""
    n = tree.num_nodes
    if n == 0:
        return Acceptance((), int(target_argmax[0]))
    parents = torch.tensor(tree.parents, dtype=torch.long, device=p.device) + 1  # each node's row
    prob = p[parents, tokens.to(p.device)]  # [N]
    ok = (prob > typical_thresholds(p, rule)[parents]).tolist()
    logp = torch.log(prob).tolist()
    # best (length, sum log p) path ending at each node, in canonical (depth-sorted) order
    best: list[tuple[int, float, tuple[int, ...]]] = [(0, 0.0, ())]  # row 0: the root
    top = best[0]
    for i in range(n):
        parent = best[tree.parents[i] + 1]
        if ok[i] and (parent[0] > 0 or tree.parents[i] < 0):
            cand = (parent[0] + 1, parent[1] + logp[i], parent[2] + (i,))
        else:
            cand = (-1, 0.0, ())  # unreachable: a rejected node or a rejected ancestor
        best.append(cand)
        if cand[0] > top[0] or (cand[0] == top[0] and cand[0] > 0 and cand[1] > top[1]):
            top = cand
    path = top[2]
    row = path[-1] + 1 if path else 0
    toks = tokens.tolist()
    return Acceptance(path, int(target_argmax[row]), tuple(toks[i] for i in path))
