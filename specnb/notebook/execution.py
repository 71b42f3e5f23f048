"""One notebook executed by papermill in a kernel of its own, and everything that can end it.

    with RunLock(folder):                       # one live run per run folder, or RunLockedError
        with stop_signals():                    # SIGTERM and SIGHUP end the run as Ctrl-C does
            outcome = execute(notebook, output, parameters, cwd, timeout)

`execute` starts the kernel itself (a `jupyter_client` kernel manager handed to papermill), so that
whatever ends the run, the kernel ends with it and the way it ended is known:

    finished       every cell ran
    failed         a cell raised (its index and error), a cell ran past the timeout, the kernel died
                   (its exit signal; "out of memory" where the kernel was SIGKILLed and the kernel's
                   out-of-memory killer count, /proc/vmstat oom_kill, rose while it ran), or anything
                   else went wrong around it (the exception's type and message)
    interrupted    Ctrl-C, SIGTERM or SIGHUP reached the runner

The kernel starts in `cwd` (the notebooks' folder, where their relative paths point); the runner's own
process never changes its current folder, so no path of a run (a failure, a signal) can leave it
standing elsewhere. Started from a folder that has since been removed, it moves to `cwd` first:
papermill and every process started from there would fail on the missing folder.

The kernel's own stderr (its logger, messages C libraries print: never a cell's output, which the
notebook keeps) goes to `kernel.log` beside the output notebook, not to the runner's terminal: a
stopped run's kernel may log its dying words as a traceback, and a failure names that file.

The kernel runs in a session of its own (jupyter_client starts it so), so a signal to the runner's
process group does not reach it; `execute` shuts it down in every case, at once. If the runner is
killed outright (SIGKILL), ipykernel's parent poller ends the kernel within about a second.

`RunLock` holds an exclusive `flock` on `<folder>/.lock` for the run's life (released by the kernel
of the operating system when the runner exits, however it exits), and writes who holds it there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

LOCK_FILE = ".lock"
KERNEL_LOG = "kernel.log"  # the kernel's own stderr, in the run folder
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, kill, a closed terminal


class Interrupted(KeyboardInterrupt):
    """The runner was asked to stop (Ctrl-C, SIGTERM, SIGHUP); `signal_name` says how."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class RunLockedError(Exception):
    """Another live run holds this run folder; the message names it."""


@dataclass(frozen=True)
class Outcome:
    status: str  # "finished", "failed" or "interrupted"
    error: str | None = None  # one line: what ended the run, and what to do
    duration_s: float = 0.0


class RunLock:
    """An exclusive lock on a run folder for as long as the run lives (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_FILE
        self._file: TextIO | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # held open while the run lives
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise RunLockedError(
                f"{self.path.parent} is being written by a live run ({holder}); wait for it to finish, or stop "
                "it first (its folder resumes from where it stopped)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._file = handle
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()  # closing releases the flock
            self._file = None


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise `Interrupted` in the main thread (SIGINT too: a process
    started with SIGINT ignored, as a test runner's worker or a shell's background job starts its
    children, would not stop on Ctrl-C); the previous handlers come back afterwards."""

    def stop(signum: int, frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():  # only the main thread takes signals
        yield
        return
    before = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP ignored while a run's record is written (a second Ctrl-C must not
    leave a half-written record)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def oom_kills() -> int | None:
    """The kernel's count of processes killed for want of memory (/proc/vmstat oom_kill), if readable."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def death(exit_code: int | None, oom_before: int | None, oom_after: int | None) -> str:
    """One line on how a kernel died, from its exit code and the out-of-memory killer's count."""
    if exit_code is not None and exit_code < 0:
        try:
            how = f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            how = f"killed by signal {-exit_code}"
    else:
        how = f"exited with code {exit_code}" if exit_code is not None else "stopped answering"
    counted = oom_before is not None and oom_after is not None
    oom = counted and oom_after > oom_before
    if exit_code == -signal.SIGKILL and counted and not oom:
        return (
            f"the kernel died ({how}), not by the out-of-memory killer (its count, /proc/vmstat oom_kill, did not "
            "move): another process or a limit of the machine (a job scheduler, a container) sent it; rerun to resume"
        )
    if oom or exit_code == -signal.SIGKILL:
        cause = (
            "out of memory: the out-of-memory killer ended it"
            if oom
            else "most likely out of memory (SIGKILL is what Linux's out-of-memory killer sends)"
        )
        return (
            f"the kernel died ({how}), {cause}; lower the sizes (budgets, max_new_tokens, batches, prompts) "
            "or free memory, then rerun to resume"
        )
    return f"the kernel died ({how}); rerun to resume"


def execute(notebook: Path, output: Path, parameters: dict[str, Any], cwd: Path, timeout: int | None) -> Outcome:
    """`notebook` through papermill into `output` in a kernel this function starts and always shuts
    down; how it ended as an `Outcome` (module docstring). `Interrupted` and KeyboardInterrupt are
    caught here and become the outcome "interrupted"."""
    import papermill
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    log = Path(output).resolve().parent / KERNEL_LOG

    class LoggedKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
            with open(log, "ab") as stderr:  # the kernel keeps its own descriptor
                await super()._async_launch_kernel(kernel_cmd, **{**kw, "stderr": stderr})

    km = LoggedKernelManager(kernel_name="python3")
    oom_before, start = oom_kills(), time.perf_counter()
    status, error = "failed", None
    standing_somewhere(cwd)
    try:
        papermill.execute_notebook(
            str(Path(notebook).resolve()),
            str(Path(output).resolve()),
            parameters=parameters,
            resources={"metadata": {"path": str(Path(cwd).resolve())}},  # the kernel's folder (nbclient), not ours
            progress_bar=False,
            log_output=True,
            kernel_name="python3",
            execution_timeout=timeout,
            km=km,
        )
        status = "finished"
    except PapermillExecutionError as e:
        error = f"cell {e.cell_index} (execution count {e.exec_count}): {e.ename}: {e.evalue}"
    except TimeoutError as e:
        error = f"a cell ran past SPECNB_CELL_TIMEOUT={timeout} s ({e}); rerun to resume"
    except DeadKernelError:
        error = death(_exit_code(km), oom_before, oom_kills())
    except KeyboardInterrupt as e:
        status = "interrupted"
        error = f"stopped by {getattr(e, 'signal_name', 'SIGINT')}; rerun the same command to resume"
    except Exception as e:  # anything else around the kernel: one line, never a traceback
        code = _exit_code(km)
        error = death(code, oom_before, oom_kills()) if code is not None else f"{type(e).__name__}: {e}"
    finally:
        with signals_ignored():
            _cancel_pending()
            run_sync(_shut_down)(km)
    if status == "failed" and error and error.startswith("the kernel died") and log.exists() and log.stat().st_size:
        error += f" (the kernel's own messages: {log})"
    return Outcome(status, error, round(time.perf_counter() - start, 1))


def standing_somewhere(fallback: Path) -> None:
    """This process's current folder, if it still exists; else it moves to `fallback` and says so."""
    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(fallback)
        print(f"the current folder was removed; running from {fallback}", flush=True)


def _exit_code(km: Any) -> int | None:
    """The kernel's exit code if its process has ended, else None."""
    process = getattr(getattr(km, "provisioner", None), "process", None)
    return process.poll() if process is not None else None


def _cancel_pending() -> None:
    """The tasks an interrupted execution left on this thread's event loop, cancelled and awaited:
    left alone, they would run during the shutdown and log the kernel's death as a traceback."""
    import asyncio

    from jupyter_core.utils import ensure_event_loop

    loop = ensure_event_loop()
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


async def _shut_down(km: Any) -> None:
    """The kernel ended now (it is only asked to once it is idle: a run stopped mid-cell must not wait
    for the cell), and its files removed."""
    with contextlib.suppress(Exception):
        if km.has_kernel and await km.is_alive():
            await km.shutdown_kernel(now=True)
    with contextlib.suppress(Exception):
        await km.cleanup_resources()
