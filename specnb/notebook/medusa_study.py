"""Notebook 05's steps: Medusa heads trained here (or loaded) against draft-model trees, and typical
acceptance (LOSSY) against lossless sampling.

    check_models         every model and the heads' checkpoints (Medusa's, EAGLE's) resolved before
                         anything loads
    study_prompts        the training and test prompts (id, category, ids), refused before any model
                         loads where a split cannot hold the counts asked for
    tree_design          what Medusa's own and Sequoia's trees are designed from, apart from the prompts
                         their tau is measured on
    heads_for            train (or load from the cache) heads for the target, or load published
                         heads (a hub id or folder in Medusa's layout), with the training tables
    tau_table            replayed tau by shape and budget for Medusa trees and for the draft model's
                         trees of the same target on the same prompts (greedy, trajectory), one tidy
                         frame with a `drafter` column
    typical_quality      per prompt: tau and perplexity (under the target) of typical acceptance
                         (lossy) and of lossless sampling with the same tree, and each output's
                         agreement with the target's own sampled output (same seed): share of equal
                         tokens position by position, and the first position that differs
    medusa_reading       the notebook's reading, computed from the tables

Conventions: tau = tokens per target call, bonus INCLUDED; acceptance_length = accepted draft
tokens per step, bonus EXCLUDED; the typical rule is named `typical_lossy` in every table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..analysis.collection import Collection
from ..analysis.medusa_training import (TrainConfig, TrainedHeads, heldout_rank_accuracy, rank_accuracy, shape_trees,
                                        split_prompts, train_or_load)
from ..analysis.quality import perplexity
from ..analysis.replay import replay
from ..core.acceptance import TypicalAcceptance
from ..core.generation import autoregressive_generate, speculative_generate
from ..core.trees import Tree
from ..drafters.medusa import MedusaDrafter, MedusaHeads
from ..io.models import load_tokenizer, prompt_format, prompt_ids
from ..io.prompts import load_prompts
from ..io.sources import check_sources
from .checks import medusa_split

LOSSY = TypicalAcceptance().name  # "typical_lossy"


HEAD_SOURCES = ("train", "standin")  # `heads` and `eagle_heads` values that name no checkpoint


def check_models(target: str, draft: str, heads: str, eagle_heads: str = "train") -> None:
    """Resolve every model notebook 05 names, the checkpoints of the Medusa heads and of the EAGLE
    head (folders or hub ids) included, at once (`io.sources.check_sources`): a gated, mistyped or
    unreachable one fails before any loads."""
    check_sources([name for name in (target, draft, heads, eagle_heads) if name and name not in HEAD_SOURCES])


def study_prompts(target: str, source: str, max_prompt_tokens: int, train_prompts: int, test_prompts: int,
                  training: bool) -> tuple[list, list, str]:
    """(train, test, prompt format): prompts (id, category, ids [T]) of `source` in the tokens of
    `target` (a model name: only its tokenizer loads) with at most `max_prompt_tokens` tokens (chat
    template included), split by `split_prompts` (disjoint; each part takes the categories in turn)
    and cut to the counts asked for, and how they were encoded (`io.models.prompt_format`). Refused
    (`checks.ParameterError`, before any model loads) where a split holds fewer than asked, the
    training one only when `training`."""
    tokenizer = load_tokenizer(target)
    prompts = [(p.id, p.category, prompt_ids(tokenizer, p.text)[0]) for p in load_prompts(source)]
    eligible = [p for p in prompts if len(p[2]) <= max_prompt_tokens]
    train, test = split_prompts(eligible)
    medusa_split(train, test, train_prompts, test_prompts, training, max_prompt_tokens, len(eligible), source)
    return (train[:train_prompts] if training else []), test[:test_prompts], prompt_format(target, tokenizer)


def heads_for(target: torch.nn.Module, target_name: str, source: str, prompts: Sequence[torch.Tensor],
              config: TrainConfig, progress: bool = True) -> TrainedHeads | MedusaHeads:
    """source "train": `train_or_load` on `prompts`; else a checkpoint folder or hub id."""
    if source == "train":
        return train_or_load(target, target_name, prompts, config, progress=progress)
    return MedusaHeads.load(source, target)


@dataclass(frozen=True)
class TreeDesign:
    """Where Medusa's own tree and Sequoia's per-depth tree come from, kept apart from where their
    tau is measured: a tree designed on the very prompts it is scored on is biased upward."""

    accuracy: list[list[float]]  # acc[d][r]: per depth, per rank (Medusa's table), the trees' input
    measured: Collection  # the head collection of the prompts tau is measured on
    note: str  # what each side holds, for the notebook to print


def tree_design(collection: Collection, trained: TrainedHeads | None) -> TreeDesign:
    """Heads trained here: accuracies of the training split's held-out rows, tau on every test
    prompt. Loaded heads (no training split): accuracies of the first half of the test prompts,
    tau on the other half."""
    n = len(collection.prompts)
    if trained is not None:
        return TreeDesign(heldout_rank_accuracy(trained.accuracy), collection,
                          f"trees designed from the training split's held-out rows; tau measured on all {n} test prompts")
    half = n // 2
    if half < 1:
        raise ValueError(f"loaded heads need >= 2 test prompts: trees are designed on half and measured on the other half (got {n})")
    design, measured = collection.prompts[:half], collection.prompts[half:]
    return TreeDesign(rank_accuracy(replace(collection, prompts=design)), replace(collection, prompts=measured),
                      f"trees designed from {half} test prompts ({', '.join(p.prompt_id for p in design)}); tau measured on "
                      f"the other {n - half} ({', '.join(p.prompt_id for p in measured)})")


def budget_trees(budgets: Sequence[int], depth: int, accuracy: Sequence[Sequence[float]]) -> dict[tuple[str, int], Tree]:
    """`shape_trees` for every budget (Medusa's own tree and Sequoia's per-depth tree included)."""
    out: dict[tuple[str, int], Tree] = {}
    for b in budgets:
        out.update(shape_trees(int(b), depth, accuracy))
    return out


def tau_table(medusa: Collection, draft: Collection | None, trees: dict[tuple[str, int], Tree],
              draft_label: str = "draft model") -> pd.DataFrame:
    """Replayed greedy metrics (trajectory) of `trees` filled by Medusa heads and, on the same
    prompts, by the draft model (its collection), with a `drafter` column."""
    cols = ["shape", "budget", "nodes", "depth", "steps", "acceptance_rate", "acceptance_length", "tau",
            "tau_ci_low", "tau_ci_high"]
    frames = [replay(medusa, trees, mode="trajectory")[cols].assign(drafter="medusa heads")]
    if draft is not None:
        top_k = draft.config.top_k
        fits = {k: t for k, t in trees.items() if t.num_nodes and max(t.ranks) < top_k}
        frames.append(replay(draft, fits, mode="trajectory")[cols].assign(drafter=draft_label))
    return pd.concat(frames, ignore_index=True)


def typical_quality(target: torch.nn.Module, heads: MedusaHeads, tree: Tree, prompts: Sequence[tuple[str, str, torch.Tensor]],
                    temperature: float, max_new_tokens: int, seed: int = 0) -> pd.DataFrame:
    """One row per (prompt, rule): rule `typical_lossy` or `lossless`, tau, perplexity under the
    target, and agreement with the target's own sampled output of the same seed (module docstring)."""
    drafter = MedusaDrafter(target, heads)
    rows = []
    for pid, category, ids in prompts:
        own = autoregressive_generate(target, ids[None], max_new_tokens, temperature=temperature, seed=seed,
                                      eos_token_id=()).tokens.tolist()
        for rule, typical in ((LOSSY, TypicalAcceptance()), ("lossless", None)):
            out = speculative_generate(target, drafter, ids[None], tree, max_new_tokens, temperature=temperature,
                                       seed=seed, typical=typical, eos_token_id=())
            toks = out.tokens.tolist()
            same = [a == b for a, b in zip(toks, own)]
            rows.append({"prompt_id": pid, "category": category, "rule": rule, "lossy": typical is not None,
                         "temperature": temperature, "tokens": len(toks),
                         "tau": sum(s.num_tokens for s in out.steps) / len(out.steps),
                         "perplexity": perplexity(target, ids, out.tokens),
                         "agreement_with_target_sample": float(np.mean(same)) if same else float("nan"),
                         "first_difference": next((i for i, s in enumerate(same) if not s), len(same))})
    return pd.DataFrame(rows)


def typical_summary(quality: pd.DataFrame) -> pd.DataFrame:
    """Per rule: mean tau, geometric-mean perplexity, mean agreement and first difference."""
    g = quality.groupby("rule", sort=False)
    return pd.DataFrame({
        "prompts": g.size(), "tau": g["tau"].mean(),
        "perplexity_geomean": g["perplexity"].apply(lambda s: float(np.exp(np.log(s).mean()))),
        "agreement_with_target_sample": g["agreement_with_target_sample"].mean(),
        "first_difference": g["first_difference"].mean(),
    }).reset_index()


def medusa_reading(accuracy: pd.DataFrame, taus: pd.DataFrame, typical: pd.DataFrame, budget: int) -> str:
    """The reading: head accuracy by depth, Medusa vs draft-model trees at `budget`, Medusa's tree
    vs Sequoia's per-depth tree, and what typical acceptance (LOSSY) buys and costs."""
    top1 = accuracy[accuracy["k"] == 1].set_index("head")["top_k_accuracy"]
    lines = ["Top-1 accuracy of the heads by depth on the test prompts: "
             + ", ".join(f"head {h} {v:.2f}" for h, v in top1.items()) + "."]
    at = taus[taus["budget"] == budget]
    for drafter, t in at.groupby("drafter", sort=False):
        best = t.loc[t["tau"].idxmax()]
        lines.append(f"{drafter}, {budget} nodes: best tau {best['tau']:.2f} ({best['shape']}; tau includes the bonus token).")
    med = at[(at["drafter"] == "medusa heads")].set_index("shape")["tau"]
    if {"medusa", "sequoia_per_depth"} <= set(med.index):
        lines.append(f"Medusa's own tree {med['medusa']:.2f} vs Sequoia's from the same per-depth accuracies "
                     f"{med['sequoia_per_depth']:.2f}.")
    s = typical_summary(typical).set_index("rule")
    if {LOSSY, "lossless"} <= set(s.index):
        lines.append(f"Typical acceptance (**lossy**: its output does not follow the target's distribution) at "
                     f"T={typical['temperature'].iloc[0]:g}: tau {s.loc[LOSSY, 'tau']:.2f} vs lossless "
                     f"{s.loc['lossless', 'tau']:.2f}; perplexity under the target {s.loc[LOSSY, 'perplexity_geomean']:.2f} "
                     f"vs {s.loc['lossless', 'perplexity_geomean']:.2f} (lower = closer to the target's greedy mode, "
                     f"not to its distribution).")
    return "\n\n".join(lines)
