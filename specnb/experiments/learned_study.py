"""Notebook 05's steps: learned drafters (EAGLE and Medusa heads) trained here or loaded, beside
the draft model of the same target, on the same held-out prompts; and Medusa's typical acceptance
(LOSSY) against lossless sampling.

    check_models         every model and both heads' checkpoints resolved before anything loads
    study_prompts        the training and test prompts (id, category, ids), refused before any model
                         loads where a split cannot hold the counts asked for
    heads_for            Medusa heads: trained (or loaded from the cache) for the target, or published
                         heads (a hub id or folder in Medusa's layout), with the training tables
    eagle_for            the same for an EAGLE head (EAGLE's published layout, `drafters.eagle`)
    tree_design          what a drafter's designed trees (Medusa's own, Sequoia's per-depth) are built
                         from, apart from the prompts their tau is measured on
    measured_together    the prompts every drafter is measured on (the designs' common part)
    depth_accuracy       top-k accuracy by depth of every drafter on the measured prompts, one frame
    tau_table            replayed tau by shape and budget for every drafter's static trees (presets
                         and designed trees) and, where a collection has super-trees, dynamic trees;
                         `with_measured` adds the dynamic trees run end to end (EAGLE-2's tree from the
                         EAGLE head, the draft model's top-N tree), one tidy frame with `drafter`
                         and `kind` columns
    eagle_config         the EAGLE head's recipe on Medusa's data parameters
    speed_drafters, speed_plan   the units of the wall-clock comparison: each drafter's best static
                         tree at a budget and the dynamic trees, beside the target alone
                         (`experiments.run_sweep`)
    typical_quality      per prompt: tau and perplexity (under the target) of typical acceptance
                         (lossy) and of lossless sampling with the same tree, and each output's
                         agreement with the target's own sampled output (same seed): share of equal
                         tokens position by position, and the first position that differs
    learned_reading      the notebook's reading, computed from the tables

Conventions: tau = tokens per target call, bonus INCLUDED; acceptance_length = accepted draft
tokens per step, bonus EXCLUDED; the typical rule is named `typical_lossy` in every table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from ..analysis import spread
from ..analysis.collection import Collection
from ..analysis.head_collection import accuracy_by_depth, rank_accuracy
from ..analysis.quality import perplexity
from ..analysis.replay import replay, replay_dynamic
from ..core.drafting import Drafter, ModelDrafter
from ..core.generation import autoregressive_generate, speculative_generate
from ..core.sampling import SamplingConfig, TypicalAcceptance
from ..core.trees import Tree
from ..drafters.dynamic import DynamicTreeDrafter
from ..drafters.eagle import EagleDrafter, EagleDynamicDrafter, EagleHead
from ..drafters.medusa import MedusaDrafter, MedusaHeads
from ..io.models import load_tokenizer, prompt_format, prompt_ids
from ..io.prompts import Prompt, load_prompts
from ..io.sources import check_sources
from ..io.tree_spec import PRESET
from ..training.eagle import EagleConfig, TrainedEagle
from ..training.eagle import train_or_load as train_eagle
from ..training.medusa import (
    TrainConfig,
    TrainedHeads,
    heldout_rank_accuracy,
    shape_trees,
    split_prompts,
    train_or_load,
)
from .checks import medusa_split

LOSSY = TypicalAcceptance().name  # "typical_lossy"


HEAD_SOURCES = ("train", "standin")  # `heads` values that name no checkpoint


def check_models(target: str, draft: str, *heads: str) -> None:
    """Resolve every model notebook 05 names, the heads' checkpoints (folders or hub ids) included, at
    once (`io.sources.check_sources`): a gated, mistyped or unreachable one fails before any loads."""
    check_sources([name for name in (target, draft, *heads) if name and name not in HEAD_SOURCES])


def study_prompts(
    target: str,
    source: str,
    max_prompt_tokens: int,
    train_prompts: int,
    test_prompts: int,
    training: bool,
    loaded: bool | None = None,
) -> tuple[list, list, str]:
    """(train, test, prompt format): prompts (id, category, ids [T]) of `source` in the tokens of
    `target` (a model name: only its tokenizer loads) with at most `max_prompt_tokens` tokens (chat
    template included), split by `split_prompts` (disjoint; each part takes the categories in turn)
    and cut to the counts asked for, and how they were encoded (`io.models.prompt_format`). Refused
    (`checks.ParameterError`, before any model loads) where a split holds fewer than asked, the
    training one only when `training` (some heads train here); with `loaded` (some heads are not
    trained here: default `not training`) at least 2 test prompts, for `tree_design`'s halves."""
    tokenizer = load_tokenizer(target)
    prompts = [(p.id, p.category, prompt_ids(tokenizer, p.text)[0]) for p in load_prompts(source)]
    eligible = [p for p in prompts if len(p[2]) <= max_prompt_tokens]
    train, test = split_prompts(eligible)
    medusa_split(
        train,
        test,
        train_prompts,
        test_prompts,
        training,
        not training if loaded is None else loaded,
        f"{len(eligible)} prompts of {source!r} have at most max_prompt_tokens={max_prompt_tokens} tokens",
    )
    return (train[:train_prompts] if training else []), test[:test_prompts], prompt_format(target, tokenizer)


def prompt_records(source: str, chosen: Sequence[tuple[str, str, torch.Tensor]]) -> list[Prompt]:
    """The `io.prompts.Prompt`s of `chosen` (id, category, ids) from `source`, in that order, for the
    sweeps that tokenize prompts themselves (`experiments.run_sweep`)."""
    by_id = {p.id: p for p in load_prompts(source)}
    return [by_id[str(pid)] for pid, _, _ in chosen]


def heads_for(
    target: torch.nn.Module,
    target_name: str,
    source: str,
    prompts: Sequence[torch.Tensor],
    config: TrainConfig,
    progress: bool = True,
) -> TrainedHeads | MedusaHeads:
    """source "train": `train_or_load` on `prompts`; else a checkpoint folder or hub id."""
    if source == "train":
        return train_or_load(target, target_name, prompts, config, progress=progress)
    return MedusaHeads.load(source, target)


def eagle_for(
    target: torch.nn.Module,
    target_name: str,
    source: str,
    prompts: Sequence[torch.Tensor],
    config: EagleConfig,
    depth: int,
    progress: bool = True,
) -> TrainedEagle | EagleHead:
    """source "train": EAGLE's `train_or_load` on `prompts` (held-out accuracy to `depth`);
    "standin": a random head; else a checkpoint folder or hub id in EAGLE's published layout."""
    if source == "train":
        return train_eagle(target, target_name, prompts, config, progress=progress, depth=depth)
    if source == "standin":
        return EagleHead.from_target(target).eval()
    return EagleHead.load(source, target)


@dataclass(frozen=True)
class TreeDesign:
    """Where a drafter's designed trees (Medusa's own, Sequoia's per-depth) come from, kept apart
    from where their tau is measured: a tree designed on the very prompts it is scored on is
    biased upward."""

    accuracy: list[list[float]]  # acc[d][r]: per depth, per rank (Medusa's table), the trees' input
    measured: Collection  # the head collection of the prompts tau is measured on
    note: str  # what each side holds, for the notebook to print


def tree_design(collection: Collection, trained: TrainedHeads | TrainedEagle | None) -> TreeDesign:
    """Heads trained here: accuracies (by depth and rank) of the training split's held-out rows,
    tau on every test prompt. Loaded heads (no training split): accuracies of the first half of the
    test prompts, tau on the other half."""
    n = len(collection.prompts)
    if trained is not None:
        return TreeDesign(
            heldout_rank_accuracy(trained.accuracy),
            collection,
            f"trees designed from the training split's held-out rows; tau measured on all {n} test prompts",
        )
    half = n // 2
    if half < 1:
        raise ValueError(
            f"loaded heads need >= 2 test prompts: trees are designed on half and measured on the other half (got {n})"
        )
    design, measured = collection.prompts[:half], collection.prompts[half:]
    return TreeDesign(
        rank_accuracy(replace(collection, prompts=design)),
        replace(collection, prompts=measured),
        f"trees designed from {half} test prompts ({', '.join(p.prompt_id for p in design)}); tau measured on "
        f"the other {n - half} ({', '.join(p.prompt_id for p in measured)})",
    )


def budget_trees(
    budgets: Sequence[int], depth: int, accuracy: Sequence[Sequence[float]], custom: Mapping[str, Tree] | None = None
) -> dict[tuple[str, int], Tree]:
    """`shape_trees` for every budget (Medusa's own tree and Sequoia's per-depth tree included), and
    each custom tree (name -> `Tree`, `io.tree_spec`) keyed (name, its node count)."""
    out: dict[tuple[str, int], Tree] = {}
    for b in budgets:
        out.update(shape_trees(int(b), depth, accuracy))
    return out | {(name, t.num_nodes): t for name, t in (custom or {}).items()}


EAGLE, MEDUSA = "EAGLE head", "Medusa heads"  # drafter labels in every table
DESIGNED = ("medusa", "sequoia_per_depth")  # shapes built from a drafter's accuracies (the others are presets)
DYNAMIC = "dynamic"
TAU_COLUMNS = [
    "drafter",
    "kind",
    "shape",
    "budget",
    "nodes",
    "depth",
    "steps",
    "acceptance_rate",
    "acceptance_length",
    "tau",
    "tau_ci_low",
    "tau_ci_high",
    "source",
]


def measured_together(designs: Sequence[TreeDesign]) -> list[str]:
    """Prompt ids that every design measures tau on (in the first design's order): every drafter is
    compared on the same prompts."""
    common = set.intersection(*({p.prompt_id for p in d.measured.prompts} for d in designs))
    return [p.prompt_id for p in designs[0].measured.prompts if p.prompt_id in common]


def restrict(collection: Collection, prompt_ids: Sequence[str]) -> Collection:
    """The collection's prompts of `prompt_ids` only."""
    keep = set(prompt_ids)
    return replace(collection, prompts=tuple(p for p in collection.prompts if p.prompt_id in keep))


def depth_accuracy(collections: dict[str, Collection], depth: int) -> pd.DataFrame:
    """Top-k accuracy by depth (k = 1, 3, 5, 10 where collected) of every drafter on its collection of
    the same prompts, one frame with a `drafter` column (`head_collection.accuracy_by_depth`; the
    draft model's to `depth`)."""
    return pd.concat(
        [
            accuracy_by_depth(c, ks=(1, 3, 5, 10), depth=depth).drop(columns="head").assign(drafter=label)
            for label, c in collections.items()
        ],
        ignore_index=True,
    )


def tau_table(
    static: dict[str, tuple[Collection, dict[tuple[str, int], Tree]]],
    dynamic: dict[str, tuple[Collection, Sequence[int]]],
) -> pd.DataFrame:
    """tau by drafter, tree and budget (greedy, the trajectory a real run visits): `static`, per
    drafter, its collection and the static trees it fills (replayed; `kind` "designed" for Medusa's
    own and Sequoia's trees, "custom" for the user's (`io.tree_spec`), else "preset"; a tree
    deeper than a head collection or of ranks it did not store is left out); `dynamic`, per drafter
    with super-trees, its collection and budgets (replayed dynamic trees). Column `source` is
    "replay"; `with_measured` adds real runs."""
    cols = [c for c in TAU_COLUMNS if c not in ("drafter", "kind", "source")]
    frames = []
    for label, (collection, trees) in static.items():
        heads = collection.prompts[0].head_ranks
        fits = {
            k: t
            for k, t in trees.items()
            if t.num_nodes and max(t.ranks) < collection.config.top_k and (heads is None or t.depth <= heads.shape[1])
        }
        t = replay(collection, fits, mode="trajectory")[cols]
        preset = t["shape"].map(lambda shape: bool(PRESET.match(shape)))
        kind = np.where(t["shape"].isin(DESIGNED), "designed", np.where(preset, "preset", "custom"))
        frames.append(t.assign(drafter=label, kind=kind, source="replay"))
    for label, (collection, budgets) in dynamic.items():
        t = replay_dynamic(collection, budgets, mode="trajectory")[cols]
        frames.append(t.assign(drafter=label, kind=DYNAMIC, source="replay"))
    return pd.concat(frames, ignore_index=True)[TAU_COLUMNS]


def with_measured(taus: pd.DataFrame, rows: pd.DataFrame, owner: dict[str, str]) -> pd.DataFrame:
    """`taus` with the measured dynamic-tree runs (`tables.shape_table` rows of the speed sweep whose
    unit label ends in "/dynamic", each drafter's as `owner` gives it: EAGLE-2's tree from the head,
    the draft model's top-N tree), as rows of kind "dynamic", source "measured"."""
    t = rows[rows["shape"].isin(owner) & rows["shape"].str.endswith("/" + DYNAMIC)]
    t = t.assign(drafter=t["shape"].map(owner), shape=DYNAMIC, kind=DYNAMIC, source="measured", nodes=t["budget"])
    return pd.concat([taus, t[TAU_COLUMNS]], ignore_index=True)


def best_static(taus: pd.DataFrame, budget: int) -> pd.DataFrame:
    """Per drafter, its static tree with the highest tau at `budget` (one row each)."""
    t = taus[(taus["budget"] == budget) & (taus["kind"] != DYNAMIC)]
    return t.loc[t.groupby("drafter", sort=False)["tau"].idxmax()]


def speed_plan(
    taus: pd.DataFrame,
    budget: int,
    trees: dict[str, dict[tuple[str, int], Tree]],
    drafters: dict[str, Drafter],
    dynamic: dict[str, dict[int, Drafter]],
    depth: int,
) -> tuple[dict[tuple[str, int], Tree], dict[tuple[str, int], Drafter], dict[str, str]]:
    """The units of the wall-clock comparison, for `experiments.run_sweep(..., drafters=)`: each
    drafter's best static tree at `budget` (by replayed tau; `trees[drafter]`, filled by
    `drafters[drafter]`), and each dynamic drafter at its budgets (`dynamic[drafter][n]`; the tree
    passed is a chain of `depth`, the cap). Keys are (prefix/shape, budget), the prefix the
    drafter's short name; returns (trees, drafters, {key label: drafter label})."""
    unit_trees: dict[tuple[str, int], Tree] = {}
    built: dict[tuple[str, int], Drafter] = {}
    owner: dict[str, str] = {}
    for _, row in best_static(taus, budget).iterrows():
        key = (f"{short_name(row['drafter'])}/{row['shape']}", budget)
        unit_trees[key], built[key], owner[key[0]] = (
            trees[row["drafter"]][(row["shape"], budget)],
            drafters[row["drafter"]],
            row["drafter"],
        )
    for label, per_budget in dynamic.items():
        for n, drafter in per_budget.items():
            key = (f"{short_name(label)}/{DYNAMIC}", int(n))
            unit_trees[key], built[key], owner[key[0]] = Tree.chain(depth), drafter, label
    return unit_trees, built, owner


def short_name(drafter: str) -> str:
    """The prefix of a drafter's units in the speed sweep: eagle, medusa, draft."""
    return {EAGLE: "eagle", MEDUSA: "medusa"}.get(drafter, "draft")


@dataclass(frozen=True)
class DynamicTrees:
    """The dynamic trees the speed comparison times: `n` nodes, `top_k` children per node, at most
    `depth` deep; EAGLE-2's tree from the head always, the draft models' with `draft_models`."""

    n: int
    top_k: int
    depth: int
    draft_models: bool = False


def speed_drafters(
    target: torch.nn.Module,
    head: EagleHead,
    medusa: MedusaHeads,
    drafts: Mapping[str, torch.nn.Module],
    dynamic: DynamicTrees,
) -> tuple[dict[str, Drafter], dict[str, dict[int, Drafter]]]:
    """The drafters `speed_plan` times: (static, by drafter label: the EAGLE head's and Medusa's
    heads' tree drafters and each draft model's (`drafts`, by label); dynamic, by label and budget
    `dynamic.n`: EAGLE-2's tree from the head, and the draft models' where `dynamic.draft_models`)."""
    n, top_k, depth = dynamic.n, dynamic.top_k, dynamic.depth
    static: dict[str, Drafter] = {EAGLE: EagleDrafter(target, head), MEDUSA: MedusaDrafter(target, medusa)}
    trees: dict[str, dict[int, Drafter]] = {
        EAGLE: {n: EagleDynamicDrafter(target, head, n=n, top_k=top_k, max_depth=depth)}
    }
    for label, draft in drafts.items():
        static[label] = ModelDrafter(draft)
        if dynamic.draft_models:
            trees[label] = {n: DynamicTreeDrafter(draft, n=n, top_k=top_k, max_depth=depth)}
    return static, trees


def eagle_config(medusa: TrainConfig, epochs: float, batch_rows: int, lr: float, ce_rows: int) -> EagleConfig:
    """The EAGLE head's recipe on Medusa's data parameters (the same continuations), the prompts' rows
    kept (the head's layer attends over the prompt when it drafts), the same held-out share and seed."""
    return EagleConfig(
        data=replace(medusa.distill_config(), prompt_rows=True),
        heldout=medusa.heldout,
        epochs=epochs,
        batch_rows=batch_rows,
        lr=lr,
        ce_rows=ce_rows,
        seed=medusa.seed,
    )


def speed_table(shape_rows: pd.DataFrame, owner: dict[str, str]) -> pd.DataFrame:
    """The measured units (`tables.shape_table` rows) as the speed comparison: drafter, tree, budget,
    tau, tokens/s, speedup over the target alone with its 95% interval (paired over prompts) and the
    verdict (`spread.verdict`: a winner only where the interval excludes 1), greedy equality."""
    t = shape_rows[shape_rows["shape"].isin(owner)].copy()
    t["drafter"] = t["shape"].map(owner)
    t["tree"] = t["shape"].str.split("/").str[1]
    t["verdict"] = [spread.verdict(lo, hi) for lo, hi in zip(t["speedup_ci_low"], t["speedup_ci_high"])]
    cols = [
        "drafter",
        "tree",
        "budget",
        "prompts",
        "tau",
        "tokens_per_s",
        "baseline_tokens_per_s",
        "speedup",
        "speedup_ci_low",
        "speedup_ci_high",
        "verdict",
        "greedy_equal",
        "greedy_ties",
        "greedy_mismatches",
    ]
    return t[cols].sort_values(["budget", "speedup"], ascending=[True, False]).reset_index(drop=True)


def typical_quality(
    target: torch.nn.Module,
    heads: MedusaHeads,
    tree: Tree,
    prompts: Sequence[tuple[str, str, torch.Tensor]],
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (prompt, rule): rule `typical_lossy` or `lossless`, tau, perplexity under the
    target, and agreement with the target's own sampled output of the same seed (module docstring)."""
    drafter = MedusaDrafter(target, heads)
    rows = []
    for pid, category, ids in prompts:
        own = autoregressive_generate(
            target,
            ids[None],
            max_new_tokens,
            eos_token_id=(),
            sampling=SamplingConfig(temperature=temperature, seed=seed),
        ).tokens.tolist()
        for rule, typical in ((LOSSY, TypicalAcceptance()), ("lossless", None)):
            out = speculative_generate(
                target,
                drafter,
                ids[None],
                tree,
                max_new_tokens,
                eos_token_id=(),
                sampling=SamplingConfig(temperature=temperature, seed=seed, typical=typical),
            )
            toks = out.tokens.tolist()
            same = [a == b for a, b in zip(toks, own)]
            rows.append(
                {
                    "prompt_id": pid,
                    "category": category,
                    "rule": rule,
                    "lossy": typical is not None,
                    "temperature": temperature,
                    "tokens": len(toks),
                    "tau": sum(s.num_tokens for s in out.steps) / len(out.steps),
                    "perplexity": perplexity(target, ids, out.tokens),
                    "agreement_with_target_sample": float(np.mean(same)) if same else float("nan"),
                    "first_difference": next((i for i, s in enumerate(same) if not s), len(same)),
                }
            )
    return pd.DataFrame(rows)


def typical_summary(quality: pd.DataFrame) -> pd.DataFrame:
    """Per rule: mean tau, geometric-mean perplexity, mean agreement and first difference."""
    g = quality.groupby("rule", sort=False)
    return pd.DataFrame(
        {
            "prompts": g.size(),
            "tau": g["tau"].mean(),
            "perplexity_geomean": g["perplexity"].apply(lambda s: float(np.exp(np.log(s).mean()))),
            "agreement_with_target_sample": g["agreement_with_target_sample"].mean(),
            "first_difference": g["first_difference"].mean(),
        }
    ).reset_index()


def learned_reading(
    accuracy: pd.DataFrame, taus: pd.DataFrame, speed: pd.DataFrame, typical: pd.DataFrame | None
) -> str:
    """The reading, computed from the tables: top-1 accuracy by depth per drafter; at each budget the
    drafter and tree with the highest tau and its lead over the next drafter's best (a win where that
    tau lies below the leader's 95% interval, else a lead within the spread); Medusa's own
    tree against Sequoia's; the wall-clock verdicts; what typical acceptance (LOSSY) buys and costs."""
    lines = []
    top1 = accuracy[accuracy["k"] == 1]
    for drafter, t in top1.groupby("drafter", sort=False):
        lines.append(
            f"{drafter}: top-1 accuracy by depth "
            + ", ".join(f"{v:.2f}" for v in t.sort_values("depth")["top_k_accuracy"])
            + " (depth 1 first; along the accepted path)."
        )
    for budget, t in taus.groupby("budget"):
        best = t.loc[t.groupby("drafter", sort=False)["tau"].idxmax()].sort_values("tau", ascending=False)
        first = best.iloc[0]
        if len(best) == 1:
            lines.append(
                f"{int(budget)} nodes: {first['drafter']}, {first['shape']} ({first['kind']}), tau {first['tau']:.2f}."
            )
            continue
        second = best.iloc[1]
        clear = second["tau"] < first["tau_ci_low"]  # a winner only where the next drafter lies below its 95% interval
        lines.append(
            f"{int(budget)} nodes: {first['drafter']} {'wins' if clear else 'leads, within the spread,'} with "
            f"{first['shape']} ({first['kind']}), tau {first['tau']:.2f} [{first['tau_ci_low']:.2f}, "
            f"{first['tau_ci_high']:.2f}], {first['tau'] / second['tau']:.2f}x the tau of the next drafter "
            f"({second['drafter']}, {second['shape']}, {second['tau']:.2f}"
            + (")." if clear else ": inside that interval).")
        )
    med = taus[(taus["drafter"] == MEDUSA) & taus["shape"].isin(DESIGNED)].pivot_table(
        index="budget", columns="shape", values="tau"
    )
    if set(DESIGNED) <= set(med.columns) and len(med):
        b = med.index.max()
        lines.append(
            f"Medusa's own tree {med.loc[b, 'medusa']:.2f} vs Sequoia's from the same per-depth accuracies "
            f"{med.loc[b, 'sequoia_per_depth']:.2f} at {int(b)} nodes."
        )
    for _, r in speed.iterrows():
        lines.append(
            f"Wall clock, {r['drafter']} {r['tree']}:{int(r['budget'])}: {r['speedup']:.2f}x the target alone "
            f"[{r['speedup_ci_low']:.2f}, {r['speedup_ci_high']:.2f}], {r['verdict']}."
        )
    if typical is not None and len(typical):
        s = typical_summary(typical).set_index("rule")
        if {LOSSY, "lossless"} <= set(s.index):
            lines.append(
                f"Typical acceptance with Medusa's heads (**lossy**: its output does not follow the target's "
                f"distribution) at T={typical['temperature'].iloc[0]:g}: tau {s.loc[LOSSY, 'tau']:.2f} vs lossless "
                f"{s.loc['lossless', 'tau']:.2f}; perplexity under the target {s.loc[LOSSY, 'perplexity_geomean']:.2f} "
                f"vs {s.loc['lossless', 'perplexity_geomean']:.2f} (lower = closer to the target's greedy mode, "
                f"not to its distribution)."
            )
    lines.append(
        "tau = tokens per target call, bonus token INCLUDED; greedy, on the same held-out prompts for every drafter."
    )
    return "\n\n".join(lines)
