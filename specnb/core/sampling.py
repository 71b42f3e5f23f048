"""Turning logits into the distributions both models are sampled from.

The same `SamplingConfig` (temperature, then top-k, then top-p) is applied to the target's logits
(giving p) and to the draft's (giving q), so the lossless rules in `acceptance` reproduce exactly
the target's *processed* distribution. `temperature == 0` means greedy decoding.

`sample_rows` draws one token per row of a batch of logits at a temperature by a two-level inverse
CDF: a few uniform draws per row instead of the vocabulary-sized noise `torch.multinomial` draws
(which dominated batched sampling on a CPU); exact, as a statistical test checks.

`top_tokens` is the one ranking rule of specnb: the draft's rank-r token is the r-th largest logit,
ties broken by the lower token id. Every drafter and the collector of `experiments.collect` rank with
it, so ranks agree between them on every device (CUDA's `topk` has no fixed order among ties).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TypicalAcceptance:
    """Medusa's typical acceptance (Cai et al. 2024, Sec. 2.3.1), a LOSSY rule: the output no longer
    follows the target's distribution. Node x (child of row j) passes if
        p_j(x) > min(epsilon, delta * exp(-H(p_j))),   H(p) = -sum_v p(v) log(p(v) + 1e-5),
    p_j the target's distribution at row j after the sampling transforms (Medusa: softmax(z / T)).
    The step keeps the longest root-to-node path of passing nodes (ties: the largest sum of log p
    along it) and its next token is the target's ARGMAX after that path (Medusa's fast mode, the
    paper's "first token greedy"), so the rule is deterministic given the logits. Defaults are
    Medusa's `medusa_generate` (posterior_threshold 0.09, posterior_alpha 0.3 = sqrt(0.09))."""

    epsilon: float = 0.09
    delta: float = 0.3
    name: str = field(default="typical_lossy", init=False)  # the label in method names and tables
    lossy: bool = field(default=True, init=False)


@dataclass(frozen=True)
class SamplingConfig:
    """How both models' logits become tokens, and which acceptance rule checks the draft."""

    temperature: float = 0.0  # 0 = greedy (argmax); > 0 scales logits before softmax
    top_k: int = 0  # keep the k most likely tokens; 0 = all
    top_p: float = 1.0  # keep the smallest set whose probability reaches top_p; 1 = all
    seed: int | None = 0  # seeds the generation's random stream (None: from entropy); unused when greedy
    # None: lossless acceptance (`acceptance.speculative_accept`); a TypicalAcceptance: Medusa's LOSSY
    # rule, used only when sampling (greedy acceptance is exact and needs no rule)
    typical: TypicalAcceptance | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def lossy(self) -> bool:
        """True when a LOSSY rule checks the draft (typical acceptance under sampling)."""
        return self.typical is not None and not self.greedy

    def method(self, name: str) -> str:
        """A method's name, with the lossy rule's label when one applies."""
        return f"{name}_{self.typical.name}" if self.lossy else name


GREEDY = SamplingConfig()


def top_tokens(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Long [..., k]: the indices of the k largest scores per row, largest first, ties broken by
    the lower index. scores: float [..., V] (read as float32).

    Exact and stable on every device: the order is that of `order_keys` (each float32 score mapped
    to an integer of the same order, the index's complement in the low bits, so no two keys are
    equal); on a GPU, `topk` over the keys of every score. On the CPU a fast path: a float `topk`,
    then the k found ordered by their keys; a row where a score outside them equals the k-th (a tie
    at the boundary, -0.0 against 0.0, a NaN) is ranked by the keys of the whole row."""
    if scores.shape[-1] > 2**20:
        raise ValueError(f"top_tokens ranks at most 2^20 entries per row, got {scores.shape[-1]}")
    s = scores.float()
    k = min(k, s.shape[-1])
    if k == 0 or s.numel() == 0:
        return torch.zeros(*s.shape[:-1], k, dtype=torch.long, device=s.device)
    every = torch.arange(s.shape[-1], device=s.device)
    if s.device.type != "cpu":  # the fast path's check would cost a host sync per call on a GPU, where this is cheap
        return torch.topk(order_keys(s, every), k, dim=-1).indices
    values, index = torch.topk(s, k, dim=-1)
    index = index.gather(-1, torch.sort(order_keys(values, index), dim=-1, descending=True).indices)
    clean = ((s >= values[..., -1:]).sum(-1) == k) & ~values.isnan().any(-1)  # no score outside the k reaches the k-th
    if not bool(clean.all()):
        tied = ~clean
        index[tied] = torch.topk(order_keys(s[tied], every), k, dim=-1).indices
    return index


def order_keys(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Int64 keys in the order of (float32 value descending, index ascending): the value's IEEE-754
    bits (negatives flipped, so the integers order as the floats) shifted above the index's
    complement; `index` broadcasts against `values`."""
    bits = values.float().contiguous().view(torch.int32).long()
    ordered = torch.where(bits < 0, -(2**31) - 1 - bits, bits)
    return ordered * 2**20 + (2**20 - 1 - index)


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Float32 probabilities [..., V] after temperature, top-k and top-p (sampling mode only).

    logits: [..., V]
    """
    if config.greedy:
        raise ValueError("probabilities() is for sampling; greedy decoding uses argmax")
    logits = logits.float() / config.temperature
    if config.top_k and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the tokens strictly more likely already reach top_p
        drop_sorted = sorted_probs.cumsum(-1) - sorted_probs >= config.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_without_replacement(probs: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """Long [..., k]: k draws without replacement from each row of `probs`, in draw order.

    Gumbel-top-k (Kool et al. 2019): the top-k of log p + Gumbel noise are distributed as k
    sequential draws without replacement. Draws beyond a row's support are arbitrary zero-probability
    tokens; the acceptance rule skips them.
    probs: [..., V]
    """
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=torch.float32)
    exponential = (-torch.log(u.clamp_min(1e-20))).clamp_min(1e-20)  # Exp(1) draws
    gumbel = -torch.log(exponential)
    return torch.topk(probs.float().log() + gumbel, k, dim=-1).indices


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from a probability vector [V]."""
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_rows(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None, block: int = 256
) -> torch.Tensor:
    """Long [n]: one draw per row from softmax(logits / temperature), exact up to float32 rounding
    (and a 2^-20 share of the mass kept off the last token so rounding cannot step past it). logits: [n, V].

    Inverse CDF in two levels: the row's unnormalised weights are summed per block of `block`
    tokens, a uniform draw picks the block from the blocks' cumulative sums and then the token
    inside it from that block's cumulative sums. One float32 copy of the logits is the only
    vocabulary-sized buffer (weights computed in place); a token of zero weight is never drawn."""
    if temperature <= 0:
        raise ValueError(f"sample_rows needs temperature > 0, got {temperature} (greedy decoding uses argmax)")
    n, vocab = logits.shape
    blocks = -(-vocab // block)
    w = torch.zeros(n, blocks * block, device=logits.device, dtype=torch.float32)  # the tail pads with weight 0
    w[:, :vocab].copy_(logits)
    w[:, :vocab].sub_(w[:, :vocab].amax(-1, keepdim=True)).div_(temperature).exp_()
    w = w.view(n, blocks, block)
    mass = w.sum(-1)  # [n, blocks]
    cum = mass.cumsum(-1)
    # float rounding must never land outside [0, mass) at either level: there, searchsorted(right=True)
    # would pick a block or token of zero weight (or one past the end)
    below = 1 - 2**-20
    u = torch.rand(n, 1, generator=generator, device=logits.device) * cum[:, -1:] * below  # in [0, total)
    b = torch.searchsorted(cum, u, right=True)  # [n, 1]: cum[b - 1] <= u < cum[b], so block b has weight
    inside = u - (cum.gather(-1, b) - mass.gather(-1, b))  # the remainder within block b
    cum_b = w[torch.arange(n, device=logits.device), b[:, 0]].cumsum(-1)  # [n, block]
    inside = torch.minimum(inside.clamp_min(0), cum_b[:, -1:] * below)
    j = torch.searchsorted(cum_b, inside, right=True)  # the first token whose cumulative weight exceeds it
    return (b * block + j)[:, 0]


def match_vocab(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Draft probabilities [..., V_draft] over the target's vocabulary size V (models may pad their
    embeddings differently; a token outside a model's vocabulary has probability 0 there)."""
    q = q.to(p.device)
    if q.shape[-1] == p.shape[-1]:
        return q
    if q.shape[-1] > p.shape[-1]:
        return q[..., : p.shape[-1]]  # p is 0 there; such a draw is always rejected
    return torch.nn.functional.pad(q, (0, p.shape[-1] - q.shape[-1]))
