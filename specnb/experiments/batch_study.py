"""Notebook 06's steps, and `benchmarks/batch.py`'s: how the batch size changes the best tree and
the speedup for one draft -> target pair.

    batch_prompts       the prompts, one per row, refused before any model loads if too few
    measure_curves      the batched cost curves of the pair (`bench.batch_curve`), resumably
    replayed_runs       each prompt's tokens and steps for every (shape, budget), replayed from one
                        collection of the pair on the prompts (greedy: a row's steps do not depend
                        on the rows beside it, so they hold at every batch size)
    measure_batches     real batched runs at every batch size B (the first B prompts): specnb's
                        target alone batched, transformers' `generate` batched (left padding),
                        specnb's chain and the cost model's best tree at that B, transformers'
                        assisted generation (batch 1 only: its refusal at B > 1 is a row), every
                        method warmed up first, then interleaved in a rotated order per B
    predicted_vs_measured   the cost model's total tokens/s against the measured, per method and B
    batch_reading       the notebook's reading, computed from the tables

Conventions: tau = tokens per target call per row, bonus INCLUDED; tokens/s "in all" = every row's
new tokens over the batch's wall clock; "per row" = that over B; speedup = against the target alone
at the same batch size, in the same run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ..analysis.collection import CollectConfig
from ..analysis.quality import compare_greedy, score
from ..analysis.replay import replay, replay_steps
from ..bench.baselines import hf_assisted_generate, hf_assisted_refusal, hf_generate_batch
from ..bench.batch_curve import batch_curve, batch_curve_table
from ..bench.timing import environment_row, fastest_rounds
from ..bench.verify_curve import CurveConfig
from ..core.batch import BatchResult, autoregressive_generate_batch, speculative_generate_batch
from ..core.generation import autoregressive_generate
from ..core.trees import Tree
from ..drafters.methods import parse_method
from ..io.models import prompt_ids
from ..io.prompts import load_prompts
from ..io.storage import Sweep
from ..kernels.cpu_linear import linear_path
from .checks import ParameterError
from .collect import collect
from .sweeps import WARMUP_TOKENS

TARGET_ALONE = "autoregressive"
HF_BATCH = "hf_generate"
HF_ASSISTED = "hf_assisted"


def batch_prompts(
    tokenizer, source: str, per_category: int, max_prompts: int, max_prompt_tokens: int, batches: Sequence[int]
) -> list[tuple[str, str, torch.Tensor]]:
    """(id, category, ids [T]) of `source`'s prompts (categories in turn) of at most
    `max_prompt_tokens` tokens, the first `max_prompts` of them. Refused (`checks.ParameterError`,
    before any model loads) when they cannot fill the largest batch: every row a different prompt."""
    chosen = []
    for p in load_prompts(source, per_category=per_category):
        ids = prompt_ids(tokenizer, p.text)[0]
        if len(ids) <= max_prompt_tokens:
            chosen.append((p.id, p.category, ids))
    chosen = chosen[:max_prompts]
    if len(chosen) < max(batches):
        raise ParameterError(
            f"batches up to {max(batches)} need as many different prompts, but {source!r} with per_category="
            f"{per_category}, max_prompts={max_prompts} and max_prompt_tokens={max_prompt_tokens} gives {len(chosen)}: "
            "raise max_prompts, per_category or max_prompt_tokens, or lower the largest batch"
        )
    return chosen


def measure_curves(
    store: Sweep,
    models: tuple[torch.nn.Module, torch.nn.Module],
    labels: tuple[str, str],
    prefix: int,
    batches: Sequence[int],
    trees: Sequence[Tree],
    repeats: int,
) -> pd.DataFrame:
    """The batched cost curves this machine lacks, then all of them for the pair and prefix: the
    target's verify of every tree size (and 0) and the draft's forward of every width a step uses
    (its levels, and the up to depth + 1 tokens it feeds first), at every batch size. models:
    (target, draft); labels: how the curves name them."""
    (target, draft), (target_label, draft_label) = models, labels
    nodes = sorted({0, *(t.num_nodes for t in trees)})
    widths = sorted(
        {
            *range(1, max(t.depth for t in trees) + 2),
            *(len(level.fed) for t in trees for level in t.levels if level.fed),
        }
    )
    config = CurveConfig(repeats=repeats)
    batch_curve(store, target, target_label, "target", prefix, batches, nodes, config)
    batch_curve(store, draft, draft_label, "draft", prefix, batches, widths, config)
    curve = batch_curve_table(store)
    env = environment_row(target.device, target.dtype)
    mine = (
        curve["model"].isin([target_label, draft_label])
        & (curve["prefix"] == prefix)
        & curve["batch"].isin(batches)
        & (curve["device"] == env["device"])
        & (curve["linear"] == linear_path(target))  # stock and oneDNN rows of one machine never mix
    )
    return curve[mine]


def replayed_runs(
    folder: Path,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: Sequence[tuple[str, str, torch.Tensor]],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
) -> tuple[pd.DataFrame, dict[tuple[str, int], list[tuple[int, int]]]]:
    """(replay table, (shape, budget) -> [(tokens, steps) per prompt, in order]) of every tree on the
    run trajectory, from one greedy collection of the pair on `prompts` (resumable in `folder`),
    every row generating `max_new_tokens` (EOS ignored, as in `measure_batches`)."""
    top_k = max([16] + [max(t.ranks) + 1 for t in trees.values() if t.num_nodes])
    collection = collect(
        folder,
        target,
        draft,
        {pid: ids[None] for pid, _, ids in prompts},
        CollectConfig(max_new_tokens, top_k=top_k, eos_token_id=()),
    )
    table = replay(collection, trees, mode="trajectory")
    runs = {}
    for key, tree in trees.items():
        steps = replay_steps(collection, tree)
        runs[key] = [(sum(s.num_tokens for s in steps[pid]), len(steps[pid])) for pid, _, _ in prompts]
    return table, runs


@dataclass(frozen=True)
class BatchMethods:
    """How `measure_batches` runs each method on a batch of prompts (`run`)."""

    target: torch.nn.Module
    draft: torch.nn.Module
    pad_token_id: int  # transformers' batched generate pads with it (left padding)
    k: int = 4  # draft tokens per step of transformers' assisted generation
    custom: Mapping[str, Tree] | None = None  # the user's trees by name, which specs may name (`io.tree_spec`)

    def run(self, name: str, prompts: Sequence[torch.Tensor], max_new_tokens: int) -> BatchResult | str:
        """Method `name` on `prompts` (one row each), EOS ignored; a string: the method refused the batch."""
        target, draft = self.target, self.draft
        if name == TARGET_ALONE:
            return autoregressive_generate_batch(target, prompts, max_new_tokens, eos_token_id=())
        if name == HF_BATCH:
            return hf_generate_batch(target, prompts, self.pad_token_id, max_new_tokens, eos_token_id=())
        if name.startswith(HF_ASSISTED):
            if len(prompts) > 1:
                return hf_assisted_refusal(target, draft, prompts, self.pad_token_id, self.k) or "ran (no refusal)"
            r = hf_assisted_generate(
                target,
                draft,
                prompts[0][None],
                num_assistant_tokens=self.k,
                max_new_tokens=max_new_tokens,
                eos_token_id=(),
            )
            return BatchResult((r,), r.total_time, r.prefill_time)
        method = parse_method(name, self.custom)
        if method.drafter != "draft":
            raise ValueError(f"{name!r}: notebook 06 batches the draft model's trees (e.g. chain:4, sparse:8)")
        return speculative_generate_batch(
            target, draft, prompts, tree=method.tree, max_new_tokens=max_new_tokens, eos_token_id=()
        )


def measure_batches(
    methods: BatchMethods,
    prompts: Sequence[torch.Tensor],
    batches: Sequence[int],
    specs: dict[int, list[str]],
    max_new_tokens: int,
    rounds: int = 1,
) -> pd.DataFrame:
    """One row per (batch, method) on the first B prompts (module docstring), every row generating
    `max_new_tokens` (EOS ignored: batches compare like with like, and the replayed steps match).
    specs[B]: the specnb method specs measured at B besides the target alone (e.g. chain:4 and the
    best tree there, which may name `methods.custom` trees); transformers' assisted generation runs
    `methods.k` draft tokens."""
    target = methods.target
    references = [
        autoregressive_generate(target, p[None], max_new_tokens=max_new_tokens, eos_token_id=()).tokens.tolist()
        for p in prompts
    ]
    for name in [TARGET_ALONE, HF_BATCH] + sorted({s for v in specs.values() for s in v}):  # warm-up, untimed
        methods.run(name, prompts[:1], WARMUP_TOKENS)
    rows = []
    for b in batches:
        names = [TARGET_ALONE, HF_BATCH, *specs[b], f"{HF_ASSISTED}:{methods.k}"]
        best, _ = fastest_rounds(names, lambda name: methods.run(name, prompts[:b], max_new_tokens), rounds, b)
        for name in names:
            rows.append(_row(b, name, best[name], target, prompts[:b], references[:b]))
    out = pd.DataFrame(rows)
    alone = out[out["method"] == TARGET_ALONE].set_index("batch")["tokens_per_s"]
    out["speedup"] = out["tokens_per_s"] / out["batch"].map(alone)
    return out


def _row(batch: int, name: str, result: BatchResult | str, target, prompts, references) -> dict:
    if isinstance(result, str):
        return {"batch": batch, "method": name, "status": "refused", "note": result}
    verdicts = []
    for row, prompt, reference in zip(result.rows, prompts, references):
        tokens = row.tokens.tolist()
        if tokens == reference:
            verdicts.append("exact")
        else:  # classify the divergence with the target's top-2 margins along the reference
            margins = score(target, prompt[None], reference).margins
            verdicts.append(compare_greedy(tokens, reference, margins, target.dtype).verdict)
    steps = sum(len(r.steps) for r in result.rows)
    decode = result.total_time - result.prefill_time
    return {
        "batch": batch,
        "method": name,
        "status": "measured",
        "note": "",
        "tokens": result.tokens,
        "seconds": result.total_time,
        "prefill_s": result.prefill_time,
        "tokens_per_s": result.tokens_per_s,
        "tokens_per_s_row": result.tokens_per_s / batch,
        "decode_tokens_per_s": result.tokens / decode,
        "tau": result.tokens / steps if steps else math.nan,
        "greedy_equal": verdicts.count("exact"),
        "greedy_ties": verdicts.count("tie"),
        "greedy_mismatches": verdicts.count("mismatch"),
        "rows": batch,
    }


def best_specs(best: pd.DataFrame, k: int = 4) -> dict[int, list[str]]:
    """specs[B] for `measure_batches`: chain:k and the cost model's best tree at B (once if they agree)."""
    out = {}
    for r in best.itertuples():
        chosen = f"{r.shape}:{int(r.budget)}"
        out[int(r.batch)] = list(dict.fromkeys([f"chain:{k}", chosen]))
    return out


def predicted_vs_measured(
    cost: pd.DataFrame, measured: pd.DataFrame, custom: Mapping[str, Tree] | None = None
) -> pd.DataFrame:
    """Per measured specnb tree method and batch: the cost model's tokens/s in all, the measured, their
    ratio; both of the decoding steps, after the prompts' ragged prefill (which the model leaves out:
    it is the same for every batched method, the draft's own prefill aside). custom: as in
    `measure_batches`."""
    rows = []
    for r in measured[measured["status"] == "measured"].itertuples():
        if r.method in (TARGET_ALONE, HF_BATCH) or r.method.startswith(HF_ASSISTED):
            continue
        m = parse_method(r.method, custom)
        hit = cost[(cost["batch"] == r.batch) & (cost["shape"] == m.shape) & (cost["budget"] == m.budget)]
        if hit.empty:
            continue
        predicted = float(hit["tokens_per_s"].iloc[0])
        rows.append(
            {
                "batch": r.batch,
                "method": r.method,
                "predicted_tokens_per_s": predicted,
                "measured_tokens_per_s": r.decode_tokens_per_s,
                "predicted_over_measured": predicted / r.decode_tokens_per_s,
                "predicted_tau": float(hit["tau"].iloc[0]),
                "measured_tau": r.tau,
            }
        )
    return pd.DataFrame(rows)


def batch_reading(measured: pd.DataFrame, best: pd.DataFrame, versus: pd.DataFrame) -> str:
    """Markdown: does batching pay, how the speedup and the best budget move with B, and how well
    the cost model predicts; every number from the tables."""
    ok = measured[measured["status"] == "measured"]
    alone = ok[ok["method"] == TARGET_ALONE].set_index("batch")["tokens_per_s"]
    lines = [
        f"The target alone batched: {', '.join(f'{alone[b]:.1f} tokens/s at batch {b}' for b in alone.index)} "
        f"(in all; batch {alone.index[-1]} gives {alone.iloc[-1] / alone.iloc[0]:.2f}x batch {alone.index[0]})."
    ]
    spec = ok[~ok["method"].isin([TARGET_ALONE, HF_BATCH]) & ~ok["method"].str.startswith(HF_ASSISTED)]
    for b, t in spec.groupby("batch"):
        top = t.loc[t["tokens_per_s"].idxmax()]
        lines.append(
            f"- batch {b}: fastest speculative method {top['method']}, {top['speedup']:.2f}x the target alone "
            f"batched ({'pays' if top['speedup'] > 1 else 'does not pay'}); tau {top['tau']:.2f} per row"
        )
    lines.append(
        "Best budget by the cost model (tau replayed, costs measured at each batch): "
        + ", ".join(
            f"batch {int(r.batch)}: {r.shape}:{int(r.budget)} ({r.speedup:.2f}x predicted)" for r in best.itertuples()
        )
    )
    if len(versus):
        lines.append(
            "Predicted over measured tokens/s: "
            + ", ".join(f"{r.method} at {int(r.batch)}: {r.predicted_over_measured:.2f}" for r in versus.itertuples())
        )
    equal, rows = int(ok["greedy_equal"].sum()), int(ok["rows"].sum())
    lines.append(
        f"Rows whose greedy output equals their own batch-1 greedy output: {equal}/{rows}"
        + (f" ({int(ok['greedy_ties'].sum())} numerical ties)" if ok["greedy_ties"].sum() else "")
    )
    refused = measured[measured["status"] == "refused"]
    if len(refused):
        lines.append(
            f"transformers' assisted generation at batch {', '.join(map(str, refused['batch']))}: "
            f'"{refused["note"].iloc[0]}"'
        )
    return "\n\n".join(lines)
