"""specnb: exact tree speculative decoding on stock Hugging Face transformers models, measured.

Notation (used everywhere, never swapped):
    p    the target model's probability distribution (Leviathan et al. 2023), after the sampling
         transforms (temperature, top-k, top-p) that both models share
    q    the draft's distribution, under the same transforms
    N    number of draft tokens (tree nodes); the root, the last accepted token, is not a node
    acceptance rate    accepted draft tokens / drafted tokens
    acceptance length  accepted draft tokens per verification step, the bonus token EXCLUDED
    tau                tokens per target call, the bonus token INCLUDED (= 1 + acceptance length)

Modules, one idea each:
    trees         Tree: draft-tree shapes, canonical order, ancestor mask, presets; TokenTrie
    masks         4D attention masks and position ids that put a tree into a stock model
    cache         KV caches that keep exactly the accepted branch
    sampling      SamplingConfig and logits -> p / q
    drafting      Drafter protocol, ModelDrafter (one draft forward per depth; optional
                  confidence threshold for chains)
    ngram         NgramDrafter: prompt lookup, n-gram continuations filling a tree
    self_draft    EarlyExitDrafter (target's first layers on its own KV cache), quantized_self_draft
    merging       MergedDrafter: several drafters' trees merged into one token tree (SpecInfer)
    draft_length  AdaptiveLength: transformers' +2/-1 draft-length schedule, for any drafter
    dynamic_trees EAGLE-2-style trees rebuilt each step: global top n by cumulative draft log-prob
    verification  one target forward over root + tree; commit the accepted branch
    acceptance    greedy and lossless (multi-round, without-replacement) acceptance rules
    generation    speculative_generate, autoregressive_generate, Step, GenerationResult
    baselines     transformers assisted generation (fixed k) and prompt lookup, as GenerationResults
    quality       perplexity of an output under the target, greedy equality
    metrics       summaries and tidy tables with the conventions above
    models        load_model / load_pair for embedded, hub and local models (4-bit nf4)
    prompts       built-in prompts and the Spec-Bench prompt file reader
    replay        collect once, replay many: every tree shape and budget from one collection
    tree_design   data-driven trees (Sequoia DP, hindsight-best static) and the budget to use
"""

from .core.acceptance import Acceptance, greedy_accept, speculative_accept
from .drafters.draft_length import AdaptiveLength
from .core.drafting import Draft, Drafter, ModelDrafter
from .drafters.dynamic import DynamicTreeDrafter
from .core.generation import GenerationResult, Step, autoregressive_generate, speculative_generate
from .drafters.merging import MergedDrafter
from .analysis.metrics import Summary, rank_acceptance, steps_table, summarize, summary_table
from .drafters.ngram import NgramDrafter
from .core.sampling import SamplingConfig
from .drafters.self_draft import EarlyExitDrafter, early_exit_model, quantized_self_draft
from .core.trees import TokenTrie, Tree

__all__ = [
    "Acceptance",
    "AdaptiveLength",
    "Draft",
    "Drafter",
    "EarlyExitDrafter",
    "DynamicTreeDrafter",
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
]
