"""specnb: exact tree speculative decoding on stock Hugging Face transformers models, measured.

Notation (used everywhere, never swapped):
    p    the target model's probability distribution (Leviathan et al. 2023), after the sampling
         transforms (temperature, top-k, top-p) that both models share
    q    the draft's distribution, under the same transforms
    N    number of draft tokens (tree nodes); the root, the last accepted token, is not a node
    acceptance rate    accepted draft tokens / drafted tokens
    acceptance length  accepted draft tokens per verification step, the bonus token EXCLUDED
    tau                tokens per target call, the bonus token INCLUDED (= 1 + acceptance length)

Layers, each a folder; a layer imports only the layers above it in this list (tests/test_layers.py):
    kernels/      fast paths on the CPU that change no result: cpu_linear (linear layers on oneDNN
                  prepacked weights), topk_head (a greedy draft's LM head in bfloat16, its top k
                  rechecked in float32)
    core/         the exact speculative step on stock models: trees, masks, cache, sampling, forward,
                  verification, acceptance, drafting, runtime, generation, streaming, ragged, batch
    io/           model sources and loading, embedded models, hub configs, prompts, result storage,
                  Medusa and EAGLE checkpoints in their published layouts, tree_spec (trees users
                  write), engines (the lines serving engines read)
    drafters/     every drafter beyond a plain draft model: dynamic trees, n-grams, self-drafts,
                  merged drafts, adaptive length, cross-tokenizer drafts, Medusa and EAGLE heads
    analysis/     pure or cheap computations on collected data: metrics, quality, collection,
                  replay, redraft, tree_design, heldout, cost_model, memory, spread, head_collection
    training/     learned drafters by self-distillation: distillation, medusa, eagle
    bench/        timing harness, tree-attention kernels and grid, verify-cost curves, batched curves,
                  transformers' own decoders (baselines) timed beside specnb
    experiments/  what the notebooks run: sweeps, pairs, tables, checks, collect and its executors
                  (in process or on Ray), replay, redraft, batch, learned-drafter and long-generation
                  studies
    notebook/     running the notebooks: runner, session, plots, legibility, readings, report, and
                  the profiles' costs (estimate: time and memory; dryrun stand-ins)

The names below are importable from `specnb` directly; every module is imported by its folder
(`from specnb.analysis import replay`).
"""

from __future__ import annotations

import importlib
from typing import Any

# the names users reach for from the top level, each loaded with its module on first access, so
# that importing one module of the package (the runner, say) does not import all of them
LAZY = {
    "Summary": "analysis.metrics",
    "rank_acceptance": "analysis.metrics",
    "steps_table": "analysis.metrics",
    "summarize": "analysis.metrics",
    "summary_table": "analysis.metrics",
    "Acceptance": "core.acceptance",
    "greedy_accept": "core.acceptance",
    "speculative_accept": "core.acceptance",
    "Draft": "core.drafting",
    "Drafter": "core.drafting",
    "ModelDrafter": "core.drafting",
    "GenerationResult": "core.generation",
    "Meter": "core.generation",
    "Step": "core.generation",
    "autoregressive_generate": "core.generation",
    "speculative_generate": "core.generation",
    "SamplingConfig": "core.sampling",
    "TokenTrie": "core.trees",
    "Tree": "core.trees",
    "CrossTokenizerDrafter": "drafters.cross_tokenizer",
    "AdaptiveLength": "drafters.draft_length",
    "DynamicTreeDrafter": "drafters.dynamic",
    "MergedDrafter": "drafters.merging",
    "budget_axis": "drafters.methods",
    "method_trees": "drafters.methods",
    "trees_for": "drafters.methods",
    "with_custom_trees": "drafters.methods",
    "NgramDrafter": "drafters.ngram",
    "EarlyExitDrafter": "drafters.self_draft",
    "early_exit_model": "drafters.self_draft",
    "quantized_self_draft": "drafters.self_draft",
    "executor_for": "experiments.executors",
    "Pair": "experiments.pairs",
    "PairModels": "experiments.pairs",
    "describe_model": "io.models",
    "load_model": "io.models",
    "load_pair": "io.models",
    "load_tokenizer": "io.models",
    "prompt_format": "io.models",
    "prompt_ids": "io.models",
    "describe_prompts": "io.prompts",
    "load_prompts": "io.prompts",
    "check_sources": "io.sources",
    "Sweep": "io.storage",
    "interact": "notebook.session",
    "record": "notebook.session",
    "shared_folder": "notebook.session",
    "show_prompts": "notebook.session",
    "show_trees": "notebook.session",
    "start_run": "notebook.session",
}


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(f".{LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'specnb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY])


__all__ = sorted(LAZY)
