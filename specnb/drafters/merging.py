"""Several drafts merged into one token tree and verified in one target pass (SpecInfer).

SpecInfer (Miao et al. 2024, Sec. 3) drafts with several small models and merges their token trees
into one: a node of the merged tree is a distinct token path, so identical paths proposed by
different drafters are verified once, and the target checks every drafter's guesses in a single
forward pass under the merged tree's mask. `MergedDrafter` does this for any drafters: model
drafters, n-gram lookup, early exit, each with its own requested tree.

Sampling stays lossless. The merged tree is returned with `q=None`: its children are treated as
deterministic proposals (one-hot draws, `acceptance`), which is exact for any set of tokens chosen
without looking at the verifier's random numbers, repeats and rank gaps included. A component that
sampled its tokens from its own q still chose them before, and independently of, the verification
draws, so conditional on the merged tree the one-hot rule emits a sample of p at every node. The
components' q are not used (after merging, a node's siblings are no longer draws without
replacement from one q).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from ..core.acceptance import Acceptance
from ..core.drafting import Draft, Drafter, ModelDrafter, as_drafter
from ..core.runtime import Clock
from ..core.sampling import SamplingConfig
from ..core.trees import TokenTrie, Tree


class MergedDrafter(Drafter):
    """Merges the trees of `components`, pairs (drafter or model, the tree it drafts).

    Each component drafts its tree truncated to the requested tree's depth (the request sets only
    the depth: the merged tree has at most the components' node counts summed). Merge rule:
    components in the given order, each one's nodes in canonical order, inserted into a token trie
    (`trees.TokenTrie`): a node is a distinct token path; a sibling's rank is its order of first
    appearance. After each draft:
        last_sources[i]  the components (indices) that proposed merged node i
        last_times[c]    seconds component c spent drafting
    Hooks: `bind_target_cache` reaches every component that has it (each restores the cache before
    the next drafts); `observe` gives each component the acceptance of its own tree: the longest
    prefix of the accepted path that it proposed, and the target's token after that prefix.
    """

    def __init__(self, components: Sequence[tuple[Drafter | torch.nn.Module, Tree]]) -> None:
        if not components:
            raise ValueError("MergedDrafter needs at least one (drafter, tree) pair")
        self.components = tuple((as_drafter(drafter), tree) for drafter, tree in components)
        models = [d.model for d, _ in self.components if isinstance(d, ModelDrafter)]
        self.device = models[0].device if models else torch.device("cpu")  # where drafting waits for the device
        self.reset()

    def reset(self) -> None:
        for drafter, _ in self.components:
            drafter.reset()
        self.last_sources: tuple[tuple[int, ...], ...] = ()
        self.last_times: tuple[float, ...] = ()
        self._drafts: list[Draft] = []
        self._nodes: list[tuple[int, ...]] = []  # per component: its node i -> merged node

    @property
    def shares_target_cache(self) -> bool:
        return any(drafter.shares_target_cache for drafter, _ in self.components)

    @property
    def evictions(self) -> int:
        return sum(drafter.evictions for drafter, _ in self.components)

    def kv_bytes(self) -> int:
        return sum(drafter.kv_bytes() for drafter, _ in self.components)

    def release(self) -> None:
        for drafter, _ in self.components:
            drafter.release()

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        for drafter, own in self.components:
            drafter.check_request(own.truncated(tree.depth), sampling)

    def bind_target_cache(self, cache: DynamicCache) -> None:
        for drafter, _ in self.components:
            drafter.bind_target_cache(cache)

    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        trie = TokenTrie()
        sources: list[list[int]] = []
        times: list[float] = []
        drafts: list[Draft] = []
        inserted: list[list[int]] = []
        clock = Clock(self.device)
        for c, (drafter, own) in enumerate(self.components):
            request = own.truncated(tree.depth)
            start = clock.now()
            draft = drafter.draft(tokens, request, sampling, generator)
            times.append(clock.now() - start)
            drafted = request if draft.tree is None else draft.tree
            if drafted.num_nodes != draft.tokens.numel() or drafted.depth > tree.depth:
                raise ValueError(f"component {c} returned {draft.tokens.numel()} tokens for {drafted.describe()}")
            draft = Draft(draft.tokens, draft.q, drafted)
            toks = draft.tokens.tolist()
            nodes: list[int] = []
            for i, parent in enumerate(drafted.parents):
                node = trie.add(nodes[parent] if parent >= 0 else -1, toks[i])
                if node == len(sources):
                    sources.append([])
                if c not in sources[node]:
                    sources[node].append(c)
                nodes.append(node)
            drafts.append(draft)
            inserted.append(nodes)
        merged, out, order = trie.build(tokens.device)
        canonical = {node: i for i, node in enumerate(order)}
        self.last_sources = tuple(tuple(sources[node]) for node in order)
        self.last_times = tuple(times)
        self._drafts = drafts
        self._nodes = [tuple(canonical[node] for node in nodes) for nodes in inserted]
        return Draft(out, None, merged)

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        accepted = acceptance.path
        for (drafter, _), own, nodes in zip(self.components, self._drafts, self._nodes):
            own_index = {node: i for i, node in reversed(list(enumerate(nodes)))}  # first wins
            path: list[int] = []
            for node in accepted:
                if node not in own_index:
                    break
                path.append(own_index[node])
            if len(path) < len(accepted):
                next_token = int(draft.tokens[accepted[len(path)]])
            else:
                next_token = acceptance.next_token
            drafter.observe(own, Acceptance(tuple(path), next_token, acceptance.tokens[: len(path)]))
