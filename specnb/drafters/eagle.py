"""EAGLE-1 draft heads (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty") and their tree drafter.

    EagleHead     fc = Linear(2H -> H) over concat(embedding of token t+1, the target's feature at t),
                  then ONE decoder layer of the target's own layer class (built from the target's
                  config with one layer; rotary position embedding of the target's class), whose
                  output is a predicted feature at t+1 that the target's frozen LM head turns into
                  logits for token t+2. As in EAGLE-1's code: the embedding and the LM head are the
                  target's (frozen, shared, not copied), the layer has no input norm, and there is
                  no final norm (the features are the target's last hidden states after its final
                  norm, what its LM head reads). `save` and `load` use EAGLE's published layout
                  (`io.eagle_checkpoint`): published heads (yuhuili/EAGLE-Vicuna-7B-v1.3) load as
                  they are, and heads trained here are saved in it.
    EagleDrafter  any static tree, level by level from the head's own KV cache, so that a node at
                  depth d reads the features the head predicted for its ancestors.
    EagleDynamicDrafter   EAGLE-2's dynamic tree (Li et al. 2024, "EAGLE-2"): the global top-n
                  nodes by the head's cumulative log-probability, `drafters.dynamic`'s definition
                  (top_k children per node, exact top n built level by level), every step.

Rows and positions. Row t of the head is the pair (f_t, x_{t+1}) at position t, f_t the target's
feature of token x_t; its output predicts f_{t+1}. Between steps the head's cache holds the rows of
every token before the root whose target feature is known, i.e. rows t = 0 .. T-2 for a sequence
x_0 .. x_{T-1} whose last token x_{T-1} is the root: the target has fed every token but the root
(`core.verification`). A draft first feeds the rows the cache lacks (the features of the last
verification's root and accepted nodes, read from the target's final norm by a hook, as
`drafters.medusa` does), whose last output g stands for the root's unknown feature: its logits give
the depth-1 nodes. A node y at depth d with children is then fed as the row (g_parent, y) at
position T - 2 + d under the tree mask (the committed rows, its ancestors among the fed nodes,
itself), and its output g is its children's parent feature. The tree's rows are dropped after the
draft (they hold predicted features); only the target's own features are committed.

Sampling: the rank-r child of a node is the r-th draw without replacement from q there (as
`core.drafting.ModelDrafter`), and q is returned, so acceptance stays lossless
(`core.acceptance`). Greedy: the rank-r child is the r-th most likely token (`top_tokens`).
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import torch
from transformers import DynamicCache, PretrainedConfig

from ..core.acceptance import Acceptance
from ..core.cache import crop, new_cache
from ..core.drafting import Draft, Drafter, fill_levels, level_indices
from ..core.masks import causal_visible, model_mask, paths_visible
from ..core.sampling import SamplingConfig
from ..core.streaming import kv_bytes
from ..core.trees import Level, Tree
from ..io.eagle_checkpoint import check_checkpoint, load_checkpoint, save_checkpoint
from .dynamic import ScoredTree, add_children, top_n
from .hidden_rows import FinalNormRows


def one_layer_config(target: torch.nn.Module) -> PretrainedConfig:
    """The target's config with one hidden layer (per-layer lists cut to their first entry)."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types[:1])
    return config


class EagleHead(torch.nn.Module):
    """An EAGLE-1 head for one target (module docstring). Build it with `from_target`, or `load` a
    checkpoint in the published layout (`io.eagle_checkpoint`).

    forward(features [B, T, H], tokens [B, T], positions [B, T], visible bool [B, T, L], cache) ->
    predicted features [B, T, H]; `visible` says which of the L = cached + T rows each new row
    attends to. `project(g)` is the target's LM head on predicted features (float32 logits)."""

    def __init__(
        self,
        config: PretrainedConfig,
        layer: torch.nn.Module,
        rotary: torch.nn.Module,
        embedding: torch.Tensor,
        lm_head: torch.Tensor,
        dtype: torch.dtype = torch.float32,
        bias: bool = True,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.config = config  # the one-layer config: its attention implementation reads the masks
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=bias, device=device or embedding.device, dtype=dtype)
        self.layer = layer
        self.layer.input_layernorm = (
            torch.nn.Identity()
        )  # EAGLE-1's layer 0 has no input norm (its fc output goes in as is)
        self.rotary = rotary
        self.register_buffer("embedding", embedding.detach(), persistent=False)  # [V, H], the target's, frozen
        self.register_buffer("lm_head", lm_head.detach(), persistent=False)  # [V, H], the target's, frozen

    @classmethod
    def from_target(
        cls, target: torch.nn.Module, dtype: torch.dtype = torch.float32, seed: int = 0, bias: bool = True
    ) -> EagleHead:
        """A freshly initialised head for `target`, on its device; trainable weights in `dtype`
        (float32 by default whatever the target's dtype, as Medusa's heads), initialised from `seed`."""
        device = target.get_output_embeddings().weight.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            return cls._build(target, dtype, bias, device)

    @classmethod
    def _build(cls, target: torch.nn.Module, dtype: torch.dtype, bias: bool, device: torch.device | str) -> EagleHead:
        """The head for `target` with fc and the layer on `device` ("meta": shapes only, nothing
        allocated or initialised); the rotary embedding, the embedding and the LM head are real."""
        config = one_layer_config(target)
        inner = getattr(target, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None or getattr(inner, "rotary_emb", None) is None:
            raise ValueError(
                f"{type(target).__name__} has no model.layers / model.rotary_emb: an EAGLE head "
                "builds its layer from the target's own decoder layer class"
            )
        lm_head = target.get_output_embeddings().weight
        with torch.device("meta") if str(device) == "meta" else contextlib.nullcontext():
            layer = type(layers[0])(config, 0)
        layer = layer.to(device=device, dtype=dtype)
        rotary = type(inner.rotary_emb)(config=config).to(lm_head.device)
        return cls(config, layer, rotary, target.get_input_embeddings().weight, lm_head, dtype, bias, device)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def forward(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        # features: [B, T, H] (any float dtype); tokens, positions: long [B, T]; visible: bool [B, T, L]
        device = self.fc.weight.device
        embedded = torch.nn.functional.embedding(tokens.to(device), self.embedding).to(self.dtype)
        x = self.fc(torch.cat([embedded, features.to(device, self.dtype)], -1))  # [B, T, H]
        positions = positions.to(device)
        mask = model_mask(visible.to(device)[:, None], self, self.dtype)
        return self.layer(
            x,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=cache is not None,
            position_embeddings=self.rotary(x, positions),
        )

    def project(self, g: torch.Tensor) -> torch.Tensor:
        """Float32 logits [..., V] of predicted features g [..., H] under the target's LM head."""
        return (g.to(self.lm_head.dtype) @ self.lm_head.T).float()

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def save(
        self,
        folder: str | Path,
        base_model: str | None = None,
        dtype: torch.dtype | None = None,
        embedding: bool = False,
    ) -> Path:
        """fc and the layer (not the target's LM head) in the published layout (`io.eagle_checkpoint`),
        cast to `dtype` (default: as they are); config.json is the head's one-layer config with
        "bias" and "base_model_name_or_path" (default: the target's name). embedding: write the
        target's embedding too, as EAGLE's published files hold it (loading ignores it)."""
        config = json.loads(self.config.to_json_string(use_diff=False))
        name = config.pop("_name_or_path", "")
        config.pop("dtype", None)  # the target's dtype: torch_dtype says the file's, as EAGLE's configs do
        config.update(
            bias=self.fc.bias is not None,
            base_model_name_or_path=base_model or name,
            torch_dtype=str(dtype or self.dtype).removeprefix("torch."),
        )
        return save_checkpoint(folder, self.state_dict(), config, dtype, self.embedding if embedding else None)

    @classmethod
    def load(cls, name_or_path: str | Path, target: torch.nn.Module, dtype: torch.dtype | None = None) -> EagleHead:
        """A head for `target` from a checkpoint folder or hub id in the published layout, on the
        target's device, in `dtype`: default the dtype of the target's LM head (where a published
        head lives: a float16 target gets a float16 head); torch.float32 for a head trained here.
        The tensors are checked against the target (`io.eagle_checkpoint.check_checkpoint`) and
        assigned to a head built on the meta device: nothing is initialised, or allocated in
        float32, first."""
        checkpoint = load_checkpoint(name_or_path)
        weight = target.get_output_embeddings().weight
        dtype = dtype or weight.dtype
        head = cls._build(target, dtype, checkpoint.bias, "meta")
        vocab, hidden = target.get_input_embeddings().weight.shape
        check_checkpoint(checkpoint, {k: tuple(v.shape) for k, v in head.state_dict().items()}, hidden, vocab)
        head.load_state_dict({k: v.to(weight.device, dtype) for k, v in checkpoint.state.items()}, assign=True)
        left = [n for n, t in [*head.named_parameters(), *head.named_buffers()] if t.is_meta]
        if left:  # a layer class with tensors outside its state dict: nothing would fill them
            raise RuntimeError(
                f"{type(head.layer).__name__} keeps {left} outside its state dict: not loadable from a checkpoint"
            )
        return head.eval()


class EagleDrafter(Drafter):
    """Drafts any static tree from an EAGLE head on the target's own features (module docstring).

    The first step reads the prompt's prefill (the loop prefills prompt[:-1] for drafters that
    share the target's cache, as for Medusa's heads); a one-token prompt has no feature before the
    root, so its first draft is empty (budget 0). tree: the default tree.
    """

    shares_target_cache = True

    def __init__(self, target: torch.nn.Module, head: EagleHead, tree: Tree | None = None) -> None:
        self.target, self.head = target, head
        self.default_tree = tree
        self._target_rows = FinalNormRows(target)  # the target's final-norm output of its last forward
        self.reset()

    def reset(self) -> None:
        self.release()
        self._target_rows.rows = None
        self._cache: DynamicCache | None = None  # the head's rows 0 .. committed - 1
        self._committed = 0
        self._features: list[torch.Tensor] = []  # target features of tokens committed, committed + 1, ... not yet fed
        self._prefill_read = False

    def bind_target_cache(self, cache) -> None:
        self._target_rows.bind()

    def release(self) -> None:
        self._target_rows.release()

    def kv_bytes(self) -> int:
        return kv_bytes(self._cache)

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        if not sampling.greedy and tree.has_rank_gaps:
            raise ValueError(
                "sampling needs a tree whose sibling ranks have no gaps (0..k-1): an EAGLE head's "
                "rank-r child is its r-th draw without replacement from q"
            )

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        # the verify rows are [pending..., root, nodes]: the root's and the accepted nodes' features are the target's
        n = draft.tokens.numel()
        rows = self._target_rows.rows[self._target_rows.rows.shape[0] - (n + 1) :]
        keep = torch.tensor([0] + [i + 1 for i in acceptance.path], dtype=torch.long, device=rows.device)
        self._features.append(rows.index_select(0, keep))

    def _commit(self, seq: list[int]) -> torch.Tensor:
        """Feed the rows the head's cache lacks, up to the root's; returns the last one's output [H]
        (the root's predicted feature)."""
        if not self._prefill_read:  # the prompt's prefill: the features of prompt[:-1]
            self._prefill_read = True
            if self._target_rows.rows is not None and len(seq) > 1:
                self._features.insert(0, self._target_rows.rows)
        feats = torch.cat(self._features) if self._features else None  # [m, H]
        m = 0 if feats is None else feats.shape[0]
        if self._committed + m != len(seq) - 1:
            raise RuntimeError(
                f"the EAGLE drafter holds features of {self._committed + m} tokens for a sequence of "
                f"{len(seq)} (it reads the target's features inside speculative_generate only)"
            )
        if self._cache is None:
            self._cache = new_cache(self.head)
        start = self._committed
        ids = torch.tensor(seq[start + 1 :], dtype=torch.long)  # host: moved by the head
        positions = torch.arange(start, len(seq) - 1)  # host: moved by the head
        out = self.head(feats[None], ids[None], positions[None], causal_visible(m, start)[None], self._cache)
        self._committed, self._features = len(seq) - 1, []
        return out[0, -1]

    @torch.inference_mode()
    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        self.check_request(tree, sampling)
        seq = tokens.reshape(-1).tolist()
        device = self.head.fc.weight.device
        if len(seq) < 2 and not self._features:  # no feature before the root yet (a one-token prompt)
            self._prefill_read = True
            return Draft(torch.zeros(0, dtype=torch.long, device=device), None, Tree(()))
        g = self._commit(seq)[None]  # [1, H]: the root's predicted feature
        if tree.num_nodes == 0:
            return Draft(torch.zeros(0, dtype=torch.long, device=device), None)
        committed, fed_so_far = self._committed, []

        def feed(level: Level, ids: torch.Tensor) -> torch.Tensor:
            """The head's next features at the level's fed nodes: row (g of the parent, the node's token)."""
            nonlocal g
            nodes, (parents, _, fed) = list(level.fed), level_indices(tree, device)[level.depth - 1]
            visible = paths_visible([tree.paths[i] for i in nodes], [tree.paths[i] for i in fed_so_far], committed)
            fed_so_far.extend(nodes)
            positions = torch.full((1, len(nodes)), committed - 1 + level.depth)  # host: a depth-d node's row
            g = self.head(g[parents[fed - level.nodes.start]][None], ids[None], positions, visible[None], self._cache)[
                0
            ]
            return self.head.project(g)  # [F, V]

        try:
            return fill_levels(tree, self.head.project(g), sampling, generator, feed)
        finally:
            crop(self._cache, committed)  # the tree's rows hold predicted features: only the target's stay


class EagleDynamicDrafter(EagleDrafter):
    """EAGLE-2's dynamic tree from an EAGLE head: each step the `n` nodes with the highest cumulative
    log q (softmax of the head's logits, temperature 1) below the root, `top_k` children per node,
    at most `max_depth` deep, with `drafters.dynamic`'s definition and ties (`top_n`). The
    proposals are chosen, not sampled: under sampling the draft is deterministic (`q=None`), so
    acceptance stays lossless (`core.acceptance`). The requested tree only caps the depth (the
    top-n tree is cut there, as `DynamicTreeDrafter` does); the default tree is a chain of
    `max_depth`. EAGLE-2's settings: n = 60 (total_token), top_k = 10, depth 6."""

    def __init__(
        self, target: torch.nn.Module, head: EagleHead, n: int = 60, top_k: int = 10, max_depth: int = 6
    ) -> None:
        if n < 1 or top_k < 1 or max_depth < 1:
            raise ValueError(f"n, top_k and max_depth must be >= 1, got {n}, {top_k}, {max_depth}")
        super().__init__(target, head, Tree.chain(max_depth))
        self.n, self.top_k, self.max_depth = n, top_k, max_depth

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        """Any request: only its depth is read."""

    @torch.inference_mode()
    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        scored = self.expand(tokens, self.max_depth if tree.depth > 0 else 0)
        cut = scored.tree.truncated(tree.depth)
        return Draft(scored.tokens[: cut.num_nodes], None, cut)

    @torch.inference_mode()
    def expand(self, tokens: torch.Tensor, max_depth: int) -> ScoredTree:
        """The top-n tree after `tokens` (long [T], inside a generation: the head reads the
        target's features), at most `max_depth` deep, with each node's cumulative log q."""
        seq = tokens.reshape(-1).tolist()
        device = self.head.fc.weight.device
        empty = ScoredTree(Tree(()), torch.zeros(0, dtype=torch.long, device=device), torch.zeros(0))  # host: scores
        if len(seq) < 2 and not self._features:  # no feature before the root yet
            self._prefill_read = True
            return empty
        g_root = self._commit(seq)
        if max_depth < 1:
            return empty
        return self._grow(g_root, self._committed, max_depth)

    @torch.inference_mode()
    def super_trees(self, features: torch.Tensor, seq: torch.Tensor, first_root: int) -> list[ScoredTree]:
        """The top-n tree (n, top_k, max_depth: the drafter's) at every root r = first_root ..
        len(seq) - 2 of one sequence, as a step of a run rooted at seq[r] drafts it: the head's rows
        0 .. r-1 from the target's features, then the tree from row r-1's output. features: [T - 1,
        H], the target's last hidden states of seq[:-1] (seq: long [T]). One pass of the head over
        all rows, then per root its cache cut to rows 0 .. r-1 (roots in descending order: a cut
        only shortens it). Re-drafts a generation's dynamic trees without running the target."""
        self.reset()
        seq = seq.reshape(-1).cpu()
        n = len(seq) - 1
        self._cache = new_cache(self.head)
        positions = torch.arange(n)  # host: moved by the head
        g = self.head(features[None], seq[1:][None], positions[None], causal_visible(n, 0)[None], self._cache)[
            0
        ]  # [n, H]
        out = []
        try:
            for r in range(n - 1, first_root - 1, -1):
                crop(self._cache, r)
                out.append(self._grow(g[r - 1], r, self.max_depth))
        finally:
            self.reset()
        return out[::-1]

    def _grow(self, g_root: torch.Tensor, committed: int, max_depth: int) -> ScoredTree:
        """The top-n tree from the root's predicted feature g_root [H], the head's cache holding
        `committed` rows (the tree's rows are cut off again)."""
        device = self.head.fc.weight.device
        scores: dict[tuple[int, ...], float] = {}
        token: dict[tuple[int, ...], int] = {}
        feature: dict[tuple[int, ...], torch.Tensor] = {
            (): g_root
        }  # a fed node's output: its children's parent feature
        add_children([()], [0.0], self.head.project(g_root[None]), self.top_k, scores, token)
        chosen = top_n(scores, self.n)
        fed: list[tuple[int, ...]] = []
        try:
            for depth in range(1, max_depth):
                level = [p for p in chosen if len(p) == depth]  # only these can have children in the top n
                if not level:
                    break
                k = len(level)
                visible = paths_visible(level, fed, committed)  # host: moved by the head
                fed += level
                feats = torch.stack([feature[p[:-1]] for p in level])[None]  # [1, k, H]
                ids = torch.tensor([[token[p] for p in level]])  # host: moved by the head
                positions = torch.full((1, k), committed - 1 + depth)  # host: moved by the head
                g = self.head(feats, ids, positions, visible[None], self._cache)[0]  # [k, H]
                feature.update(zip(level, g))
                add_children(level, [scores[p] for p in level], self.head.project(g), self.top_k, scores, token)
                chosen = top_n(scores, self.n)
        finally:
            crop(self._cache, committed)
        out = Tree.from_paths(chosen)
        return ScoredTree(
            out,
            torch.tensor([token[p] for p in out.paths], dtype=torch.long, device=device),
            torch.tensor([scores[p] for p in out.paths], dtype=torch.float32),
        )  # host: scores
