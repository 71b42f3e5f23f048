"""The memory arithmetic of models, caches and downloads, from the models' configs alone (pure: configs in,
numbers out; nothing is downloaded or allocated, model skeletons live on the meta device).

What it holds:
    WeightBytes       a model's weight bytes, split into 4-bit Linear weights and what stays float16
    weight_bytes      the bytes of a config's weights in float16 (quantization None) or bitsandbytes nf4
    nf4_linear_bytes  one nf4 Linear weight: 4 bits per value + one float32 absmax per block
    kv_cache_bytes    the KV cache of a number of tokens
    parameter_count, download_bytes, medusa_heads_bytes, eagle_head_bytes
                      what a model's (or a Medusa or EAGLE checkpoint's) download costs, from its config
    LONGEST_PROMPT    the longest prompt the estimates assume (tokens)
    attention_grid_bytes  one point of notebook 03's attention grid

nf4 as transformers 5 and bitsandbytes store it (Dettmers et al. 2023, QLoRA): transformers' own
bnb 4-bit quantizer is run on the skeleton (`HfQuantizer.preprocess_model`), so what it leaves
unquantized is what it would leave on a real load: every module that is not a plain `nn.Linear`
(token embeddings, RMSNorm weights) and the modules it refuses to convert,
`get_keys_to_not_convert`: the output embeddings (`lm_head`), and for tied models the tied
embedding (`model.embed_tokens`) and the last parameter's module (`model.norm`). Those stay in the
load dtype (float16). Each converted Linear stores its weight packed, two 4-bit codes per
byte, plus one float32 absmax per block of `blocksize` values (64, the bitsandbytes default; read
from the converted module) and no double quantization (`bnb_4bit_use_double_quant` False, as
`io.models` loads). Per-weight constants (the 16-entry code table, shapes) are left out: 64 bytes
a Linear.

KV cache (float16): 2 (keys and values) x layers x kv heads x head size x tokens x 2 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, PretrainedConfig

from ..io.eagle_checkpoint import PublishedEagle

GB = 1e9
FLOAT16_BYTES = 2
ABSMAX_BYTES = 4  # one float32 absmax per block


@dataclass(frozen=True)
class WeightBytes:
    quantization: str | None  # None (float16 everywhere) or "4bit" (nf4)
    quantized: int  # bytes of the 4-bit Linear weights, absmax included (0 in float16)
    unquantized: int  # bytes of every other parameter, float16
    quantized_modules: int  # Linear modules converted to 4 bit
    not_converted: tuple[str, ...]  # modules transformers' quantizer refuses to convert (sorted)

    @property
    def total(self) -> int:
        return self.quantized + self.unquantized


def nf4_linear_bytes(out_features: int, in_features: int, blocksize: int = 64) -> int:
    """One nf4 Linear weight [out, in]: numel / 2 bytes of codes + one float32 absmax per block."""
    numel = out_features * in_features
    return math.ceil(numel / 2) + math.ceil(numel / blocksize) * ABSMAX_BYTES


def weight_bytes(config: PretrainedConfig, quantization: str | None = None) -> WeightBytes:
    """The weight bytes of a causal LM built from `config` (tied weights counted once); counted once
    per (config, quantization) in a process (building the skeleton takes a fraction of a second)."""
    if quantization not in (None, "4bit"):
        raise ValueError(f"quantization must be None or '4bit', got {quantization!r}")
    key = (type(config).__name__, config.to_json_string(use_diff=False), quantization)
    if key not in _WEIGHT_BYTES:
        _WEIGHT_BYTES[key] = _count_weight_bytes(config, quantization)
    return _WEIGHT_BYTES[key]


_WEIGHT_BYTES: dict[tuple[str, str, str | None], WeightBytes] = {}


def _count_weight_bytes(config: PretrainedConfig, quantization: str | None) -> WeightBytes:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    if quantization is None:
        total = sum(p.numel() for p in model.parameters()) * FLOAT16_BYTES
        return WeightBytes(None, 0, total, 0, ())
    from bitsandbytes.nn import Linear4bit
    from transformers.quantizers.auto import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(
        BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float16)
    )
    quantizer.preprocess_model(model, device_map={"": "cpu"})  # the skeleton's Linears become Linear4bit
    quantized, unquantized, converted = 0, 0, set()
    for name, module in model.named_modules():
        if isinstance(module, Linear4bit):
            weight = module.weight
            if getattr(weight, "compress_statistics", False):
                raise ValueError("double quantization is not modelled here")
            quantized += nf4_linear_bytes(module.out_features, module.in_features, weight.blocksize)
            converted.add(name)
    for name, param in model.named_parameters():  # deduplicated: a tied weight is counted once
        if name.rsplit(".", 1)[0] not in converted:
            unquantized += param.numel() * FLOAT16_BYTES
    return WeightBytes("4bit", quantized, unquantized, len(converted), tuple(sorted(quantizer.modules_to_not_convert)))


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def parameter_count(config: PretrainedConfig) -> int:
    """Parameters of a causal LM built from `config` (on the meta device; tied weights counted once)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    return sum(p.numel() for p in model.parameters())


def download_bytes(config: PretrainedConfig, weights_dtype: str) -> int:
    """What downloading the model's weights costs: its parameters in the dtype of the files the hub
    serves (`io.model_configs.HubModel.weights_dtype`; transformers fetches the safetensors files of
    a repository that also holds .bin copies, so each parameter is downloaded once)."""
    return parameter_count(config) * DTYPE_BYTES[weights_dtype]


def medusa_heads_bytes(
    hidden_size: int, vocab_size: int, heads: int, layers: int = 1, dtype_bytes: int = FLOAT16_BYTES
) -> int:
    """A Medusa-1 checkpoint of `heads` heads (each `layers` residual blocks H x H + bias, then its
    own V x H projection), as published in float16."""
    return heads * (layers * (hidden_size * hidden_size + hidden_size) + vocab_size * hidden_size) * dtype_bytes


def eagle_head_bytes(head: PublishedEagle, dtype_bytes: int = FLOAT16_BYTES) -> int:
    """An EAGLE-1 checkpoint (`io.eagle_checkpoint`): fc 2H -> H (+ its bias), one Llama-style
    decoder layer without an input norm (q and o H x heads*d, k and v H x kv_heads*d, gate and up
    H x I, down I x H, the post-attention norm H), and the target's embedding V x H where the file
    holds it."""
    h = head.hidden_size
    d = h // head.num_attention_heads
    fc = 2 * h * h + (h if head.bias else 0)
    layer = (
        2 * h * head.num_attention_heads * d + 2 * h * head.num_key_value_heads * d + 3 * h * head.intermediate_size + h
    )
    return (fc + layer + (head.vocab_size * h if head.holds_embedding else 0)) * dtype_bytes


def kv_cache_bytes(config: PretrainedConfig, tokens: int, dtype_bytes: int = FLOAT16_BYTES) -> int:
    """Keys and values of `tokens` positions in every layer."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * tokens * dtype_bytes


LONGEST_PROMPT = 1024  # tokens, an assumption: above the longest Spec-Bench prompt t4's 01 and 02 select (~940
# Llama-2 tokens, estimated); 05 keeps prompts of <= 512 tokens


def attention_grid_bytes(
    batch: int, heads: int, kv_heads: int, head_dim: int, prefix: int, nodes: int, dtype_bytes: int
) -> int:
    """One point of the tree-attention grid (notebook 03): q and the output [B, H, M, D], k and v
    [B, Hkv, P + M, D] in the grid's dtype, and the eager reference's float32 scores [B, H, M, P + M]
    (the largest tensor)."""
    qo = 2 * batch * heads * nodes * head_dim * dtype_bytes
    kv = 2 * batch * kv_heads * (prefix + nodes) * head_dim * dtype_bytes
    return qo + kv + batch * heads * nodes * (prefix + nodes) * 4
