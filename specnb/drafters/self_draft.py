"""Self-drafts: the target model drafting for itself, by early exit or as a 4-bit copy.

    early_exit_model(target, layers)   the target's first `layers` decoder layers, then its final
                                       norm and LM head, as a model object that shares every weight
                                       tensor with the target (nothing is copied)
    EarlyExitDrafter(target, layers)   drafts with that model (LayerSkip-style early exit, Elhoushi
                                       et al. 2024, without LayerSkip's training) on the target's own
                                       KV cache
    quantized_self_draft(name, ...)    a `ModelDrafter` on a 4-bit nf4 copy of the target

Sharing the target's cache is exact. Between steps the target's cache holds the keys and values of
every committed token but the last, in every layer. Layer l < L of the early-exit model is layer l
of the target with the same weights, fed the same hidden states (layers below l are the same too)
at the same positions, so the keys and values it would compute for those tokens are the ones the
target already stored. The drafter therefore feeds only the root and the tree levels into the
target's cache; before returning it puts back the state of the L layers it wrote
(`cache.restore_layers`: the very tensors, so the cache is bit-identical; the other layers are
never touched). Without a bound cache (used outside `speculative_generate`, or before the target's
prefill) it drafts on a cache of its own, as any `ModelDrafter`.

`models.truncate_layers` cuts a model in place (it keeps the first layers' modules; the rest are
freed), so it cannot cut the target itself; `models.load_model(..., layers=L)` loads a second,
separate copy with its own weights and cache. `early_exit_model` is the one that shares.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from ..core.cache import cache_length, layer_states, restore_layers
from ..core.drafting import Draft, ModelDrafter
from ..core.forward import forward
from ..core.sampling import SamplingConfig
from ..core.trees import Tree

if TYPE_CHECKING:  # importing the model classes takes seconds; only loading needs them
    from transformers import PreTrainedModel


def early_exit_model(target: PreTrainedModel, layers: int) -> PreTrainedModel:
    """The target's first `layers` decoder layers + final norm + LM head, sharing its weights.

    A new model object of the target's class (built on the meta device, so nothing is allocated)
    whose submodules are the target's own; the target is not modified. Its config is a copy with
    `num_hidden_layers = layers`.
    """
    decoder = getattr(getattr(target, "model", None), "layers", None)
    if decoder is None:
        raise ValueError(f"{type(target).__name__} has no model.layers: cannot exit early")
    if not 1 <= layers <= len(decoder):
        raise ValueError(f"layers must lie in 1..{len(decoder)} for this model, got {layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.device("meta"):
        view = type(target)(config)
    for name, _ in list(view.model.named_children()):
        shared = torch.nn.ModuleList(decoder[:layers]) if name == "layers" else getattr(target.model, name)
        setattr(view.model, name, shared)
    for name, _ in list(view.named_children()):
        if name != "model":
            setattr(view, name, getattr(target, name))
    left = [name for name, t in [*view.named_parameters(), *view.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"{type(target).__name__}: could not share {left[:3]} with the target")
    view.generation_config = target.generation_config
    return view.eval()


class EarlyExitDrafter(ModelDrafter):
    """Drafts with the target's first `layers` layers on the target's own KV cache (module docstring).

    `layers` = all of them makes the draft the target itself (every greedy draft token accepted).
    confidence_threshold: as in `ModelDrafter`.
    """

    shares_target_cache = True

    def __init__(self, target: PreTrainedModel, layers: int, confidence_threshold: float = 0.0) -> None:
        super().__init__(early_exit_model(target, layers), confidence_threshold)
        self.layers = layers
        self._target_layers = len(target.model.layers)

    def reset(self) -> None:
        super().reset()
        self._target_cache: DynamicCache | None = None

    def bind_target_cache(self, cache: DynamicCache) -> None:
        """Draft on `cache` from now until `reset`: the cache of the target this drafter was made
        from (another model's cache would give wrong drafts; verification would still be exact)."""
        if len(cache.layers) != self._target_layers:
            raise ValueError(
                f"a cache of {len(cache.layers)} layers is not the target's ({self._target_layers} layers)"
            )
        self._target_cache = cache

    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        if self._target_cache is None:
            return super().draft(tokens, tree, sampling, generator)
        saved = layer_states(self._target_cache, self.layers)
        try:
            return super().draft(tokens, tree, sampling, generator)
        finally:
            restore_layers(self._target_cache, saved)
            self._cache, self._fed = None, []  # nothing of the tree is kept

    def _advance(self, seq: list[int], k: int = 0) -> torch.Tensor:
        if self._target_cache is None:
            return super()._advance(seq, k)
        held = cache_length(self._target_cache)
        if held != len(seq) - 1:
            raise RuntimeError(
                f"the target's cache holds {held} tokens, but a draft for a sequence of {len(seq)} "
                "needs all but the last; bind_target_cache only works inside speculative_generate"
            )
        # the tree levels go on top of the target's cache (ModelDrafter.draft); nothing of them is
        # kept: the target's layers are restored after the draft
        self._cache, self._committed, self._fed = self._target_cache, list(seq), []
        return forward(
            self.model,
            self._cache,
            torch.tensor(seq[-1:]),
            logits_to_keep=1,  # host: moved by forward
            head=self.head if k else None,
            k=k,
        )[-1].float()


def quantized_self_draft(
    name_or_path: str,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    confidence_threshold: float = 0.0,
) -> ModelDrafter:
    """A drafter on a 4-bit (bitsandbytes nf4) copy of the model `name_or_path`, for a target
    loaded from the same name in full precision: `load_model(name, quantization="4bit")`, wrapped.

    The copy has its own weights and KV cache. On CPU bitsandbytes computes in bfloat16.
    """
    from ..io.models import load_model

    model, _ = load_model(name_or_path, "4bit", dtype=dtype, device=device, attn_implementation=attn_implementation)
    return ModelDrafter(model, confidence_threshold)
