"""The committed configs of hub models: the values the plans rest on, a source for each file, and
the files shipped as package data."""

import tomllib
from pathlib import Path

import pytest
from transformers import LlamaConfig

from specnb.io.model_configs import config_of, file_name, hub_model, known_models

ROOT = Path(__file__).resolve().parents[1]

# hub id: (hidden, intermediate, layers, heads, kv heads, head size, vocab, max positions, tied, bos, eos)
EXPECTED = {
    "meta-llama/Llama-2-7b-hf": (4096, 11008, 32, 32, 32, 128, 32000, 4096, False, 1, 2),
    "JackFram/llama-160m": (768, 3072, 12, 12, 12, 64, 32000, 2048, False, 1, 2),
    "Felladrin/Llama-160M-Chat-v1": (768, 3072, 12, 12, 12, 64, 32000, 2048, False, 1, 2),
    "meta-llama/Llama-3.2-1B": (2048, 8192, 16, 32, 8, 64, 128256, 131072, True, 128000, 128001),
    "meta-llama/Llama-3.2-3B": (3072, 8192, 28, 24, 8, 128, 128256, 131072, True, 128000, 128001),
    "lmsys/vicuna-7b-v1.3": (4096, 11008, 32, 32, 32, 128, 32000, 2048, False, 1, 2),
}


def test_every_expected_model_is_committed():
    assert set(known_models()) == set(EXPECTED)


@pytest.mark.parametrize("hub_id", sorted(EXPECTED))
def test_config_values(hub_id):
    c = config_of(hub_id)
    assert isinstance(c, LlamaConfig)
    got = (
        c.hidden_size,
        c.intermediate_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.vocab_size,
        c.max_position_embeddings,
        c.tie_word_embeddings,
        c.bos_token_id,
        c.eos_token_id,
    )
    assert got == EXPECTED[hub_id]
    model = hub_model(hub_id)
    assert len(model.source) > 80, "say where the values came from"
    llama3 = model.vocab_size == 128256
    assert model.tokenizer.family == ("llama3" if llama3 else "llama2")
    rope = c.rope_parameters
    if llama3:
        assert rope["rope_theta"] == 500000.0 and rope["rope_type"] == "llama3"
        assert (
            rope["factor"],
            rope["high_freq_factor"],
            rope["low_freq_factor"],
            rope["original_max_position_embeddings"],
        ) == (32.0, 4.0, 1.0, 8192)
    else:
        assert rope["rope_theta"] == 10000.0 and rope["rope_type"] == "default"


def test_config_of_is_a_fresh_copy():
    a = config_of("meta-llama/Llama-3.2-1B")
    a.rope_parameters["factor"] = 1.0
    assert config_of("meta-llama/Llama-3.2-1B").rope_parameters["factor"] == 32.0


def test_unknown_model_names_the_known_ones():
    with pytest.raises(KeyError, match="meta-llama/Llama-2-7b-hf"):
        hub_model("org/nothing")
    assert file_name("meta-llama/Llama-3.2-1B") == "meta-llama--Llama-3.2-1B.json"


def test_configs_ship_as_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for pattern in data["specnb.io"] for p in (ROOT / "specnb" / "io").glob(pattern)}
    assert {ROOT / "specnb" / "io" / "configs" / file_name(h) for h in EXPECTED} <= shipped
