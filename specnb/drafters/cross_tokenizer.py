"""Tree drafts across tokenizers: the draft model drafts in its own vocabulary, the target verifies
a tree of its own tokens, so any two causal LMs can be paired (Llama-160M's 32k vocabulary with
Llama-3.2-3B's 128k; SmolLM2 with Qwen2.5).

transformers does this for chains (universal assisted generation: `generate(assistant_model=...,
tokenizer=..., assistant_tokenizer=...)`); `CrossTokenizerDrafter` does it for any tree a drafter
builds, dynamic trees included. One step (`draft`):

1. The draft's view: the target's committed tokens as draft tokens of the same text
   (`retokenize.Mirror`, re-encoded from the last safe boundary). The inner drafter keeps what is
   unchanged and the accepted nodes it fed, and feeds the rest, so its cache never drifts from a
   fresh prefill of the accepted text in draft tokens.
2. The inner drafter (`ModelDrafter`, `DynamicTreeDrafter`, ...) builds its tree in draft tokens,
   always greedily (see "Exactness").
3. The bytes of every root-to-leaf path are written in target tokens after the committed ones
   (`retokenize.continue_text`, the committed text from the last safe boundary as left context, so
   the join is cut as the target's tokenizer would cut it) and inserted, the draft's rank-0 path
   first, into one target-token trie (`trees.TokenTrie`) of at most the draft tree's node count
   and the requested depth. A path is cut at a special token: one that maps to a target special
   (the same content, or EOS to EOS) ends it with that token, any other ends it before.
4. The target verifies the trie in one pass, as any tree.

A path's last target token may be one the target would extend (the draft's text stops mid-word:
`Ġwor` where the target writes `Ġworld`); it is proposed anyway, as transformers' chains do.

Exactness. Proposals come from the draft's greedy ranking alone, never from the target's random
draws, so under sampling the trie is checked with the one-hot rule (`Draft.q` is None;
`core.acceptance`: a proposal x is accepted with probability p(x)). Greedy output equals the
target's greedy output, sampled output follows the target's distribution, whatever the two
vocabularies; what the alignment gets wrong costs acceptance only.

Counting: acceptance is in target tokens (the verified trie); `Draft.draft_tokens` is the number
of draft tokens the draft model drafted.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.acceptance import Acceptance
from ..core.drafting import Draft, Drafter, ModelDrafter, NoDraft, as_drafter
from ..core.sampling import SamplingConfig
from ..core.trees import TokenTrie, Tree
from .retokenize import Mirror, TokenText, continue_text, map_specials, window_start

GREEDY = SamplingConfig()
EMPTY = Draft(torch.zeros(0, dtype=torch.long), None, Tree(()), draft_tokens=0)  # host: as the ids
LOOKBEHIND = 64  # tokens searched back for a safe boundary (target side); transformers uses 10


class CrossTokenizerDrafter(Drafter):
    """Drafts with `drafter` (a drafter or model in the draft's vocabulary) and proposes the
    target-token trie of its paths (module docstring).

    draft_tokenizer, target_tokenizer: transformers fast tokenizers, or `retokenize.TokenText`s
    made from them (shared between drafters: building one reads the whole vocabulary).
    lookbehind: target tokens searched back for the left context's safe boundary.
    After each draft, `last_draft` is the draft-token Draft (its tree and tokens) it came from;
    once the next sequence is seen (`draft_view`), `accepted_nodes` are the nodes of that draft
    tree whose tokens the accepted text begins with (the draft-side accepted path).
    """

    def __init__(
        self,
        drafter: Drafter | torch.nn.Module,
        draft_tokenizer: Any,
        target_tokenizer: Any,
        lookbehind: int = LOOKBEHIND,
    ) -> None:
        self.inner = as_drafter(drafter)
        if self.inner.shares_target_cache:
            raise ValueError(
                "a drafter on the target's own cache shares its vocabulary: it needs no cross-tokenizer drafting"
            )
        self.draft_text = draft_tokenizer if isinstance(draft_tokenizer, TokenText) else TokenText.of(draft_tokenizer)
        self.target_text = (
            target_tokenizer if isinstance(target_tokenizer, TokenText) else TokenText.of(target_tokenizer)
        )
        if lookbehind < 1:
            raise ValueError(f"lookbehind must be >= 1, got {lookbehind}")
        self.lookbehind = lookbehind
        self.mirror = Mirror(self.target_text, self.draft_text)
        # a draft special token that ends a path with a target special
        ends = map_specials(self.draft_text, self.target_text)
        self._ends = {d: ids[0] for d, ids in ends.items() if len(ids) == 1 and self.target_text.is_special(ids[0])}
        self.default_tree = self.inner.default_tree
        self.reset()

    def reset(self) -> None:
        self.inner.reset()
        self.mirror.reset()
        self.last_draft: Draft | None = None
        self.accepted_nodes: tuple[int, ...] = ()
        self._drafted_from: list[int] = []  # the draft sequence `last_draft` was drafted after

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        self.inner.check_request(tree, GREEDY)

    @property
    def evictions(self) -> int:
        """The wrapped drafter's cache cuts (its own bounded cache, if any)."""
        return self.inner.evictions

    def kv_bytes(self) -> int:
        """The wrapped drafter's KV cache: what this drafter holds."""
        return self.inner.kv_bytes()

    def release(self) -> None:
        self.inner.release()

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        """Nothing until the next draft: the draft nodes to keep are known once the accepted text is
        in draft tokens (`_follow`)."""

    @torch.inference_mode()
    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        """tokens: long [1, T] or [T], the target's sequence so far (its last token is the root).
        `sampling` and `generator` are unused: the draft proposes its greedy ranking (module
        docstring)."""
        seq = tokens.reshape(-1).tolist()
        view = self.draft_view(seq)
        if not view or tree.num_nodes == 0:
            self.last_draft = None
            return EMPTY
        drafted = self.inner.draft(torch.tensor(view), tree, GREEDY)  # host: drafters read ids there
        return self.propose(seq, view, drafted, tree)

    def propose(self, seq: list[int], view: list[int], drafted: Draft, tree: Tree) -> Draft:
        """The target-token trie of `drafted` (the draft's tree after `view`, the draft tokens of the
        target's sequence `seq`), remembered as the last draft (step 3)."""
        own = drafted.tree if drafted.tree is not None else tree
        self.last_draft, self._drafted_from = Draft(drafted.tokens, None, own), view
        trie = self._target_trie(seq, own, drafted.tokens.tolist(), own.num_nodes, tree.depth)
        out, token_ids, _ = trie.build()
        return Draft(token_ids, None, out, draft_tokens=own.num_nodes)

    def draft_view(self, seq: list[int]) -> list[int]:
        """The draft tokens of the target's sequence `seq` (`Mirror`), with the draft nodes of the
        last draft that the target accepted handed to the inner drafter, whose cache keeps them."""
        view = self.mirror.update(seq)
        last, before = self.last_draft, self._drafted_from
        if last is not None and last.tree is not None:
            path: list[int] = []
            if len(view) > len(before) and view[: len(before)] == before:
                path = _walk(last.tree, last.tokens.tolist(), view[len(before) :])
            if path:
                self.inner.observe(last, Acceptance(tuple(path), 0, tuple(view[len(before) : len(before) + len(path)])))
            self.accepted_nodes = tuple(path)
        self.last_draft = None
        return view

    def _target_trie(self, seq: list[int], own: Tree, tokens: list[int], budget: int, depth: int) -> TokenTrie:
        """The target-token trie of the draft tree's root-to-leaf paths (module docstring, step 3)."""
        window = [self.target_text.piece(t) for t in seq[-self.lookbehind :]]
        left = b"".join(p for p in window[window_start(window, self.lookbehind) :] if p is not None)
        pending = self.mirror.pending
        texts, ends = [], []
        for path in sorted(own.leaf_paths, key=lambda p: own.paths[p[-1]]):
            data, end = b"", None
            for node in path:
                piece = self.draft_text.piece(tokens[node])
                if piece is None:
                    end = self._ends.get(tokens[node])
                    break
                data += piece
            if not data.startswith(pending):
                continue  # it does not finish the character the target has half written
            texts.append(data[len(pending) :])
            ends.append(end)
        trie = TokenTrie()
        for ids, end in zip(continue_text(self.target_text, left, texts), ends):
            if ids is None:
                continue
            node = -1
            for token in (ids + [end] if end is not None else ids)[:depth]:
                child = trie.child(node, token)
                if child is None:
                    if len(trie) == budget:
                        break
                    child = trie.add(node, token)
                node = child
            if len(trie) == budget:
                break
        return trie


class CrossTokenizerRows:
    """B rows drafted across tokenizers at once (a `core.generation.RowDrafting`): each row's text work
    is its own `CrossTokenizerDrafter`'s (`drafters[r]`: its view of the target's sequence in draft
    tokens, the target-token trie of its draft tree), and the draft model drafts every row's tree in
    one forward per depth (`model`: a draft model, drafted by `core.drafting.ModelDrafter.draft_rows`,
    or such a drafter, e.g. `dynamic.DynamicTreeDrafter` for each row's own dynamic tree; a view
    re-encoded from an earlier point is fed again from there). Each row's drafts equal its own
    `CrossTokenizerDrafter`'s of the same inner drafter, up to the float rounding of another batch shape."""

    def __init__(
        self, model: torch.nn.Module | ModelDrafter, draft_tokenizer: Any, target_tokenizer: Any, rows: int
    ) -> None:
        draft_text = draft_tokenizer if isinstance(draft_tokenizer, TokenText) else TokenText.of(draft_tokenizer)
        target_text = target_tokenizer if isinstance(target_tokenizer, TokenText) else TokenText.of(target_tokenizer)
        self.batch = model if isinstance(model, ModelDrafter) else ModelDrafter(model)
        self.batch.check_rows()
        self.batch.reset()
        self.drafters = [CrossTokenizerDrafter(NoDraft(), draft_text, target_text) for _ in range(rows)]

    def draft_rows(
        self,
        sequences: list[list[int]],
        tree: Tree,
        sampling: SamplingConfig,
        generators: list,
        depths: list[int] | None = None,
    ) -> list[Draft]:
        """Each row's target-token trie (`CrossTokenizerDrafter.draft`); given `depths`, row r's as
        drafted alone with `tree` cut to depths[r] (its draft tree is a prefix of the whole one)."""
        views = [d.draft_view(list(seq)) for d, seq in zip(self.drafters, sequences)]
        if not all(views):
            raise ValueError("every row needs a sequence of at least one draft token")
        cuts = [tree] * len(views) if depths is None else [tree.truncated(d) for d in depths]
        drafted = (
            self.batch.draft_rows(views, tree, GREEDY, [None] * len(views), [c.depth for c in cuts])
            if tree.num_nodes
            else None
        )
        out = []
        for r, (d, seq, v, cut) in enumerate(zip(self.drafters, sequences, views, cuts)):
            if cut.num_nodes == 0:  # as `CrossTokenizerDrafter.draft` of an empty tree
                d.last_draft = None
                out.append(EMPTY)
            else:  # a tree the batch drafter shaped (cut to the row's depth), or the first nodes of `tree`'s
                own = drafted[r] if drafted[r].tree is not None else Draft(drafted[r].tokens[: cut.num_nodes], None)
                out.append(d.propose(list(seq), v, own, cut))
        return out

    def observe_rows(self, drafts: list[Draft], results: list[Acceptance]) -> None:
        """Nothing to learn: each row finds its accepted draft nodes in its next view."""

    def keep_rows(self, rows: list[int]) -> None:
        self.batch.keep_rows(rows)
        self.drafters = [self.drafters[r] for r in rows]

    def kv_bytes(self) -> int:
        return self.batch.kv_bytes()


def _walk(tree: Tree, tokens: list[int], sequence: list[int]) -> list[int]:
    """The longest path of `tree` from its root whose tokens are a prefix of `sequence`."""
    path: list[int] = []
    row = 0
    for token in sequence:
        child = next((c for c in tree.children[row] if tokens[c] == token), None)
        if child is None:
            break
        path.append(child)
        row = child + 1
    return path
