"""How long a notebook run takes and how much memory it needs, estimated before anything loads: one
module for both, any profile, a CPU or a GPU. Each notebook's spec names its rule (`registry`,
"estimate"; RULES): a rule sizes the notebook's memory part by part and prices its work on a T4, from
the notebook's resolved parameters and the models' configs. A notebook without a rule of its own takes
"generation" (its models, caches and the generations of `methods`), and its estimate says so
(`rule_of`).

    python -m specnb.notebook.estimate time [PROFILE] [-f FILE ...] [--device t4|cpu] [--decode-ms MS]
    python -m specnb.notebook.estimate memory [PROFILE] [-f FILE ...] [--device cuda|cpu] [--usable-gb GB]
    python -m specnb.notebook.estimate record [--outputs DIR] [--force] [--fresh]

-f: parameter files layered on the profile as `run_notebooks.sh -f` layers them (your `custom_trees`,
notebooks/my_trees.example.yaml, are counted where the notebooks run them). It applies to the T4 time
and the memory; a CPU's time is read from reference runs, not computed from sizes.

What it holds:
    machine_speed, given_decode, Reference, REFERENCES, line_through, plan, Plan, Progress, duration,
    record, rescaled            a CPU's time from reference runs (below)
    T4Figures, Costs, t4_time, t4_markdown
                                a T4's time from published figures (docs/t4.md's figure)
    RunMemory, PART_NAMES, gb, model_config_of, forward_bytes, widest_rank, notebook_memory,
    available_bytes, check_run_memory, refusal
                                a notebook's memory, and the check that refuses a run that does not fit
    custom_trees, custom_trees_of   the custom trees a notebook's parameters name
    Rule, RULES, rule_of        each notebook's rule: its memory and its T4 time
    profile_params, profile_memory, memory_markdown, profile_downloads, published_download,
    download_markdown, drive_warning, cpu_time
                                a profile's notebooks: their memory table, downloads, CPU time

Time on a CPU (the runner's estimate, `plan`): measured, not modelled. reference_times.json beside this
module holds per profile the seconds of each notebook on some machine and that machine's speed, timed
in a few seconds before the first notebook (`machine_speed`): its decode step (one token of the target
on a DECODE_PREFIX-token cache) and, in runs since it was added, its block step (BLOCK_TOKENS at once on
that cache). The runner scales the reference times by the block step here over there: most of a
notebook's time is forwards of many tokens, which follow a machine's arithmetic, not its memory
bandwidth (the course on one core of this machine took 1.66x its time on two, where the decode step
grew 1.2x and the block step 1.8x). A reference without a block step is scaled by the decode step: runs
on machines of different speed give each notebook a fixed part and a part per ms of decode
(`line_through`). $SPECNB_DECODE_MS gives the decode step (then it scales; "skip" scales nothing).
`record` adds a finished run to its profile's references (--fresh: where the code's speed changed, the
recorded runs scaled to it first, `rescaled`).
`Progress` prints the time left between notebooks, corrected by how the finished ones compared. The
estimate is a first figure, not a promise: each run's params.json records the actual time beside it
("timing").

Time on a T4 (`t4_time`, the t4 profile's estimate; docs/t4.md's figure is its output, a test checks
that they agree): an ESTIMATE
from published figures and the profile's sizes, not a measurement. Its inputs (`T4Figures`,
t4_figures.json: each value with its source or marked as an assumption) and how they combine:
    decode step      a 4-bit target's single-row step: bitsandbytes' published T4 step for Qwen2.5-3B
                     in nf4, scaled by the target's nf4 weight bytes over Qwen2.5-3B's (decoding reads
                     every weight once, so its time follows the bytes)
    verify of r rows the same benchmark's 8-row step over its 1-row step (s), extended as a power law:
                     step x r ** (log s / log 8) (an assumption beyond 8 rows)
    draft forward    a float16 draft at batch 1: the larger of its layers' kernel launches
                     (`launch_per_layer_s`, an assumption) and its weight bytes over the bandwidth
    a speculative run of n tokens with a tree of N nodes and depth d: n / tau steps of one verify of
                     N + 1 rows and d draft forwards (tau an assumption); the target alone: n steps;
                     every generation also pays a prefill and a perplexity pass
    loads            every model a notebook loads, its hub files read at `load_bytes_per_s`; downloads
                     once at `download_bytes_per_s`

Memory (`notebook_memory`; `check_run_memory` refuses a run that does not fit this machine, with the
estimate and the parameters to lower, its spec's "lower"), part by part (GB = 10^9 bytes;
`analysis.memory` does the weight and cache arithmetic):
    weights           target and draft (and 05's heads) as loaded: float32 on a CPU, float16 on CUDA,
                      unless model_dtype says otherwise; "4bit" as transformers' nf4 quantizer leaves
                      it. A draft cut to draft_layers is counted whole (it is cut after it loads). A
                      notebook of pairs loads them one at a time and keeps a model while a later pair
                      uses it: its estimate is its largest pair with what is still held then.
    kv_cache          both models' caches of the longest sequence: LONGEST_PROMPT (or max_prompt_tokens)
                      + max_new_tokens + the root + the largest tree, times the batch
    verify            the largest single forward (`forward_bytes`): the largest tree verified on the
                      longest cache, or the perplexity score of prompt + output without a cache
    continuations     the target decoding `batch` prompts at once: their caches and their prefill
    super_trees       SUPER_CHUNK positions' off-path nodes fed to the draft in one forward per round,
                      and the draft's cache growing by them
    arrays            a collection and its replay: log q [L + 1, V], the ranks [L, K + 1], the replay's
                      child table and per-position arrays, Sequoia's tables
    grid              the largest attention-grid point (before any model loads)
    training          heads trained in float32 with Adam, their loss logits, the distilled rows
    runtime           the interpreter, torch and transformers (CPU), or the CUDA context (GPU)
The parts are summed although some never coexist (03's grid runs before its models load; 01's
replay after its collection): an upper bound, within ~2x of what a run measures where the weights
dominate. Attention scores are counted as eager attention makes them (SDPA with a mask may not), and
on CUDA host-side arrays are counted against the device: a refusal errs on the safe side. A model
whose config cannot be read without its weights counts 0, and `describe()` says so: the memory
estimate never raises for a name it cannot size.

`memory` also prints what the profile downloads (`profile_downloads`) and whether it fits a free
Google Drive (`drive_warning`, which the runner prints).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import AutoConfig, PretrainedConfig, Qwen2Config

from ..analysis.collection import CollectConfig
from ..analysis.memory import (
    DTYPE_BYTES,
    FLOAT16_BYTES,
    GB,
    LONGEST_PROMPT,
    attention_grid_bytes,
    download_bytes,
    eagle_head_bytes,
    kv_cache_bytes,
    medusa_heads_bytes,
    parameter_count,
    weight_bytes,
)
from ..bench.attention_grid import head_shape
from ..core.trees import SPARSE_ACCEPTANCE, Tree
from ..drafters.methods import (
    DYNAMIC,
    DYNAMIC_MAX_DEPTH,
    DYNAMIC_TOP_K,
    budget_axis,
    parse_method,
    trees_for,
    with_custom_trees,
)
from ..experiments.checks import ParameterError
from ..experiments.long_generation import TARGET_ALONE
from ..io import embedded
from ..io.eagle_checkpoint import PublishedEagle
from ..io.medusa_checkpoint import PublishedHeads
from ..io.model_configs import config_of, hub_model, known_models
from ..io.published import published_checkpoints
from ..io.tree_spec import TreeSpecError, parse_custom_trees
from . import registry
from .places import NOTEBOOKS, default_outputs
from .profiles import (
    RunnerError,
    device_profile,
    hub_models,
    notebooks,
    profile_chain,
    published_heads,
    resolve,
    runner_settings,
)

DECODE_PREFIX = 256
DECODE_WARMUP = 2
DECODE_REPEATS = 8
BLOCK_TOKENS = 33  # the block step: a root and 32 tokens in one forward, on the decode step's cache
BLOCK_REPEATS = 5
DECODE_ENV = "SPECNB_DECODE_MS"

# ---- time on this machine, from reference runs -------------------------------------------------


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
    block_ms: float | None = None  # that machine's block step (`machine_speed`), where it was measured

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
            r.get("block_ms"),
        )
        for name, r in data.items()
    }


REFERENCES: dict[str, Reference] = load_references()
T4_PROFILE = "t4"  # profiles extending it take `t4_time` (a T4's estimate from published figures)


def reference(chain: Sequence[str]) -> tuple[str, Reference] | None:
    """The first profile of `chain` (a profile and the ones it extends, in order) with a reference:
    REFERENCES, or t4's estimate (`t4_time`, not scaled: no T4 here to compare)."""
    for name in chain:
        if name in REFERENCES:
            return name, REFERENCES[name]
        if name == T4_PROFILE:
            per_notebook = t4_time(chain[0]).groupby("stem")["seconds"].sum()
            return name, Reference(
                {k: float(v) for k, v in per_notebook.items() if k != "set-up"},
                None,
                "an estimate for a Colab T4 from published figures (python -m specnb.notebook.estimate time)",
            )
    return None


def machine_speed(params_01: Mapping[str, Any]) -> tuple[float | None, float | None, str]:
    """(decode ms, block ms, how): 01's target here, one token on a DECODE_PREFIX-token cache (the decode
    step) and BLOCK_TOKENS at once on the same cache (the block step), or (None, None, why not). Only an
    embedded model or a local folder is loaded for it (a hub target would cost a download or a long load
    first). The two tell a machine's memory bandwidth from its arithmetic: on a CPU a decode step reads
    the weights, a block step computes with them, and most of a notebook's time goes to forwards of many
    tokens (prefills, verified trees, rows drafted together), which scale with the block step."""
    from ..io.embedded import EMBEDDED_MODELS

    target = str(params_01.get("target") or "")
    if target not in EMBEDDED_MODELS and not Path(target).expanduser().is_dir():
        return None, None, f"not measured: 01's target {target!r} is a hub model (loading it is no quick check)"
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
        block = verify_and_forward(model, cache, None, tokens=BLOCK_TOKENS, warmup=1, repeats=BLOCK_REPEATS)
    except Exception as e:
        return None, None, f"not measured: {type(e).__name__}: {e}"
    finally:
        model = cache = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    ms, block_ms = timing["plain"].median_s * 1e3, block["plain"].median_s * 1e3
    how = (
        f"{target}: one token on a {DECODE_PREFIX}-token cache, median of {DECODE_REPEATS}; {BLOCK_TOKENS} tokens "
        f"at once {block_ms:.0f} ms, median of {BLOCK_REPEATS} (measured in {time.perf_counter() - start:.1f} s, "
        "load included)"
    )
    return ms, block_ms, how


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
    block_ms: float | None = None  # this machine's block step (`machine_speed`)
    reference_block_ms: float | None = None

    @property
    def scale(self) -> float | None:
        if self.decode_ms is None or self.reference_decode_ms is None:
            return None
        return self.decode_ms / self.reference_decode_ms

    @property
    def block_scale(self) -> float | None:
        """Block step here over the reference's: what the estimate scales by, where both are known."""
        if self.block_ms is None or self.reference_block_ms is None:
            return None
        return self.block_ms / self.reference_block_ms

    @property
    def total(self) -> float:
        return sum(v for v in self.estimates.values() if v is not None)

    def record(self, notebook: str) -> dict[str, Any]:
        """What a run's params.json holds under "timing" (the runner adds "actual_s")."""
        return {
            "estimate_s": self.estimates.get(notebook),
            "decode_ms": None if self.decode_ms is None else round(self.decode_ms, 1),
            "block_ms": None if self.block_ms is None else round(self.block_ms, 1),
            "decode": self.decode_how,
            "reference_profile": self.reference_profile,
            "reference_decode_ms": self.reference_decode_ms,
            "reference_block_ms": self.reference_block_ms,
            "reference": self.reference_where,
        }

    def lines(self) -> list[str]:
        """What the runner prints before the first notebook starts."""
        decode = f"{self.decode_ms:.0f} ms" if self.decode_ms is not None else "unknown"
        block = f", block step {self.block_ms:.0f} ms" if self.block_ms is not None else ""
        out = [f"== this machine's decode step: {decode}{block} ({self.decode_how})"]
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
    profile: str,
    chain: Sequence[str],
    books: Sequence[str],
    decode: tuple[float | None, str] = (None, ""),
    block_ms: float | None = None,
) -> Plan:
    """Each notebook's estimate on this machine (`decode`: its decode step in ms and how it was had;
    `block_ms`: its block step; `chain`: the profile and those it extends, the first with a reference
    is used). Where this machine's block step and the reference's are both known: the reference time x
    (block step here / block step there), the block step being what most of a notebook's time scales
    with (`machine_speed`). Else by the decode step: on the line through the notebook's own times at
    different decode steps (`Reference.notebook_line`); else its share of the reference times of a whole
    run at this decode step on the line through the profile's runs (`Reference.line`); without such
    runs, its reference time x (decode here / decode there); unscaled where either decode step is
    unknown."""
    found = reference(chain)
    if found is None:
        return Plan(profile, None, "", None, decode[0], decode[1], {b: None for b in books}, block_ms=block_ms)
    name, ref = found
    out = Plan(
        profile,
        name,
        ref.where,
        ref.decode_ms,
        decode[0],
        decode[1],
        block_ms=block_ms,
        reference_block_ms=ref.block_ms,
    )
    if out.block_scale is not None:
        out.estimates = {b: (ref.seconds[b] * out.block_scale if b in ref.seconds else None) for b in books}
        decoded = f"; the decode step would say {out.scale:.2f}" if out.scale is not None else ""
        out.how = (
            f"scaled by {out.block_scale:.2f} (block step here / {ref.block_ms:.0f} ms where they were measured: "
            f"most of a notebook's time is forwards of many tokens, which scale with it{decoded})"
        )
        return out
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


def rescaled(recorded: Mapping[str, Any], seconds: Mapping[str, float], decode: float, where: str) -> dict[str, Any]:
    """A profile's recorded runs (`recorded`: its reference_times.json entry) scaled to a run of faster
    or slower code that took `seconds` per notebook at a decode step of `decode` ms: each notebook's
    earlier times times its time here over what the line through them says at `decode`, each whole run
    by the same ratio of the whole; a notebook (or a whole) without such a line is dropped."""
    old = Reference({}, None, "", tuple(recorded.get("runs", ())), tuple(recorded.get("notebook_runs", ())))
    factor = {}
    for notebook, t in seconds.items():
        fit = old.notebook_line(notebook)
        if fit is not None and fit[0] + fit[1] * decode > 0:
            factor[notebook] = t / (fit[0] + fit[1] * decode)
    note = f" (scaled to the code of {where.split(', on ')[0]})"
    notebook_runs = [
        {
            "decode_ms": r["decode_ms"],
            "notebooks": {nb: round(v * factor[nb], 1) for nb, v in r["notebooks"].items() if nb in factor},
            "where": r["where"] + note,
        }
        for r in old.notebook_runs
    ]
    line = old.line()
    whole = sum(seconds.values()) / (line[0] + line[1] * decode) if line and line[0] + line[1] * decode > 0 else None
    runs = (
        []
        if whole is None
        else [r | {"seconds": round(r["seconds"] * whole, 1), "where": r["where"] + note} for r in old.runs]
    )
    return {"runs": runs, "notebook_runs": [r for r in notebook_runs if r["notebooks"]]}


def record(outputs: Path, path: Path = REFERENCE_FILE, force: bool = False, fresh: bool = False) -> Reference:
    """The last run under `outputs` (its run_summary.json, written by the runner) as its profile's
    reference (the profile whose values it ran on this device, `profiles.device_profile`: a course run
    on a CPU is course-cpu's): each finished notebook's actual seconds, the decode step the runner measured, and where
    (commit, start, device) from the runs' records. Refused where the run has no finished notebook or
    no measured decode step (its times could not be scaled), and, unless `force`, where the line through
    the profile's recorded runs misses its time by more than `OFF_LINE` (its decode check read the
    machine's speed wrong, or the machine's speed moved during the run: it would bend every estimate).
    fresh: the code's speed changed since the recorded runs were taken: they are kept scaled to this run
    (`rescaled`), so that they still tell how the time grows with the decode step while this run sets
    its level (an assumption: the code's change sped up every machine alike)."""
    outputs = Path(outputs)
    summary = json.loads((outputs / "run_summary.json").read_text())
    runs = {nb: r for nb, r in summary.get("runs", {}).items() if r.get("status") == "finished"}
    decode = (summary.get("plan") or {}).get("decode_ms")
    block = (summary.get("plan") or {}).get("block_ms")
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
    seconds = {nb: float(r["actual_s"]) for nb, r in runs.items()}
    profile = device_profile(summary["profile"])
    kept = data.get(profile, {})
    if fresh:
        kept = rescaled(kept, seconds, float(decode), where)
    earlier = list(kept.get("runs", []))
    this = {"decode_ms": round(float(decode), 1), "seconds": round(sum(seconds.values()), 1), "where": where}
    timed = {
        "decode_ms": this["decode_ms"],
        "notebooks": {nb: round(t, 1) for nb, t in seconds.items()},
        "where": where,
    }
    if block is not None:
        this["block_ms"] = timed["block_ms"] = round(float(block), 1)
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
    timed_before = list(kept.get("notebook_runs", []))
    reference = Reference(
        seconds, this["decode_ms"], where, (*earlier, this), (*timed_before, timed), this.get("block_ms")
    )
    data[profile] = {
        "seconds": seconds,
        "decode_ms": reference.decode_ms,
        **({"block_ms": reference.block_ms} if reference.block_ms is not None else {}),
        "where": where,
        "runs": list(reference.runs),
        "notebook_runs": list(reference.notebook_runs),
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    return reference


# ---- memory ------------------------------------------------------------------------------------

RUNTIME = {"cpu": int(1.0 * GB), "cuda": int(0.5 * GB)}  # interpreter + torch + transformers; the CUDA context
SUPER_CHUNK = CollectConfig.super_chunk  # positions whose super-tree nodes, one each, share one draft forward
SOFTMAX_COPIES = 1  # float32 [rows, V] (log-)softmaxes taken of a forward's logits at once
REPLAY_COPIES = 6  # float64/int64 [positions, nodes] arrays alive at once in a replay (`analysis.replay`)
ADAM_COPIES = 4  # a trained float32 parameter: itself, its gradient, Adam's two moments
MEDUSA_NEGATIVES = 2048  # `training.medusa.MedusaConfig.negatives`: unseen tokens in a "sampled" loss
COLLECTION_TOP_K = 16  # `PairCollectConfig.top_k`: ranks a collection keeps at least
FLOAT32 = 4

PART_NAMES = {
    "weights": "weights",
    "kv_cache": "KV cache",
    "verify": "verify activations",
    "continuations": "batched continuations",
    "super_trees": "super-trees",
    "arrays": "collection/replay arrays",
    "grid": "attention grid",
    "training": "training",
    "runtime": "runtime",
}


@dataclass(frozen=True)
class RunMemory:
    """One notebook's estimate in bytes, part by part (module docstring); `total` sums them."""

    notebook: str
    device: str  # "cpu" or "cuda": what the parts are sized for
    dtype: str  # the models' dtype (4-bit layers apart)
    weights: int = 0
    kv_cache: int = 0
    verify: int = 0
    continuations: int = 0  # the target decoding `batch` prompts at once: their caches and prefill
    super_trees: int = 0
    arrays: int = 0
    grid: int = 0
    training: int = 0
    runtime: int = 0
    notes: tuple[str, ...] = ()  # what was left out or assumed (models that could not be sized)

    def parts(self) -> dict[str, int]:
        """Part -> bytes, in PART_NAMES' order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in PART_NAMES}

    @property
    def total(self) -> int:
        return sum(self.parts().values())

    def describe(self) -> str:
        """One line: the total and its non-zero parts in GB, the device and dtype, the notes."""
        parts = " + ".join(f"{PART_NAMES[k]} {gb(v)}" for k, v in self.parts().items() if v)
        notes = f"; {'; '.join(self.notes)}" if self.notes else ""
        return f"{self.notebook}: ~{gb(self.total)} GB = {parts or '0'} ({self.device}, {self.dtype}{notes})"


def gb(n: int) -> str:
    """Bytes in GB: one decimal from 0.1 GB, two below, "<0.01" under that."""
    return f"{n / GB:.1f}" if n >= 0.1 * GB else f"{n / GB:.2f}" if n >= 0.01 * GB else "<0.01"


# ---- models ------------------------------------------------------------------------------------


def model_config_of(name: str) -> tuple[PretrainedConfig | None, str]:
    """(config, "") for a model specnb can size without touching its weights, else (None, why): a
    config.json or a folder holding one, an installed embedded model (`io.embedded.model_config`), a
    hub id in the local hub cache (what will load: a dry run's stand-ins; no request is made), else
    its committed config (`io.model_configs`)."""
    path = Path(name).expanduser()
    try:
        if path.is_file() or (path / "config.json").is_file():
            return AutoConfig.from_pretrained(path), ""
        if name in embedded.EMBEDDED_MODELS:
            model = embedded.EMBEDDED_MODELS[name]
            if embedded.missing_parts(model):
                return None, f"{name}: embedded model not installed, not counted"
            return embedded.model_config(model), ""
        if "/" in name:
            with contextlib.suppress(OSError, ValueError):  # what will load: the local hub cache first
                return AutoConfig.from_pretrained(name, local_files_only=True), ""
        if name in known_models():
            return config_of(name), ""
    except (OSError, ValueError, KeyError, embedded.ModelNotInstalledError, embedded.ChecksumError) as e:
        return None, f"{name}: config unreadable ({str(e).splitlines()[0][:80]}), not counted"
    return None, f"{name}: unknown model, not counted"


@dataclass(frozen=True)
class _Model:
    """One model as a run loads it: its config (None: unsized), quantization, kept layers."""

    name: str
    config: PretrainedConfig | None
    quantization: str | None = None
    layers: int | None = None

    def weights(self, dtype_bytes: int) -> int:
        """The whole model as loaded (a draft's layers are cut after loading)."""
        if self.config is None:
            return 0
        try:
            w = weight_bytes(self.config, self.quantization)
        except ImportError:  # 4-bit without bitsandbytes: float16 everywhere, an upper bound
            w = weight_bytes(self.config, None)
        return w.quantized + w.unquantized * dtype_bytes // DTYPE_BYTES["float16"]

    def kv(self, tokens: int, dtype_bytes: int) -> int:
        if self.config is None:
            return 0
        config = self.config
        if self.layers is not None and self.layers < config.num_hidden_layers:
            config = copy.copy(config)
            config.num_hidden_layers = self.layers
        return kv_cache_bytes(config, tokens, dtype_bytes)

    @property
    def vocab(self) -> int:
        return int(getattr(self.config, "vocab_size", 0) or 0)


def _load(
    name: str, quantization: str | None = None, layers: int | None = None, notes: list[str] | None = None
) -> _Model:
    if not name:
        return _Model("", None)
    config, why = model_config_of(name)
    if why and notes is not None and why not in notes:
        notes.append(why)
    return _Model(name, config, quantization, layers)


def _shape(config: PretrainedConfig | None) -> tuple[int, int, int, int, int]:
    """(heads, kv heads, head size, hidden, intermediate) of a config; zeros for None."""
    if config is None:
        return 0, 0, 0, 0, 0
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    hidden = int(config.hidden_size)
    return heads, kv_heads, head_dim, hidden, int(getattr(config, "intermediate_size", None) or 4 * hidden)


def forward_bytes(
    config: PretrainedConfig | None,
    rows: int,
    cache: int,
    dtype_bytes: int,
    logits_rows: int | None = None,
    float_rows: int | None = None,
    batch: int = 1,
) -> int:
    """The activations of one forward of `rows` new tokens per sequence on `cache` cached ones, for
    `batch` sequences; one layer's at a time, as the layers run in turn:
        hidden      rows x (4 hidden + 3 intermediate) in the model dtype (residual, norm, attention
                    projections, MLP gate, up and activation)
        mask        rows x (cache + rows): the bool visibility and the 4D mask in the model dtype
        scores      heads x rows x (cache + rows) float32, twice (eager attention: scores, softmax)
        logits      logits_rows (default rows) x vocab in the model dtype, and of float_rows (default
                    logits_rows) x vocab in float32: the .float() copy (none for a float32 model)
                    and SOFTMAX_COPIES (log-)softmaxes
    A config of None (an unsized model) counts the mask alone."""
    heads, _, _, hidden, intermediate = _shape(config)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    logits_rows = rows if logits_rows is None else logits_rows
    float_rows = logits_rows if float_rows is None else float_rows
    keys = cache + rows
    per_sequence = (
        rows * (4 * hidden + 3 * intermediate) * dtype_bytes
        + rows * keys * (1 + dtype_bytes)
        + 2 * heads * rows * keys * FLOAT32
        + logits_rows * vocab * dtype_bytes
        + float_rows * vocab * FLOAT32 * (SOFTMAX_COPIES + (dtype_bytes != FLOAT32))
    )
    return batch * per_sequence


# ---- trees and methods -------------------------------------------------------------------------


def custom_trees(*specs: Any, notes: list[str] | None = None) -> dict[str, Tree]:
    """Custom trees by name from tree specs (`io.tree_spec`): a spec that is not a tree raises
    TreeSpecError, or, given `notes`, is left out and said there (the runner refuses it first)."""
    out: dict[str, Tree] = {}
    for spec in specs:
        try:
            out.update(parse_custom_trees(spec))
        except TreeSpecError as e:
            if notes is None:
                raise
            notes.append(f"custom_trees not sized ({str(e).splitlines()[0][:60]})")
    return out


def custom_trees_of(params: Mapping[str, Any]) -> dict[str, Tree]:
    """One notebook's custom trees by name (`custom_trees`, and every pair's own): each is verified,
    timed or costed at its node count where the notebook takes trees."""
    return custom_trees(params.get("custom_trees"), *(p.get("custom_trees") for p in params.get("pairs") or []))


def widest_rank(shape: str, nodes: int) -> int:
    """The widest sibling rank of `Tree.preset(shape, nodes)`, without building it: chain 0, wide
    nodes - 1, kary<k> and beams<k> k - 1 (fewer nodes: nodes - 1); bounds for sparse (below
    len(SPARSE_ACCEPTANCE)) and an unknown shape (nodes - 1)."""
    width = {"chain": 1, "sparse": len(SPARSE_ACCEPTANCE)}.get(shape, nodes)
    for prefix in ("kary", "beams"):
        if shape.startswith(prefix) and shape[len(prefix) :].isdigit():
            width = int(shape[len(prefix) :])
    return max(min(nodes, width) - 1, 0)


@dataclass(frozen=True)
class _TreeSize:
    shape: str  # a preset, "dynamic", or a custom tree's name
    nodes: int
    widest: int  # the widest sibling rank


def _tree_sizes(
    shapes: Iterable[str], budgets: Iterable[int], methods: Iterable[str], custom: Mapping[str, Tree]
) -> list[_TreeSize]:
    """Every tree a notebook builds: each shape at each budget, each method spec that names a tree
    (autoregressive and specs that do not parse are left out), each custom tree."""
    out = [_TreeSize(s, int(b), widest_rank(s, int(b))) for s in shapes for b in budgets]
    out += [_TreeSize(n, t.num_nodes, max(t.ranks, default=0)) for n, t in custom.items()]
    for spec in methods:
        try:
            m = parse_method(spec, dict(custom))
        except (ValueError, KeyError):
            continue
        if m.shape in custom:
            out.append(_TreeSize(m.shape, m.budget, max(custom[m.shape].ranks, default=0)))
        else:
            out.append(_TreeSize(m.shape, m.budget, widest_rank(m.shape, m.budget)))
    return out


# ---- the parts ---------------------------------------------------------------------------------


def _int(p: Mapping[str, Any], name: str, default: int = 0) -> int:
    value = p.get(name)
    return default if value is None else int(value)


def _ints(p: Mapping[str, Any], name: str) -> list[int]:
    return [int(v) for v in p.get(name) or [] if v is not None]


def _verify(
    config: PretrainedConfig | None, nodes: int, cache: int, new: int, dtype_bytes: int, prompt: int, batch: int = 1
) -> int:
    """The largest forward of a generating notebook: the largest tree verified on the longest cache
    (`batch` rows), the prefill of the longest prompt (logits of its last token), or the perplexity
    score of prompt + output, one sequence without a cache (float32 copies of the output's rows)."""
    return max(
        forward_bytes(config, nodes + 1, cache, dtype_bytes, batch=batch),
        forward_bytes(config, prompt, 0, dtype_bytes, logits_rows=1, batch=batch),
        forward_bytes(config, prompt + new, 0, dtype_bytes, float_rows=new),
    )


def _super_tree_bytes(draft: _Model, target: _Model, size: int, k: int, depth: int, cache: int, db: int) -> int:
    """SUPER_CHUNK positions, one node each, fed in one draft forward per round (best first,
    `experiments.collect`), and the draft's cache growing by every fed node (at most `size` per
    position). An unsized draft is sized as the target (an upper bound)."""
    if k < 1 or depth < 2 or size < 1:
        return 0
    rows = SUPER_CHUNK
    fed = SUPER_CHUNK * size
    model = draft if draft.config is not None else target
    return forward_bytes(model.config, rows, cache + fed, db) + model.kv(fed, db)


def _replay_bytes(positions: int, new: int, vocab: int, nodes: int, top_k: int, sequoia: bool = False) -> int:
    """A collection's ranks and one replay (module docstring, "arrays"): log q [L + 1, V] float32
    twice, ranks [L, K + 1] (int64 top, float32 gaps, bool hits), the child table [N + 1, K + 1]
    int64, REPLAY_COPIES [positions, N] arrays, and Sequoia's two [K + 1, N + 1] tables."""
    ranked = min(top_k + 1, vocab) if vocab else top_k + 1
    out = (new + 1) * vocab * FLOAT32 * 2 + new * ranked * (8 + 4 + 1)
    out += (nodes + 1) * (top_k + 1) * 8 + REPLAY_COPIES * positions * nodes * 8
    return out + (2 * (top_k + 1) * (nodes + 1) * 8 if sequoia else 0)


def _grid_bytes(p: Mapping[str, Any], target: _Model, custom: Mapping[str, Tree], notes: list[str]) -> int:
    """03's largest grid point: q and the output [B, H, M, D], k and v [B, Hkv, P + M, D] in the
    grid's dtype, the eager reference's float32 scores [B, H, M, P + M]."""
    shape = p.get("attention_shape") or ""
    if isinstance(shape, str) and shape.strip().startswith("{"):
        try:
            shape = json.loads(shape)
        except ValueError:
            notes.append(f"attention_shape {shape!r} is not JSON: the grid is not counted")
            return 0
    if isinstance(shape, Mapping):
        heads, kv_heads, head_dim = shape["heads"], shape.get("kv_heads", shape["heads"]), shape["head_dim"]
    else:
        heads, kv_heads, head_dim, _, _ = _shape(_load(shape, notes=notes).config if shape else target.config)
    size = 2 if p.get("dtype") in ("float16", "bfloat16") else FLOAT32
    b, prefix = max(_ints(p, "batches"), default=0), max(_ints(p, "prefixes"), default=0)
    m = max(_ints(p, "nodes") + [t.num_nodes for t in custom.values()], default=0)
    return attention_grid_bytes(b, heads, kv_heads, head_dim, prefix, m, size)


@dataclass(frozen=True)
class _Setting:
    """What every part of one notebook's estimate shares."""

    notebook: str
    device: str
    dtype: str
    notes: list[str]  # filled while sizing; frozen into RunMemory.notes

    @property
    def db(self) -> int:
        return DTYPE_BYTES.get(self.dtype, FLOAT32)  # another dtype name: counted as float32

    def pair(self, p: Mapping[str, Any]) -> tuple[_Model, _Model]:
        target = _load(p.get("target") or "", p.get("target_quantization"), None, self.notes)
        draft = _load(p.get("draft") or "", p.get("draft_quantization"), p.get("draft_layers"), self.notes)
        return target, draft

    def memory(self, **parts: int) -> RunMemory:
        return RunMemory(
            self.notebook, self.device, self.dtype, runtime=RUNTIME[self.device], notes=tuple(self.notes), **parts
        )


def _tree_shapes_memory(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """01: the pair, a collection with super-trees, every shape and budget replayed, Sequoia's trees
    designed at the largest budget, the verify-cost curve, methods checked end to end."""
    target, draft = s.pair(p)
    custom = custom_trees(p.get("custom_trees"), notes=s.notes)
    new = _int(p, "max_new_tokens")
    cache = max(LONGEST_PROMPT + new, _int(p, "verify_prefix"))
    static = _tree_sizes(p.get("shapes") or [], _ints(p, "budgets"), [], custom)
    run = _tree_sizes([], [], [*(p.get("check_methods") or []), "chain:4"], custom)
    size = max(_ints(p, "dynamic_budgets"), default=1)
    nodes = max([t.nodes for t in static + run] + _ints(p, "dynamic_budgets") + _ints(p, "verify_nodes"), default=0)
    k = _int(p, "super_k")
    top_k = max([t.widest + 1 for t in static] + [k, _int(p, "top_k")])
    vocab = target.vocab or draft.vocab
    replayed = max([t.nodes for t in static] + [size])
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db),
        kv_cache=target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db),
        verify=_verify(target.config, nodes, cache, new, s.db, LONGEST_PROMPT),
        continuations=_continuations(p, target, s),
        super_trees=_super_tree_bytes(draft, target, size, k, _int(p, "super_depth"), cache, s.db),
        arrays=_replay_bytes(_int(p, "max_prompts") * new, new, vocab, replayed, top_k, sequoia=True),
    )


def _continuations(p: Mapping[str, Any], target: _Model, s: _Setting) -> int:
    """The target decoding `batch` prompts' continuations together (`experiments.continuations`): their
    caches, and the forward that prefills them (rows of similar length together: the longest at worst)."""
    batch = min(_int(p, "batch", 1), _int(p, "max_prompts", 1))
    cache = batch * target.kv(LONGEST_PROMPT + _int(p, "max_new_tokens") + 1, s.db)
    return cache + forward_bytes(target.config, LONGEST_PROMPT, 0, s.db, logits_rows=1, batch=batch)


def _model_pairs_memory(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """02: every pair in turn, with the models held for later pairs (`experiments.sweeps.run_pairs`),
    its methods and, with `grid`, its collection (super-trees) and every shape x budget replayed and
    designed (`experiments.grid`); the largest pair is the estimate (a note names it)."""
    new = _int(p, "max_new_tokens")
    cache = LONGEST_PROMPT + new
    pairs = [q for q in p.get("pairs") or [] if isinstance(q, Mapping)]
    keys = [
        (
            (q.get("target") or "", q.get("target_quantization"), None),
            (q.get("draft") or "", q.get("draft_quantization"), q.get("draft_layers")),
        )
        for q in pairs
    ]
    models = {key: _load(*key, notes=s.notes) for pair in keys for key in pair}
    held: set[tuple] = set()
    candidates = []
    for i, (q, (target_key, draft_key)) in enumerate(zip(pairs, keys)):
        held = {key for key in held if key in {k for later in keys[i:] for k in later}} | {target_key, draft_key}
        target, draft = models[target_key], models[draft_key]
        custom = custom_trees(p.get("custom_trees"), q.get("custom_trees"), notes=s.notes)
        trees = _tree_sizes([], [], [*(q.get("methods") or p.get("methods") or []), *(p.get("measure") or [])], custom)
        grid = _tree_sizes(p.get("shapes") or [], _ints(p, "budgets"), [], custom) if p.get("grid") else []
        nodes = max((t.nodes for t in trees + grid), default=0)
        dynamic = max((t.nodes for t in trees if t.shape == DYNAMIC), default=0) if p.get("replay", True) else 0
        dynamic = max([dynamic, *(_ints(p, "dynamic_budgets") if grid else [])])
        k, depth = (_int(p, "super_k"), _int(p, "super_depth")) if grid else (DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH)
        top_k = max([t.widest + 1 for t in trees + grid] + [COLLECTION_TOP_K, _int(p, "top_k") if grid else 0])
        parts = dict(
            weights=sum(models[key].weights(s.db) for key in held),
            kv_cache=target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db),
            verify=_verify(target.config, nodes, cache, new, s.db, LONGEST_PROMPT),
            continuations=_continuations(p, target, s) if grid else 0,
            super_trees=_super_tree_bytes(draft, target, dynamic, max(k, DYNAMIC_TOP_K), depth, cache, s.db),
            arrays=_replay_bytes(
                _int(p, "max_prompts") * new, new, target.vocab or draft.vocab, nodes, top_k, sequoia=bool(grid)
            ),
        )
        label = f"largest: pair {i + 1} of {len(pairs)}, {draft.name} -> {target.name}, {len(held)} models held"
        candidates.append((sum(parts.values()), label, parts))
    if not candidates:
        return s.memory()
    _, label, parts = max(candidates, key=lambda c: c[0])
    s.notes.insert(0, label)
    return s.memory(**parts)


def _attention_memory(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """03: the attention grid (no model loaded), then the verify-cost curve of the pair on a cache of
    verify_prefix tokens (the draft's forward up to the widest level, at most the largest tree)."""
    target, draft = s.pair(p)
    custom = custom_trees(p.get("custom_trees"), notes=s.notes)
    cache = _int(p, "verify_prefix")
    nodes = max(_ints(p, "verify_nodes") + [t.num_nodes for t in custom.values()], default=0)
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db),
        kv_cache=target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db),
        verify=max(
            forward_bytes(target.config, nodes + 1, cache, s.db), forward_bytes(draft.config, nodes, cache, s.db)
        ),
        grid=_grid_bytes(p, target, custom, s.notes),
    )


def _generation_memory(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """04 (and a notebook without a rule of its own): the pair, the full cache (window 0) of the
    longest generation, its largest tree and the perplexity score of its output."""
    target, draft = s.pair(p)
    custom = custom_trees(p.get("custom_trees"), notes=s.notes)
    new = _int(p, "max_new_tokens")
    cache = LONGEST_PROMPT + new
    nodes = max((t.nodes for t in _tree_sizes([], [], p.get("methods") or [], custom)), default=0)
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db),
        kv_cache=target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db),
        verify=_verify(target.config, nodes, cache, new, s.db, LONGEST_PROMPT),
    )


def _batch_memory(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """06: the largest batch's caches (prompts of at most max_prompt_tokens), its verify forward over
    the largest tree in every row, the replayed collection of its prompts."""
    target, draft = s.pair(p)
    custom = custom_trees(p.get("custom_trees"), notes=s.notes)
    new, batch = _int(p, "max_new_tokens"), max(_ints(p, "batches"), default=1)
    prompt = min(LONGEST_PROMPT, _int(p, "max_prompt_tokens", LONGEST_PROMPT))
    cache = prompt + new
    trees = _tree_sizes(p.get("shapes") or [], _ints(p, "budgets"), [f"chain:{_int(p, 'k', 1)}"], custom)
    nodes = max((t.nodes for t in trees), default=0)
    top_k = max([t.widest + 1 for t in trees] + [COLLECTION_TOP_K])
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db),
        kv_cache=batch * (target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db)),
        verify=_verify(target.config, nodes, cache, new, s.db, prompt, batch),
        arrays=_replay_bytes(_int(p, "max_prompts") * new, new, target.vocab or draft.vocab, nodes, top_k),
    )


def _learned_memory(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """05: the pair and the Medusa and EAGLE heads (`_head_bytes`); where a head is trained, the
    distillation batches (gen_batch rows of prompt + distill_tokens, `samples` sampled rows more for
    each) and the training step;
    the heads' super-trees (EAGLE-2's trees re-drafted) and replays of every drafter's trees."""
    target, draft = s.pair(p)
    custom = custom_trees(p.get("custom_trees"), notes=s.notes)
    new, distill = _int(p, "max_new_tokens"), _int(p, "distill_tokens")
    prompt = min(LONGEST_PROMPT, _int(p, "max_prompt_tokens", LONGEST_PROMPT))
    rows = max(_int(p, "gen_batch", 1), 1) * (1 + _int(p, "samples"))
    budgets = _ints(p, "budgets")
    nodes = max(budgets + [_int(p, "speed_budget")] + [t.num_nodes for t in custom.values()], default=0)
    _, _, _, hidden, intermediate = _shape(target.config)
    vocab = target.vocab
    training, trains = 0, "train" in (p.get("heads"), p.get("eagle_heads"))
    if trains:
        kept = _int(p, "train_prompts") * (1 + _int(p, "samples")) * (distill + (prompt if p.get("prompt_rows") else 0))
        batch, num_heads = _int(p, "batch_size"), _int(p, "num_heads")
        loss_vocab = vocab if p.get("loss_vocab") == "full" else min(vocab, batch * num_heads + MEDUSA_NEGATIVES)
        medusa = batch * num_heads * loss_vocab * FLOAT32 * (SOFTMAX_COPIES + 1) if p.get("heads") == "train" else 0
        eagle_rows = _int(p, "eagle_batch_rows")
        ce_rows = _int(p, "eagle_ce_rows") or eagle_rows
        eagle = (
            eagle_rows * (6 * hidden + 3 * intermediate) * FLOAT32 * 2
            + ce_rows * vocab * FLOAT32 * (SOFTMAX_COPIES + 1)
            if p.get("eagle_heads") == "train"
            else 0
        )
        training = kept * hidden * FLOAT32 + max(medusa, eagle)
    size = max(budgets, default=1)
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db) + _head_bytes(p, target, s.db, s.notes),
        kv_cache=max(
            target.kv(prompt + new + 1 + nodes, s.db) + draft.kv(prompt + new + 1 + nodes, s.db),
            rows * target.kv(prompt + distill, s.db) if trains else 0,
        ),
        verify=max(
            _verify(target.config, nodes, prompt + new, new, s.db, prompt),
            forward_bytes(target.config, prompt + distill, 0, s.db, logits_rows=1, batch=rows) if trains else 0,
        ),
        super_trees=_super_tree_bytes(
            draft, target, size, _int(p, "dynamic_top_k"), _int(p, "eagle_depth"), prompt + new, s.db
        ),
        arrays=_replay_bytes(_int(p, "test_prompts") * new, new, vocab, nodes, max(nodes, COLLECTION_TOP_K), True),
        training=training,
    )


def _head_bytes(p: Mapping[str, Any], target: _Model, dtype_bytes: int, notes: list[str]) -> int:
    """05's Medusa and EAGLE heads: trained (float32, ADAM_COPIES), random stand-ins (model dtype), or
    a published checkpoint (`io.checkpoints`); a folder or an unknown id: not counted, said so."""
    heads, kv_heads, head_dim, hidden, intermediate = _shape(target.config)
    vocab = target.vocab
    medusa, eagle = p.get("heads") or "", p.get("eagle_heads") or ""
    out = 0
    if medusa in ("train", "standin"):
        own_head = 0 if p.get("share_lm_head", True) and medusa == "train" else vocab * hidden
        blocks = _int(p, "num_heads") * (max(_int(p, "head_layers", 1), 1) * (hidden * hidden + hidden) + own_head)
        out += blocks * (FLOAT32 * ADAM_COPIES if medusa == "train" else dtype_bytes)
    if eagle in ("train", "standin"):
        layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate + hidden
        size = 2 * hidden * hidden + hidden + layer
        out += size * (FLOAT32 * ADAM_COPIES if eagle == "train" else dtype_bytes)
    published = published_checkpoints()
    for name in (medusa, eagle):
        if name in ("train", "standin", ""):
            continue
        checkpoint = published.get(name)
        if isinstance(checkpoint, PublishedHeads):
            out += medusa_heads_bytes(hidden, vocab, checkpoint.num_heads, checkpoint.num_layers, dtype_bytes)
        elif isinstance(checkpoint, PublishedEagle):
            out += eagle_head_bytes(checkpoint, dtype_bytes)
        else:
            notes.append(f"heads {name}: not a published checkpoint specnb knows, not counted")
    return out


def _no_memory(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """07: no model, only the runs' tables and figures (the interpreter's runtime)."""
    return s.memory()


def notebook_memory(
    notebook: str, params: Mapping[str, Any], device: str | None = None, folder: Path = NOTEBOOKS
) -> RunMemory:
    """The estimate for one notebook (its stem) from its resolved parameters, by the rule its spec
    names (`rule_of`: without a spec, or naming no known rule, "generation", and a note says so).
    device: "cpu" or "cuda" (None: this machine's, CUDA where torch sees it)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = params.get("model_dtype") or ("float16" if device == "cuda" else "float32")
    rule, note = rule_of(notebook, folder)
    setting = _Setting(notebook, device, dtype, [note] if note else [])
    return rule.memory(setting, params)


# ---- this machine and the check ----------------------------------------------------------------


def available_bytes() -> tuple[int, str]:
    """(bytes, where the number comes from): CUDA device 0's total memory where torch sees CUDA, else
    MemAvailable of /proc/meminfo, else psutil's available memory, else a very large number, unknown."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return int(props.total_memory), f"total memory of CUDA device 0, {props.name}"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return 1 << 62, "unknown: no /proc/meminfo and no psutil, so nothing is refused"
    return int(psutil.virtual_memory().available), "available memory, psutil"


def check_run_memory(
    resolved: Mapping[str, Mapping[str, Any]], available: tuple[int, str] | None = None, folder: Path = NOTEBOOKS
) -> None:
    """ParameterError, before any model loads, naming every notebook of `resolved` (stem -> its
    parameters) whose estimate exceeds `available` (default `available_bytes()`): the estimate with
    its parts in GB, what this machine has, and the parameters that size its largest parts."""
    limit, where = available or available_bytes()
    refused = [m for m in (notebook_memory(nb, p, folder=folder) for nb, p in resolved.items()) if m.total > limit]
    if refused:
        raise ParameterError("\n".join(refusal(m, limit, where, folder) for m in refused))


def refusal(memory: RunMemory, limit: int, where: str, folder: Path = NOTEBOOKS) -> str:
    """Why `memory` does not fit in `limit` bytes, and the parameters that size its largest parts (its
    spec's `lower`: up to three, each at least 5% of the total)."""
    lower = registry.spec(memory.notebook, folder).lower
    parts = memory.parts()
    largest = sorted(((v, k) for k, v in parts.items() if k in lower and v >= 0.05 * memory.total), reverse=True)[:3]
    advice = "; ".join(f"{PART_NAMES[k]} {gb(v)} GB: {', '.join(lower[k])}" for v, k in largest)
    return (
        f"{memory.describe()}\n  does not fit: this machine has {gb(limit)} GB ({where}); nothing was started. "
        f"Lower the parameters that size the largest parts ({advice})."
    )


# ---- time on a T4, from published figures --------------------------------------------------------

FIGURES_FILE = Path(__file__).with_name("t4_figures.json")  # the inputs, each with its source (`T4Figures`)


@dataclass(frozen=True)
class T4Figures:
    """The inputs (FIGURES_FILE: each value with its source, or marked as an assumption)."""

    nf4_step_3b_s: float
    nf4_rows8_over_1: float
    launch_per_layer_s: float
    bandwidth_bytes_per_s: float
    attention_call_floor_s: float
    tau: float
    download_bytes_per_s: float
    load_bytes_per_s: float
    setup_s: float
    flex_compile_s: float
    prompt_tokens: int

    @classmethod
    def published(cls, path: Path | None = None) -> T4Figures:
        """The inputs as FIGURES_FILE (or `path`) gives them."""
        data = json.loads(Path(path or FIGURES_FILE).read_text())
        return cls(**{name: entry["value"] for name, entry in data.items()})


def qwen25_3b_nf4_bytes() -> int:
    """The nf4 weight bytes of Qwen2.5-3B, the model of bitsandbytes' published T4 figures (its
    config.json sizes: hidden 2048, intermediate 11008, 36 layers, 16 heads, 2 key-value heads,
    vocabulary 151936, tied embeddings)."""
    config = Qwen2Config(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    return weight_bytes(config, "4bit").total


class Costs:
    """Seconds of the T4's basic operations for one profile's models."""

    def __init__(self, figures: T4Figures) -> None:
        self.f = figures
        self.reference = qwen25_3b_nf4_bytes()
        self.exponent = math.log(figures.nf4_rows8_over_1) / math.log(8)

    def step(self, target: str, quantization: str | None) -> float:
        """One single-row decoding step of the target."""
        return self.f.nf4_step_3b_s * weight_bytes(config_of(target), quantization).total / self.reference

    def verify(self, target: str, quantization: str | None, rows: int) -> float:
        return self.step(target, quantization) * max(rows, 1) ** self.exponent

    def draft(self, draft: str) -> float:
        """One float16 forward of the draft at batch 1."""
        config = config_of(draft)
        return max(
            config.num_hidden_layers * self.f.launch_per_layer_s,
            weight_bytes(config, None).total / self.f.bandwidth_bytes_per_s,
        )

    def generation(
        self, target: str, quantization: str | None, draft: str | None, tree: Tree | None, tokens: int, prompt: int
    ) -> float:
        """One generation with its prefill and its perplexity pass: the target alone (tree None), a
        speculative run with a draft model, or with heads (draft None: drafting costs nothing)."""
        fixed = self.verify(target, quantization, prompt) + self.verify(target, quantization, prompt + tokens)
        if tree is None:
            return fixed + tokens * self.step(target, quantization)
        per_step = self.verify(target, quantization, tree.num_nodes + 1) + (
            tree.depth * self.draft(draft) if draft else 0.0
        )
        return fixed + tokens / self.f.tau * per_step

    def collection(
        self, target: str, quantization: str | None, draft: str, tokens: int, draft_pass: bool = True
    ) -> float:
        """One prompt of a collection that makes its own continuation: an exact chain:4 run and
        (draft_pass) the teacher-forced draft pass."""
        run = self.generation(target, quantization, draft, Tree.chain(4), tokens, self.f.prompt_tokens)
        return run + (self.draft(draft) if draft_pass else 0.0)

    def continuations(self, target: str, quantization: str | None, tokens: int, batch: int) -> float:
        """One batch of `batch` prompts' continuations decoded together (`experiments.continuations`):
        the ragged prefill, then one verify of `batch` rows per token."""
        prefill = self.verify(target, quantization, batch * self.f.prompt_tokens)
        return prefill + tokens * self.verify(target, quantization, batch)

    def super_trees(self, draft: str, tokens: int, size: int) -> float:
        """One prompt's super-trees of up to `size` nodes: each chunk of SUPER_CHUNK positions grows in
        rounds of one draft forward, each round one fed node per position, so at most `size` rounds
        (an upper bound: on-path nodes are not fed)."""
        return math.ceil(tokens / SUPER_CHUNK) * size * self.draft(draft)

    def curve(self, target: str, quantization: str | None, draft: str, nodes: Sequence[int], rows: int = 1) -> float:
        """One pass of a verify-cost curve: a verify of rows x (n + 1) and a draft forward per point n."""
        return sum(self.verify(target, quantization, rows * (n + 1)) for n in nodes) + len(nodes) * self.draft(draft)

    def load(self, name: str) -> float:
        """Reading (and quantizing) a model's hub files, or a published head checkpoint's."""
        if name in published_checkpoints():
            size = published_download(name).bytes
        else:
            size = download_bytes(config_of(name), hub_model(name).weights_dtype)
        return size / self.f.load_bytes_per_s


def _row(notebook: str, part: str, count: float, each: float) -> dict:
    return {"notebook": notebook, "part": part, "count": count, "each_s": each, "seconds": count * each}


def t4_time(
    profile: str = "t4", figures: T4Figures | None = None, files: Sequence[str | Path] = (), folder: Path = NOTEBOOKS
) -> pd.DataFrame:
    """One row per (notebook, part): the notebook's number ("set-up" before them) and stem, the part,
    how many of it, seconds each, seconds in all (an estimate), each notebook by the rule its spec
    names (`registry`); files: parameter files on top of the profile (the user's custom trees);
    figures: default `T4Figures.published()`; folder: the notebooks (and their profiles/)."""
    p = profile_params(profile, files, folder)
    f = figures or T4Figures.published()
    c = Costs(f)
    rows = [
        _row("set-up", "pip install (assumption)", 1, f.setup_s),
        _row(
            "set-up",
            "downloads",
            sum(d.bytes for d in profile_downloads(profile, folder)) / f.download_bytes_per_s,
            1.0,
        ),
    ]
    rows = [r | {"stem": "set-up"} for r in rows]
    decoded: set[tuple[str, str | None]] = set()  # targets whose continuations a notebook decoded already
    for stem, params in p.items():
        rule, note = rule_of(stem, folder)
        number = registry.spec(stem, folder).number or stem
        said = [_row(number, note, 0, 0.0)] if note else []  # why the generic rule sized it
        rows += [r | {"stem": stem} for r in said + rule.t4(params, c, number, decoded)]
    return pd.DataFrame(rows)


def _tree_shapes_t4(a: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 01 (parameters `a`): the collection, super-trees, check runs, the verify curve."""
    prompt = c.f.prompt_tokens
    rows: list[dict] = []
    t, tq, d = a["target"], a["target_quantization"], a["draft"]
    n, prompts = a["max_new_tokens"], a["max_prompts"]
    custom = custom_trees_of(a)
    named = {parse_method(m, custom).shape for m in a["check_methods"]}
    extra = [tree for name, tree in custom.items() if name not in named]  # with_custom_trees: each checked
    verify_nodes = budget_axis(a["verify_nodes"], custom)  # the curve at the custom trees' sizes too
    r = a["run_tokens"]
    batch = a["batch"]
    decoded.add((t, tq))  # its continuations: a later notebook with this target reads them
    rows += [
        _row(nb, "load target and draft", 1, c.load(t) + c.load(d)),
        _row(
            nb,
            f"the target's continuations, {batch} prompts at once (02 reads them)",
            math.ceil(prompts / batch),
            c.continuations(t, tq, n, batch),
        ),
        _row(nb, "teacher-forced draft pass (ranks)", prompts, c.draft(d)),
        _row(
            nb,
            f"super-trees (up to {max(a['dynamic_budgets'], default=0)} nodes, chunks of {SUPER_CHUNK} positions)",
            min(a["super_prompts"] or prompts, prompts),
            c.super_trees(d, n, max(a["dynamic_budgets"], default=0)),
        ),
        _row(nb, "check runs: target alone", a["check_prompts"], c.generation(t, tq, None, None, r, prompt)),
        _row(
            nb,
            "check runs: methods",
            a["check_prompts"] * len(a["check_methods"]),
            c.generation(t, tq, d, Tree.sparse(16), r, prompt),
        ),
        _row(
            nb,
            "recommended tree run end to end, the target alone beside it (a 16-node tree assumed)",
            a["measure_prompts"],
            c.generation(t, tq, None, None, r, prompt) + c.generation(t, tq, d, Tree.sparse(16), r, prompt),
        ),
        _row(nb, "verify-cost curve", a["verify_repeats"] + 1, c.curve(t, tq, d, verify_nodes)),
    ]
    if extra:
        rows.append(
            _row(
                nb,
                f"check runs: {len(extra)} custom trees",
                a["check_prompts"],
                sum(c.generation(t, tq, d, tree, r, prompt) for tree in extra),
            )
        )
    return rows


def _model_pairs_t4(b: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 02 (parameters `b`): per pair its loads, target alone, methods end to end on the first
    method_prompts prompts, the grid; decoded: targets whose continuations 01 decoded already."""
    prompt = c.f.prompt_tokens
    rows: list[dict] = []
    n2, prompts2, rounds2 = b["run_tokens"], b["method_prompts"], b["rounds"]  # every timed run, rounds times
    targets_seen: set[str] = set()
    loaded: set[str] = set()  # run_pairs keeps a model loaded while a later pair still uses it
    custom = custom_trees_of(b)
    everyone = with_custom_trees(b["methods"], custom)  # the notebook adds each custom tree no method names
    for i, pair in enumerate(b["pairs"]):
        t, tq, d = pair["target"], pair.get("target_quantization"), pair["draft"]
        methods = [parse_method(m, custom) for m in (pair.get("methods") or everyone)]
        shared = hub_model(t).tokenizer.family == hub_model(d).tokenizer.family
        label = f"{d} -> {t}"
        loaded &= {x for later in b["pairs"][i:] for x in (later["target"], later["draft"])}
        rows.append(_row(nb, f"{label}: load", 1, sum(c.load(x) for x in {t, d} - loaded)))
        loaded |= {t, d}
        if t not in targets_seen:
            targets_seen.add(t)
            rows.append(
                _row(nb, f"{label}: target alone", prompts2 * rounds2, c.generation(t, tq, None, None, n2, prompt))
            )
        run = [
            m
            for m in methods
            if (m.shared_vocabulary <= shared) and not (b["replay"] and m.replayable and m.spec not in b["measure"])
        ]
        replayed = [m for m in methods if shared and b["replay"] and m.replayable and m.spec not in b["measure"]]
        rows.append(
            _row(
                nb,
                f"{label}: {len(run)} methods end to end",
                prompts2 * len(run) * rounds2,
                sum(c.generation(t, tq, d, m.tree, n2, prompt) for m in run) / max(len(run), 1),
            )
        )
        if replayed:
            rows.append(
                _row(
                    nb,
                    f"{label}: one collection for {len(replayed)} replayed trees",
                    prompts2,
                    c.collection(t, tq, d, n2)
                    + c.super_trees(d, n2, max((m.budget for m in replayed if m.shape == DYNAMIC), default=0)),
                )
            )
        if b.get("grid"):
            mine = {**b, **{k: pair[k] for k in ("shapes", "budgets", "dynamic_budgets") if pair.get(k) is not None}}
            mine["max_prompts"] = min(pair.get("grid_prompts") or b["max_prompts"], b["max_prompts"])
            rows += _grid_t4(mine, c, nb, label, (t, tq, d), shared, custom, (t, tq) in decoded)
            decoded.add((t, tq))
    return rows


def _grid_t4(
    b: dict, c: Costs, nb: str, label: str, models: tuple, shared: bool, custom: dict, decoded: bool = False
) -> list[dict]:
    """Notebook 02's grid of one pair: the target's continuations (unless 01 or an earlier pair decoded
    them), the teacher-forced draft pass, super-trees on super_prompts; across tokenizers, every
    distinct tree re-drafted for every prompt at once (about max_new_tokens / 2 steps, one batched draft
    forward per level) and the dynamic trees on super_prompts, one prompt at a time."""
    t, tq, d = models
    n, prompts, batch = b["max_new_tokens"], b["max_prompts"], b["batch"]
    rows = []
    if not decoded:
        rows.append(
            _row(
                nb,
                f"{label}: the target's continuations, {batch} prompts at once",
                math.ceil(prompts / batch),
                c.continuations(t, tq, n, batch),
            )
        )
    if shared:
        rows.append(_row(nb, f"{label}: teacher-forced draft pass (ranks)", prompts, c.draft(d)))
        if b["super_k"]:
            rows.append(
                _row(
                    nb,
                    f"{label}: the grid's super-trees (up to {max(b['dynamic_budgets'], default=0)} nodes)",
                    min(b["super_prompts"] or prompts, prompts),
                    c.super_trees(d, n, max(b["dynamic_budgets"], default=0)),
                )
            )
        return rows
    trees = trees_for(b["shapes"], b["budgets"], custom)
    distinct = {tuple(sorted(tree.paths)): tree for tree in trees.values()}
    levels = sum(tree.depth + 1 for tree in distinct.values())  # each step feeds the accepted tokens, then a level
    rows.append(
        _row(
            nb,
            f"{label}: the grid re-drafted across tokenizers, every prompt at once ({len(distinct)} trees)",
            math.ceil(n / 2),
            levels * c.draft(d),
        )
    )
    dynamic = len(b["dynamic_budgets"]) * (b["super_depth"] + 1)
    rows.append(
        _row(
            nb,
            f"{label}: dynamic trees re-drafted, one prompt at a time",
            min(b["super_prompts"] or prompts, prompts) * math.ceil(n / 2),
            dynamic * c.draft(d),
        )
    )
    return rows


def _attention_t4(g: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 03 (parameters `g`): the attention grid, FlexAttention's compile, the verify curve."""
    f = c.f
    rows: list[dict] = []
    heads = head_shape(g["attention_shape"] or g["target"])  # the target's config unless given
    calls = 0.0
    mine = custom_trees_of(g)
    custom = list(mine.values())  # timed at every batch and prefix, at their node count
    verify_nodes = budget_axis(g["verify_nodes"], mine)
    trees = [Tree.sparse(n) for n in g["nodes"]] + custom
    for batch in g["batches"]:
        for prefix in g["prefixes"]:
            for tree in trees:
                nodes = tree.num_nodes
                kv = 2 * batch * heads.kv_heads * (prefix + nodes) * heads.head_dim * FLOAT16_BYTES
                one = max(f.attention_call_floor_s, kv / f.bandwidth_bytes_per_s)
                leaves = len(tree.leaves)
                per_impl = {"per_sequence": leaves * one, "eager": 3 * one}
                calls += sum(per_impl.get(i, one) for i in g["impls"]) * (g["warmup"] + g["repeats"])
    t, tq, d = g["target"], g["target_quantization"], g["draft"]
    rows += [
        _row(nb, "attention grid (every implementation, warm-up and repeats)", 1, calls),
        _row(nb, "FlexAttention compile (assumption)", int("flex" in g["impls"]), f.flex_compile_s),
        _row(nb, "load target and draft", 1, c.load(t) + c.load(d)),
        _row(nb, "verify-cost curve", g["verify_repeats"] + 1, c.curve(t, tq, d, verify_nodes)),
    ]
    return rows


def _generation_t4(h: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """A notebook that generates (04, and the rule of a notebook whose spec names no other): every
    method (`methods`, else the target alone) on max_prompts prompts x max_new_tokens tokens, over
    every cache window (`windows`: 04's), and its models' loads."""
    prompt = c.f.prompt_tokens
    rows: list[dict] = []
    t, tq, d = h.get("target") or "", h.get("target_quantization"), h.get("draft") or ""
    if not t:
        return rows
    windows = len({0, *(h.get("windows") or [])})
    tokens, prompts = h.get("max_new_tokens") or 0, h.get("max_prompts") or 1
    for m in h.get("methods") or [TARGET_ALONE]:
        tree = None if m == TARGET_ALONE else parse_method(m).tree
        rows.append(
            _row(
                nb,
                f"{m}: {tokens} tokens x {windows} caches",
                prompts * windows,
                c.generation(t, tq, d if tree is not None else None, tree, tokens, prompt),
            )
        )
    rows.append(_row(nb, "load target and draft", 1, c.load(t) + (c.load(d) if d else 0.0)))
    return rows


def _learned_t4(m: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 05 (parameters `m`): heads' collections, re-drafted EAGLE-2 trees, timed runs."""
    prompt = c.f.prompt_tokens
    rows: list[dict] = []
    t, tq, d, n5 = m["target"], m["target_quantization"], m["draft"], m["max_new_tokens"]
    tree = Tree.sparse(max(m["budgets"])).truncated(5)
    speed_tree = Tree.sparse(m["speed_budget"]).truncated(5)
    eagle = m.get("eagle_heads") if m.get("eagle_heads") in published_checkpoints() else None  # published: sized
    loaded = m["heads"] != "train" or m["eagle_heads"] != "train"
    measured = m["test_prompts"] // 2 if loaded else m["test_prompts"]  # loaded heads: trees designed on the other half
    rounds = m.get("rounds", 1)
    rows += [
        _row(
            nb,
            "load target, heads" + (", EAGLE head" if eagle else "") + " and draft",
            1,
            c.load(t) + c.load(m["heads"]) + (c.load(eagle) if eagle else 0.0) + (c.load(d) if d else 0.0),
        ),
        _row(
            nb,
            "head collections (a Medusa run and an EAGLE run per test prompt)",
            2 * m["test_prompts"],
            c.generation(t, tq, None, tree, n5, prompt),
        ),
        _row(
            nb,
            "draft-model collection (the measured prompts)",
            measured if d else 0,
            c.collection(t, tq, d, n5) if d else 0.0,
        ),
        # one head forward (a decoder layer and the LM head) per depth and position: two layers' launches (assumption)
        _row(
            nb,
            "EAGLE-2 trees re-drafted at every position (head forwards only, depth x tokens)",
            m["test_prompts"],
            n5 * m.get("eagle_depth", 6) * 2 * c.f.launch_per_layer_s,
        ),
        _row(
            nb,
            "timed: target alone, 3 best static trees, EAGLE-2's and the draft's dynamic trees",
            measured * rounds,
            c.generation(t, tq, None, None, n5, prompt)
            + 3 * c.generation(t, tq, None, speed_tree, n5, prompt)
            + ((1 + bool(m.get("draft_dynamic"))) * c.generation(t, tq, d, speed_tree, n5, prompt) if d else 0.0),
        ),
        _row(
            nb,
            "typical vs lossless: target sample + 2 runs",
            m["typical_prompts"],
            c.generation(t, tq, None, None, n5, prompt) + 2 * c.generation(t, tq, None, tree, n5, prompt),
        ),
    ]
    return rows


def _batch_t4(z: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 06 (parameters `z`): the collection, references, batched cost curves and runs per batch."""
    prompt, f = c.f.prompt_tokens, c.f
    rows: list[dict] = []
    t, tq, d, n6 = z["target"], z["target_quantization"], z["draft"], z["max_new_tokens"]
    chain = Tree.chain(z["k"])
    custom = custom_trees_of(z)  # replayed and costed beside the shapes, the shapes also at their node count
    budgets = budget_axis(z["budgets"], custom)
    sizes = {Tree.preset(s, x).num_nodes for s in z["shapes"] for x in budgets} | {t.num_nodes for t in custom.values()}
    widest = max(sizes)
    rows += [
        _row(nb, "load target and draft", 1, c.load(t) + c.load(d)),
        _row(nb, "collection for tau (chain:4 run per prompt)", z["max_prompts"], c.collection(t, tq, d, n6)),
        _row(
            nb,
            "each row's batch-1 greedy reference (the target alone)",
            max(z["batches"]),
            c.generation(t, tq, None, None, n6, prompt),
        ),
    ]
    for b in z["batches"]:
        nodes = sorted({0, *sizes})
        rows.append(_row(nb, f"batched cost curves at batch {b}", z["curve_repeats"] + 1, c.curve(t, tq, d, nodes, b)))
        alone = n6 * c.verify(t, tq, b)  # one decoding step of b rows per token
        spec = sum(
            n6 / f.tau * (c.verify(t, tq, b * (tree.num_nodes + 1)) + tree.depth * c.draft(d))
            for tree in (chain, Tree.sparse(widest))
        )
        rows.append(
            _row(
                nb,
                f"batch {b}: target alone, transformers' batched generate, chain and the best tree",
                z["rounds"],
                2 * alone + spec,
            )
        )
    return rows


def t4_markdown(profile: str = "t4", figures: T4Figures | None = None, files: Sequence[str | Path] = ()) -> str:
    """docs/t4.md's summary: minutes per notebook and in all, with the inputs named."""
    table = t4_time(profile, figures, files)
    by = table.groupby("notebook", sort=False)["seconds"].sum() / 60
    parts = ", ".join(f"{name} {minutes:.0f} min" for name, minutes in by.items())
    return (
        f"**About {table['seconds'].sum() / 60:.0f} min for `./run_notebooks.sh {profile}`** (an estimate: {parts}; "
        f"`python -m specnb.notebook.estimate time {profile}` prints every part and its inputs)"
    )


# ---- the rules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A notebook's estimate (its spec's "estimate"): its memory, and its work priced on a T4."""

    memory: Callable[[_Setting, Mapping[str, Any]], RunMemory]
    t4: Callable[[dict, Costs, str, set], list[dict]]


RULES = {  # a notebook's spec names its rule (`registry.NotebookSpec.estimate`)
    "tree_shapes": Rule(_tree_shapes_memory, _tree_shapes_t4),
    "model_pairs": Rule(_model_pairs_memory, _model_pairs_t4),
    "attention_timing": Rule(_attention_memory, _attention_t4),
    "generation": Rule(_generation_memory, _generation_t4),
    "learned_drafters": Rule(_learned_memory, _learned_t4),
    "batch_size": Rule(_batch_memory, _batch_t4),
    "none": Rule(_no_memory, lambda params, c, nb, decoded: []),  # no model: no part worth a T4's time
}


def rule_of(stem: str, folder: Path = NOTEBOOKS) -> tuple[Rule, str | None]:
    """The rule the notebook's spec names, or "generation" (its models, caches and the generations of
    `methods`) with a note saying why: no spec in its metadata, or a rule RULES lacks."""
    spec = registry.spec(stem, folder)
    if spec.estimate not in RULES:
        return RULES["generation"], f"no estimate rule {spec.estimate!r} (have {sorted(RULES)}): sized as a generation"
    if not spec.declared:
        return RULES["generation"], "no spec in its metadata: sized as a generation"
    return RULES[spec.estimate], None


# ---- a profile's notebooks ---------------------------------------------------------------------

T4_USABLE = int(14 * GB)  # of the T4's 15 GB, what the models, caches and activations may take


def profile_params(
    profile: str, files: Sequence[str | Path] = (), folder: Path = NOTEBOOKS
) -> dict[str, dict[str, Any]]:
    """The profile's parameters per notebook of `folder` (profiles in its profiles/), with parameter
    files (`run_notebooks.sh -f`) layered on."""
    return resolve(profile, {}, [Path(f) for f in files], notebooks(folder), folder / "profiles")


def profile_memory(profile: str, files: Sequence[str | Path] = (), device: str = "cuda") -> list[RunMemory]:
    """Every notebook's memory estimate for the profile's parameters on `device` (`notebook_memory`)."""
    return [
        notebook_memory(notebook, params, device=device) for notebook, params in profile_params(profile, files).items()
    ]


FREE_DRIVE = int(15 * GB)  # a free Google Drive (shared with Gmail and Photos)


@dataclass(frozen=True)
class Download:
    name: str  # hub id
    what: str  # "model", "Medusa heads" or "EAGLE head"
    dtype: str  # of the files
    parameters: int
    bytes: int


def published_download(repo_id: str) -> Download:
    """A published head checkpoint (`io.published.published_checkpoints`): its tensors counted from
    its base model's config (Medusa) or its own config's sizes (EAGLE, the target's embedding
    included where the file holds it), times the bytes of the published dtype."""
    h = published_checkpoints()[repo_id]
    size_of = DTYPE_BYTES[h.dtype]
    if isinstance(h, PublishedHeads):
        base = config_of(h.base_model)
        size = medusa_heads_bytes(base.hidden_size, base.vocab_size, h.num_heads, h.num_layers, size_of)
        return Download(repo_id, "Medusa heads", h.dtype, size // size_of, size)
    size = eagle_head_bytes(h, size_of)
    return Download(repo_id, "EAGLE head", h.dtype, size // size_of, size)


def profile_downloads(profile: str, folder: Path = NOTEBOOKS) -> list[Download]:
    """What the profile's notebooks (in `folder`) download from the hub: every hub model they name
    (committed configs, parameters x the dtype of the hub's files) and the published heads they load."""
    resolved = profile_params(profile, (), folder)
    out = []
    for hub_id in hub_models(resolved):
        model = hub_model(hub_id)
        config = config_of(hub_id)
        n = parameter_count(config)
        out.append(Download(hub_id, "model", model.weights_dtype, n, download_bytes(config, model.weights_dtype)))
    return out + [published_download(repo) for repo in published_heads(resolved)]


def download_markdown(profile: str = "t4") -> str:
    """docs/colab.md's download table: one row per repository, the total, and where to keep it."""
    rows = profile_downloads(profile)
    total = sum(r.bytes for r in rows)
    lines = ["| repository | what | parameters | files | download |", "|---|---|---|---|---|"]
    lines += [f"| {r.name} | {r.what} | {r.parameters / 1e9:.2f} B | {r.dtype} | {r.bytes / GB:.2f} GB |" for r in rows]
    lines += [
        f"| **total** | | | | **{total / GB:.1f} GB** |",
        "",
        f"GB = 10^9 bytes; parameters counted from the committed configs (a published head's from its base model's "
        f"config or its own config's sizes), times the bytes of the dtype the hub's files hold (an estimate: "
        f"tokenizers and configs add a few MB). {drive_note(total)}",
    ]
    return "\n".join(lines)


def drive_note(total: int) -> str:
    return (
        f"More than a free Google Drive's {FREE_DRIVE / GB:.0f} GB: keep the Hugging Face cache on the Colab VM's "
        "own disk (the default, ~/.cache/huggingface: re-downloaded after a disconnect, a few minutes) and put only "
        "outputs/ on Drive (SPECNB_OUTPUTS)."
        if total > FREE_DRIVE
        else f"Within a free Google Drive's {FREE_DRIVE / GB:.0f} GB."
    )


def drive_warning(profile: str, environ: dict[str, str]) -> str | None:
    """A warning when the Hugging Face cache (HF_HUB_CACHE or HF_HOME) is on Google Drive and the
    profile's downloads exceed a free Drive: the download would fail partway."""
    cache = environ.get("HF_HUB_CACHE") or environ.get("HF_HOME") or ""
    if not cache.startswith("/content/drive"):
        return None
    total = sum(r.bytes for r in profile_downloads(profile))
    if total <= FREE_DRIVE:
        return None
    return (
        f"warning: the Hugging Face cache is on Google Drive ({cache}) and profile {profile} downloads "
        f"~{total / GB:.0f} GB. {drive_note(total)}"
    )


def memory_markdown(
    profile: str = "t4", usable: int = T4_USABLE, files: Sequence[str | Path] = (), device: str = "cuda"
) -> str:
    """docs/t4.md's memory table (device "cuda"): one row per notebook, its parts and total in GB
    against `usable`, then what each estimate assumed (`RunMemory.notes`) and the prompt length assumed."""
    rows = profile_memory(profile, files, device)
    where = "on CUDA" if device == "cuda" else "on a CPU"
    runtime = "the CUDA context" if device == "cuda" else "the interpreter, torch and transformers"
    shown = [k for k in PART_NAMES if any(r.parts()[k] for r in rows)]
    lines = [
        "| notebook | "
        + " | ".join(PART_NAMES[k] for k in shown)
        + f" | total | fits in {round(usable / GB, 1):g} GB |",
        "|---|" + "---|" * (len(shown) + 2),
    ]
    for r in rows:
        parts = " | ".join(gb(r.parts()[k]) if r.parts()[k] else "" for k in shown)
        fits = "yes" if r.total <= usable else "**NO**"
        lines.append(f"| {r.notebook} | {parts} | **{gb(r.total)}** | {fits} |")
    notes = [f"{r.notebook}: {'; '.join(r.notes)}." for r in rows if r.notes]
    lines += [
        "",
        f"GB = 10^9 bytes; profile `{profile}` {where}, models in {rows[0].dtype if rows else 'float16'} (4-bit "
        f"where the profile quantizes them); the longest prompt assumed {LONGEST_PROMPT} tokens (05 and 06: at "
        f"most their max_prompt_tokens); runtime: {runtime}. `specnb.notebook.estimate` sizes each part; "
        "the same estimate refuses a run that does not fit the machine, before any model loads.",
        *notes,
    ]
    return "\n".join(lines)


# ---- the command -------------------------------------------------------------------------------


def cpu_time(profile: str, decode: float | None = None, block: float | None = None) -> Plan:
    """The runner's estimate of the profile's notebooks on a CPU whose decode step is `decode` ms and
    block step `block` ms (`machine_speed`; None: not known, the reference times unscaled)."""
    books = [b.stem for b in notebooks(only=list(runner_settings(profile).notebooks) or None)]
    how = "given" if decode is not None else "not given: the reference times as measured"
    return plan(profile, profile_chain(profile), books, (decode, how), block)


def main(argv: list[str] | None = None) -> int:
    intro = __doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1]
    ap = argparse.ArgumentParser(
        prog="python -m specnb.notebook.estimate",
        description=intro,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    time_ = sub.add_parser("time", help="each notebook's time: on a T4 from published figures, or on a CPU")
    memory = sub.add_parser("memory", help="each notebook's memory against a device's, and the profile's downloads")
    for one in (time_, memory):
        one.add_argument("profile", nargs="?", default="t4", help="a profile (default: %(default)s)")
        one.add_argument("-f", dest="files", action="append", default=[], help="a parameter file on top (custom_trees)")
    time_.add_argument("--device", choices=("t4", "cpu"), help="default: t4 for profiles extending t4, else cpu")
    time_.add_argument("--decode-ms", type=float, help="cpu: this machine's decode step (default: the reference's)")
    time_.add_argument(
        "--block-ms", type=float, help="cpu: this machine's block step (default: scale by the decode step)"
    )
    memory.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda for profiles extending t4, else cpu")
    memory.add_argument(
        "--usable-gb", type=float, help="GB the device offers (default: a T4's 14, or what this CPU has)"
    )
    rec = sub.add_parser("record", help="make the last run under OUTPUTS its profile's reference times")
    rec.add_argument("--outputs", type=Path, default=None, help="default: $SPECNB_OUTPUTS, else outputs/")
    rec.add_argument("--force", action="store_true", help="record a run far off the line through the recorded runs")
    rec.add_argument(
        "--fresh", action="store_true", help="the code's speed changed: the recorded runs scaled to this run"
    )
    args = ap.parse_args(argv)
    try:
        print(_command(args))
    except (OSError, ValueError, KeyError, RunnerError, TreeSpecError) as e:
        said = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(
            f"not recorded: {said}" if args.command == "record" else f"estimate {args.command}: {said}", file=sys.stderr
        )
        return 2
    return 0


def _command(args: argparse.Namespace) -> str:
    """What one command prints (`main`)."""
    if args.command == "record":
        return (
            f"{REFERENCE_FILE}: {record(args.outputs or default_outputs(), force=args.force, fresh=args.fresh).where}"
        )
    on_t4 = T4_PROFILE in profile_chain(args.profile)
    if args.command == "memory":
        device = args.device or ("cuda" if on_t4 else "cpu")
        usable = int(args.usable_gb * GB) if args.usable_gb else T4_USABLE if device == "cuda" else available_bytes()[0]
        table = memory_markdown(args.profile, usable, args.files, device)
        return table + "\n\nDownloads:\n\n" + download_markdown(args.profile)
    if (args.device or ("t4" if on_t4 else "cpu")) == "cpu":
        if args.files:
            raise ValueError("-f changes no CPU time (it is read from reference runs): drop -f, or use --device t4")
        found = reference(profile_chain(args.profile))
        if found is None or found[1].decode_ms is None and found[0] == T4_PROFILE:
            raise ValueError(f"no reference runs of profile {args.profile} on a CPU: its time on a T4 is --device t4")
        return "\n".join(cpu_time(args.profile, args.decode_ms, args.block_ms).lines())
    if args.decode_ms is not None or args.block_ms is not None:
        raise ValueError("--decode-ms and --block-ms scale a CPU's reference times: use them with --device cpu")
    with pd.option_context("display.width", 200, "display.max_colwidth", 80, "display.max_rows", 200):
        table = t4_time(args.profile, files=args.files).round(2).to_string(index=False)
    inputs = f"inputs ({FIGURES_FILE.name}): {T4Figures.published()}"
    return f"{table}\n\n{inputs}\n{t4_markdown(args.profile, files=args.files)}"


if __name__ == "__main__":
    sys.exit(main())
