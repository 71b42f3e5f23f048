"""Every term specnb's tables and readings use, defined once, for the report's glossary (`markdown`)."""

from __future__ import annotations

TERMS: dict[str, str] = {
    "draft -> target pair": "the small model that proposes tokens (draft) and the large model whose output is kept "
    "(target); `[4bit]` marks a model quantized to 4 bits, `[:N layers]` a draft cut to its first N layers",
    "budget (N)": "draft tokens per tree: the nodes the target verifies in one call, besides the root",
    "shape": "how a tree of N nodes is arranged (`core.trees.Tree`): chain (one path), wide (N children of the "
    "root), kary<k> (the first N nodes, level by level, of the complete k-ary tree), beams<k> (k chains from the "
    "draft's top-k first tokens, SpecInfer-style), sparse (Medusa-style: the N nodes with the largest product of a "
    "fixed per-rank acceptance along their path); your own trees and shape rules (`custom_trees`)",
    "rank": "a node's place among its siblings by the draft's probability (0: the draft's most likely token)",
    "acceptance rate": "accepted draft tokens / drafted tokens, drafted counting the nodes actually verified (a "
    "tree the end of the generation cut counts its kept nodes): columns accepted / drafted on every row",
    "acceptance length": "accepted draft tokens per target call (verification step), the bonus token excluded: "
    "accepted / steps",
    "tau": "tokens per target call, the bonus token included: tokens / steps = 1 + acceptance length - "
    "no_bonus_steps / steps (a step that accepts up to the target's stop token adds no bonus token)",
    "cut_steps": "steps whose tree the end of the generation cut (the loop verifies no node past max_new_tokens): "
    "they draft fewer nodes; at 128 tokens and budgets up to 32 they are a few steps per prompt",
    "no_bonus_steps": "steps that accepted up to the continuation's stop token (EOS) and so added no bonus token",
    "paired difference": "two trees measured on the same prompts compared per prompt: tau of one minus tau of the "
    "other, with the 95% bootstrap interval of the difference (prompts resampled together); an interval that holds "
    "0 is a tie",
    "winner, runner-up, lead": "per pair and budget the best tree one could deploy, the next, and the best's tau "
    "minus the runner-up's on the prompts both answer, with its paired interval: 'wins' where it excludes 0, "
    "else 'tied'",
    "bonus token": "the target's own next token after the accepted branch: every step yields it, speculation or not",
    "run trajectory": "the positions a real run with that tree visits (it skips the positions inside accepted "
    "branches): what a run measures; the rows of the tables are on it",
    "tau_all": "tau averaged over every position of the target's output instead of the run trajectory; defined for "
    "any tree, so trees can be compared on the same positions",
    "replay": "the acceptance of any tree computed from one collection (the target's greedy output and the draft's "
    "ranks of it), without running the models again; exact under greedy decoding, checked against real runs",
    "re-drafted": "a pair of two tokenizers has no draft rank of the target's tokens: each tree is drafted again along "
    "the target's output, in the draft's own tokens (exact too, at the cost of the draft's forwards)",
    "xtok": "drafting across tokenizers: the draft's paths re-encoded into one tree of target tokens",
    "hf_uag": "transformers' universal assisted generation: a draft of another tokenizer, a chain per step",
    "hf_assisted, hf_prompt_lookup": "transformers' own assisted generation and prompt lookup, run beside specnb",
    "super-tree": "the draft's top nodes by cumulative probability at a position (super_k children per node, "
    "super_depth levels): every dynamic tree of a budget is a subtree of it",
    "dynamic": "an EAGLE-2-style tree rebuilt every step: the N nodes of highest cumulative draft probability",
    "sequoia": "the tree Sequoia's dynamic programme designs from the measured acceptance per sibling rank",
    "medusa": "the tree Medusa's search designs from the measured acceptance per depth and rank",
    "hindsight": "the static tree with the most accepted tokens over every position of these very prompts: "
    "in-sample, the ceiling of static trees' tau_all, not a tree to deploy",
    "oracle": "a bound, not a tree: at each position the longest accepted prefix whose draft ranks are all below K "
    "(top_k), capped at N; no tree of N nodes from the draft's top-K children accepts more there",
    "fitted, held out": "a design fitted to the prompts it is scored on flatters itself; held-out tau scores each "
    "prompt with trees fitted on the other folds of prompts (k-fold, seeded)",
    "num_steps, topk, num_draft_tokens": "SGLang's three flags (--speculative-num-steps, --speculative-eagle-topk, "
    "--speculative-num-draft-tokens): it grows its own tree each step, the root's top-k then num_steps - 1 levels "
    "keeping the k best, and verifies the num_draft_tokens - 1 best nodes; replayed per budget in 01",
    "of oracle": "the best tree's held-out tau over the oracle bound at the same budget",
    "rank r, rank 0 squared": "the share of positions where the draft's rank-r token is the target's next token; "
    "the top token's share squared is about what a second level under it is accepted at, if positions were "
    "independent (Sequoia's positional assumption)",
    "x a decode": "a verify's time over the target's time for one decoded token (the verify of 0 draft tokens)",
    "median speed-up": "per_sequence_over_tree's median over the other axes of 03's grid, at one value of an axis",
    "95% interval": "x [low, high]: the percentile bootstrap over prompts (2000 resamples); none below 3 prompts",
    "verify cost": "the target's time for one call verifying N nodes, over its time for one decoded token",
    "speed-up": "tokens/s of a method over the target alone, measured in the same run (wall clock)",
    "pays off / cannot tell": "a predicted or measured speed-up whose 95% interval lies above 1 (pays off), below 1 "
    "(does not pay off), or straddles 1 (cannot tell)",
    "per_sequence_over_tree": "time of one attention call per root-to-leaf sequence over one tree-masked call: how "
    "much the tree mask saves (above 1: the tree call is faster)",
    "mask_overhead": "a tree-masked call's time over plain causal attention on the same number of tokens (1: free)",
    "greedy_equal, greedy_ties, greedy_mismatches": "outputs equal to the target's own greedy output; those that "
    "differ only where the target's top two logits are within the tie margin (numerical); those that differ "
    "otherwise (bugs)",
    "lossy": "a rule that changes the output distribution (Medusa's typical acceptance); labelled wherever it appears",
}


def markdown() -> str:
    """The glossary as markdown bullets, in the order above."""
    return "\n".join(f"- **{term}**: {meaning}" for term, meaning in TERMS.items())
