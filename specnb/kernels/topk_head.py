"""A draft's LM head that reads half the bytes and still ranks its top k exactly.

A CPU draft forward is bound by reading weights, and the LM head is a large part of them. A greedy
drafter needs only the top k tokens of each row (k = the next level's width: 1 for a chain), so

    TopKHead(weight)(hidden, k)
        1. approximate logits a = x W^T from a bfloat16 copy of W (oneDNN-prepacked on the CPU: half
           the bytes of the float32 head), x rounded to bfloat16, products summed in float32;
        2. a bound b_j >= |a_j - t_j| for every token j, t the float32 logits x W^T: bfloat16 rounds x
           and W to 8 significant bits (unit roundoff u = 2^-8), so |x~ w~ - x w| <= (2u + u^2)|x||w|
           per product; the products are summed in float32 (g = H u32, u32 = 2^-24, a first-order
           bound, Higham 2002 section 3.1) and the sum is rounded to bfloat16 on output (u); by
           Cauchy-Schwarz sum_i |x_i||W_ji| <= ||x|| ||W_j||, so
           b_j = (2u + u^2 + (g + u (1 + g)) (1 + u)^2) ||x|| ||W_j|| (row norms computed once);
        3. L = the k-th largest of a - b: at least k tokens have t >= L, so a token with a_j + b_j < L
           is not in the top k of t. The others get their float32 logits from the dense weight's rows;
        4. the returned row holds those float32 values and a elsewhere, every a there below L <= the
           k-th float32 value among the candidates: its top k (`sampling.top_tokens`) is the top k of t.

So a greedy draft proposes the tokens its float32 head would (up to float32 rounding, which any two
kernels already differ by). k = 0 returns a itself: a sampled draft reports the q it samples from
(`core.acceptance` stays lossless for any q), and a confidence threshold reads a's softmax, which
may differ from the float32 head's near the threshold. Memory: a bfloat16 copy of the head (half
its float32 size) besides the dense float32 weight the recheck reads (on the oneDNN path,
`kernels.cpu_linear`, a dense copy beside the prepacked head), once per draft model.
`draft_head` builds one for a float32 CPU draft where oneDNN runs bfloat16 natively, else None.
"""

from __future__ import annotations

import weakref

import torch

U_BF16 = 2.0**-8  # unit roundoff of bfloat16 (8 significant bits, round to nearest)
U_F32 = 2.0**-24
MIN_WEIGHT = 4_000_000  # smaller heads (V x H entries) gain too little to be worth a second copy


class TopKHead:
    """The LM head y = x W^T (+ bias) for drafting: top k exact per row, half the bytes (module docstring).

    weight: float32 [V, H], dense (the head's own weight, read for the rechecked rows only);
    bias: float32 [V] or None."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError(f"TopKHead takes a float32 [V, H] weight, got {weight.dtype} {tuple(weight.shape)}")
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach().float()
        low = self.weight.to(torch.bfloat16)
        self._packed = weight.device.type == "cpu"
        self.low = torch.ops.mkldnn._reorder_linear_weight(low, 16) if self._packed else low
        hidden = weight.shape[1]
        g = hidden * U_F32
        self._coef = 2 * U_BF16 + U_BF16**2 + (g + U_BF16 * (1 + g)) * (1 + U_BF16) ** 2
        self._floor = 1e-6  # absolute slack: bfloat16 dot products flush subnormals (far below any bound that matters)
        self.row_norms = self.weight.norm(dim=1)  # [V]

    def approximate(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 [n, V]: x [n, H] times the bfloat16 weight (the bias added)."""
        xb = x.to(torch.bfloat16)
        if self._packed:
            a = torch.ops.mkldnn._linear_pointwise(xb, self.low, None, "none", [], "").float()
        else:
            a = torch.nn.functional.linear(xb, self.low).float()
        return a if self.bias is None else a + self.bias

    def bound(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 [n, V]: b >= |approximate(x) - x W^T| entry by entry (module docstring, step 2)."""
        return self._coef * x.norm(dim=1, keepdim=True) * self.row_norms + self._floor

    def __call__(self, x: torch.Tensor, k: int = 0) -> torch.Tensor:
        """Float32 logits [n, V] of hidden rows x [n, H] whose top k per row are the float32 head's."""
        x = x.reshape(-1, x.shape[-1]).float()
        a = self.approximate(x)
        if k <= 0:
            return a
        k = min(k, a.shape[-1])
        bound = self.bound(x)  # [n, V]
        floor = torch.topk(a - bound, k, dim=-1).values[:, -1:]  # [n, 1]: the k-th largest lower bound
        rows, cols = torch.nonzero(a + bound >= floor, as_tuple=True)  # the candidates
        exact = (x[rows] * self.weight[cols]).sum(-1)
        if self.bias is not None:
            exact = exact + self.bias[cols]
        return a.index_put((rows, cols), exact)


_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # LM head module -> its TopKHead (a memo)


def draft_head(model: torch.nn.Module) -> TopKHead | None:
    """The TopKHead of `model`'s LM head where it pays: a float32 model on the CPU, oneDNN with native
    bfloat16, a head of at least MIN_WEIGHT entries; else None (the model's own head is used).

    Made once per LM head module and shared by every drafter of that model (a memo keyed weakly by
    the module: a frozen draft's head is a pure function of its weights), so ten drafters of one draft
    hold one copy."""
    module = model.get_output_embeddings()
    if module in _MADE:
        return _MADE[module]
    weight = getattr(module, "weight", None)  # a PackedLinear's is a dense copy, kept by the TopKHead
    usable = (
        weight is not None
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.numel() >= MIN_WEIGHT
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )
    head = TopKHead(weight, getattr(module, "bias", None)) if usable else None
    _MADE[module] = head
    return head
