"""Executors: one plain function mapped over work units, in this process or on a Ray cluster.

    Executor        the interface: map(load, work, units) -> Outcome; `load()` makes what a worker
                    keeps (a model pair), `work(models, unit)` does one unit
    LocalExecutor   the units one after another in this process (the default)
    RayExecutor     Ray actors, each calling `load()` once and `work` for many units; `num_gpus` per
                    actor where the cluster has GPUs (Ray is an optional dependency: `specnb[ray]`)
    executor_for    the notebooks' parameters ("local" / "ray", the Ray address) -> an executor
    start_ray       `ray.init` that, when it fails, stops the servers it started
    Progress, Failure, WorkerInfo, Outcome

Both executors retry a unit that fails (it raised, or its worker died) up to their `retries` more times,
at the back of the queue, then report it by name (`Failure`) without stopping the other units. A
unit may therefore run more than once (its worker died after writing, or two collections share a
folder), so `work` must be idempotent: the collection's units skip themselves when their file
exists, and their files are written atomically (`analysis.collection`). That is why the Ray driver
is a small loop over `ray.wait` rather than `ray.util.ActorPool`: a dead actor's unit goes back to
the queue and a new actor takes the dead one's place (at most `replacements` in all), where
ActorPool would raise.
"""

from __future__ import annotations

import abc
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RAY_INSTALL = 'pip install "specnb[ray]" (or: pip install "ray[default]")'


@dataclass(frozen=True)
class Progress:
    """Where a map stands, passed to `on_progress` after every finished attempt."""

    total: int  # units handed to the executor
    done: int  # finished
    failed: int  # given up after their retries
    retried: int  # attempts that failed and were queued again
    workers: tuple[WorkerInfo, ...]  # workers now running (Ray: actors that loaded their models)
    lost_workers: int  # workers that died or could not start


@dataclass(frozen=True)
class Failure:
    """A unit given up on after 1 + retries attempts."""

    unit: str  # the unit's name
    attempts: int
    error: str  # the last attempt's error, one line
    exception: BaseException | None = field(default=None, compare=False, repr=False)  # when it could be kept


@dataclass(frozen=True)
class WorkerInfo:
    node: str  # host name
    pid: int  # the worker's process id (a Ray actor's process)
    load_s: float  # seconds `load()` took there


@dataclass(frozen=True)
class Outcome:
    """What a map did: each finished unit's result by name, the failures, the workers."""

    results: dict[str, Any]
    failures: tuple[Failure, ...]
    attempts: dict[str, int]  # failed attempts per unit name (units that never failed are absent)
    workers: tuple[WorkerInfo, ...]  # every worker that started, replacements included
    lost_workers: int
    retried: int
    startup_s: float  # until the first worker was ready to take units
    seconds: float  # the whole map


class _Ledger:
    """Attempts, results and failures of one map (the bookkeeping both executors share)."""

    def __init__(self, total: int, retries: int, on_progress: Callable[[Progress], None] | None) -> None:
        self.total, self.retries, self.on_progress = total, retries, on_progress
        self.started = time.perf_counter()  # the map's start: its times count from here
        self.results: dict[str, Any] = {}
        self.failures: list[Failure] = []
        self.attempts: dict[str, int] = {}
        self.retried = 0

    def succeeded(self, unit: Any, result: Any) -> None:
        self.results[unit.name] = result

    def failed(self, unit: Any, error: str, exception: BaseException | None = None) -> bool:
        """Count a failed attempt; True if the unit should be tried again."""
        self.attempts[unit.name] = self.attempts.get(unit.name, 0) + 1
        if self.attempts[unit.name] <= self.retries:
            self.retried += 1
            return True
        self.failures.append(Failure(unit.name, self.attempts[unit.name], error, exception))
        return False

    def report(self, workers: Sequence[WorkerInfo], lost: int) -> None:
        if self.on_progress is not None:
            self.on_progress(
                Progress(self.total, len(self.results), len(self.failures), self.retried, tuple(workers), lost)
            )

    def outcome(self, workers: Sequence[WorkerInfo], lost: int = 0, ready: float | None = None) -> Outcome:
        now = time.perf_counter()
        return Outcome(
            dict(self.results),
            tuple(self.failures),
            dict(self.attempts),
            tuple(workers),
            lost,
            self.retried,
            (ready if ready is not None else now) - self.started,
            now - self.started,
        )


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:500]


class Executor(abc.ABC):
    """The interface both executors share: `map` (its start here), each executor's `_run` the rest."""

    retries: int  # a unit that fails is tried this many more times, then reported

    def map(
        self,
        load: Callable[[], Any],
        work: Callable[[Any, Any], Any],
        units: Sequence[Any],
        on_progress: Callable[[Progress], None] | None = None,
    ) -> Outcome:
        """Run `work(load(), unit)` for every unit (each with a unique `name`); `load` runs once per
        worker. A unit that fails is retried up to the executor's `retries` more times, then reported."""
        ledger = _Ledger(len(units), self.retries, on_progress)
        return self._run(load, work, list(units), ledger) if units else ledger.outcome(())

    @abc.abstractmethod
    def _run(self, load: Callable[[], Any], work: Callable[[Any, Any], Any], units: list, ledger: _Ledger) -> Outcome:
        """The units (at least one) run, `ledger` told of each."""


@dataclass(frozen=True)
class LocalExecutor(Executor):
    """The units one after another in this process, with the models `load()` gives (the default)."""

    retries: int = 2  # a unit that fails is tried this many more times, then reported by name

    def _run(self, load: Callable[[], Any], work: Callable[[Any, Any], Any], units: list, ledger: _Ledger) -> Outcome:
        models = load()
        me = (WorkerInfo(socket.gethostname(), os.getpid(), time.perf_counter() - ledger.started),)
        ready = time.perf_counter()
        pending = deque(units)
        while pending:
            unit = pending.popleft()
            try:
                ledger.succeeded(unit, work(models, unit))
            except Exception as e:  # the unit's own error: retried, then reported; KeyboardInterrupt stops
                if ledger.failed(unit, _one_line(e), e):
                    pending.append(unit)
            ledger.report(me, 0)
        return ledger.outcome(me, 0, ready)


def start_ray(ray: Any, **init: Any) -> None:
    """`ray.init(**init)`; if it raises, what it started is stopped before the error goes on. Ray's own
    `shutdown` cannot do it after a local start fails: the node that started the GCS server, the raylet
    and their monitors is registered only once it is up, so a start that times out (a machine busy on
    every core) leaves them running. They are this process's children that were not there before."""
    import psutil  # a dependency of accelerate, hence always installed with specnb

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    try:
        ray.init(**init)
    except BaseException:
        ray.shutdown()
        started = [p for p in me.children(recursive=True) if p.pid not in before]
        for p in started:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(started, timeout=10)
        raise


def import_ray() -> Any:
    """The `ray` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"the ray executor needs Ray, which is not installed: {RAY_INSTALL}") from e
    return ray


class _RayWorker:
    """A Ray actor: `load()` once (a model pair on this actor's GPU, or the CPU), then `work` per unit."""

    def __init__(self, load: Callable[[], Any], work: Callable[[Any, Any], Any], threads: int) -> None:
        import ray
        import torch

        if not ray.get_gpu_ids():  # an actor that was given no GPU uses none (Ray leaves them visible)
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if threads > 0:
            torch.set_num_threads(threads)  # the same threads as a pinned local run: the same float sums
        start = time.perf_counter()
        self.work, self.error = work, None
        try:
            self.models = load()
        except Exception as e:  # kept for `ready`, which raises it: the driver then gets the error itself
            self.error = e
        self.info = WorkerInfo(socket.gethostname(), os.getpid(), time.perf_counter() - start)

    def ready(self) -> WorkerInfo:
        if self.error is not None:
            raise self.error
        return self.info

    def run(self, unit: Any) -> Any:
        return self.work(self.models, unit)


@dataclass(frozen=True)
class RayExecutor(Executor):
    """Units on Ray actors: each actor loads the models once (`load`), then takes units one at a
    time until none are left. The driver (this process) only hands out units and collects small
    results, so `work` must write its output where the driver can read it (a shared folder or an
    fsspec URL: `io.storage.ResultFolder`)."""

    address: str = ""  # "": start Ray on this machine (stopped afterwards); "auto": join the running
    #                    cluster (`ray start --head` / a worker node of it); "ray://head:10001": Ray Client
    workers: int = (
        0  # actors; 0: one per GPU where the cluster has GPUs, else one per num_cpus CPUs (at most one per unit)
    )
    num_gpus: float | None = None  # GPUs per actor; None: 1 where the cluster has GPUs, else 0
    num_cpus: float = 1  # CPUs per actor
    threads: int = 0  # torch threads per actor; 0: num_cpus (rounded, at least 1)
    replacements: int = 4  # actors started in place of ones that died or could not start, in all
    retries: int = 2  # a unit that fails (or whose actor died) is tried this many more times, then reported
    ship_code: bool = True  # when this executor starts or joins Ray: send this specnb to the actors (runtime_env
    #                         py_modules), so they run the driver's code; a Ray the caller started keeps its own
    #                         runtime_env

    def _run(self, load: Callable[[], Any], work: Callable[[Any, Any], Any], units: list, ledger: _Ledger) -> Outcome:
        ray = import_ray()
        owned = not ray.is_initialized()
        if owned:
            self._init(ray)
        actors: list[Any] = []
        try:
            return self._drive(ray, load, work, units, ledger, actors)
        finally:
            for actor in actors:
                ray.kill(actor)
            if owned:
                ray.shutdown()

    def _init(self, ray: Any) -> None:
        """Connect to `address`, or start a local instance. A local start that times out waiting for its
        raylet (Ray waits a fixed 30 s, which a machine busy on every core can exceed) is tried once more.
        A start that fails leaves nothing running (`start_ray`)."""
        job: dict[str, Any] = {"log_to_driver": False}
        if self.ship_code:
            job["runtime_env"] = {"py_modules": [str(Path(__file__).resolve().parents[1])]}
        where = f"at address {self.address!r}" if self.address else "on this machine"
        for attempt in (1, 2):
            try:
                if self.address:
                    start_ray(ray, address=self.address, **job)
                else:  # a local instance sized for the actors asked for; units never pass through its object store
                    cpus = int(self.workers * self.num_cpus) if self.workers else None
                    start_ray(ray, num_cpus=cpus, include_dashboard=False, object_store_memory=256 * 2**20, **job)
                return
            except Exception as e:
                if attempt == 1 and not self.address and "timed out during startup" in str(e):
                    continue
                raise RuntimeError(f"Ray could not start {where}: {_one_line(e)}") from e

    def _drive(self, ray: Any, load: Callable, work: Callable, units: list, ledger: _Ledger, actors: list) -> Outcome:
        wanted, options = self._actor_plan(ray, len(units))
        threads = self.threads or max(1, round(self.num_cpus))
        actor_class = ray.remote(_RayWorker).options(**options)
        inflight: dict[Any, tuple[str, Any, Any]] = {}  # ref -> ("ready" | "run", actor, unit)

        def start() -> None:
            actor = actor_class.remote(load, work, threads)
            actors.append(actor)
            inflight[actor.ready.remote()] = ("ready", actor, None)

        for _ in range(wanted):
            start()
        pending, idle = deque(units), []
        running: dict[Any, WorkerInfo] = {}
        infos: list[WorkerInfo] = []
        lost, last_error, ready_at = 0, "", None
        while True:
            while idle and pending:
                actor, unit = idle.pop(), pending.popleft()
                inflight[actor.run.remote(unit)] = ("run", actor, unit)
            if not inflight:
                break
            (ref,), _ = ray.wait(list(inflight), num_returns=1)
            kind, actor, unit = inflight.pop(ref)
            try:
                value = ray.get(ref)
            except ray.exceptions.RayError as e:
                died = isinstance(e, ray.exceptions.RayActorError)  # killed, out of memory, node lost
                cause = getattr(e, "cause", None) or e  # a task's error: the exception it raised
                if kind == "ready" or died:  # a worker that could not load, or is gone: replace it
                    lost += 1
                    last_error = _one_line(cause) if kind == "ready" else f"worker lost: {_one_line(e)}"
                    running.pop(actor, None)
                    ray.kill(actor)
                    if kind == "run" and ledger.failed(unit, last_error):
                        pending.append(unit)
                    if lost <= self.replacements and pending:
                        start()
                else:  # the unit raised; its worker is fine
                    if ledger.failed(unit, _one_line(cause), cause):
                        pending.append(unit)
                    idle.append(actor)
            else:
                if kind == "ready":
                    running[actor] = value
                    infos.append(value)
                    ready_at = ready_at or time.perf_counter()
                else:
                    ledger.succeeded(unit, value)
                idle.append(actor)
            ledger.report(list(running.values()), lost)
        if pending:  # no worker left to take them
            for unit in pending:
                reason = f"no worker left ({lost} lost; last: {last_error})"
                ledger.failures.append(Failure(unit.name, ledger.attempts.get(unit.name, 0), reason))
            ledger.report(list(running.values()), lost)
        return ledger.outcome(infos, lost, ready_at)

    def _actor_plan(self, ray: Any, units: int) -> tuple[int, dict]:
        """(actors to start, their Ray options): `workers`, or one per GPU of the cluster where it has
        GPUs (num_gpus each, default 1), else one per `num_cpus` of its CPUs; never more than units."""
        resources = ray.cluster_resources()
        gpus_each = self.num_gpus if self.num_gpus is not None else (1.0 if resources.get("GPU", 0) >= 1 else 0.0)
        wanted = self.workers or int(
            resources.get("GPU", 0) // gpus_each if gpus_each else resources.get("CPU", 1) // self.num_cpus
        )
        return max(1, min(wanted, units)), {"num_cpus": self.num_cpus, "num_gpus": gpus_each, "max_restarts": 0}


def executor_for(name: str, address: str = "", workers: int = 0, retries: int = 2) -> Executor:
    """The executor a notebook's parameters name: "local", or "ray" (at `address`, with `workers`
    actors; `RayExecutor`), each retrying a failed unit `retries` more times. Naming Ray checks that
    it is installed, before anything runs."""
    if name == "local":
        return LocalExecutor(retries)
    if name == "ray":
        import_ray()
        return RayExecutor(address=address, workers=workers, retries=retries)
    raise ValueError(f"unknown executor {name!r}: 'local' or 'ray'")
