"""Quality of generated text: its perplexity under the target, and equality with the target's own
greedy output.

    perplexity(target, prompt_ids, new_tokens) = exp(-(1/n) sum_i log p(y_i | prompt, y_<i))

over the n generated tokens y (p = the target's distribution, no temperature: the model's raw
softmax), in one teacher-forced forward pass over prompt + y. Speculative decoding is lossless,
so a greedy run's perplexity equals that of the target's own greedy output, and a sampled run's
is distributed like the target's; a difference flags a bug (or floating-point drift that changed
a token). The seed project reports it per method.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


@torch.inference_mode()
def perplexity(target: torch.nn.Module, prompt_ids: torch.Tensor, new_tokens: torch.Tensor | Sequence[int]) -> float:
    """exp(mean negative log-likelihood) of `new_tokens` under `target` given the prompt; nan when
    there are no new tokens.

    prompt_ids: long [1, T] or [T], T >= 1. new_tokens: long [n] (or a list of ids).
    """
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)
    new = torch.as_tensor(new_tokens, dtype=torch.long).reshape(-1)
    if prompt.numel() == 0:
        raise ValueError("perplexity needs a prompt of at least one token")
    n = new.numel()
    if n == 0:
        return math.nan
    device = target.device
    seq = torch.cat([prompt, new]).to(device)[None]  # [1, T + n]
    t = prompt.numel()
    # logits at positions t-1 .. t+n-2 predict the new tokens t .. t+n-1
    logits = target(input_ids=seq, attention_mask=torch.ones_like(seq), use_cache=False).logits[0, t - 1 : t - 1 + n]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, new.to(device)[:, None])[:, 0]  # [n]
    return float(torch.exp(-logp.mean()))


def greedy_equal(tokens: torch.Tensor | Sequence[int], reference: torch.Tensor | Sequence[int] | None) -> bool:
    """True when `tokens` equal `reference` token for token (False when there is no reference)."""
    if reference is None:
        return False
    return _as_list(tokens) == _as_list(reference)


def _as_list(tokens: torch.Tensor | Sequence[int]) -> list[int]:
    return tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else [int(t) for t in tokens]
