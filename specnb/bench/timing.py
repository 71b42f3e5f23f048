"""Timing harness: wall clock of callables, fairly compared, on any device.

    Timing, measure            seconds per call of a callable: warm-up, repeated runs, the device
                               synchronised around each call; median, quartiles, min and max
    measure_interleaved        several callables round-robin (shuffled order per round), so drifts
                               of the machine fall on all of them alike; warmed up until settled
    fastest_rounds             whole generations round-robin, the order rotated by the caller (per
                               prompt, per batch size): each one's fastest result and every round's seconds
    device_name, environment_row   what every timed row carries: device, dtype, torch, threads

No timing is asserted anywhere: tables are measurements of this machine, with the machine named.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import torch

from ..core.runtime import synchronize


@dataclass(frozen=True)
class Timing:
    """Seconds per call over `repeats` timed runs after `warmup` untimed ones."""

    median_s: float
    q25_s: float
    q75_s: float
    min_s: float
    max_s: float
    repeats: int
    warmup: int

    def row(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def of(cls, times: list[float], warmup: int = 0) -> Timing:
        """The summary of `times`, seconds of timed calls made after `warmup` untimed ones."""
        q25, _, q75 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else times * 3
        return cls(statistics.median(times), q25, q75, min(times), max(times), len(times), warmup)


def measure(
    fn: Callable[[], Any],
    device: torch.device | str,
    warmup: int = 2,
    repeats: int = 7,
    setup: Callable[[], Any] | None = None,
) -> Timing:
    """Time `fn()`; `setup()` runs before every call, untimed (e.g. cropping a cache back)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times = []
    for i in range(warmup + repeats):
        if setup is not None:
            setup()
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return Timing.of(times, warmup)


def measure_interleaved(
    fns: Mapping[str, Callable[[], Any]],
    device: torch.device | str,
    warmup: int = 2,
    repeats: int = 7,
    setups: Mapping[str, Callable[[], Any]] | None = None,
    settle: float | None = None,
    most_warmup: int = 20,
) -> dict[str, Timing]:
    """Time several callables round-robin (each round runs every one once), so that a drift in the
    machine's speed (other load, clocks) falls on all of them alike and their ratios stay fair. The
    order within a round is shuffled (seeded), so that the effect of what ran just before a call
    (e.g. the caches it left) lands on every callable alike.
    setups[name]() runs, untimed, before each call of fns[name].
    Warm-up: `warmup` untimed rounds; with `settle`, more until every callable's last two untimed
    calls are within `settle` (0.1: 10%) of each other, at most `most_warmup` rounds: a first
    call's costs (allocations, a kernel picked for new shapes) stay out of the timed rounds however
    long they last. Each Timing records the warm-up rounds made."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    setups = setups or {}
    order = list(fns)
    rng = random.Random(0)
    untimed: dict[str, list[float]] = {name: [] for name in fns}
    rounds = 0
    while rounds < max(warmup, 0) or (settle is not None and rounds < most_warmup and not _settled(untimed, settle)):
        _round(fns, setups, device, order, rng, untimed)
        rounds += 1
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        _round(fns, setups, device, order, rng, times)
    return {name: Timing.of(t, rounds) for name, t in times.items()}


def _round(fns, setups, device, order: list[str], rng: random.Random, into: dict[str, list[float]]) -> None:
    """Every callable once, in a freshly shuffled order; its seconds appended to `into[name]`."""
    rng.shuffle(order)
    for name in order:
        if name in setups:
            setups[name]()
        synchronize(device)
        start = time.perf_counter()
        fns[name]()
        synchronize(device)
        into[name].append(time.perf_counter() - start)


def _settled(untimed: dict[str, list[float]], settle: float) -> bool:
    """Every callable's last two calls within `settle` of each other (a time still falling is not settled)."""
    return all(len(t) >= 2 and max(t[-2:]) <= (1 + settle) * min(t[-2:]) for t in untimed.values())


K = TypeVar("K", bound=Hashable)


def fastest_rounds(
    keys: Sequence[K], run: Callable[[K], Any], rounds: int, rotation: int
) -> tuple[dict[K, Any], dict[K, list[float]]]:
    """`run(key)` for every key, `rounds` times, interleaved in an order rotated by `rotation` (so no
    key always runs first): per key its fastest result (by `total_time`; a result without one, such
    as a refusal's text, is kept as it is) and every round's seconds, keyed in the order of `keys`."""
    best: dict[K, Any] = {}
    seconds: dict[K, list[float]] = {k: [] for k in keys}
    shift = rotation % len(keys) if keys else 0
    for _ in range(rounds):
        for k in [*keys[shift:], *keys[:shift]]:
            result = run(k)
            took = getattr(result, "total_time", None)
            if took is not None:
                seconds[k].append(took)
            if k not in best or took is None or took < best[k].total_time:
                best[k] = result
    return best, seconds


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads, {os.cpu_count()} cores)"


def environment_row(device: torch.device | str, dtype: torch.dtype) -> dict[str, str]:
    """What every timed row carries so that tables from different machines can be told apart."""
    return {"device": device_name(device), "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__}
