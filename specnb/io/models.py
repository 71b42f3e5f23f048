"""Model loading: embedded models, local folders and hub ids, in float or 4-bit nf4, checked first.

What it holds:
    load_tokenizer / load_model   one tokenizer / a (model, tokenizer) on a device, optionally 4-bit;
                                  the name is resolved first (`sources`): a mistyped name, a gated
                                  model without access or an unreachable hub fails at once, naming
                                  the model and what to do, before any weights load
    load_config                   a model's transformers config alone (no weights): embedded, a
                                  folder or config.json, committed, cached or fetched from the hub
    check_pair / load_pair        a target and a draft that share one vocabulary, checked before any
                                  weights are loaded (or, with cross_tokenizer=True, any two causal
                                  LMs, for the cross-tokenizer drafter)
    ModelPair                     a pair by name (what a worker process needs to load it itself)
    truncate_layers               keep a model's first layers (a separate early-exit copy)
    describe_model                what was loaded, in one line: class, layers, dtype, 4-bit Linears,
                                  and whether it is a dry run's stand-in (`notebook.dryrun`)
    prompt_ids / prompt_format    a user prompt as input ids [1, T], through the chat template if any
                                  (a known model's conversation format where its tokenizer has none);
                                  which of these a model's prompts get, in words

Embedded models load from their de-quantized float32 folder (`embedded.float_folder`), hub models
from the hub or its local cache, local folders as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    BatchEncoding,
    BitsAndBytesConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)

from ..kernels.cpu_linear import PackedLinear, check_linear_path, pack_linears
from ..kernels.gqa_sdpa import register as register_gqa_sdpa
from . import embedded
from .model_configs import config_of, hub_model, known_models
from .sources import ModelSourceError, Source, check_sources, resolve_source

if TYPE_CHECKING:  # importing the model classes takes seconds; loading a model imports them (the runner needs none)
    from transformers import PreTrainedModel

QUANTIZATIONS: tuple[str | None, ...] = (None, "4bit")

# Pairs known to share a vocabulary, quoted when a pair is refused (docs/cross-tokenizer.md for the pairs that do not).
VALID_PAIRS = (
    "JackFram/llama-68m or JackFram/llama-160m -> meta-llama/Llama-2-7b-hf (Llama-2's 32k vocabulary); "
    "meta-llama/Llama-3.2-1B -> meta-llama/Llama-3.2-3B or meta-llama/Llama-3.1-8B (128k); "
    "qwen2.5-coder-0.5b -> qwen2.5-coder-1.5b (embedded, 151k)"
)
# What a refused pair can use instead (quoted in the message).
CROSS_TOKENIZER = (
    "To pair them anyway, draft across tokenizers: method specs xtok/chain:4, xtok/sparse:16 or "
    "xtok/dynamic:16 (specnb.drafters.cross_tokenizer.CrossTokenizerDrafter: the draft's tree re-encoded "
    "into target tokens), transformers' hf_uag:4 (universal assisted generation), and "
    "load_pair(..., cross_tokenizer=True)"
)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """float16 on CUDA (the T4 has no bfloat16 speed), float32 elsewhere (CPU half is slow)."""
    return torch.float16 if device.type == "cuda" else torch.float32


def model_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A dtype as parameter files name it ("float16", "bfloat16", "float32"), a torch dtype, or None
    (the device's default, `default_dtype`)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"unknown model dtype {dtype!r}; allowed: None, 'float16', 'bfloat16', 'float32'")
    return getattr(torch, dtype)


def load_tokenizer(name_or_path: str, source: Source | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of an embedded model (short name), a hub id or a local folder. No weights load.
    source: `resolve_source(name_or_path)`, resolved here when not given. A hub model trained in a
    conversation format its tokenizer lacks (Vicuna: `model_configs.TokenizerFacts.conversation`)
    gets that format as its chat template, so `prompt_ids` encodes prompts as the model saw them."""
    source = source or resolve_source(name_or_path)
    if source.kind == "embedded":
        tokenizer = embedded.tokenizer_of(embedded.EMBEDDED_MODELS[name_or_path])
    else:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=source.local_files_only)
    conversation = _conversation(name_or_path)
    if conversation and not tokenizer.chat_template:
        tokenizer.chat_template = conversation
    return tokenizer


def load_config(name_or_path: str) -> PretrainedConfig:
    """The transformers config of a model, never its weights: a config.json file or a local folder's;
    a hub id's committed config (`model_configs.config_of`: exact, no hub needed); an embedded model's
    (`embedded.model_config`; ModelNotInstalledError says how to install it); else a hub id's
    config.json from the local hub cache, else that one file from the hub (not in offline mode).
    ModelSourceError says what failed."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return AutoConfig.from_pretrained(path)
    if name_or_path in known_models():
        return config_of(name_or_path)
    source = resolve_source(name_or_path, check_access=False)  # a name that leads nowhere: why, and what works
    if source.kind == "embedded":
        return embedded.model_config(embedded.EMBEDDED_MODELS[name_or_path])
    if source.kind == "folder":
        return AutoConfig.from_pretrained(path)
    try:
        return AutoConfig.from_pretrained(name_or_path, local_files_only=True)  # the hub cache: no request
    except OSError as e:
        if source.local_files_only:
            raise ModelSourceError(f"the cached config.json of {name_or_path!r} cannot be read: {e}") from e
    try:
        return AutoConfig.from_pretrained(name_or_path)  # config.json alone
    except OSError as e:
        raise ModelSourceError(
            f"the config.json of {name_or_path!r} could not be fetched from the Hugging Face hub: "
            f"{str(e).splitlines()[0]} (a gated model needs its licence accepted and a token in HF_TOKEN)"
        ) from e


def prompt_format(name_or_path: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """How `prompt_ids` encodes prompts for this model, in words: its tokenizer's chat template, the
    conversation format specnb supplies (Vicuna's), or plain text."""
    if not tokenizer.chat_template:
        return "plain text (the tokenizer has no chat template)"
    if tokenizer.chat_template == _conversation(name_or_path):
        return f"{name_or_path}'s conversation format, supplied by specnb (its tokenizer has none: io/configs)"
    return "the tokenizer's chat template"


def _conversation(name_or_path: str) -> str | None:
    """The committed conversation format of a hub id, None for anything else."""
    return hub_model(name_or_path).tokenizer.conversation if name_or_path in known_models() else None


def _check_quantization(quantization: str | None) -> None:
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; allowed: {', '.join(map(repr, QUANTIZATIONS))}")


def _load_causal_lm(
    name_or_path: str,
    source: Source,
    quantization: str | None,
    layers: int | None = None,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    cpu_linear: str = "stock",
) -> PreTrainedModel:
    """The weights of `name_or_path` on `device`, in eval mode, cut to `layers` and packed for
    `cpu_linear` (the arguments of `load_model`)."""
    _check_quantization(quantization)
    device = torch.device(device) if device is not None else default_device()
    dtype = model_dtype(dtype) or default_dtype(device)
    if attn_implementation == "sdpa" and device.type == "cpu":
        attn_implementation = (
            register_gqa_sdpa()
        )  # the same sdpa, grouped key/value heads not copied (`kernels.gqa_sdpa`)
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "attn_implementation": attn_implementation,
        "device_map": {"": device},  # straight onto the device: a 7B model need not fit in CPU RAM
    }
    if quantization == "4bit":
        # nf4 with compute in the model dtype: float16 on a T4, float32 on CPU. bitsandbytes >= 0.48
        # runs 4-bit on CPU; with AVX512-BF16 its CPU kernel computes in bfloat16 whatever this says.
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
        )
    if source.kind == "embedded":
        path = str(embedded.float_folder(embedded.EMBEDDED_MODELS[name_or_path]))
    else:
        path, kwargs["local_files_only"] = name_or_path, source.local_files_only
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    if layers is not None:
        truncate_layers(model, layers)
    pack_linears(model, cpu_linear)
    return model


def load_model(
    name_or_path: str,
    quantization: str | None = None,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    layers: int | None = None,
    cpu_linear: str = "stock",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM in eval mode and its tokenizer.

    name_or_path: an embedded model's short name (EMBEDDED_MODELS: its GGUF, de-quantized once to
        `<cache>/<name>-float32/`), else a hub id or local folder passed to `from_pretrained` as is.
    quantization: None, or "4bit" for bitsandbytes nf4.
    dtype: of the weights (and of 4-bit compute), a torch dtype or its name ("float16"); default
        float16 on CUDA, float32 elsewhere. device: default "cuda" if available, else "cpu".
    layers: keep only the first `layers` decoder layers (then the final norm and LM head): an
        early-exit copy of the model, e.g. a draft made from the target itself (LayerSkip-style,
        but as a separate model with its own cache).
    cpu_linear: how a float32 CPU model runs its linear layers (`kernels.cpu_linear`): "stock" (torch's
        nn.Linear) or "onednn" (oneDNN on prepacked weights); ignored on CUDA, in half precision and
        for 4-bit layers.
    """
    _check_quantization(quantization)
    check_linear_path(cpu_linear)
    source = resolve_source(name_or_path)
    tokenizer = load_tokenizer(name_or_path, source)
    model = _load_causal_lm(name_or_path, source, quantization, layers, dtype, device, attn_implementation, cpu_linear)
    return model, tokenizer


def truncate_layers(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """Keep the first `layers` decoder layers of `model`, in place (frees the others)."""
    decoder = getattr(getattr(model, "model", None), "layers", None)
    if decoder is None:
        raise ValueError(f"{type(model).__name__} has no model.layers: cannot keep its first layers")
    total = len(decoder)
    if not 1 <= layers <= total:
        raise ValueError(f"layers must lie in 1..{total} for this model, got {layers}")
    model.model.layers = decoder[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    return model


def describe_model(model: torch.nn.Module) -> str:
    """E.g. "LlamaForCausalLM, 32 layers, float16, nf4 4-bit: 224 Linear" as loaded (not as asked);
    a dry run's stand-in says so (its config carries `specnb_standin`)."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", "?")
    out = f"{type(model).__name__}, {layers} layers, {str(getattr(model, 'dtype', '?')).removeprefix('torch.')}"
    four_bit = sum(type(m).__name__ == "Linear4bit" for m in model.modules())
    if four_bit:
        kind = getattr(getattr(config, "quantization_config", None), "bnb_4bit_quant_type", "4-bit")
        out += f", {kind} 4-bit: {four_bit} Linear"
    packed = sum(isinstance(m, PackedLinear) for m in model.modules())
    if packed:
        out += f", oneDNN prepacked: {packed} Linear"
    if getattr(config, "specnb_standin", None):
        out += ", STAND-IN (tiny random model, not the real weights)"
    return out


def check_pair(
    target_tokenizer: PreTrainedTokenizerBase,
    draft_tokenizer: PreTrainedTokenizerBase,
    target_name: str | None = None,
    draft_name: str | None = None,
) -> None:
    """Raise ValueError unless target and draft map the same tokens to the same ids.

    A token tree is drafted in the draft's ids and verified by indexing the target's logits with
    them, so the two token -> id maps must be identical (not merely of equal size). The names in the
    message default to the tokenizers' `name_or_path` (for a GGUF tokenizer, only its folder).
    """
    target_name = target_name or target_tokenizer.name_or_path
    draft_name = draft_name or draft_tokenizer.name_or_path
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return
    differing = sorted(
        token for token in target_vocab.keys() | draft_vocab.keys() if target_vocab.get(token) != draft_vocab.get(token)
    )
    raise ValueError(
        f"target tokenizer {target_name!r} (vocab size {len(target_vocab)}) and draft "
        f"tokenizer {draft_name!r} (vocab size {len(draft_vocab)}) have different "
        f"vocabularies ({len(differing)} tokens differ, e.g. {differing[:3]}). A token tree of the draft's ids "
        f"needs a draft and target that share one vocabulary; valid pairs include: {VALID_PAIRS}. {CROSS_TOKENIZER}."
    )


# what `load_pair` passes on to `load_model` for both models
PAIR_OPTIONS = ("dtype", "device", "attn_implementation", "cpu_linear")


def load_pair(
    target: str,
    draft: str,
    target_quantization: str | None = None,
    draft_quantization: str | None = None,
    *,
    draft_layers: int | None = None,
    cross_tokenizer: bool = False,
    **options: Any,
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerBase]:
    """(target model, draft model, the target's tokenizer). The vocabularies are checked before any
    weights load: a pair that does not share one is refused, unless cross_tokenizer=True (for the
    cross-tokenizer drafter, which needs the draft's tokenizer too: `load_tokenizer(draft)`).

    Names and quantizations mean what they mean in `load_model`; draft_layers keeps only the draft's
    first layers. options: `load_model`'s dtype, device, attn_implementation and cpu_linear, for both.
    """
    unknown = sorted(set(options) - set(PAIR_OPTIONS))
    if unknown:
        raise TypeError(
            f"load_pair() got unknown options {unknown}; it takes {', '.join(PAIR_OPTIONS)} (for both models)"
        )
    _check_quantization(target_quantization)
    _check_quantization(draft_quantization)
    check_linear_path(options.get("cpu_linear", "stock"))
    sources = check_sources([target, draft])
    tokenizer = load_tokenizer(target, sources[target])
    if not cross_tokenizer:
        check_pair(tokenizer, load_tokenizer(draft, sources[draft]), target, draft)
    target_model = _load_causal_lm(target, sources[target], target_quantization, None, **options)
    draft_model = _load_causal_lm(draft, sources[draft], draft_quantization, draft_layers, **options)
    return target_model, draft_model, tokenizer


@dataclass(frozen=True)
class ModelPair:
    """A draft -> target pair by name, as parameter files name it: what a worker process (a Ray
    actor) is sent so that it loads the pair itself, once (`load`)."""

    target: str  # an embedded model's short name, a hub id or a local folder
    draft: str
    target_quantization: str | None = None  # None or "4bit"
    draft_quantization: str | None = None
    draft_layers: int | None = None  # keep only the draft's first layers (early-exit self-draft)
    dtype: str | None = None  # weights and 4-bit compute (`model_dtype`); None: the device's default
    cpu_linear: str = "stock"  # a CPU float32 model's linear layers (`kernels.cpu_linear`): "stock" or "onednn"

    def load(
        self, device: str | torch.device | None = None
    ) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerBase]:
        """`load_pair` of these names: (target, draft, tokenizer) on `device` (default: CUDA if seen)."""
        return load_pair(
            self.target,
            self.draft,
            self.target_quantization,
            self.draft_quantization,
            device=device,
            dtype=self.dtype,
            draft_layers=self.draft_layers,
            cpu_linear=self.cpu_linear,
        )


def prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> torch.Tensor:
    """`text` as one user turn, through the chat template when the tokenizer has one: ids [1, T] (long)."""
    if tokenizer.chat_template:
        # return_dict=True: a BatchEncoding in transformers 4.x and 5 alike (5 made it the default).
        encoded = cast(
            BatchEncoding,
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True, return_tensors="pt"
            ),
        )
    else:
        encoded = tokenizer(text, return_tensors="pt")
    return torch.as_tensor(encoded["input_ids"], dtype=torch.long)  # host: prompts live on the CPU
