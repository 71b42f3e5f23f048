"""What notebook 01 passes on: the pair's measured acceptance, the best trees it found, the tree to
deploy with its interval and verdict, and that tree's lines for serving engines.

    TreeResults     the record (JSON in 01's run folder: RESULTS_FILE; the deploy lines also as
                    DEPLOY_FILE, one block per engine)
    write, read     the two files, and reading one back
    latest          the newest 01 run of a pair under an outputs folder
    acceptance_from what notebooks 03 and 06 read: a named run folder (or JSON file), "latest" (the
                    newest 01 run of the same pair), or "" / "default": their own default vector,
                    with one line saying which (`Earlier.note`)

tau includes the bonus token. Trees are rank paths (`Tree.paths`, canonical order).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.trees import Tree
from .engines import ENGINE_NAMES, deploy_lines
from .storage import read_json, write_json

RESULTS_FILE = "tree_results.json"
DEPLOY_FILE = "deploy.txt"


@dataclass(frozen=True)
class FoundTree:
    """One tree 01 scored: its rank paths, budget and tau in-sample and on held-out prompts."""

    name: str  # the shape: a preset's name or a design's (sequoia, medusa, hindsight)
    budget: int
    paths: tuple[tuple[int, ...], ...]
    tau_in_sample: float
    tau_heldout: float  # NaN where nothing could be held out (one prompt)
    fitted: bool  # fitted to the collected data (a design), or a preset

    @property
    def tree(self) -> Tree:
        return Tree.from_paths(self.paths)


@dataclass(frozen=True)
class Recommendation:
    """The tree and budget to deploy (best expected tokens/s with held-out tau), its 95% intervals
    and the verdict, and the measured run against the target alone when 01 made one."""

    tree: FoundTree
    tau_low: float
    tau_high: float
    speedup: float  # expected, by the cost model on 01's machine
    speedup_low: float
    speedup_high: float
    verdict: str  # "pays off", "does not pay off" or "cannot tell"
    measured_speedup: float | None = None  # measured on 01's check prompts; None when not run
    measured_prompts: int = 0
    device: str = ""
    # the steady-state speed-up predicted while the measurement ran against it (`sweeps.prediction_check`):
    # prompts, predicted, low, high, measured, check ("confirmed" or how far off); empty when not run
    check: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TreeResults:
    """Notebook 01's results for one pair (module docstring)."""

    pair: str
    acceptance: tuple[float, ...]  # per rank: a_r, the share of positions whose next token is the draft's rank r
    acceptance_by_depth: tuple[tuple[float, ...], ...]  # a[d-1][r], `replay.rank_accuracy_by_depth`
    trees: tuple[FoundTree, ...]  # per budget: the best preset and every design
    recommendation: Recommendation | None
    split: Mapping[str, Any] = field(default_factory=dict)  # k, folds, seed and each fold's prompt ids
    written: str = ""  # when (ISO time); `latest` orders by it
    sglang: Mapping[str, Any] = field(
        default_factory=dict
    )  # SGLang's flags chosen by replay (`engine_choice.grown_tree`)
    # per engine taking static trees, the fastest tree it drafts as verified and what it gives up
    # (`engine_choice.static_trees`); "vllm_chain": current vLLM's chain, "tensorrt_llm_dynamic": TensorRT-LLM's
    # dynamic tree's flags by replay (`engine_choice.vllm_chain`, `grown_tree`)
    engines: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def deploy(self) -> dict[str, str]:
        """The recommended tree's line per engine, or "not accepted: why" (`io.engines.deploy_lines`);
        empty without one."""
        if not self.recommendation:
            return {}
        lines = {name: line.text() for name, line in deploy_lines(self.recommendation.tree.tree).items()}
        return lines | ({"sglang": self.sglang["line"]} if self.sglang else {})

    def best_trees(self) -> dict[tuple[str, int], Tree]:
        """(name, budget) -> tree: the recommended one, and per budget the one of highest held-out
        tau (in-sample where nothing was held out)."""
        out: dict[tuple[str, int], Tree] = {}
        if self.recommendation:
            r = self.recommendation.tree
            out[(r.name, r.budget)] = r.tree
        for budget in sorted({t.budget for t in self.trees}):
            mine = [t for t in self.trees if t.budget == budget]
            best = max(mine, key=lambda t: t.tau_heldout if t.tau_heldout == t.tau_heldout else t.tau_in_sample)
            out.setdefault((best.name, best.budget), best.tree)
        return out

    def table(self) -> pd.DataFrame:
        """One row per tree found: name, budget, nodes, in-sample and held-out tau, fitted, rank paths."""
        return pd.DataFrame(
            [
                {
                    "name": t.name,
                    "budget": t.budget,
                    "nodes": len(t.paths),
                    "fitted": t.fitted,
                    "tau_in_sample": t.tau_in_sample,
                    "tau_heldout": t.tau_heldout,
                    "paths": [list(p) for p in t.paths],
                }
                for t in self.trees
            ]
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["deploy"] = self.deploy
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TreeResults:
        found = lambda d: FoundTree(**{**d, "paths": tuple(tuple(p) for p in d["paths"])})  # noqa: E731
        rec = data.get("recommendation")
        return cls(
            pair=data["pair"],
            acceptance=tuple(float(a) for a in data["acceptance"]),
            acceptance_by_depth=tuple(tuple(float(a) for a in row) for row in data.get("acceptance_by_depth", ())),
            trees=tuple(found(t) for t in data["trees"]),
            recommendation=None if rec is None else Recommendation(**{**rec, "tree": found(rec["tree"])}),
            split=dict(data.get("split", {})),
            written=str(data.get("written", "")),
            sglang=dict(data.get("sglang", {})),
            engines={k: dict(v) for k, v in data.get("engines", {}).items()},
        )


def write(folder: str | Path, results: TreeResults) -> Path:
    """RESULTS_FILE (with `written` set to now when empty) and DEPLOY_FILE in `folder`; returns the JSON's path."""
    folder = Path(folder)
    if not results.written:
        results = replace(results, written=time.strftime("%Y-%m-%dT%H:%M:%S"))
    path = write_json(folder / RESULTS_FILE, results.to_json())
    (folder / DEPLOY_FILE).write_text(deploy_text(results))
    return path


def deploy_text(results: TreeResults) -> str:
    """The recommended tree's export for each engine, one block each, with what SGLang's differs in."""
    rec = results.recommendation
    if rec is None:
        return f"# {results.pair}: no tree recommended (nothing scored)\n"
    head = [
        f"# {results.pair}: {rec.tree.name} with {rec.tree.budget} draft tokens, "
        f"held-out tau {rec.tree.tau_heldout:.2f} [{rec.tau_low:.2f}, {rec.tau_high:.2f}], expected "
        f"{rec.speedup:.2f}x [{rec.speedup_low:.2f}, {rec.speedup_high:.2f}] the target alone (95% intervals; "
        f"nan: too few prompts for one): {rec.verdict}",
        f"# rank paths: {[list(p) for p in rec.tree.paths]}",
        "# each engine's line, or why it cannot take this tree as verified (rules and sources: docs/engines.md)",
        "",
    ]
    blocks = [
        sglang_block(results.sglang)
        if name == "sglang" and results.sglang
        else f"# {ENGINE_NAMES[name]}: {line.note}\n"
        + (line.line if line.line is not None else refused(results.engines.get(name)))
        + "\n"
        for name, line in deploy_lines(rec.tree.tree).items()
    ]
    blocks += [block(results.engines[key]) for key, block in CURRENT.items() if results.engines.get(key)]
    return "\n".join(head + blocks)


def vllm_chain_block(best: Mapping[str, Any]) -> str:
    """deploy.txt's block for current vLLM (0.21 on), which drafts a chain of num_speculative_tokens."""
    return (
        "# vLLM 0.21 on (current; the tree line above is for 0.10.1 to 0.20.x): EAGLE, EAGLE-3, MTP and a draft model "
        f"draft a chain; the fastest chain here: {best['budget']} tokens, tau {best['expected_tau']:.2f}, expected "
        f"{best['speedup']:.2f}x [{best['speedup_ci_low']:.2f}, {best['speedup_ci_high']:.2f}]: {best['verdict']}\n"
        f"{best['line']}\n"
    )


def trtllm_dynamic_block(flags: Mapping[str, Any]) -> str:
    """deploy.txt's block for TensorRT-LLM's dynamic tree, its flags chosen by replaying its rule."""
    return (
        "# TensorRT-LLM, EAGLE-2 dynamic tree (its direction: the static eagle_choices above are deprecated, "
        "removed in 1.4): its own tree each step, the flags chosen by replaying its rule on this pair "
        f"({flags['rule']}): held-out tau {flags['tau_heldout']:.2f} "
        f"[{flags['tau_heldout_ci_low']:.2f}, {flags['tau_heldout_ci_high']:.2f}], "
        f"expected {flags['speedup']:.2f}x [{flags['speedup_ci_low']:.2f}, {flags['speedup_ci_high']:.2f}]: "
        f"{flags['verdict']}\n{flags['line']}\n"
    )


CURRENT = {"vllm_chain": vllm_chain_block, "tensorrt_llm_dynamic": trtllm_dynamic_block}  # beside the static lines


def refused(best: Mapping[str, Any] | None) -> str:
    """deploy.txt's lines for an engine that cannot take the recommended tree: the fastest tree it drafts
    as verified (`engine_choice.static_trees`), with what it gives up, and its line; or only that it is refused."""
    if not best or not best.get("line"):
        return "# not accepted"
    return (
        f"# not accepted; the fastest tree it drafts as verified: {best['shape']} with {best['budget']} draft tokens, "
        f"tau {best['expected_tau']:.2f}, expected {best['speedup']:.2f}x [{best['speedup_ci_low']:.2f}, "
        f"{best['speedup_ci_high']:.2f}] ({best['speedup_given_up']:.2f}x and {best['tau_given_up']:.2f} tau below "
        f"the recommendation): {best['verdict']}\n{best['line']}"
    )


def sglang_block(flags: Mapping[str, Any]) -> str:
    """deploy.txt's SGLang block for the flags chosen by replaying SGLang's rule (`engine_choice.grown_tree`)."""
    return (
        f"# {ENGINE_NAMES['sglang']}: its own tree each step, the flags chosen by replaying its rule on this pair "
        f"({flags['rule']}): held-out tau {flags['tau_heldout']:.2f} [{flags['tau_heldout_ci_low']:.2f}, "
        f"{flags['tau_heldout_ci_high']:.2f}], expected {flags['speedup']:.2f}x [{flags['speedup_ci_low']:.2f}, "
        f"{flags['speedup_ci_high']:.2f}]: {flags['verdict']}\n{flags['line']}\n"
    )


def read(path: str | Path) -> TreeResults:
    """The results in a run folder (its RESULTS_FILE) or in a JSON file."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    return TreeResults.from_json(json.loads(path.read_text()))


def latest(outputs: str | Path, pair: str) -> Path | None:
    """The newest RESULTS_FILE for `pair` in a run folder under `outputs` (`outputs/<notebook>/<run>/`,
    whichever notebook wrote it; by `written`, then path), None if there is none."""
    found = []
    for path in sorted(Path(outputs).glob(f"*/*/{RESULTS_FILE}")):
        data = read_json(path)  # {}: a half-written or foreign file is no result
        if data.get("pair") == pair:
            found.append((str(data.get("written", "")), str(path), path))
    return max(found)[2] if found else None


@dataclass(frozen=True)
class Earlier:
    """What 03 and 06 take from 01 (`acceptance_from`): the vector, the trees, where from."""

    acceptance: tuple[float, ...]
    trees: dict[tuple[str, int], Tree]  # `TreeResults.best_trees`; empty with the default
    results: TreeResults | None  # None: the default was used
    note: str  # one line saying where the acceptance came from
    folder: Path | None = None  # 01's run folder (its verify_curve.csv: `experiments.earlier.pair_verdict`); None: none

    def heldout_tau(self) -> dict[tuple[str, int], float]:
        """(name, budget) -> held-out tau measured in 01 (in-sample where nothing was held out)."""
        if self.results is None:
            return {}
        out = {}
        for t in self.results.trees + ((self.results.recommendation.tree,) if self.results.recommendation else ()):
            out[(t.name, t.budget)] = t.tau_heldout if t.tau_heldout == t.tau_heldout else t.tau_in_sample
        return out


def acceptance_from(source: str, pair: str, outputs: str | Path, default: Sequence[float]) -> Earlier:
    """The acceptance vector and best trees of notebook 01 from `source`: a run folder or JSON file,
    "latest" (the newest 01 run of `pair` under `outputs`), or "" / "default" (`default`, no
    trees). A folder named but missing is an error (say "latest" or "default" instead); "latest"
    with no run of the pair falls back to `default`, and `note` says so."""
    default = tuple(float(a) for a in default)
    if source in ("", "default"):
        return Earlier(default, {}, None, f"acceptance: the default {list(default)} (acceptance_from = {source!r})")
    if source == "latest":
        path = latest(outputs, pair)
        if path is None:
            fallback = f"using the default {list(default)}" if default else "nothing taken from it"
            return Earlier(
                default, {}, None, f"acceptance: no run of notebook 01 for {pair} under {outputs}; {fallback}"
            )
    else:
        path = Path(source)
        if not (path / RESULTS_FILE).exists() and not path.is_file():
            raise FileNotFoundError(
                f"acceptance_from = {source!r}: no {RESULTS_FILE} there; name a run folder of notebook 01, "
                "'latest' or 'default'"
            )
    results = read(path)
    folder = Path(path).parent if Path(path).is_file() else Path(path)
    other = "" if results.pair == pair else f" (a run of {results.pair}, not of this pair {pair})"
    shown = ", ".join(f"{a:.3f}" for a in results.acceptance[:6])
    return Earlier(
        results.acceptance,
        results.best_trees(),
        results,
        f"acceptance: measured by notebook 01 in {folder}{other}: "
        f"[{shown}{', ...' if len(results.acceptance) > 6 else ''}]; {len(results.best_trees())} trees from it",
        folder,
    )
