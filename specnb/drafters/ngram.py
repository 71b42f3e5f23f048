"""Prompt lookup: drafts copied from earlier occurrences of the sequence's last n tokens.

The n-gram drafter of transformers (`PromptLookupCandidateGenerator`, `prompt_lookup_num_tokens`)
and vLLM (`method="ngram"`, `prompt_lookup_min/max`), generalised from one chain to a tree (as
Lookahead decoding does with its n-gram pool). No draft model: the sequence so far (prompt and
output) is searched for earlier occurrences of its last n tokens, and the tokens that followed an
occurrence (its *continuation*) are the draft. Strong where the output copies its input:
summarisation, retrieval-augmented answers, code editing.

The rule (`NgramDrafter.draft`):
1. Matches: for n = max_ngram down to min_ngram, every earlier occurrence of the last n tokens
   that has at least one token after it. Longer n first; within one n, the earliest occurrence
   first (order="earliest", as transformers and vLLM pick their single match) or the most recent
   first (order="latest"). An occurrence already found at a longer n is not repeated.
2. Continuations: the up to `depth` tokens after each match, depth = the requested tree's depth.
3. Tree: the continuations inserted in match order into a token trie (`trees.TokenTrie`), so
   identical prefixes are shared, a distinct continuation opens a new branch, and the first match's
   continuation is the rank-0 chain. Insertion stops at the requested tree's node count (the last
   continuation may be cut), after `max_branches` continuations that added a node, or after
   `max_matches` matches. With a chain request and a long enough first continuation, the draft is
   exactly transformers' candidate for `max_matching_ngram_size=max_ngram`, `min_ngram=1`.
4. No match: an empty tree (0 nodes); the step is a plain target step with its one bonus token.

Proposals are deterministic (chosen without any probability), so `Draft.q` is None also under
sampling and the acceptance rule treats each as a one-hot draw (lossless; see `acceptance`).

An index maps each n-gram to the positions after its occurrences; it is extended with the new
tokens at each call (O(new tokens * n-gram sizes)), rebuilt if the sequence is not an extension of
the last one, and cleared by `reset`. A lookup costs O(matches), not O(sequence length).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..core.drafting import Draft, Drafter
from ..core.sampling import SamplingConfig
from ..core.trees import TokenTrie, Tree

ORDERS = ("earliest", "latest")


class NgramDrafter(Drafter):
    """Prompt-lookup drafter filling a tree with the continuations of n-gram matches.

    max_ngram, min_ngram: the n-gram sizes tried, longest first (transformers: max 2, min 1;
        vLLM: prompt_lookup_max, prompt_lookup_min).
    order: "earliest" or "latest" occurrence first, within one n-gram size.
    max_branches: at most this many continuations fill the tree (1: a chain, as transformers and
        vLLM draft); None: as many as the node budget takes.
    max_matches: matches read per step at most, bounding the work for frequent short n-grams.
    After each draft, `last_ngram` is the n-gram size of the first match (0: no match) and
    `last_matches` the number of matches read.
    """

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        order: str = "earliest",
        max_branches: int | None = None,
        max_matches: int = 64,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        if max_branches is not None and max_branches < 1:
            raise ValueError(f"max_branches must be >= 1 or None, got {max_branches}")
        if max_matches < 1:
            raise ValueError(f"max_matches must be >= 1, got {max_matches}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.order, self.max_branches, self.max_matches = order, max_branches, max_matches
        self.reset()

    def reset(self) -> None:
        self._seq: list[int] = []
        # n-gram -> the positions right after its occurrences, ascending; only occurrences with a
        # token after them (position < len(sequence)) are indexed
        self._index: dict[tuple[int, ...], list[int]] = {}
        self.last_ngram = 0
        self.last_matches = 0

    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        """tokens: long [1, T] or [T], the sequence so far. `sampling` and `generator` are unused:
        the proposals are the same in both modes."""
        seq = tokens.reshape(-1).tolist()
        self._extend(seq)
        trie = TokenTrie()
        budget, depth = tree.num_nodes, tree.depth
        self.last_ngram = self.last_matches = 0
        seen: set[int] = set()
        branches = 0
        for start in self._matches(seq):
            if start in seen:
                continue
            seen.add(start)
            self.last_matches += 1
            node, grew = -1, False
            for token in seq[start : start + depth]:
                nxt = trie.child(node, token)
                if nxt is None:
                    if len(trie) == budget:
                        break
                    nxt, grew = trie.add(node, token), True
                node = nxt
            branches += grew
            full = len(trie) == budget or (self.max_branches is not None and branches == self.max_branches)
            if full or self.last_matches == self.max_matches:
                break
        drafted, out, _ = trie.build(tokens.device)
        return Draft(out, None, drafted)

    def _matches(self, seq: list[int]) -> Iterator[int]:
        """Positions after each earlier occurrence of seq's last n tokens, longest n first."""
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            starts = self._index.get(tuple(seq[len(seq) - n :]), ())
            if starts and not self.last_ngram:
                self.last_ngram = n
            yield from (starts if self.order == "earliest" else reversed(starts))

    def _extend(self, seq: list[int]) -> None:
        """Index the n-grams that end before seq's last token (each has a token after it)."""
        if len(seq) < len(self._seq) or seq[: len(self._seq)] != self._seq:
            self.reset()
        sizes = range(self.min_ngram, self.max_ngram + 1)
        for end in range(max(len(self._seq), 1), len(seq)):
            for n in sizes:
                if n <= end:
                    self._index.setdefault(tuple(seq[end - n : end]), []).append(end)
        self._seq = seq
