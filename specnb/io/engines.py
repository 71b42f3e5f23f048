"""What each serving engine accepts of a draft tree, as rules read from the engine's own source, and
the line to paste where it does (`deploy_lines`): vLLM's speculative_token_tree (product trees only),
TensorRT-LLM's and Medusa / EAGLE-1's choices lists, SGLang's three flags (a budget, not a shape) and
llama.cpp's chain. A line an engine would refuse, or would draft as another tree than the one verified,
is never given: the entry says why and what to use instead. Each rule, and where in the engine's
source it was read: docs/engines.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.trees import Tree

CHOICES_TOPK = 10  # Medusa's and EAGLE-1's TOPK: each head's (node's) top 10 is drafted, ranks 0..9


@dataclass(frozen=True)
class EngineLine:
    """One engine's answer for a tree: the line to paste, or None and why not (with what to use)."""

    engine: str  # as `ENGINES` names it
    line: str | None  # what to paste; None where the engine cannot take this tree as verified
    note: str  # why not and what instead, or what the line means (a budget, not this shape)

    def text(self) -> str:
        """The line, or "not accepted: <why>" (what tables and deploy.txt show)."""
        return self.line if self.line is not None else f"not accepted: {self.note}"


def level_widths(tree: Tree) -> tuple[int, ...] | None:
    """The widths k_1, k_2, ... if `tree` is a product tree (every node of a depth has the same
    children, ranks 0..k - 1: `Tree.from_branching`), else None."""
    counts = [0] * tree.depth
    for path in tree.paths:
        counts[len(path) - 1] += 1
    widths, above = [], 1
    for count in counts:
        if count % above:
            return None
        widths.append(count // above)
        above = count
    return tuple(widths) if Tree.from_branching(widths) == tree else None


def vllm_line(tree: Tree) -> EngineLine:
    """vLLM's speculative_config for a product tree (docs/engines.md); else what it would draft."""
    widths = level_widths(tree)
    if widths is None:
        return EngineLine(
            "vllm",
            None,
            "vLLM's EAGLE proposer drafts the same number of top children under every node of a level, so only a "
            "tree {branching: [k1, k2, ...]} is drafted as it is verified; this one is not (take the best product "
            "tree of the budget instead)",
        )
    config = {"num_speculative_tokens": tree.num_nodes, "speculative_token_tree": str([tuple(p) for p in tree.paths])}
    return EngineLine(
        "vllm",
        f"speculative_config={config!r}",
        f"branching {list(widths)}; EAGLE methods (eagle, eagle3, mtp) with the TREE_ATTN attention backend, in vLLM "
        "0.10.1 to 0.20.x, the releases that carry speculative_token_tree (0.21 on drafts chains only: "
        "num_speculative_tokens; docs/engines.md)",
    )


def choices_line(tree: Tree, heads: int | None = None) -> EngineLine:
    """Medusa's and EAGLE-1's `choices` (and TensorRT-LLM's medusa_choices): ranks below CHOICES_TOPK,
    depth at most `heads` where the heads are known."""
    widest = max((path[-1] for path in tree.paths), default=0)
    if widest >= CHOICES_TOPK:
        return EngineLine(
            "medusa_eagle1", None, f"a rank of {widest}: Medusa and EAGLE-1 draft each node's top {CHOICES_TOPK} only"
        )
    if heads is not None and tree.depth > heads:
        return EngineLine("medusa_eagle1", None, f"depth {tree.depth} above the {heads} Medusa heads")
    return EngineLine("medusa_eagle1", repr(tree.to_choices()), "any order; Medusa's depth at most its heads")


def trtllm_line(tree: Tree) -> EngineLine:
    """TensorRT-LLM's EAGLE static tree (any gap-free branching)."""
    if tree.has_rank_gaps:
        return EngineLine(
            "tensorrt_llm", None, "a node's children must have ranks 0..c - 1 (it drafts each node's top c)"
        )
    return EngineLine(
        "tensorrt_llm",
        f"EagleDecodingConfig(eagle_choices={tree.to_choices()!r})",
        "max_total_draft_tokens becomes the node count, max_draft_len the depth; deprecated in TensorRT-LLM ("
        "static trees to be removed in release 1.4)",
    )


def trtllm_dynamic_line(depth: int, topk: int, tokens: int) -> str:
    """TensorRT-LLM's EAGLE-2 dynamic tree: `depth` levels of `topk`, the `tokens` best verified (its check:
    depth <= tokens <= topk x depth); topk 1 is its linear worker, a chain of `depth`."""
    if topk == 1:
        return f"EagleDecodingConfig(max_draft_len={depth})  # a chain: the linear worker"
    return (
        f"EagleDecodingConfig(max_draft_len={depth}, use_dynamic_tree=True, dynamic_tree_max_topK={topk}, "
        f"max_total_draft_tokens={tokens})"
    )


def sglang_flags(tree: Tree) -> dict[str, int]:
    """SGLang's three flags from the tree's depth (steps), widest branching (topk) and node count
    (num-draft-tokens, the root counted), the count kept within what those steps and topk can grow
    (k + (steps - 1) k^2 nodes); topk 1 means a chain of steps nodes (SGLang sets num-draft-tokens to
    steps + 1 then)."""
    steps = tree.depth
    topk = max((len(kids) for kids in tree.children), default=1)
    pool = topk + (steps - 1) * topk * topk
    tokens = steps + 1 if topk == 1 else min(tree.num_nodes, pool) + 1
    return {"speculative_num_steps": steps, "speculative_eagle_topk": topk, "speculative_num_draft_tokens": tokens}


def sglang_line(tree: Tree) -> EngineLine:
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in sglang_flags(tree).items())
    return EngineLine(
        "sglang",
        flags,
        "a budget, not this shape: SGLang grows its own tree every step from these three flags (EAGLE-2 style)",
    )


def llama_cpp_line(tree: Tree) -> EngineLine:
    """llama.cpp's server: a chain only."""
    if tree != Tree.chain(tree.num_nodes):
        return EngineLine(
            "llama_cpp", None, f"its server drafts chains only; a chain of {tree.depth} is --draft-max {tree.depth}"
        )
    return EngineLine("llama_cpp", f"--draft-max {tree.num_nodes}", "the server's greedy chain draft")


ENGINES = {
    "vllm": vllm_line,
    "tensorrt_llm": trtllm_line,
    "medusa_eagle1": choices_line,
    "sglang": sglang_line,
    "llama_cpp": llama_cpp_line,
}


ENGINE_NAMES = {
    "vllm": "vLLM",
    "tensorrt_llm": "TensorRT-LLM (EAGLE static tree)",
    "medusa_eagle1": "Medusa / EAGLE-1 choices",
    "sglang": "SGLang",
    "llama_cpp": "llama.cpp server",
}


def deploy_lines(tree: Tree) -> dict[str, EngineLine]:
    """Every engine's answer for `tree` (`ENGINES`), in that order."""
    return {name: line(tree) for name, line in ENGINES.items()}
