"""How long a run of the notebooks will take on this machine, said before it starts.

    decode_ms(params_01)        this machine's decode step: one token of the profile's 01 target on a
                                DECODE_PREFIX-token cache, median of DECODE_REPEATS after DECODE_WARMUP
                                (a few seconds, the load included); None when the target is a hub model
    reference(profile, chain)   REFERENCES[profile] (or of the first profile it extends that has some)
    plan(...)                   the estimate of each notebook: on the line through its own times at
                                different decode steps (`Reference.notebook_line`: its fixed part and
                                its part per ms); else its share of the reference
                                times, of a whole run's time at this decode step on the line fitted to
                                the profile's runs (`Reference.line`); without such runs, its reference
                                time x (decode here / decode there); unscaled where either is unknown
    Progress                    the progress line between notebooks: elapsed, and the time left (the
                                remaining estimates, corrected by how the finished notebooks compared)

The reference times per profile live in reference_times.json beside this module (REFERENCES), each
with the decode step of the machine it was measured on; `python -m specnb.notebook.estimate record`
rewrites a profile's from a finished run (its run_summary.json and records) and adds it to the
profile's runs and, notebook by notebook, to its notebook runs. A notebook's time does not all scale
with the decode step (loading, prompts, plotting do not): the runs on machines of different speed give
the fixed part and the part that scales, notebook by notebook where each was timed. The
estimate is a first figure, not a promise (a machine whose speed changes during a run is not
foreseen): the actual time is recorded beside it in each run's params.json ("timing").

$SPECNB_DECODE_MS skips the measurement: a number is taken as the decode step in ms; "skip" (the
tests set it) scales nothing.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .places import default_outputs

DECODE_PREFIX = 256
DECODE_WARMUP = 2
DECODE_REPEATS = 8
DECODE_ENV = "SPECNB_DECODE_MS"


@dataclass(frozen=True)
class Reference:
    """Seconds per notebook measured on one machine, and that machine's decode step (None: not known,
    so the times are not scaled)."""

    seconds: Mapping[str, float]
    decode_ms: float | None
    where: str  # when, where and how the times (and the decode step) were measured
    # whole runs of the profile on machines of different speed: {"decode_ms", "seconds" (its notebooks
    # together), "where"}; `line` fits their time to the decode step
    runs: tuple[Mapping[str, Any], ...] = ()
    # runs that timed each notebook on its own, whole or not (a course run times 01-03 and 07 with the
    # cpu profile's values): {"decode_ms", "notebooks": {stem: seconds}, "where"}; `notebook_line`
    notebook_runs: tuple[Mapping[str, Any], ...] = ()

    def line(self) -> tuple[float, float] | None:
        """`line_through` its runs."""
        return line_through(self.runs)

    def notebook_line(self, notebook: str) -> tuple[float, float] | None:
        """`line_through` the notebook's own times (`notebook_runs`): its own fixed part and part per ms
        of decode (loading, Python and the draft's batched forwards in one notebook, decoding in
        another do not scale alike)."""
        return line_through(
            [
                {"decode_ms": r["decode_ms"], "seconds": r["notebooks"][notebook]}
                for r in self.notebook_runs
                if notebook in r["notebooks"]
            ]
        )


def line_through(runs: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(fixed seconds, seconds per ms of decode): the least-squares line through the runs' notebook time
    against their decode step (loading and Python do not scale with it); None with fewer than two decode
    steps to fit."""
    points = [(float(r["decode_ms"]), float(r["seconds"])) for r in runs]
    if len({d for d, _ in points}) < 2:
        return None
    d, t = (list(v) for v in zip(*points))
    mean_d, mean_t = sum(d) / len(d), sum(t) / len(t)
    slope = sum((x - mean_d) * (y - mean_t) for x, y in points) / sum((x - mean_d) ** 2 for x in d)
    return mean_t - slope * mean_d, slope


REFERENCE_FILE = Path(__file__).with_name("reference_times.json")  # profile -> seconds per notebook, decode_ms, where
OFF_LINE = 0.25  # a run whose time the line through the recorded runs misses by more is not recorded unasked


def load_references(path: Path = REFERENCE_FILE) -> dict[str, Reference]:
    """The reference times per profile, from the data file (`record` rewrites a profile's from a run)."""
    data = json.loads(Path(path).read_text())
    return {
        name: Reference(
            dict(r["seconds"]),
            r.get("decode_ms"),
            str(r["where"]),
            tuple(r.get("runs", ())),
            tuple(r.get("notebook_runs", ())),
        )
        for name, r in data.items()
    }


REFERENCES: dict[str, Reference] = load_references()
T4_PROFILE = "t4"  # profiles extending it take `t4_estimate` (a T4's estimate from published figures)


def reference(chain: Sequence[str]) -> tuple[str, Reference] | None:
    """The first profile of `chain` (a profile and the ones it extends, in order) with a reference:
    REFERENCES, or t4's estimate (`t4_estimate.estimate`, not scaled: no T4 here to compare)."""
    for name in chain:
        if name in REFERENCES:
            return name, REFERENCES[name]
        if name == T4_PROFILE:
            from .t4_estimate import estimate

            per_notebook = estimate(chain[0]).groupby("stem")["seconds"].sum()
            return name, Reference(
                {k: float(v) for k, v in per_notebook.items() if k != "set-up"},
                None,
                "an estimate for a Colab T4 from published figures (python -m specnb.notebook.t4_estimate)",
            )
    return None


def decode_ms(params_01: Mapping[str, Any]) -> tuple[float | None, str]:
    """(ms, how): one decode step of 01's target here, or (None, why not). Only an embedded model or a
    local folder is loaded for it (a hub target would cost a download or a long load first)."""
    from ..io.embedded import EMBEDDED_MODELS

    target = str(params_01.get("target") or "")
    if target not in EMBEDDED_MODELS and not Path(target).expanduser().is_dir():
        return None, f"not measured: 01's target {target!r} is a hub model (loading it is no quick check)"
    import torch

    from ..bench.verify_curve import prefilled_cache, verify_and_forward
    from ..io.models import load_model

    start = time.perf_counter()
    try:
        model, _ = load_model(
            target,
            params_01.get("target_quantization"),
            params_01.get("model_dtype"),
            cpu_linear=str(params_01.get("cpu_linear") or "stock"),
        )
        cache = prefilled_cache(model, DECODE_PREFIX)
        timing = verify_and_forward(model, cache, None, tokens=1, warmup=DECODE_WARMUP, repeats=DECODE_REPEATS)
    except Exception as e:
        return None, f"not measured: {type(e).__name__}: {e}"
    finally:
        model = cache = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    ms = timing["plain"].median_s * 1e3
    how = (
        f"{target}: one token on a {DECODE_PREFIX}-token cache, median of {DECODE_REPEATS} "
        f"(measured in {time.perf_counter() - start:.1f} s, load included)"
    )
    return ms, how


def given_decode() -> tuple[bool, float | None, str]:
    """(given, ms, how) from $SPECNB_DECODE_MS: not given (measure), a number, or "skip"."""
    value = os.environ.get(DECODE_ENV, "").strip()
    if not value:
        return False, None, ""
    if value.lower() == "skip":
        return True, None, f"not measured (${DECODE_ENV}=skip)"
    return True, float(value), f"given (${DECODE_ENV}={value})"


@dataclass
class Plan:
    """The estimate of each notebook of a run, and how it was made."""

    profile: str
    reference_profile: str | None
    reference_where: str
    reference_decode_ms: float | None
    decode_ms: float | None  # this machine's
    decode_how: str
    estimates: dict[str, float | None] = field(default_factory=dict)  # seconds; None: no reference time
    how: str = ""  # how the reference times were scaled, where not by the decode ratio alone

    @property
    def scale(self) -> float | None:
        if self.decode_ms is None or self.reference_decode_ms is None:
            return None
        return self.decode_ms / self.reference_decode_ms

    @property
    def total(self) -> float:
        return sum(v for v in self.estimates.values() if v is not None)

    def record(self, notebook: str) -> dict[str, Any]:
        """What a run's params.json holds under "timing" (the runner adds "actual_s")."""
        return {
            "estimate_s": self.estimates.get(notebook),
            "decode_ms": None if self.decode_ms is None else round(self.decode_ms, 1),
            "decode": self.decode_how,
            "reference_profile": self.reference_profile,
            "reference_decode_ms": self.reference_decode_ms,
            "reference": self.reference_where,
        }

    def lines(self) -> list[str]:
        """What the runner prints before the first notebook starts."""
        decode = f"{self.decode_ms:.0f} ms" if self.decode_ms is not None else "unknown"
        out = [f"== this machine's decode step: {decode} ({self.decode_how})"]
        if self.reference_profile is None:
            out.append(f"== no reference times for profile {self.profile}: no estimate")
            return out
        ref = f"{self.reference_decode_ms:.0f} ms" if self.reference_decode_ms is not None else "an unknown"
        how = self.how or (
            f"scaled by {self.scale:.2f} (decode here / {ref} decode where they were measured)"
            if self.scale is not None
            else "not scaled (a decode step missing here or there)"
        )
        out.append(f"== estimated time, from the reference times of {self.reference_profile} ({how}):")
        for name, seconds in self.estimates.items():
            out.append(f"   {name:<28} {duration(seconds) if seconds is not None else 'no reference time'}")
        out.append(f"   {'total':<28} {duration(self.total)}")
        out.append(f"   reference: {self.reference_where}")
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"scale": self.scale, "total_s": self.total}


def plan(
    profile: str, chain: Sequence[str], books: Sequence[str], decode: tuple[float | None, str] = (None, "")
) -> Plan:
    """Each notebook's estimate (module docstring): `chain` is the profile and those it extends."""
    found = reference(chain)
    if found is None:
        return Plan(profile, None, "", None, decode[0], decode[1], {b: None for b in books})
    name, ref = found
    out = Plan(profile, name, ref.where, ref.decode_ms, decode[0], decode[1])
    line, factor = ref.line(), out.scale or 1.0
    if line is not None and decode[0] is not None:  # each notebook its share of the fitted whole run
        total = line[0] + line[1] * decode[0]
        factor = total / sum(ref.seconds.values())
        out.how = (
            f"each its share of a whole run of {duration(total)} at this decode step: {duration(line[0])} + "
            f"{line[1]:.2f} s per ms of decode, fitted to {len(ref.runs)} runs at "
            f"{min(float(r['decode_ms']) for r in ref.runs):.0f}-{max(float(r['decode_ms']) for r in ref.runs):.0f} ms"
        )
    out.estimates = {b: (ref.seconds[b] * factor if b in ref.seconds else None) for b in books}
    own = {b: ref.notebook_line(b) for b in books} if decode[0] is not None else {}
    for b, fit in own.items():  # a notebook timed on machines of different speed: its own line
        if fit is not None:
            out.estimates[b] = max(fit[0] + fit[1] * decode[0], 0.0)
    fitted = [b for b, fit in own.items() if fit is not None]
    if fitted:
        decodes = sorted({float(r["decode_ms"]) for r in ref.notebook_runs})
        out.how = (
            f"{len(fitted)} notebooks each on the line through its own times at decode steps of "
            + ", ".join(f"{d:.0f}" for d in decodes)
            + " ms"
            + (f"; the others {out.how or 'scaled by the decode step'}" if len(fitted) < len(books) else "")
        )
    return out


class Progress:
    """The line printed after each notebook: done / all, elapsed, the time left."""

    def __init__(self, estimates: Mapping[str, float | None]) -> None:
        self.estimates = dict(estimates)
        self.start = time.perf_counter()
        self.done: dict[str, float] = {}

    def finished(self, notebook: str, seconds: float) -> str:
        self.done[notebook] = seconds
        elapsed = time.perf_counter() - self.start
        timed = [n for n in self.done if self.estimates.get(n)]
        ratio = sum(self.done[n] for n in timed) / sum(self.estimates[n] for n in timed) if timed else 1.0
        left = [self.estimates[n] for n in self.estimates if n not in self.done]
        known = [s for s in left if s is not None]
        said = f"about {duration(sum(known) * ratio)} left" if known else "nothing left to estimate"
        if timed:
            said += f" (the estimates x {ratio:.2f}, as the finished notebooks compared)"
        if len(known) < len(left):
            said += f", and {len(left) - len(known)} notebook(s) without an estimate"
        return f"== progress: {len(self.done)}/{len(self.estimates)} notebooks in {duration(elapsed)}; {said}"


def duration(seconds: float) -> str:
    """'7 min 05 s', or '42 s' under a minute."""
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def record(outputs: Path, path: Path = REFERENCE_FILE, force: bool = False) -> Reference:
    """The last run under `outputs` (its run_summary.json, written by the runner) as its profile's
    reference: each finished notebook's actual seconds, the decode step the runner measured, and where
    (commit, start, device) from the runs' records. Refused where the run has no finished notebook or
    no measured decode step (its times could not be scaled), and, unless `force`, where the line through
    the profile's recorded runs misses its time by more than `OFF_LINE` (its decode check read the
    machine's speed wrong, or the machine's speed moved during the run: it would bend every estimate)."""
    outputs = Path(outputs)
    summary = json.loads((outputs / "run_summary.json").read_text())
    runs = {nb: r for nb, r in summary.get("runs", {}).items() if r.get("status") == "finished"}
    decode = (summary.get("plan") or {}).get("decode_ms")
    if not runs or decode is None:
        raise ValueError(
            f"{outputs / 'run_summary.json'}: no finished notebook or no decode step measured; record a run made "
            "without $SPECNB_DECODE_MS"
        )
    first = json.loads((outputs / next(iter(runs.values()))["folder"] / "params.json").read_text())
    env = first.get("environment", {})
    where = (
        f"the {summary['profile']} profile's run started {summary['started']}, commit "
        f"{(env.get('git_commit') or '?')[:7]}, on {env.get('device')}; its decode step: {decode:.0f} ms "
        f"({(summary.get('plan') or {}).get('decode_how', '')})"
    )
    data = json.loads(Path(path).read_text())
    earlier = list(data.get(summary["profile"], {}).get("runs", []))
    seconds = {nb: float(r["actual_s"]) for nb, r in runs.items()}
    this = {"decode_ms": round(float(decode), 1), "seconds": round(sum(seconds.values()), 1), "where": where}
    timed = {
        "decode_ms": this["decode_ms"],
        "notebooks": {nb: round(t, 1) for nb, t in seconds.items()},
        "where": where,
    }
    line = line_through(earlier)
    if line is not None and not force:
        told = line[0] + line[1] * this["decode_ms"]
        if abs(told / this["seconds"] - 1) > OFF_LINE:
            raise ValueError(
                f"its notebooks took {duration(this['seconds'])} at a decode step of {decode:.0f} ms, and the line "
                f"through the {len(earlier)} recorded runs says {duration(told)} ({told / this['seconds'] - 1:+.0%}, "
                f"more than {OFF_LINE:.0%} off): the decode check may have misread the machine's speed (compare 01's "
                "verify curve, verify_curve.csv); --force records it anyway"
            )
    timed_before = list(data.get(summary["profile"], {}).get("notebook_runs", []))
    reference = Reference(seconds, this["decode_ms"], where, (*earlier, this), (*timed_before, timed))
    data[summary["profile"]] = {
        "seconds": seconds,
        "decode_ms": reference.decode_ms,
        "where": where,
        "runs": list(reference.runs),
        "notebook_runs": list(reference.notebook_runs),
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    return reference


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specnb.notebook.estimate", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="make the last run under OUTPUTS its profile's reference times")
    rec.add_argument("--outputs", type=Path, default=None, help="default: $SPECNB_OUTPUTS, else outputs/")
    rec.add_argument("--force", action="store_true", help="record a run far off the line through the recorded runs")
    args = ap.parse_args(argv)
    try:
        reference = record(args.outputs or default_outputs(), force=args.force)
    except (OSError, ValueError, KeyError) as e:
        print(f"not recorded: {e}", file=sys.stderr)
        return 2
    print(f"{REFERENCE_FILE}: {reference.where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
