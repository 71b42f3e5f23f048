"""Quality of generated text: its perplexity under the target, and how it compares with the target's
own greedy output (exact, a numerical tie, or a mismatch).

    logit_gap(target, prompt_ids, tokens) -> float   decode-vs-verify logit difference, measured
    tie_margin(dtype, gap) -> float                   the tie margin a comparison uses
    score(target, prompt_ids, tokens) -> Score(perplexity, margins)
        one teacher-forced forward over prompt + tokens: the perplexity
        exp(-(1/n) sum_i log p(y_i | prompt, y_<i)) over the n tokens y (p = the target's raw
        softmax, no temperature), and at every position the margin between the target's two largest
        logits there (how close its greedy choice was to a tie)
    compare_greedy(tokens, reference, margins, dtype) -> Equality("exact" | "tie" | "mismatch", ...)

Why ties. Speculative decoding is exact, but on a GPU the target's logits for the same context are
computed by different kernels in a plain decode (one row), a tree verify (many rows) and a prefill,
and in float16 (with bitsandbytes' 4-bit kernels even more) they round differently. Where the
target's top two logits are closer than that rounding, the argmax can flip between two equally
valid greedy continuations. So a divergence is reported as a "tie" when, at its first position, the
reference's context (identical in both outputs up to there) gives a top-2 margin below
`TIE_MARGIN[dtype]`, and as a "mismatch" otherwise: a mismatch is a bug, a tie is arithmetic.

TIE_MARGIN is in logits, a convention: float32 1e-3; float16 0.1 and bfloat16 0.5 (a few units in
the last place of logits of magnitude ~10-30). Every run also measures its target's own gap
(`logit_gap`: the largest difference between the logits of one-row decoding and of one several-row
forward over the same tokens) and uses `tie_margin(dtype, gap)` = max(TIE_MARGIN[dtype], 2 x gap):
two logits each off by up to the gap can swap when closer than twice it. Both are stored beside
every comparison.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.cache import crop, new_cache

# below this gap between the target's two largest logits, a flipped argmax is a numerical tie
TIE_MARGIN: dict[torch.dtype, float] = {torch.float32: 1e-3, torch.float16: 0.1, torch.bfloat16: 0.5}
VERDICTS = ("exact", "tie", "mismatch")


@dataclass(frozen=True)
class Score:
    perplexity: float  # nan when there are no tokens
    margins: tuple[float, ...]  # per token: the target's top-1 minus top-2 logit where it was chosen


@dataclass(frozen=True)
class Equality:
    verdict: str  # one of VERDICTS
    position: int | None  # the first index where the outputs differ (None when exact)
    margin: float | None  # the target's top-2 margin there
    threshold: float  # the tie margin used

    @property
    def equal(self) -> bool:
        """Equal up to numerical ties: "exact" or "tie"."""
        return self.verdict != "mismatch"


def tie_margin(dtype: torch.dtype, gap: float = 0.0) -> float:
    """The tie margin for logits of `dtype` whose measured decode-vs-verify gap is `gap`."""
    return max(TIE_MARGIN.get(dtype, TIE_MARGIN[torch.float16]), 2.0 * gap)


@torch.inference_mode()
def logit_gap(target: torch.nn.Module, prompt_ids: torch.Tensor, tokens: torch.Tensor | Sequence[int]) -> float:
    """The largest |logit difference| between decoding `tokens` one row at a time after the prompt
    (the kernels of a plain decode) and one forward of all of them as several rows over the same
    prompt cache (the kernels of a tree verify): how far apart the target's two paths compute the
    same logits on this device. prompt_ids: long [1, T] or [T], T >= 1; tokens: at least one."""
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=target.device).reshape(1, -1)
    new = torch.as_tensor(tokens, dtype=torch.long, device=target.device).reshape(1, -1)
    if new.shape[1] == 0:
        raise ValueError("logit_gap needs at least one token")
    cache = new_cache(target)
    target(input_ids=prompt, cache=cache, use_cache=True)
    t = prompt.shape[1]
    rows = []
    for i in range(new.shape[1]):
        rows.append(target(input_ids=new[:, i : i + 1], cache=cache, use_cache=True).logits[0, -1].float())
    crop(cache, t)
    together = target(input_ids=new, cache=cache, use_cache=True).logits[0].float()  # [n, V]
    return float((torch.stack(rows) - together).abs().max())


@torch.inference_mode()
def score(target: torch.nn.Module, prompt_ids: torch.Tensor, new_tokens: torch.Tensor | Sequence[int]) -> Score:
    """Perplexity of `new_tokens` after the prompt, and the target's top-2 margin at every position.

    prompt_ids: long [1, T] or [T], T >= 1. new_tokens: long [n] (or a list of ids)."""
    # on the host first: a CUDA prompt and a result's tokens (kept on the CPU) are concatenated below
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).cpu()  # host: moved below
    new = torch.as_tensor(new_tokens, dtype=torch.long).reshape(-1).cpu()  # host: moved below
    if prompt.numel() == 0:
        raise ValueError("perplexity needs a prompt of at least one token")
    n = new.numel()
    if n == 0:
        return Score(math.nan, ())
    device = target.device
    seq = torch.cat([prompt, new]).to(device)[None]  # [1, T + n]
    t = prompt.numel()
    # logits at positions t-1 .. t+n-2 predict the new tokens t .. t+n-1
    logits = (
        target(input_ids=seq, attention_mask=torch.ones_like(seq), use_cache=False).logits[0, t - 1 : t - 1 + n].float()
    )
    logp = torch.log_softmax(logits, dim=-1).gather(-1, new.to(device)[:, None])[:, 0]  # [n]
    top2 = torch.topk(logits, min(2, logits.shape[-1]), dim=-1).values
    margins = (top2[:, 0] - top2[:, -1]).tolist()
    return Score(float(torch.exp(-logp.mean())), tuple(margins))


def perplexity(target: torch.nn.Module, prompt_ids: torch.Tensor, new_tokens: torch.Tensor | Sequence[int]) -> float:
    """exp(mean negative log-likelihood) of `new_tokens` under `target` given the prompt (`score`)."""
    return score(target, prompt_ids, new_tokens).perplexity


def compare_greedy(
    tokens: torch.Tensor | Sequence[int],
    reference: torch.Tensor | Sequence[int] | None,
    margins: Sequence[float] | None = None,
    dtype: torch.dtype = torch.float32,
    gap: float = 0.0,
) -> Equality:
    """`tokens` against the target's own greedy `reference`: "exact", "tie" (the first divergence is
    where the target's top-2 margin, `margins[i]` from `score` of either output, is below
    `tie_margin(dtype, gap)`; gap: the target's measured `logit_gap`) or "mismatch". No reference,
    or no margins for a divergence: "mismatch"."""
    threshold = tie_margin(dtype, gap)
    if reference is None:
        return Equality("mismatch", None, None, threshold)
    a, b = _as_list(tokens), _as_list(reference)
    if a == b:
        return Equality("exact", None, None, threshold)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    margin = float(margins[first]) if margins is not None and first < len(margins) else None
    verdict = "tie" if margin is not None and margin < threshold else "mismatch"
    return Equality(verdict, first, margin, threshold)


def greedy_equal(tokens: torch.Tensor | Sequence[int], reference: torch.Tensor | Sequence[int] | None) -> bool:
    """True when `tokens` equal `reference` token for token (False when there is no reference)."""
    return compare_greedy(tokens, reference).verdict == "exact"


def _as_list(tokens: torch.Tensor | Sequence[int]) -> list[int]:
    return tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else [int(t) for t in tokens]
