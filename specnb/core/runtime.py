"""What every generation loop shares: a clock that waits for the device, stop tokens, input checks,
seeded generators.

    Clock           wall clock that first waits for queued CUDA work (on CPU a plain perf_counter)
    synchronize     wait for queued work on a device (nothing to do on CPU)
    reset_peak_memory, peak_memory   the CUDA peak allocation of a call (None on other devices)
    check_input     input ids as long [1, T]; batches, empty prompts and max_new_tokens < 1 refused
    eos_ids         the stop tokens: the ones given, else the model's generation config; () = none
    cut_at_eos      tokens up to and including the first stop token
    make_generator  a torch.Generator on a device, seeded (None: from entropy)

Every generation loop, baseline and timing harness uses these, so a time, a stop token or a
refused input means the same everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for queued work on `device` (CUDA runs asynchronously; CPU needs nothing)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Wall clock that waits for queued work on `device` before reading the time (sync=False: it reads
    the time without waiting, so a step's draft and verify times are only what the host saw, and the
    step makes no device syncs for them)."""

    def __init__(self, device: torch.device | str, sync: bool = True) -> None:
        self.device, self.sync = torch.device(device), sync

    def now(self) -> float:
        if self.sync:
            synchronize(self.device)
        return time.perf_counter()


def reset_peak_memory(device: torch.device | str) -> None:
    """Start counting the CUDA peak allocation anew (nothing to do on other devices)."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device | str) -> int | None:
    """Bytes of the CUDA peak allocation since `reset_peak_memory`; None on other devices."""
    return int(torch.cuda.max_memory_allocated(device)) if torch.device(device).type == "cuda" else None


def check_input(input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """input_ids as long [1, T] (a [T] vector is accepted); ValueError for anything else."""
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [1, T] with T >= 1 (batch size 1), got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return input_ids.long()


def eos_ids(model: torch.nn.Module, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    """The stop tokens: `eos_token_id` if given (() = never stop), else the model's generation config."""
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
        if eos_token_id is None:
            return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(e) for e in eos_token_id)


def cut_at_eos(tokens: list[int], eos: frozenset[int]) -> tuple[list[int], bool]:
    """(tokens up to and including the first stop token, whether one was found)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1], True
    return tokens, False


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    generator = torch.Generator(device=torch.device(device))
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
