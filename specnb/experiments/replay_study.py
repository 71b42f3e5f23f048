"""Collect once, replay many (notebook 01; `analysis.replay`): one collection of a pair on its
prompts (`collect_pair`), the cost curves of the cost model (`cost_curves`), every shape x budget
and the data-driven trees replayed from it (`replay_table`, `designed_trees`, `replay_depths`,
`replayed_steps_frame`; `tree_choices`: the (shape, budget) pairs a tree viewer can
offer), the data-fitted trees scored on prompts they were not fitted to
(`heldout_scores`) and what 01 passes on (`tree_results`), and real runs checked against the
replay step by step (`replay_agreement`). A cross-tokenizer collection is re-drafted instead (`redraft_study`)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..analysis import engine_choice, heldout, replay
from ..analysis.collection import CollectConfig, Collection, collection_params
from ..analysis.cost_model import draft_widths
from ..analysis.metrics import step_row
from ..analysis.quality import TIE_MARGIN
from ..bench.timing import environment_row
from ..bench.verify_curve import CurveConfig, curve_table, missing_points, verify_curve
from ..core.trees import Tree
from ..drafters.cross_tokenizer import CrossTokenizerDrafter
from ..drafters.methods import DYNAMIC, DYNAMIC_MAX_DEPTH, parse_method
from ..io import tree_results as tree_store
from ..io.models import ModelPair, default_device, default_dtype, load_model, model_dtype, prompt_ids
from ..io.prompts import Prompt
from ..io.storage import Sweep
from ..kernels.cpu_linear import effective_path, linear_path
from .collect import CollectReport, collect_units
from .continuations import continue_prompts, target_description
from .executors import Executor, LocalExecutor
from .pairs import Pair, PairModels
from .redraft_study import Redrafter, needs_redrafter, redraft_table, redrafts, steps_of
from .tables import steps_frame


@dataclass(frozen=True)
class PairCollectConfig:
    """What `collect_pair` collects of a pair, built where a notebook reads its parameters."""

    max_new_tokens: int  # tokens generated per prompt
    super_k: int = 0  # children per node of the super-trees; 0: no super-trees
    super_depth: int = DYNAMIC_MAX_DEPTH  # depth of the super-trees
    dynamic_budgets: tuple[int, ...] = ()  # budgets of the dynamic trees: the super-trees are as large as the largest
    top_k: int = 16  # ranks kept per position (at least the widest rank any tree uses; the oracle's limit K)
    super_prompts: int | None = None  # super-trees on the first prompts only; None: every prompt
    dtype: str | None = None  # the dtype a worker loads the pair in (`io.models.model_dtype`)
    batch: int = 16  # prompts whose continuations the target decodes at once (`experiments.continuations`)


def collect_pair(
    root: str | Path,
    models: PairModels,
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    config: PairCollectConfig,
    pair: Pair | None = None,
    executor: Executor | None = None,
    continuations: str | Path | None = None,
) -> CollectReport:
    """`experiments.collect.collect_units` for a prompt set: ranks kept up to config.top_k (at least
    the widest rank any tree uses; the oracle's limit K), super-trees (when config.super_k > 0) as
    large as the largest dynamic budget, on the first `config.super_prompts` prompts (None: all).
    Resumable in `folder` (a path, a shared folder or an fsspec URL). The local executor (the
    default) uses the loaded `models.target` and `models.draft`; any other (Ray) loads `pair` on
    each worker (in `config.dtype`, `io.models.model_dtype`), and the draft's dtype is recorded so
    that a worker loading another refuses. The collection is described by the pair's label. The
    report holds the collection of the collected prompts and the failures by name (`CollectReport`).

    `models.tokenizer` is the target's; with the draft's (`models.draft_tokenizer`) and a different
    vocabulary, the collection is a cross-tokenizer one, made in this process: the continuation
    only (`redrafter` answers it).

    continuations: a folder of the target's own greedy continuations (`experiments.continuations`):
    those missing are decoded there first, `config.batch` prompts at once, by the loaded target, and
    every unit reads its prompt's (continuation "target"): a pair that shares its target with another,
    or a notebook that asks for the prompts another already decoded, decodes nothing. None (or no
    target loaded here): each unit makes its own continuation by an exact chain:4 run, whose steps
    it keeps."""
    executor = executor or LocalExecutor()
    target, draft, tokenizer = models.target, models.draft, models.tokenizer
    ids = {p.id: prompt_ids(tokenizer, p.text) for p in prompts}
    draft_dtype = draft.dtype if draft is not None else model_dtype(config.dtype) or default_dtype(default_device())
    describe = {"pair": models.label, "draft_dtype": str(draft_dtype).removeprefix("torch.")}
    categories = {p.id: p.category for p in prompts}
    given = continuations is not None and target is not None
    decoded = (
        continue_prompts(
            continuations,
            target,
            target_description(models.target_label, target, linear_path(target)),
            ids,
            config.max_new_tokens,
            batch=config.batch,
        )
        if given
        else None
    )
    source = "target" if given else "run"
    if models.draft_tokenizer is not None and models.draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        if target is None or draft is None:
            raise ValueError("a cross-tokenizer collection runs in this process: pass the loaded target and draft")
        cross = CollectConfig(config.max_new_tokens, run_tree="chain:4", continuation=source, cross_tokenizer=True)
        drafter = CrossTokenizerDrafter(draft, models.draft_tokenizer, tokenizer)
        here = LocalExecutor(executor.retries)  # in this process, whatever executor was given
        folder = collection_folder(root, models.label, cross, describe)
        return collect_units(folder, (target, draft, drafter), ids, cross, categories, describe, here, True, decoded)
    widest = max((max(path) for tree in trees.values() for path in tree.paths), default=0)
    collect = CollectConfig(
        max_new_tokens=config.max_new_tokens,
        top_k=max(widest + 1, config.super_k, config.top_k),
        continuation=source,
        super_k=config.super_k,
        super_depth=config.super_depth,
        super_size=max(config.dynamic_budgets, default=1),
    )
    if config.super_prompts is not None:
        describe["super_prompts"] = [p.id for p in prompts[: config.super_prompts]]
    workers = _collecting_models(models, pair, executor, config.dtype)
    folder = collection_folder(root, models.label, collect, describe)
    return collect_units(folder, workers, ids, collect, categories, describe, executor, True, decoded)


def collection_folder(root: str | Path, label: str, config: CollectConfig, describe: Mapping) -> str | Path:
    """A pair's collection folder under `root` (a path, or an fsspec URL): named after its label
    (`Pair.label`) and a digest of its config and description, so two notebooks that collect the
    same pair alike (01 and 02 under one run of the runner) share one, and never one made otherwise."""
    digest = hashlib.sha256(json.dumps(collection_params(config, describe), sort_keys=True).encode()).hexdigest()[:10]
    name = f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', label)}-{digest}"
    return f"{str(root).rstrip('/')}/{name}" if "://" in str(root) else Path(root) / name


def _collecting_models(
    models: PairModels, pair: Pair | None, executor: Executor, dtype: str | None
) -> ModelPair | tuple[torch.nn.Module, torch.nn.Module]:
    """The loaded (target, draft) for the local executor; the pair's names for workers that load it."""
    if isinstance(executor, LocalExecutor) and models.target is not None and models.draft is not None:
        return (models.target, models.draft)
    if pair is None:
        raise ValueError("workers load the pair themselves: pass the pair's names (pair=...)")
    return ModelPair(
        pair.target,
        pair.draft,
        pair.target_quantization,
        pair.draft_quantization,
        pair.draft_layers,
        dtype,
        pair.cpu_linear,
    )


def cost_curves(
    store: Sweep,
    pair: Pair,
    prefix: int,
    nodes: Sequence[int],
    trees: Iterable[Tree],
    repeats: int,
    models: tuple[torch.nn.Module, torch.nn.Module] | None = None,
    dtype: str | None = None,
) -> pd.DataFrame:
    """The curves of the cost model (`analysis.cost_model`): the target's verify time against tree
    size on a cache of `prefix` tokens, and the draft's forward time per level width up to the
    widest level of `trees`. Points already in `store` for this machine are read, not measured
    again: notebooks 01 and 03 share one store (`session.shared_folder`), so the second reuses what
    the first measured (each row says when, in "measured"). models: the pair's (target, draft) if
    loaded; otherwise they are loaded (in `dtype`, `io.models.model_dtype`, with the pair's
    cpu_linear) only if a point is missing. Curves are kept per linear path (`kernels.cpu_linear`),
    each model's own (a 4-bit model keeps stock layers)."""
    device = models[0].device if models else default_device()
    env = environment_row(device, models[0].dtype if models else model_dtype(dtype) or default_dtype(device))
    # each model's own linear path: a 4-bit draft keeps stock layers beside a oneDNN target
    quantized = (pair.target_quantization, pair.draft_quantization)
    paths = [
        linear_path(m)
        if models
        else "stock"
        if q
        else effective_path(pair.cpu_linear, device, model_dtype(env["dtype"]))
        for m, q in zip(models or (None, None), quantized)
    ]
    envs = [{**env, "linear": path} for path in paths]
    widths = draft_widths(trees)
    names = (pair.target_label, pair.draft_label)
    if missing_points(store, names[0], "target", prefix, nodes, env=envs[0]) or missing_points(
        store, names[1], "draft", prefix, widths, env=envs[1]
    ):
        target, draft = models or (
            load_model(pair.target, pair.target_quantization, dtype=dtype, cpu_linear=pair.cpu_linear)[0],
            load_model(
                pair.draft, pair.draft_quantization, dtype=dtype, layers=pair.draft_layers, cpu_linear=pair.cpu_linear
            )[0],
        )
        verify_curve(store, target, names[0], prefix, nodes, config=CurveConfig(repeats=repeats))
        verify_curve(store, draft, names[1], prefix, widths, "draft", CurveConfig(repeats=repeats))
    parts = [curve_table(store, [n], prefix, env["device"], e["linear"]) for n, e in zip(names, envs)]
    parts = [t[t["role"] == role] for t, role in zip(parts, ("target", "draft")) if not t.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def designed_trees(collection: Collection, budgets: Sequence[int]) -> dict[tuple[str, int], Tree]:
    """The data-driven static trees of a collection (`analysis.heldout.DESIGNERS`), fitted on every
    prompt, per budget: "sequoia" (Sequoia's DP under the measured acceptance vector), "medusa"
    (Medusa's search under the per-depth acceptance) and "hindsight" (the static tree with the most
    accepted tokens over every position of this very data: in-sample, the ceiling of static trees'
    tau_all, not of their run-trajectory tau; `heldout_scores` scores them held out)."""
    return {(name, n): t for name, design in heldout.DESIGNERS.items() for n, t in design(collection, budgets).items()}


def replay_table(
    collection: Collection,
    trees: dict[tuple[str, int], Tree],
    budgets: Sequence[int],
    dynamic_budgets: Sequence[int],
    oracle_k: int | None = None,
    redraft_with: Redrafter | None = None,
    dynamic_prompts: int | None = None,
) -> tuple[pd.DataFrame, dict[tuple[str, int], Tree]]:
    """Every shape x budget replayed, plus the data-driven trees (`designed_trees`), "dynamic"
    (super-trees needed; on the prompts collected with them) and the per-position "oracle"
    (`replay.oracle`, ranks below `oracle_k`, default the collection's top_k; column `top_k`).
    Returns (table, trees incl. the designed ones).

    Rows: trajectory-mode metrics (the positions a real run visits: what it would measure) with
    95% intervals of tau and acceptance rate across prompts (`analysis.spread`), the number of
    prompts, plus tau_all over every position, and tau_all as a fraction of the hindsight tree's
    tau_all (the best static tree's on every position, in-sample) and of the oracle of the same
    budget (both defined on all positions, on the same prompts as the row: dynamic rows on a
    super-tree subset are compared on that subset).

    A cross-tokenizer collection (`redraft_with`: `redrafter(...)` of the pair) is re-drafted
    instead (`analysis.redraft`): every shape x budget drafted in draft tokens and "dynamic", on the
    run trajectory, exact; no designed trees, no oracle and no tau_all (they need draft ranks of the
    target's tokens): those columns are NaN; its dynamic trees on the first `dynamic_prompts` prompts
    (None: every one), as a shared vocabulary's are on the prompts with super-trees."""
    if collection.config.cross_tokenizer:
        again = needs_redrafter(redraft_with)
        return redraft_table(collection, trees, dynamic_budgets, again, dynamic_prompts), dict(trees)
    every = {**trees, **designed_trees(collection, budgets)}
    hindsight = {k: t for k, t in every.items() if k[0] == "hindsight"}

    def rows(c: Collection, replayed) -> pd.DataFrame:
        """replayed(mode) -> rows; trajectory rows with tau_all and the ratios on `c`'s prompts."""
        table = replayed("trajectory")
        every_pos = replayed("all")[["shape", "budget", "tau"]].rename(columns={"tau": "tau_all"})
        for ref, part in (
            ("hindsight", replay.replay(c, hindsight, mode="all")),
            ("oracle", replay.oracle(c, budgets, mode="all", k=oracle_k)),
        ):
            every_pos[f"tau_all_over_{ref}"] = every_pos["tau_all"] / every_pos["budget"].map(
                part.set_index("budget")["tau"]
            )
        return table.merge(every_pos, on=["shape", "budget"])

    parts = [
        rows(
            collection,
            lambda m: pd.concat(
                [replay.replay(collection, every, mode=m), replay.oracle(collection, budgets, mode=m, k=oracle_k)],
                ignore_index=True,
            ),
        )
    ]
    if collection.has_super_trees and dynamic_budgets:
        subset = collection.super_tree_prompts()
        parts.append(rows(subset, lambda m: replay.replay_dynamic(subset, dynamic_budgets, mode=m)))
    return pd.concat(parts, ignore_index=True), every


def tree_choices(trees: Mapping[tuple[str, int], Tree]) -> list[tuple[str, tuple[str, int]]]:
    """(label, (shape, budget)) for every tree `replay_table` returned, by shape then budget: what a
    tree viewer offers (ipywidgets takes such pairs as a dropdown's options). Only pairs that exist:
    a custom tree has one budget (its node count), the designs only the swept budgets, so a shape x
    budget grid would offer trees that were never built."""
    return [(f"{shape}, {budget} draft tokens", (shape, budget)) for shape, budget in sorted(trees)]


def replay_agreement(
    store: Sweep | None,
    pair_label: str,
    collection: Collection,
    specs: Sequence[str],
    redraft_with: Redrafter | None = None,
    custom: Mapping[str, Tree] | None = None,
    max_new_tokens: int | None = None,
) -> pd.DataFrame:
    """Real runs against the replay, step by step (the replay cut to the runs' `max_new_tokens`,
    default the collected length): one row per method with the steps compared and
    how many were identical (position, drafted, accepted and tokens added). The collection's own
    run (its `run_tree`, on every prompt), where it made its continuation, as source "collection run"; `specs`
    are end-to-end units in `store` (source "end to end"). A cross-tokenizer collection is
    re-drafted (`redraft_with`) instead of replayed; its specs are xtok methods. custom: the user's
    trees by name, which specs may name (`drafters.methods.parse_method`)."""
    rows = []
    if collection.config.continuation == "run":  # the continuation's own run (none where the target's is read)
        run_spec = collection.config.run_tree
        replayed = steps_of(collection, "chain", collection.config.run, redraft_with)
        real = {p.prompt_id: [tuple(int(x) for x in row) for row in p.run_steps] for p in collection.prompts}
        rows.append(_agreement_row(run_spec, "collection run", replayed, real, collection))
    steps = steps_frame(store) if store is not None and len(store) else pd.DataFrame()
    if "source" in steps:
        steps = steps[steps["source"] != "replay"]  # units replayed from a collection are no real runs
    for spec in specs:
        method = parse_method(spec, custom)
        dynamic = method.drafter == "dynamic" or method.shape == DYNAMIC
        mine = steps[
            (steps["pair"] == pair_label) & (steps["shape"] == method.label) & (steps["budget"] == method.budget)
        ]
        prompts = set(mine["prompt_id"])
        shape = DYNAMIC if dynamic else method.shape
        tree = method.budget if dynamic and not collection.config.cross_tokenizer else method.tree
        replayed = steps_of(collection, shape, tree, redraft_with, method.budget, max_new_tokens, sorted(prompts))
        real = {
            pid: [
                tuple(int(x) for x in r)
                for r in g.sort_values("position")[
                    ["position", "num_drafted", "num_accepted", "num_tokens"]
                ].itertuples(index=False)
            ]
            for pid, g in mine.groupby("prompt_id")
        }
        rows.append(_agreement_row(spec, "end to end", replayed, real, collection))
    return pd.DataFrame(rows)


def _agreement_row(spec: str, source: str, replayed: dict, real: dict, collection: Collection) -> dict:
    """Identical steps; a differing step is a "tie" when a draft rank in its span could flip by
    rounding (`rank_margin` below the tie margin of the draft's dtype), else a mismatch."""
    margins = {p.prompt_id: p.rank_margin for p in collection.prompts}
    threshold = TIE_MARGIN.get(collection_dtype(collection), TIE_MARGIN[torch.float16])
    compared = identical = ties = 0
    for pid, mine in replayed.items():
        ours = [(s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in mine]
        theirs = real.get(pid, [])
        compared += max(len(ours), len(theirs))
        for a, b in zip(ours, theirs):
            if a == b:
                identical += 1
            elif (
                margins.get(pid) is not None
                and margins[pid][a[0] : a[0] + max(a[3], b[3]) + 1].min(initial=np.inf) < threshold
            ):
                ties += 1
    n_real = sum(len(v) for v in real.values())
    n_replayed = sum(len(v) for v in replayed.values())
    return {
        "method": spec,
        "source": source,
        "prompts": len(replayed),
        "steps_compared": compared,
        "identical_steps": identical,
        "tie_steps": ties,
        "mismatched_steps": compared - identical - ties,
        "tau_real": sum(r[3] for v in real.values() for r in v) / max(n_real, 1),
        "tau_replayed": sum(s.num_tokens for v in replayed.values() for s in v) / max(n_replayed, 1),
    }


def collection_dtype(collection: Collection) -> torch.dtype:
    """The draft's dtype as recorded in the collection's description (float32 when not recorded)."""
    return getattr(torch, str(collection.describe.get("draft_dtype", "float32")), torch.float32)


def replayed_steps_frame(
    collection, tree: Tree, shape: str = "", redraft_with: Redrafter | None = None
) -> pd.DataFrame:
    """The replayed run-trajectory steps of one static tree as a steps frame (for `node_frequency`).
    A cross-tokenizer collection is re-drafted with the drafter of (shape, tree size), and each
    step's `accepted_ranks` is the accepted path in the DRAFT's tree (`tree`), not in the verified
    target-token tree."""
    if not collection.config.cross_tokenizer:
        return pd.DataFrame([step_row(s) for v in replay.replay_steps(collection, tree).values() for s in v])
    runs = redrafts(collection, shape, tree, tree.num_nodes, needs_redrafter(redraft_with))
    return pd.DataFrame(
        [
            {**step_row(s), "accepted_ranks": "/".join(map(str, path))}
            for run in runs.values()
            for s, path in zip(run.steps, run.draft_paths)
        ]
    )


def replay_depths(table: pd.DataFrame) -> pd.DataFrame:
    """Tidy per-depth acceptance (P(accepted >= d), run trajectory) from a replay table, in the
    columns depth and acceptance, for the trees a real drafter could build (not the oracle)."""
    cols = [c for c in table.columns if re.fullmatch(r"depth_\d+_acceptance", c)]
    long = table[table["shape"] != "oracle"].melt(
        id_vars=["shape", "budget"], value_vars=cols, var_name="depth", value_name="acceptance"
    )
    long["depth"] = long["depth"].str.extract(r"(\d+)", expand=False).astype(int)
    return long.dropna(subset=["acceptance"]).sort_values(["budget", "shape", "depth"]).reset_index(drop=True)


def heldout_scores(
    collection: Collection,
    presets: dict[tuple[str, int], Tree],
    budgets: Sequence[int],
    table: pd.DataFrame,
    k: int = 3,
    seed: int = 0,
) -> heldout.HeldOut:
    """Every data-fitted tree scored on prompts it was not fitted to (`analysis.heldout.score`:
    k-fold over prompts, seeded), beside the presets. A cross-tokenizer collection holds no draft
    ranks of the target's tokens, so nothing is fitted: presets only, from `table`
    (`replay_table`'s rows)."""
    if collection.config.cross_tokenizer:
        return heldout.HeldOut(heldout.from_table(table), pd.DataFrame(), dict(presets), (), k, seed)
    return heldout.score(collection, presets, budgets, k, seed)


def tree_results(
    pair: str,
    collection: Collection,
    held: heldout.HeldOut,
    choice: heldout.Choice | None,
    measured: pd.DataFrame | None = None,
    device: str = "",
    grown: Mapping[str, pd.DataFrame] | None = None,
    check: pd.DataFrame | None = None,
    engines: pd.DataFrame | None = None,
) -> tree_store.TreeResults:
    """What notebook 01 passes on (`io.tree_results`): the acceptance vectors (none for a
    cross-tokenizer collection), per budget the best preset and every design with in-sample and
    held-out tau, the choice with its intervals and verdict, its measured speed-up if run, and
    SGLang's and TensorRT-LLM's dynamic-tree flags of highest expected speed-up (`grown`:
    `engine_choice.grown_tree` per engine) where replayed, and the prediction checked against the
    measurement (`sweeps.prediction_check`'s steady-state row), and per engine the fastest tree it drafts
    as verified (`engines`: `engine_choice.static_trees`' rows, with current vLLM's chain,
    `engine_choice.vllm_chain`, as "vllm_chain")."""
    cross = collection.config.cross_tokenizer
    acceptance = () if cross else replay.acceptance_vector(collection)
    by_depth = () if cross else replay.rank_accuracy_by_depth(collection, heldout.MEDUSA_DEPTH)
    table = held.table
    presets = table[~table["fitted"]]
    keep = pd.concat([presets.loc[presets.groupby("budget")["tau_heldout"].idxmax()], table[table["fitted"]]])
    found = {(r["shape"], int(r["budget"])): _found(r, held.trees) for _, r in keep.iterrows()}
    recommendation = None
    if choice is not None:
        row = table.set_index(["shape", "budget"]).loc[(choice.shape, choice.budget)]
        run = None if measured is None or measured.empty else measured.iloc[0]
        recommendation = tree_store.Recommendation(
            tree=_found(pd.Series({"shape": choice.shape, "budget": choice.budget, **row}), held.trees),
            tau_low=choice.tau_low,
            tau_high=choice.tau_high,
            speedup=choice.speedup,
            speedup_low=choice.speedup_low,
            speedup_high=choice.speedup_high,
            verdict=choice.verdict,
            measured_speedup=None if run is None else float(run["speedup"]),
            measured_prompts=0 if run is None else int(run["prompts"]),
            device=device,
            check=_check_record(check),
        )
    flags = {}
    for engine, table in (grown or {}).items():
        if len(table) and table["speedup"].notna().any():
            flags[engine] = _plain(table.loc[table["speedup"].idxmax()]) | {"rule": engine_choice.RULES[engine]}
    best_per_engine = {
        str(r["engine"]): _plain(r.drop("engine"))
        for _, r in (engines.dropna(subset=["line"]).iterrows() if engines is not None and "line" in engines else [])
    }
    if "tensorrt_llm_dynamic" in flags:
        best_per_engine["tensorrt_llm_dynamic"] = flags["tensorrt_llm_dynamic"]
    return tree_store.TreeResults(
        pair,
        tuple(acceptance),
        tuple(by_depth),
        tuple(found.values()),
        recommendation,
        held.record(),
        sglang=flags.get("sglang", {}),
        engines=best_per_engine,
    )


def _found(row: pd.Series, trees: dict[tuple[str, int], Tree]) -> tree_store.FoundTree:
    key = (str(row["shape"]), int(row["budget"]))
    return tree_store.FoundTree(
        key[0],
        key[1],
        tuple(tuple(p) for p in trees[key].paths),
        float(row["tau_in_sample"]),
        float(row["tau_heldout"]),
        bool(row["fitted"]),
    )


def _check_record(check: pd.DataFrame | None) -> dict:
    """The steady-state row of `sweeps.prediction_check` as plain JSON values; {} without one."""
    if check is None or check.empty:
        return {}
    row = check.set_index("quantity").loc["speed-up, steady state"]
    return {"prompts": int(check["prompts"].iloc[0])} | {
        k: (str(row[k]) if k == "check" else float(row[k])) for k in ("predicted", "low", "high", "measured", "check")
    }


def _plain(row: pd.Series) -> dict:
    """A table row as plain JSON values (numpy scalars unboxed)."""
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
