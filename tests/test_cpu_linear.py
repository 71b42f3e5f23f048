"""The oneDNN linear path (`kernels.cpu_linear`): the same model within float32 tolerance, greedy outputs
equal to the stock path's, the option named in load_model / load_pair, left alone where it does
not apply. Speed is measured by benchmarks/cpu_verify.py, not here."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import random_prompt, tiny_model

from specnb import Tree, autoregressive_generate, speculative_generate
from specnb.core.drafting import ModelDrafter
from specnb.io.models import ModelPair, describe_model, load_model, load_pair, prompt_ids
from specnb.kernels.cpu_linear import LINEAR_PATHS, PackedLinear, linear_path, pack_linears

# the tolerance this path is held to: oneDNN sums in another order than MKL, so each output
# differs by float32 rounding; across a whole model relative to the largest logit
TOLERANCE = 1e-5

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def packed_copy(model: torch.nn.Module) -> torch.nn.Module:
    out = copy.deepcopy(model)
    pack_linears(out, "onednn")
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: biases on q, k, v
def test_logits_within_tolerance_and_every_linear_packed(arch):
    stock = tiny_model(3, arch=arch, scale=30.0, layers=3)
    packed = packed_copy(stock)
    linears = sum(type(m) is torch.nn.Linear for m in stock.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == linears > 0
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())
    assert linear_path(stock) == "stock" and linear_path(packed) == "onednn"
    for rows in (1, 2, 7, 16, 40):  # one decode, small trees, more rows than the pack's batch
        ids = random_prompt(rows, length=rows)
        with torch.inference_mode():
            a, b = stock(ids).logits, packed(ids).logits
        assert a.shape == b.shape
        assert ((a - b).abs().max() / a.abs().max()).item() < TOLERANCE


def test_the_packed_weight_is_the_dense_one_and_biases_are_kept():
    stock = tiny_model(4, arch="qwen2")
    packed = packed_copy(stock)
    for (name, a), b in zip(
        ((n, m) for n, m in stock.named_modules() if type(m) is torch.nn.Linear),
        (m for m in packed.modules() if isinstance(m, PackedLinear)),
    ):
        assert torch.equal(a.weight, b.weight), name  # to_dense of the prepacked weight: exact
        assert (a.bias is None) == (b.bias is None)
        if a.bias is not None:
            assert torch.equal(a.bias, b.bias)
    x = torch.randn(2, 3, 48)
    layer = packed.model.layers[0].self_attn.q_proj
    reference = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert ((layer(x) - reference).abs().max() / reference.abs().max()).item() < TOLERANCE


@pytest.mark.parametrize("tree", ["chain:4", "sparse:16", "kary2:8"])
def test_greedy_speculative_output_equals_the_stock_target_greedy_output(tree):
    target, draft = tiny_model(0, scale=30.0), tiny_model(1, scale=30.0, layers=1)
    p_target, p_draft = packed_copy(target), packed_copy(draft)
    shape, budget = tree.split(":")
    for seed in range(3):
        ids = random_prompt(seed)
        stock_out = autoregressive_generate(target, ids, max_new_tokens=40).tokens.tolist()
        assert autoregressive_generate(p_target, ids, max_new_tokens=40).tokens.tolist() == stock_out
        spec = speculative_generate(
            p_target, ModelDrafter(p_draft), ids, tree=Tree.preset(shape, int(budget)), max_new_tokens=40
        )
        assert spec.tokens.tolist() == stock_out


def test_a_tied_lm_head_is_not_held_twice():
    """A tied LM head's weight is the token embedding's: packing it would keep a packed copy beside
    the dense weight the embedding reads (0.93 GB more for Qwen2.5-Coder-1.5B). It stays dense and
    shared, so the packed model holds no more bytes than the stock one; the outputs stay equal."""
    stock = tiny_model(5, scale=30.0)
    stock.config.tie_word_embeddings = True
    stock.lm_head.weight = stock.model.embed_tokens.weight
    packed = packed_copy(stock)

    assert type(packed.lm_head) is torch.nn.Linear and packed.lm_head.weight is packed.model.embed_tokens.weight
    assert (
        sum(isinstance(m, PackedLinear) for m in packed.modules())
        == sum(type(m) is torch.nn.Linear for m in stock.modules()) - 1
    )
    dense = sum(p.numel() * 4 for p in stock.parameters())  # parameters() counts the tied weight once
    packed_bytes = sum(
        m.packed_weight.to_dense().numel() * 4 for m in packed.modules() if isinstance(m, PackedLinear)
    ) + sum(p.numel() * 4 for p in packed.parameters())
    assert packed_bytes == dense, "every weight held once"
    ids = random_prompt(3, length=9)
    with torch.inference_mode():
        a, b = stock(ids).logits, packed(ids).logits
    assert ((a - b).abs().max() / a.abs().max()).item() < TOLERANCE


def test_left_alone_where_it_does_not_apply():
    half = tiny_model(5).to(torch.bfloat16)
    assert pack_linears(half, "onednn") == 0 and linear_path(half) == "stock"
    model = tiny_model(5)
    assert pack_linears(model, "stock") == 0 and linear_path(model) == "stock"
    with pytest.raises(ValueError, match="unknown cpu_linear 'mkl'.*stock"):
        pack_linears(model, "mkl")
    with pytest.raises(ValueError, match="unknown cpu_linear"):
        load_model("no/such-model-anywhere", cpu_linear="fast")  # refused before any lookup or load
    assert LINEAR_PATHS == ("stock", "onednn")


def test_load_model_and_pairs_take_the_option(smollm2):
    stock, tokenizer = smollm2
    packed, _ = load_model("smollm2-135m", cpu_linear="onednn")
    assert "oneDNN prepacked: 210 Linear" in describe_model(packed)  # 30 layers x 7; the tied LM head stays dense
    assert type(packed.lm_head) is torch.nn.Linear and packed.lm_head.weight is packed.model.embed_tokens.weight
    assert "oneDNN" not in describe_model(stock)
    ids = prompt_ids(tokenizer, "Write a haiku about the sea.")
    with torch.inference_mode():
        a, b = stock(ids).logits, packed(ids).logits
    assert ((a - b).abs().max() / a.abs().max()).item() < TOLERANCE
    assert (
        autoregressive_generate(packed, ids, max_new_tokens=24).tokens.tolist()
        == autoregressive_generate(stock, ids, max_new_tokens=24).tokens.tolist()
    )
    target, draft, _ = load_pair("smollm2-135m", "smollm2-135m", draft_layers=24, cpu_linear="onednn")
    assert linear_path(target) == linear_path(draft) == "onednn"
    assert ModelPair("smollm2-135m", "smollm2-135m", cpu_linear="onednn").cpu_linear == "onednn"


def test_packing_leaves_no_view_of_the_loaded_weights(tmp_path):
    """transformers loads weights as views of the memory-mapped file: after packing, no parameter or
    buffer may still view the storage it was loaded in (one view keeps the whole file mapped and
    every page the packing read resident: RSS 12.6 GB against 6.6 GB for Qwen2.5-Coder-1.5B)."""
    from transformers import AutoModelForCausalLM

    tiny_model(6, arch="qwen2").save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    held = [t.detach() for t in list(loaded.parameters()) + list(loaded.buffers())]  # alive: no address reused
    before = {t.untyped_storage().data_ptr() for t in held}
    pack_linears(loaded, "onednn")
    left = [t for t in list(loaded.parameters()) + list(loaded.buffers()) if t.layout == torch.strided]
    assert left and not {t.untyped_storage().data_ptr() for t in left} & before
