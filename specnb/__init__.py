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
    core/       the exact speculative step on stock models
        trees         Tree: shapes, canonical order, ancestor mask, level plan, presets; TokenTrie
        masks         4D attention masks that put a tree into a stock model
        cache         KV caches that keep exactly the accepted branch
        sampling      SamplingConfig, logits -> p / q, the one ranking rule (top_tokens)
        forward       one forward of new tokens over a cache, with positions and visibility
        verification  one target forward over root + tree (the prompt folded into the first)
        acceptance    greedy and lossless (multi-round, without-replacement) acceptance rules;
                      Medusa's typical acceptance (LOSSY, opt-in)
        drafting      Drafter base class (no-op hooks), Draft, ModelDrafter
        topk_head     a greedy draft's LM head from a bfloat16 copy, its top k rechecked in float32
        runtime       clock, stop tokens, input checks, generators: what every loop shares
        generation    speculative_generate, autoregressive_generate, Step, GenerationResult
        streaming     StreamingCache: attention sinks + a window (StreamingLLM), bounded caches
        ragged        ragged batches on one KV cache: per-row masks, positions and commits
        batch         batched speculative generation and the target alone batched
    io/         embedded models, model sources (checked before loading), model loading (4-bit),
                cpu_linear (a CPU model's linear layers on oneDNN prepacked weights),
                the committed configs of hub models (model_configs), prompts (Spec-Bench's shipped
                with the package, the built-in ones, refusals of requests they cannot fill), result storage,
                medusa_checkpoint and eagle_checkpoint (Medusa and EAGLE heads in their published
                layouts), checkpoints (what both layouts share: hub download, files, published entries)
    drafters/   dynamic (EAGLE-2-style trees), ngram (prompt lookup), self_draft (early exit,
                4-bit copy), merging (SpecInfer), draft_length (adaptive), retokenize (tokens as
                bytes, the look-behind rule), cross_tokenizer (a draft of another vocabulary),
                methods (method specs), hidden_rows (the target's last hidden rows, read by a
                hook on its final norm), medusa (Medusa-1 heads on the target's hidden states,
                their drafter), eagle (EAGLE-1 heads: one decoder layer over the target's features,
                their tree drafter)
    analysis/   metrics, quality, baselines (transformers' decoders), collection / collect /
                replay (collect once, replay many), redraft (a cross-tokenizer draft re-drafted
                over a collected continuation), executors (work units in this process or on
                Ray actors), tree_design (Sequoia, hindsight), cost_model, memory (weights in
                float16 / nf4 and KV cache bytes from a config), spread (bootstrap intervals across
                prompts), distillation (the target's continuations and hidden states: the
                self-distillation data both trainers share), medusa_training (Medusa heads by
                self-distillation, cached), eagle_training (EAGLE heads by self-distillation, cached),
                head_collection (a learned drafter's ranks at every depth of every step, for replay)
    bench/      timing harness, tree-attention kernels and grid, the verify-cost curve, the batched
                cost curves (batch_curve)
    notebook/   experiments (the sweeps the notebooks run), pair_specs (draft -> target pairs as parameters
                name them), tables (tidy tables from a sweep), replay_study (collect once, replay
                many: notebook 01), redraft_study (cross-tokenizer collections re-drafted),
                long_generation (notebook 04), plots,
                legibility (is a figure readable), readings, session, checks (parameters refused
                before any model loads), runner, report (the executed
                notebook as HTML appendices and the index), profile_memory (will a profile's pairs
                fit its GPU, what it downloads), batch_study (notebook 06), t4_estimate (the t4 profile's time on a T4, an
                estimate from published figures), dryrun (stand-in hub models), learned_study (notebook 05)

The names below are importable from `specnb` directly; so are the modules by their short names
(`from specnb import replay, experiments, models`), loaded on first use.
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

# module short name -> its place in the layers (loaded on first access, see __getattr__)
MODULES = {
    **{m: f"core.{m}" for m in ("trees", "masks", "cache", "sampling", "forward", "verification",
                                "acceptance", "drafting", "runtime", "generation", "streaming", "ragged",
                                "batch", "topk_head")},
    **{m: f"io.{m}" for m in ("embedded", "sources", "models", "cpu_linear", "model_configs", "prompts", "storage",
                              "checkpoints", "medusa_checkpoint", "eagle_checkpoint")},
    **{m: f"drafters.{m}" for m in ("dynamic", "ngram", "self_draft", "merging", "draft_length", "retokenize",
                                    "cross_tokenizer", "methods", "hidden_rows", "medusa", "eagle")},
    **{m: f"analysis.{m}" for m in ("metrics", "quality", "baselines", "collection", "collect", "replay",
                                    "redraft", "executors", "tree_design", "cost_model", "memory", "spread",
                                    "distillation", "medusa_training", "eagle_training", "head_collection")},
    **{m: f"bench.{m}" for m in ("timing", "attention", "attention_grid", "verify_curve", "batch_curve")},
    **{m: f"notebook.{m}" for m in ("experiments", "pair_specs", "tables", "replay_study", "redraft_study",
                                    "long_generation", "plots", "legibility", "readings", "session",
                                    "checks", "runner", "report", "profile_memory", "t4_estimate", "dryrun",
                                    "learned_study", "batch_study")},
}
# functions users reach for from the top level, loaded with their module on first access
LAZY = {
    "load_model": "io.models", "load_pair": "io.models", "load_tokenizer": "io.models", "prompt_ids": "io.models",
    "load_prompts": "io.prompts", "Sweep": "io.storage", "start_run": "notebook.session",
}


def __getattr__(name: str) -> Any:
    if name in MODULES:
        return importlib.import_module(f".{MODULES[name]}", __name__)
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
