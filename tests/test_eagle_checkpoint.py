"""EAGLE-1's published checkpoint layout (`io.eagle_checkpoint`): a head saved and loaded gives the
same logits and the same drafts; a folder written by hand in the published key names (with an
embed_tokens.weight, float16, no fc.bias and "bias": false) loads and drafts exactly; a head for
another model is refused with a message naming the file, the key and what was expected;
model.safetensors is read when pytorch_model.bin is absent; a float16 target's head is float16 and
built on the meta device."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import random_prompt, tiny_model

from specnb.core.generation import autoregressive_generate, speculative_generate
from specnb.core.masks import causal_visible
from specnb.core.trees import Tree
from specnb.drafters.eagle import EagleDrafter, EagleHead
from specnb.io.eagle_checkpoint import PUBLISHED, load_checkpoint

TREE = Tree.sparse(12)


def random_head(target: torch.nn.Module, seed: int = 0, bias: bool = True) -> EagleHead:
    """A random head with every weight away from its initial value (biases, norms), so that a key
    left unread would show."""
    head = EagleHead.from_target(target, seed=seed, bias=bias).eval()
    with torch.no_grad():
        for p in head.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return head


@torch.no_grad()
def logits(head: EagleHead, target: torch.nn.Module) -> torch.Tensor:
    """Float [6, V]: the head's logits on fixed random features and tokens (rows causal)."""
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(1, 6, target.config.hidden_size, generator=g)
    tokens = torch.randint(0, target.config.vocab_size, (1, 6), generator=g)
    return head.project(head(feats, tokens, torch.arange(6)[None], causal_visible(6, 0)[None])[0])


def steps(target: torch.nn.Module, head: EagleHead, prompt: torch.Tensor) -> tuple[list[int], list[tuple]]:
    out = speculative_generate(target, EagleDrafter(target, head), prompt, TREE, 20, eos_token_id=())
    return out.tokens.tolist(), [(s.num_drafted, s.num_accepted, s.accepted_ranks) for s in out.steps]


@pytest.mark.parametrize("bias", [True, False])
def test_save_then_load_gives_the_same_head(tiny_target, tmp_path, bias):
    head = random_head(tiny_target, bias=bias)
    head.save(tmp_path / "h", "tiny")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["bias"] is bias and config["base_model_name_or_path"] == "tiny"
    assert config["hidden_size"] == tiny_target.config.hidden_size and config["torch_dtype"] == "float32"
    stored = torch.load(tmp_path / "h" / "pytorch_model.bin", weights_only=True)
    assert {k.split(".")[0] for k in stored} == {"fc", "layers"} and "layers.0.mlp.up_proj.weight" in stored
    assert not any("input_layernorm" in k for k in stored)  # EAGLE-1's layer 0 has no input norm
    loaded = EagleHead.load(tmp_path / "h", tiny_target)
    assert loaded.dtype == torch.float32 and not loaded.training and (loaded.fc.bias is not None) == bias
    for (name, a), (other, b) in zip(head.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert name == other and torch.equal(a, b), name
    assert torch.equal(logits(loaded, tiny_target), logits(head, tiny_target))
    prompt = random_prompt(3, 9)
    assert steps(tiny_target, loaded, prompt) == steps(tiny_target, head, prompt)


def test_a_folder_in_the_published_key_names_loads_and_drafts_exactly(tiny_target, tmp_path):
    """Written by hand as EAGLE publishes: `layers.0.*` keys, the target's embedding as
    embed_tokens.weight, float16 tensors, and a head without fc.bias ("bias": false)."""
    head = random_head(tiny_target, seed=1, bias=False)
    state = {
        ("layers.0." + k.removeprefix("layer.") if k.startswith("layer.") else k): v.half()
        for k, v in head.state_dict().items()
    }
    state["embed_tokens.weight"] = tiny_target.get_input_embeddings().weight.detach().half()
    assert "fc.bias" not in state and "layers.0.self_attn.q_proj.weight" in state
    folder = tmp_path / "published"
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    c = tiny_target.config
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": c.hidden_size,
                "intermediate_size": c.intermediate_size,
                "num_attention_heads": c.num_attention_heads,
                "num_key_value_heads": c.num_key_value_heads,
                "num_hidden_layers": 1,
                "rms_norm_eps": 1e-6,
                "vocab_size": c.vocab_size,
                "torch_dtype": "float16",
                "bias": False,
            }
        )
    )
    loaded = EagleHead.load(folder, tiny_target)
    assert loaded.fc.bias is None and loaded.dtype == torch.float32
    rounded = copy.deepcopy(head)  # the same head through float16, as the file holds it
    rounded.load_state_dict({k: v.half().float() for k, v in head.state_dict().items()})
    assert torch.equal(logits(loaded, tiny_target), logits(rounded, tiny_target))
    drafted = 0
    for length in (2, 9):
        prompt = random_prompt(length, length)
        ref = autoregressive_generate(tiny_target, prompt, 20, eos_token_id=())
        out = speculative_generate(tiny_target, EagleDrafter(tiny_target, loaded), prompt, TREE, 20, eos_token_id=())
        assert out.tokens.tolist() == ref.tokens.tolist()
        drafted += sum(s.num_drafted for s in out.steps)
    assert drafted > 0


def test_a_head_for_another_model_is_refused_with_what_was_expected(tiny_target, tmp_path):
    wide = tiny_model(0, hidden=64)  # another hidden size, the same vocabulary
    random_head(wide).save(tmp_path / "wide")
    with pytest.raises(ValueError, match=r"hidden_size 64, but the target's hidden size is 48") as e:
        EagleHead.load(tmp_path / "wide", tiny_target)
    assert str(tmp_path / "wide" / "config.json") in str(e.value)
    # without the config's sizes, the shapes refuse it, naming the file and the published key
    (tmp_path / "wide" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"fc\.weight has shape \[64, 128\], expected \[48, 96\]") as e:
        EagleHead.load(tmp_path / "wide", tiny_target)
    assert str(tmp_path / "wide" / "pytorch_model.bin") in str(e.value)


def test_missing_keys_a_bias_the_config_denies_and_other_layouts_are_refused(tiny_target, tmp_path):
    random_head(tiny_target).save(tmp_path / "h")
    weights = tmp_path / "h" / "pytorch_model.bin"
    state = torch.load(weights, weights_only=True)
    torch.save({k: v for k, v in state.items() if k != "layers.0.mlp.up_proj.weight"}, weights)
    with pytest.raises(ValueError, match=r"missing \['layers\.0\.mlp\.up_proj\.weight'\]"):
        EagleHead.load(tmp_path / "h", tiny_target)
    torch.save({k: v for k, v in state.items() if k != "fc.bias"}, weights)  # config: bias true
    with pytest.raises(ValueError, match=r"has no fc\.bias, but .*config\.json says bias true"):
        EagleHead.load(tmp_path / "h", tiny_target)
    torch.save({**state, "embed_tokens.weight": torch.zeros(7, 48)}, weights)
    with pytest.raises(ValueError, match=r"embed_tokens\.weight has shape \[7, 48\], expected \[61, 48\]"):
        EagleHead.load(tmp_path / "h", tiny_target)
    torch.save({**state, "midlayer.self_attn.q_proj.weight": torch.zeros(1), "d2t": torch.zeros(1)}, weights)
    with pytest.raises(ValueError, match="is not an EAGLE-1 head"):  # an EAGLE-3 head
        EagleHead.load(tmp_path / "h", tiny_target)


def test_safetensors_is_read_when_the_bin_is_absent(tiny_target, tmp_path):
    from safetensors.torch import save_file

    head = random_head(tiny_target, seed=2)
    head.save(tmp_path / "h")
    bin_file, st_file = tmp_path / "h" / "pytorch_model.bin", tmp_path / "h" / "model.safetensors"
    state = torch.load(bin_file, weights_only=True)
    save_file({k: v + 1.0 for k, v in state.items()}, st_file)  # beside the .bin: the .bin wins, as in EAGLE
    assert load_checkpoint(tmp_path / "h").file == bin_file
    assert torch.equal(logits(EagleHead.load(tmp_path / "h", tiny_target), tiny_target), logits(head, tiny_target))
    save_file(state, st_file)
    bin_file.unlink()
    assert load_checkpoint(tmp_path / "h").file == st_file
    assert torch.equal(logits(EagleHead.load(tmp_path / "h", tiny_target), tiny_target), logits(head, tiny_target))
    st_file.unlink()
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin, model.safetensors"):
        EagleHead.load(tmp_path / "h", tiny_target)


def test_a_float16_targets_head_is_float16_and_built_on_the_meta_device(tiny_target, tmp_path, monkeypatch):
    """No float32 head is initialised first (a 7B head's layer would take 0.9 GB): every weight
    initialisation during the load runs on meta tensors; a head to train stays float32."""
    head = random_head(tiny_target)
    head.save(tmp_path / "h")
    half = copy.deepcopy(tiny_target).half()
    devices = []
    real = torch.nn.init.kaiming_uniform_

    def recording(tensor, *args, **kwargs):
        devices.append(tensor.device.type)
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.nn.init, "kaiming_uniform_", recording)
    loaded = EagleHead.load(tmp_path / "h", half)
    assert devices and set(devices) == {"meta"}
    assert {p.dtype for p in loaded.parameters()} == {torch.float16}
    assert all(not t.is_meta for t in [*loaded.parameters(), *loaded.buffers()])
    torch.testing.assert_close(logits(loaded, half), logits(head, tiny_target), atol=0.5, rtol=0.02)  # float16 rounding
    assert EagleHead.load(tmp_path / "h", half, torch.float32).dtype == torch.float32


def test_published_entries_match_their_base_models_where_committed():
    """Vicuna-7B's EAGLE head: the sizes of its config are its base model's (committed config)."""
    from specnb.io.model_configs import config_of, known_models

    assert set(PUBLISHED) == {"yuhuili/EAGLE-Vicuna-7B-v1.3", "yuhuili/EAGLE-llama2-chat-7B"}
    vicuna = PUBLISHED["yuhuili/EAGLE-Vicuna-7B-v1.3"]
    assert vicuna.base_model in known_models()
    base = config_of(vicuna.base_model)
    assert (
        vicuna.hidden_size,
        vicuna.intermediate_size,
        vicuna.num_attention_heads,
        vicuna.num_key_value_heads,
        vicuna.vocab_size,
    ) == (base.hidden_size, base.intermediate_size, base.num_attention_heads, base.num_key_value_heads, base.vocab_size)


def test_download_size_is_eagles_fc_layer_and_embedding():
    """EAGLE-Vicuna-7B-v1.3 by hand: fc 8192 x 4096 + 4096, attention 4 x 4096^2, MLP 3 x 4096 x 11008,
    the post-attention norm 4096 (0.236 B: EAGLE's "0.24B"), and the embedding 32000 x 4096, in float32."""
    from specnb.notebook.estimate import published_download

    row = published_download("yuhuili/EAGLE-Vicuna-7B-v1.3")
    layer = 8192 * 4096 + 4096 + 4 * 4096**2 + 3 * 4096 * 11008 + 4096
    assert layer == 235_937_792
    assert (row.what, row.dtype, row.parameters, row.bytes) == (
        "EAGLE head",
        "float32",
        layer + 32000 * 4096,
        4 * (layer + 32000 * 4096),
    )
