"""Medusa heads (Cai et al. 2024, Medusa-1): K extra decoding heads on the target's last hidden state.

    MedusaHeads       K heads, each a residual SiLU block h + SiLU(W1 h + b) then a vocabulary
                      projection W2 initialised from the target's LM head; a `torch.nn.ModuleList`
                      whose state dict has exactly the published key layout (`{h}.0.linear.weight`,
                      `{h}.0.linear.bias`, `{h}.1.weight`; `io.medusa_checkpoint` reads and writes it)
    MedusaDrafter     fills any tree from the heads: node at rank path (r1..rd) gets head d's
                      r_d-th token, whatever r1..r_{d-1} are (Medusa's `generate_candidates`), so
                      every preset shape, Sequoia trees and Medusa's own accuracy-greedy tree apply
    head_inputs       the hidden-state rows the heads read for every step of a continuation (replay)

Index identity (Medusa's training: logits[i, :, :-(2+i)] vs labels[2+i:]). With h_q the target's
last hidden state (after the final norm, the LM head's input) at sequence position q, the LM head
on h_q gives token q+1 and head d (1-based) gives token q+1+d. In a speculative step the root is
the last token of the sequence (q+1, the previous step's next token) and head d fills depth d, so
the heads read h of the token BEFORE the root: the verify row that produced the root. That row was
computed by the previous verify pass (or by the prompt's prefill before the first step): drafting
costs no target forward, only the K heads on one vector. A forward hook on the target's final norm
keeps the rows of the target's last forward while the drafter is bound to a generation (registered
by `bind_target_cache`, removed by `release` and `reset`).

The proposals are deterministic (q=None): lossless sampling accepts them exactly (`acceptance`,
one-hot rounds), and sibling rank gaps are allowed.

`MedusaHeads.from_target(target, k, share_lm_head=True)` (the default) points every head's W2 at
the target's own LM-head weight (one frozen tensor; only the residual blocks train, as in Medusa's
legacy variant); a saved checkpoint still holds one `{h}.1.weight` per head, as published, and a
load re-shares them when they equal the target's weight.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..core.acceptance import Acceptance
from ..core.drafting import Draft, Drafter
from ..core.sampling import SamplingConfig, top_tokens
from ..core.trees import Tree
from ..io.medusa_checkpoint import check_layout, load_checkpoint, save_checkpoint
from .hidden_rows import FinalNormRows


class ResBlock(torch.nn.Module):
    """x + SiLU(linear(x)); zero weight and bias at init, so the block starts as the identity
    (Medusa zeroes the weight only: its bias keeps PyTorch's default init)."""

    def __init__(
        self, hidden_size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, hidden_size, device=device, dtype=dtype)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)
        self.act = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(torch.nn.ModuleList):
    """K Medusa-1 heads: head h = Sequential(ResBlock x layers, Linear(H, V, bias=False)).

    The residual blocks are made on `device` in `dtype`; the projections (V x H each, the bulk of
    the weights) are made on the meta device, holding no memory, until `share_lm_head`,
    `copy_lm_head` (or the `lm_head` argument) or a checkpoint (`from_state_dict`) gives them their
    weights. forward(h: [..., H]) -> logits [K, ..., V]: head d (index d - 1) predicts the token
    d + 1 positions after the one h belongs to (the module docstring); the blocks and the
    projections may differ in dtype (float32 trainable blocks on a float16 target's LM head)."""

    def __init__(
        self,
        num_heads: int,
        hidden_size: int,
        vocab_size: int,
        num_layers: int = 1,
        lm_head: torch.Tensor | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 1, got {num_heads}, {num_layers}")
        heads = []
        for _ in range(num_heads):
            # independent blocks (Medusa repeats one)
            blocks = [ResBlock(hidden_size, device, dtype) for _ in range(num_layers)]
            proj = torch.nn.Linear(hidden_size, vocab_size, bias=False, device="meta")
            heads.append(torch.nn.Sequential(*blocks, proj))
        super().__init__(heads)
        self.hidden_size, self.vocab_size, self.num_layers = hidden_size, vocab_size, num_layers
        if lm_head is not None:
            self.copy_lm_head(lm_head)

    @property
    def num_heads(self) -> int:
        return len(self)

    @property
    def shares_lm_head(self) -> bool:
        """Every head's projection is one tensor (the target's LM head, frozen)."""
        first = self[0][-1].weight
        return all(h[-1].weight is first for h in self) and not first.requires_grad

    @classmethod
    def from_target(
        cls,
        target: torch.nn.Module,
        num_heads: int,
        num_layers: int = 1,
        share_lm_head: bool = True,
        dtype: torch.dtype = torch.float32,
    ) -> MedusaHeads:
        """Heads for `target`, on its device: W2 = its LM head (shared and frozen, in the target's
        dtype, or one trainable copy per head in `dtype`, as Medusa-1 does), the residual blocks the
        identity, in `dtype`. float32 by default whatever the target's dtype: trainable parameters
        stay float32 (AdamW on float16 parameters, a T4 target's, tends to NaN)."""
        weight = target.get_output_embeddings().weight
        heads = cls(num_heads, weight.shape[1], weight.shape[0], num_layers, device=weight.device, dtype=dtype)
        if share_lm_head:
            heads.share_lm_head(weight)
        else:
            heads.copy_lm_head(weight)
        return heads

    def share_lm_head(self, weight: torch.Tensor) -> None:
        """Point every head's projection at `weight` [V, H] (no copy; not trained)."""
        self._check_projection(weight)
        shared = torch.nn.Parameter(weight.detach(), requires_grad=False)
        for h in self:
            h[-1].weight = shared

    def copy_lm_head(self, weight: torch.Tensor) -> None:
        """Give every head its own trainable copy of `weight` [V, H] (Medusa-1's initialisation), in
        the blocks' dtype and device."""
        self._check_projection(weight)
        for h in self:
            h[-1].weight = torch.nn.Parameter(weight.detach().to(h[0].linear.weight, copy=True))

    def _check_projection(self, weight: torch.Tensor) -> None:
        if tuple(weight.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(
                f"LM head of shape {tuple(weight.shape)}; these heads need ({self.vocab_size}, {self.hidden_size})"
            )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = []
        for h in self:
            z = h[:-1](hidden.to(h[0].linear.weight.dtype))
            out.append(h[-1](z.to(h[-1].weight.dtype)))
        return torch.stack(out)

    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters a training step updates (W2 only when not shared)."""
        seen: set[int] = set()
        out = []
        for p in self.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor], lm_head: torch.Tensor | None = None) -> MedusaHeads:
        """Heads from a state dict in the published layout (K and layers read from the keys, shapes
        checked), holding its tensors (their dtype and device: nothing allocated or copied here).
        lm_head: the target's LM-head weight; when every head's saved projection equals it, the heads
        share it instead of holding K copies."""
        num_heads, layers = check_layout(state)
        proj = state[f"0.{layers}.weight"]
        heads = cls(num_heads, proj.shape[1], proj.shape[0], layers, device="meta")  # no memory, no random init
        shared = lm_head is not None and all(
            torch.equal(state[f"{h}.{layers}.weight"].to(lm_head.device, lm_head.dtype), lm_head)
            for h in range(num_heads)
        )
        if shared:
            state = {k: v for k, v in state.items() if not k.endswith(f".{layers}.weight")}
        # assign: the tensors themselves, their dtype and device
        heads.load_state_dict(dict(state), strict=not shared, assign=True)
        if shared:
            heads.share_lm_head(lm_head)
        return heads

    def save(self, folder: str, base_model: str, dtype: torch.dtype | None = None) -> None:
        """Write the published layout (`io.medusa_checkpoint`), one projection per head."""
        save_checkpoint(folder, self.published_state_dict(), base_model, dtype)

    @classmethod
    def load(cls, name_or_path: str, target: torch.nn.Module | None = None) -> MedusaHeads:
        """Heads from a checkpoint folder or hub id, in the target's dtype and device (float32 when
        no target); projections equal to the target's LM head are shared with it."""
        state, _ = load_checkpoint(name_or_path)
        if target is None:
            return cls.from_state_dict({k: v.float() for k, v in state.items()})
        weight = target.get_output_embeddings().weight
        state = {k: v.to(weight.device, weight.dtype) for k, v in state.items()}
        return cls.from_state_dict(state, lm_head=weight.detach())

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict as published (`{h}.{l}.linear.weight`, `{h}.{l}.linear.bias`, `{h}.{L}.weight`),
        one projection tensor per head even when shared."""
        return {k: v.detach() for k, v in self.state_dict(keep_vars=True).items()}


@torch.inference_mode()
def head_ranks(heads: MedusaHeads, hidden: torch.Tensor, tokens: torch.Tensor, top_k: int) -> torch.Tensor:
    """Int [T, K]: rank (0 = most likely, `top_tokens` order) of tokens[t + d] under head d + 1
    applied to hidden[t]; top_k where it is >= top_k or past the end. hidden: [T, H] rows whose
    LM-head token is tokens[t] (tokens: long [T + something])."""
    t, k = hidden.shape[0], heads.num_heads
    out = torch.full((t, k), top_k, dtype=torch.long)  # host: ranks are numpy-bound
    for lo in range(0, t, 256):
        logits = heads(hidden[lo : lo + 256].to(heads[0][0].linear.weight))  # [K, B, V]
        top = top_tokens(logits, top_k).cpu()  # [K, B, top_k]
        for d in range(k):
            idx = torch.arange(lo, min(lo + 256, t)) + d  # host: indexes the host tokens
            want = torch.where(idx < tokens.numel(), tokens.cpu()[idx.clamp(max=tokens.numel() - 1)], -1)
            hit = top[d] == want[:, None]
            out[lo : lo + hit.shape[0], d] = torch.where(hit.any(-1), hit.int().argmax(-1), top_k)
    return out


class MedusaDrafter(Drafter):
    """Drafts any tree (depth <= K) from Medusa heads on the target's own hidden states.

    The heads read the verify row of the last accepted token (module docstring). The first step
    reads the prompt's prefill (the loop prefills prompt[:-1] for drafters that share the target's
    cache); a one-token prompt has no such row, so its first draft is empty (budget 0).
    tree: the default tree (e.g. Medusa's own, `tree_design.medusa_tree`).
    """

    shares_target_cache = True

    def __init__(self, target: torch.nn.Module, heads: MedusaHeads, tree: Tree | None = None) -> None:
        self.target, self.heads = target, heads
        self.default_tree = tree
        self._target_rows = FinalNormRows(target)  # the final norm's output of the target's last forward
        self.reset()

    def reset(self) -> None:
        self.release()
        self._target_rows.rows = None
        self._h: torch.Tensor | None = None  # [H]: the row the next draft reads

    def bind_target_cache(self, cache) -> None:
        self._target_rows.bind()

    def release(self) -> None:
        """Remove the hook on the target's final norm (also done by `reset`)."""
        self._target_rows.release()

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        if tree.depth > self.heads.num_heads:
            raise ValueError(
                f"a tree of depth {tree.depth} needs {tree.depth} Medusa heads; these are "
                f"{self.heads.num_heads}: use a tree of depth <= {self.heads.num_heads}"
            )

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        # the verify rows are [pending..., root, nodes]: the last N + 1 captured ones
        n = draft.tokens.numel()
        row = acceptance.path[-1] + 1 if acceptance.path else 0
        self._h = self._target_rows.rows[self._target_rows.rows.shape[0] - (n + 1) + row]

    @torch.inference_mode()
    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        self.check_request(tree, sampling)
        h = self._h
        if h is None and self._target_rows.rows is not None and tokens.numel() >= 2:
            h = self._target_rows.rows[-1]  # the prefill of prompt[:-1]: the row of the token before the root
        if h is None or tree.num_nodes == 0:
            return Draft(torch.zeros(0, dtype=torch.long, device=self.target.device), None, Tree(()))
        logits = self.heads(h.to(self.heads[0][0].linear.weight))  # [K, V]
        width = max(tree.ranks) + 1
        top = top_tokens(logits[: tree.depth], width)  # [depth, width]
        depth = torch.tensor(tree.depths, device=top.device) - 1
        rank = torch.tensor(tree.ranks, device=top.device)
        return Draft(top[depth, rank], None)
