"""The real configurations of hub models specnb plans for, committed as package data (no hub needed).

What it holds:
    TokenizerFacts   what a model's tokenizer is: its family (one vocabulary shared by every member),
                     class, special tokens, whether it adds BOS, its chat template
    HubModel         one model: config.json values, generation_config.json values (None where not
                     recorded: transformers then derives one from config.json), tokenizer facts, and
                     where the values came from (`source`)
    hub_model        the HubModel of a hub id; KeyError lists the known ones
    known_models     every hub id with a committed file
    config_of        a transformers config of the real model (nothing downloaded)

The files are `specnb/io/configs/<org>--<name>.json` (the hub cache's spelling of a repository),
each `{"hub_id", "source", "weights_dtype", "gated", "config", "generation_config", "tokenizer"}`
(`weights_dtype`: the dtype of the weight files the hub serves; `analysis.memory`'s download
estimate is parameters x its bytes). They describe the models the `t4` profile names (Llama-2-7B
and its 160M drafts, Llama-3.2-1B and -3B) and Vicuna-7B v1.3; `analysis.memory` sizes them and
`notebook.dryrun` builds tiny stand-ins with their vocabularies.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from transformers import AutoConfig, PretrainedConfig

FOLDER = "configs"  # inside this package (specnb/io/configs), shipped as package data (pyproject.toml)
FAMILIES = ("llama2", "llama3")  # llama2: SentencePiece BPE, 32000 pieces; llama3: byte-level BPE, 128256 tokens


@dataclass(frozen=True)
class TokenizerFacts:
    family: str  # one of FAMILIES: models of one family share one vocabulary
    tokenizer_class: str  # as tokenizer_config.json names it, e.g. "LlamaTokenizer"
    bos_token: str
    eos_token: str
    unk_token: str | None
    pad_token: str | None  # None: the real tokenizer has no pad token
    add_bos_token: bool  # BOS is prepended when encoding
    chat_template: str | None  # None: a base model without one (prompts are encoded as plain text)
    # the conversation format the model was trained in where its tokenizer carries no chat template
    # (a Jinja chat template; Vicuna's from FastChat): `io.models.load_tokenizer` sets it
    conversation: str | None = None


@dataclass(frozen=True)
class HubModel:
    hub_id: str  # "org/name"
    source: str  # where the values came from
    config: dict[str, Any]  # config.json as the hub serves it (read-only by convention; config_of copies)
    generation_config: dict[str, Any] | None  # generation_config.json, None where not recorded
    tokenizer: TokenizerFacts
    weights_dtype: str  # dtype of the weight files the hub serves: a download's bytes per parameter
    gated: bool  # the hub asks for a licence and a token (Llama-2, Llama-3.2)

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])


def file_name(hub_id: str) -> str:
    """ "org/name" -> "org--name.json" (the hub cache's `models--org--name` spelling)."""
    return hub_id.replace("/", "--") + ".json"


def known_models() -> list[str]:
    """Every hub id with a committed file, sorted."""
    folder = resources.files(__package__).joinpath(FOLDER)
    return sorted(json.loads(f.read_text())["hub_id"] for f in folder.iterdir() if f.name.endswith(".json"))


def hub_model(hub_id: str) -> HubModel:
    """The committed facts of `hub_id`; KeyError names the known models."""
    path = resources.files(__package__).joinpath(FOLDER, file_name(hub_id))
    if not path.is_file():
        raise KeyError(f"no committed config for {hub_id!r}; known: {', '.join(known_models())}")
    record = json.loads(path.read_text())
    if record["hub_id"] != hub_id:
        raise ValueError(f"{path.name} describes {record['hub_id']!r}, not {hub_id!r}")
    facts = TokenizerFacts(**record["tokenizer"])
    if facts.family not in FAMILIES:
        raise ValueError(f"{path.name}: tokenizer family {facts.family!r} is not one of {FAMILIES}")
    return HubModel(
        hub_id,
        record["source"],
        record["config"],
        record["generation_config"],
        facts,
        record["weights_dtype"],
        record["gated"],
    )


def config_of(hub_id: str) -> PretrainedConfig:
    """The real model's transformers config (its class from `model_type`), built from the committed
    values; a fresh object each call, safe to change."""
    values = copy.deepcopy(hub_model(hub_id).config)
    return AutoConfig.for_model(values.pop("model_type"), **values)
