"""The target's last hidden rows, what learned draft heads read (Medusa, EAGLE).

final_norm      the target's final norm: its output is the LM head's input, the "last hidden state"
FinalNormRows   that output of the target's last forward, captured by a forward hook while a
                drafter is bound to a generation (`Drafter.bind_target_cache` ... `release`):
                the heads read the verify pass's rows without a forward of their own
last_hidden     the same rows of a whole sequence from one plain causal forward (collections,
                tests: what the heads read in a real run, up to float rounding)
"""

from __future__ import annotations

import torch


def final_norm(target: torch.nn.Module) -> torch.nn.Module:
    """The target's final norm, whose output is the LM head's input (`model.norm` in Llama/Qwen)."""
    norm = getattr(getattr(target, "model", None), "norm", None)
    if norm is None:
        raise ValueError(f"{type(target).__name__} has no model.norm: draft heads need the last hidden state")
    return norm


class FinalNormRows:
    """`rows`: [n, H], the target's final-norm output of its last forward (n = the tokens it fed), or
    None before any forward while bound. A hook on the final norm, added by `bind` and removed by
    `release`; no attribute is set on the model."""

    def __init__(self, target: torch.nn.Module) -> None:
        self._norm = final_norm(target)
        self._hook: torch.utils.hooks.RemovableHandle | None = None
        self.rows: torch.Tensor | None = None

    def bind(self) -> None:
        if self._hook is None:
            self._hook = self._norm.register_forward_hook(self._capture)

    def release(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _capture(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        self.rows = output.reshape(-1, output.shape[-1])


@torch.inference_mode()
def last_hidden(target: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Float [T, H]: the target's last hidden state (after the final norm) of `ids` (long [T]), one
    plain causal forward."""
    out = target.model(input_ids=ids.reshape(1, -1).to(target.device))
    return out.last_hidden_state[0]
