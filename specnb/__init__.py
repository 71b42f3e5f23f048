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
    core/         the exact speculative step on stock models: trees, tree_spec (trees users write, the
                  lines engines read), masks, cache, sampling, forward,
                  verification, acceptance, drafting, runtime, generation, streaming, ragged, batch
    io/           model sources and loading, embedded models, hub configs, prompts, result storage,
                  Medusa and EAGLE checkpoints in their published layouts
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
                  the profiles' costs (profile_memory, t4_estimate, dryrun stand-ins)

The names below are importable from `specnb` directly; every module is imported by its folder
(`from specnb.analysis import replay`).
"""

from __future__ import annotations

import importlib
from typing import Any

from .analysis.metrics import Summary, rank_acceptance, steps_table, summarize, summary_table
from .core.acceptance import Acceptance, greedy_accept, speculative_accept
from .core.drafting import Draft, Drafter, ModelDrafter
from .core.generation import GenerationResult, Step, autoregressive_generate, speculative_generate
from .core.sampling import SamplingConfig
from .core.trees import TokenTrie, Tree
from .drafters.cross_tokenizer import CrossTokenizerDrafter
from .drafters.draft_length import AdaptiveLength
from .drafters.dynamic import DynamicTreeDrafter
from .drafters.merging import MergedDrafter
from .drafters.ngram import NgramDrafter
from .drafters.self_draft import EarlyExitDrafter, early_exit_model, quantized_self_draft

# functions users reach for from the top level, loaded with their module on first access
LAZY = {
    "load_model": "io.models",
    "load_pair": "io.models",
    "load_tokenizer": "io.models",
    "prompt_ids": "io.models",
    "load_prompts": "io.prompts",
    "Sweep": "io.storage",
    "start_run": "notebook.session",
}


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(f".{LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'specnb' has no attribute {name!r}")


__all__ = [
    "Acceptance",
    "AdaptiveLength",
    "CrossTokenizerDrafter",
    "Draft",
    "Drafter",
    "DynamicTreeDrafter",
    "EarlyExitDrafter",
    "GenerationResult",
    "MergedDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "SamplingConfig",
    "Step",
    "Summary",
    "TokenTrie",
    "Tree",
    "autoregressive_generate",
    "early_exit_model",
    "greedy_accept",
    "quantized_self_draft",
    "rank_acceptance",
    "speculative_accept",
    "speculative_generate",
    "steps_table",
    "summarize",
    "summary_table",
    *LAZY,
]
