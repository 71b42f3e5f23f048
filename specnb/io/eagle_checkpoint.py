"""EAGLE-1 head checkpoints (Li et al. 2024) in the published layout (yuhuili/EAGLE-Vicuna-7B-v1.3,
yuhuili/EAGLE-llama2-chat-7B).

A checkpoint folder holds
    config.json          the head's LlamaConfig-like config, num_hidden_layers 1 (EAGLE's
                         eagle/train/vicuna_7B_config.json, llama_2_chat_7B_config.json), and an
                         optional "bias" (default true: fc has a bias); specnb writes
                         "base_model_name_or_path" too
    pytorch_model.bin    torch.save of the head's state dict: `fc.weight` [H, 2H] over concat(embedding
                         of token t+1, the target's feature at t), `fc.bias` [H] when "bias", and one
                         decoder layer `layers.0.self_attn.{q,k,v,o}_proj.weight`,
                         `layers.0.mlp.{gate,up,down}_proj.weight`, `layers.0.post_attention_layernorm.weight`
                         (no input norm: EAGLE-1's layer 0 has none); the published files also hold
                         `embed_tokens.weight` [V, H], the target's own embedding
(`model.safetensors` is read when the .bin is absent, as EAGLE's loader does). `drafters.eagle.EagleHead`
holds the same tensors as `fc.*` and `layer.*` (`layers.0.X` <-> `layer.X`). `embed_tokens.weight` is
dropped on load (the head uses the target's embedding, as EAGLE's loader, strict=False, ends up doing)
and written only when asked. A hub id is downloaded with huggingface_hub (`io.checkpoints`).

What it holds:
    PublishedEagle, PUBLISHED   the published heads specnb plans for: base model, the dtype and sizes
                                of their files (download estimates, the dry run's stand-in)
    to_published, from_published   the key mapping (and the keys refused: another EAGLE version's)
    EagleCheckpoint             what load_checkpoint read: specnb's keys, the config, the file
    load_checkpoint, save_checkpoint
    check_checkpoint            the checkpoint against the head a target needs; every refusal names the
                                file, the key and what was expected
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import checkpoints
from .checkpoints import CONFIG, PublishedCheckpoint, read_config, read_state, write_config, write_state

WEIGHTS = "pytorch_model.bin"
WEIGHTS_SAFETENSORS = "model.safetensors"
EMBEDDING = "embed_tokens.weight"  # the target's embedding, in the published files only
LAYER, PUBLISHED_LAYER = "layer.", "layers.0."  # EagleHead's prefix, the published one


@dataclass(frozen=True)
class PublishedEagle(PublishedCheckpoint):
    """A published EAGLE-1 head, as far as specnb plans for it: the sizes of its config.json, what
    its weights file holds, and (inherited) its base model and the dtype of its tensors."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    holds_embedding: bool  # the file holds embed_tokens.weight [V, H] too
    bias: bool = True  # fc has a bias (config.json's "bias")


# Sizes: EAGLE's eagle/train/vicuna_7B_config.json and llama_2_chat_7B_config.json (no "bias" key:
# fc has one). Dtype: config.json says float16, but the weights are float32 and include the target's
# embedding (EAGLE's author, SafeAILab/EAGLE issue 60: the 1.4 GB .bin of a 0.24B head "saves
# weights in fp32"; 4 x (0.236B + 32000 x 4096) = 1.47 GB). Assumed the same for the Llama-2-chat
# head (the same training code and size).
PUBLISHED = {
    h.repo_id: h
    for h in (
        PublishedEagle(
            "yuhuili/EAGLE-Vicuna-7B-v1.3",
            "lmsys/vicuna-7b-v1.3",
            "float32",
            hidden_size=4096,
            intermediate_size=11008,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32000,
            holds_embedding=True,
        ),
        PublishedEagle(
            "yuhuili/EAGLE-llama2-chat-7B",
            "meta-llama/Llama-2-7b-chat-hf",
            "float32",
            hidden_size=4096,
            intermediate_size=11008,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32000,
            holds_embedding=True,
        ),
    )
}


def checkpoint_folder(name_or_path: str | os.PathLike) -> Path:
    """A local folder as given, else the hub snapshot of the repository id (downloaded once)."""
    return checkpoints.checkpoint_folder(name_or_path, [CONFIG, WEIGHTS, WEIGHTS_SAFETENSORS])


def published_key(key: str) -> str:
    """EagleHead's key -> the published one (`layer.X` -> `layers.0.X`; fc.* as is)."""
    return PUBLISHED_LAYER + key[len(LAYER) :] if key.startswith(LAYER) else key


def to_published(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An EagleHead state dict (fc.*, layer.*) under the published keys."""
    bad = [k for k in state if not k.startswith(("fc.", LAYER))]
    if bad:
        raise ValueError(f"not an EAGLE head state dict: keys {bad[:4]} are neither fc.* nor {LAYER}*")
    return {published_key(k): v for k, v in state.items()}


def from_published(
    state: Mapping[str, torch.Tensor], file: str | os.PathLike = "the state dict"
) -> dict[str, torch.Tensor]:
    """A published state dict under EagleHead's keys, embed_tokens.weight dropped. Keys of another
    layout (two layers, EAGLE-3's midlayer.* / d2t / lm_head) are refused, naming `file`."""
    bad = [k for k in state if k != EMBEDDING and not k.startswith(("fc.", PUBLISHED_LAYER))]
    if bad:
        raise ValueError(
            f"{file} is not an EAGLE-1 head: keys {sorted(bad)[:4]} are none of fc.*, {PUBLISHED_LAYER}* "
            f"and {EMBEDDING} (a head of another EAGLE version, or of more than one layer?)"
        )
    return {
        (LAYER + k[len(PUBLISHED_LAYER) :] if k.startswith(PUBLISHED_LAYER) else k): v
        for k, v in state.items()
        if k != EMBEDDING
    }


@dataclass(frozen=True)
class EagleCheckpoint:
    state: dict[str, torch.Tensor]  # EagleHead's keys (fc.*, layer.*), tensors as stored: cast them on use
    config: dict[str, Any]  # config.json ({} where the folder has none)
    file: Path  # the weights file read
    embedding_shape: tuple[int, ...] | None  # embed_tokens.weight's shape where the file holds it (dropped)

    @property
    def bias(self) -> bool:
        """fc has a bias: config.json's "bias" (true where absent, as EAGLE reads it)."""
        return bool(self.config.get("bias", True))


def load_checkpoint(name_or_path: str | os.PathLike) -> EagleCheckpoint:
    """The checkpoint of a folder or hub id, under EagleHead's keys (see `check_checkpoint`)."""
    folder = checkpoint_folder(name_or_path)
    state, file = read_state(folder, [WEIGHTS, WEIGHTS_SAFETENSORS])
    embedding = tuple(state[EMBEDDING].shape) if EMBEDDING in state else None
    return EagleCheckpoint(from_published(state, file), read_config(folder), file, embedding)


def save_checkpoint(
    folder: str | os.PathLike,
    state: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    dtype: torch.dtype | None = None,
    embedding: torch.Tensor | None = None,
) -> Path:
    """Write pytorch_model.bin (EagleHead's `state` under the published keys; atomically) and
    config.json (`config` as given). dtype: cast the tensors; default as they are. embedding: the
    target's [V, H], written as embed_tokens.weight as the published files hold it (default none:
    loaders use the target's own)."""
    folder = Path(folder)
    extra = {} if embedding is None else {EMBEDDING: embedding}
    write_state(folder, WEIGHTS, to_published(state) | extra, dtype)
    write_config(folder, config)
    return folder


def check_checkpoint(
    checkpoint: EagleCheckpoint, expected: Mapping[str, tuple[int, ...]], hidden_size: int, vocab_size: int
) -> None:
    """ValueError unless the checkpoint fits the head a target needs: `expected` holds EagleHead's
    keys and shapes for that target (its hidden size and vocabulary, read from its embedding); the
    config's hidden size and vocabulary, the embedding the file holds, fc's bias against the
    config's "bias", every key and every shape. The message names the file, the key (as published)
    and what was expected."""
    file, config = checkpoint.file, checkpoint.config
    config_file = file.parent / CONFIG
    said = config.get("hidden_size")
    if said is not None and int(said) != hidden_size:
        raise ValueError(
            f"{config_file}: hidden_size {said}, but the target's hidden size is {hidden_size}: this EAGLE "
            "head was trained for another model (use the head published for this target)"
        )
    said = config.get("vocab_size")
    if said is not None and int(said) != vocab_size:
        raise ValueError(
            f"{config_file}: vocab_size {said}, but the target's embedding has {vocab_size} rows: this "
            "EAGLE head was trained for another vocabulary"
        )
    if checkpoint.embedding_shape is not None and checkpoint.embedding_shape != (vocab_size, hidden_size):
        raise ValueError(
            f"{file}: {EMBEDDING} has shape {list(checkpoint.embedding_shape)}, expected "
            f"{[vocab_size, hidden_size]} (the target's embedding): a head for another model"
        )
    if ("fc.bias" in checkpoint.state) != checkpoint.bias:
        raise ValueError(
            f"{file}: {'holds' if 'fc.bias' in checkpoint.state else 'has no'} fc.bias, but {config_file} "
            f"says bias {'true' if checkpoint.bias else 'false'} (absent means true, as EAGLE reads it)"
        )
    missing = sorted(published_key(k) for k in expected if k not in checkpoint.state)
    extra = sorted(published_key(k) for k in checkpoint.state if k not in expected)
    if missing or extra:
        raise ValueError(
            f"{file}: an EAGLE-1 head for this target needs {sorted(map(published_key, expected))}; "
            f"missing {missing}, not expected {extra}"
        )
    for key, shape in expected.items():
        got = tuple(checkpoint.state[key].shape)
        if got != tuple(shape):
            raise ValueError(
                f"{file}: {published_key(key)} has shape {list(got)}, expected {list(shape)} for this target "
                f"(hidden size {hidden_size}; the layer's sizes from the target's config)"
            )
