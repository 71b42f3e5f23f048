"""Tree-masked verification equals running each root-to-node path as a plain sequence."""

import pytest
import torch
from conftest import random_prompt, tiny_model
from test_trees import random_tree
from transformers import DynamicCache

from specnb import Tree
from specnb.core.cache import GrowingLayer, layer_states, new_cache, restore_layers
from specnb.core.masks import model_mask, prefix_tree_mask, rooted_ancestor_mask, use_attention
from specnb.core.verification import commit, prefill, verify
from specnb.kernels.gqa_sdpa import register
from specnb.training.grouped_attention import GROUPED_ATTENTION, grouped_attention

GQA_SDPA = register()  # a CPU model's attention (`io.models.load_model`)
ATOL = 1e-4  # fp32; path logits come from different matmul shapes, so not bit-identical

TREES = {
    "chain": Tree.chain(5),
    "kary": Tree.kary(2, 9),
    "wide": Tree.wide(4),
    "sparse": Tree.sparse(10),
    "random": random_tree(7, 11),
}


def plain_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits[0].float()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", GQA_SDPA, "eager"])
@pytest.mark.parametrize("name", list(TREES))
def test_tree_logits_equal_each_path(arch, attn, name):
    tree = TREES[name]
    model = tiny_model(3, arch=arch, attn=attn)
    prompt = random_prompt(5, length=9)
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(3, 61, (tree.num_nodes,), generator=g)

    cache = new_cache(model)
    prefill(model, cache, prompt[:, :-1])
    logits = verify(model, cache, int(prompt[0, -1]), tree, tokens)  # [N+1, V]

    reference = plain_logits(model, prompt)[-1]
    torch.testing.assert_close(logits[0], reference, atol=ATOL, rtol=0)
    for i in range(tree.num_nodes):
        path = torch.tensor([tokens[j] for j in tree.node_path(i)])[None]
        reference = plain_logits(model, torch.cat([prompt, path], dim=1))[-1]
        torch.testing.assert_close(logits[i + 1], reference, atol=ATOL, rtol=0)


def test_boolean_mask_on_eager_would_be_wrong():
    """The pitfall `model_mask` exists for: eager adds a bool mask to the scores."""
    model = tiny_model(3, attn="eager")
    tree = Tree.wide(3)
    prompt = random_prompt(5)
    tokens = torch.tensor([10, 11, 12])
    bool_mask = prefix_tree_mask(rooted_ancestor_mask(tree.ancestor_mask()), prompt.shape[1] - 1)
    ids = torch.cat([prompt[:, -1:], tokens[None]], 1)
    positions = prompt.shape[1] - 1 + torch.tensor([[0, 1, 1, 1]])

    def run(mask):
        cache = new_cache(model)
        prefill(model, cache, prompt[:, :-1])
        with torch.inference_mode():
            return model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache).logits[0]

    good = run(model_mask(bool_mask, model, model.dtype))
    bad = run(bool_mask)
    reference = plain_logits(model, torch.cat([prompt, tokens[:1, None]], 1))[-1]
    torch.testing.assert_close(good[1], reference, atol=ATOL, rtol=0)
    assert (bad[1] - reference).abs().max() > 1e-2


def test_grouped_attention_equals_sdpa_with_repeated_keys():
    """Several queries per row under a dense mask, 3 query heads per key head: the same as sdpa on
    keys repeated per query head, and keys past the mask's length never read (NaN there is harmless)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((2, 6, 4, 8), (2, 2, 9, 8), (2, 2, 9, 8)))
    mask = torch.rand(2, 1, 4, 7, generator=g) > 0.4
    mask[..., 0] = True  # every query sees something
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k[:, :, :7].repeat_interleave(3, 1), v[:, :, :7].repeat_interleave(3, 1), attn_mask=mask, scale=0.3
    )
    k[:, :, 7:], v[:, :, 7:] = float("nan"), float("nan")  # the unwritten tail of a static cache
    got, _ = grouped_attention(torch.nn.Module(), q, k, v, mask, scaling=0.3)
    torch.testing.assert_close(got, want.transpose(1, 2), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="boolean 4D mask"):
        grouped_attention(torch.nn.Module(), q, k, v, mask.float())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("name", ["kary", "sparse"])
def test_grouped_heads_read_in_place_give_sdpas_logits_to_the_bit(arch, name):
    """`kernels.gqa_sdpa` (a CPU model's attention, `io.models.load_model`) is transformers' sdpa
    without copying the 2 key/value heads for the 4 query heads: a prefill and a tree's verify give
    the same logits, bit for bit."""
    tree, prompt = TREES[name], random_prompt(5, length=9)
    tokens = torch.randint(3, 60, (tree.num_nodes,), generator=torch.Generator().manual_seed(2))
    out = {}
    for attn in ("sdpa", GQA_SDPA):
        model = tiny_model(3, arch=arch, attn=attn)
        assert model.config.num_key_value_heads < model.config.num_attention_heads
        cache = new_cache(model)
        prefill(model, cache, prompt[:, :-1])
        out[attn] = (plain_logits(model, prompt), verify(model, cache, int(prompt[0, -1]), tree, tokens))
    assert all(torch.equal(a, b) for a, b in zip(out["sdpa"], out[GQA_SDPA]))


@pytest.mark.parametrize("attn", ["sdpa", GQA_SDPA, "eager"])
def test_a_growing_cache_gives_a_dynamic_caches_logits_to_the_bit(attn, monkeypatch):
    """`GrowingLayer` (new_cache's layers: appends in place into spare columns) against transformers'
    own DynamicCache, step after step of verify and commit (trees whose accepted branch is gathered,
    chains that are cropped), past the spare columns several times (SPARE set to 5): the same logits
    and the same committed keys and values, bit for bit; and a layer's held columns are never written
    by a later update (`layer_states` stays valid)."""
    monkeypatch.setattr(GrowingLayer, "SPARE", 5)
    model = tiny_model(3, attn=attn)
    prompt = random_prompt(5, length=9)
    growing, stock = new_cache(model), DynamicCache(config=model.config)
    assert all(type(layer) is GrowingLayer for layer in growing.layers)
    for cache in (growing, stock):
        prefill(model, cache, prompt[:, :-1])
    root, g = int(prompt[0, -1]), torch.Generator().manual_seed(5)
    for step in range(8):
        tree = (TREES["sparse"], TREES["chain"])[step % 2]
        tokens = torch.randint(3, 60, (tree.num_nodes,), generator=g)
        held = growing.get_seq_length()
        saved = layer_states(growing, len(growing.layers))
        before = [(layer.keys.clone(), layer.values.clone()) for layer in growing.layers]
        logits = [verify(model, cache, root, tree, tokens) for cache in (growing, stock)]
        assert torch.equal(*logits)
        restore_layers(growing, saved)  # what a self-draft does: the held columns are as they were
        assert growing.get_seq_length() == held
        assert all(
            torch.equal(layer.keys, k) and torch.equal(layer.values, v) for layer, (k, v) in zip(growing.layers, before)
        )
        assert torch.equal(verify(model, growing, root, tree, tokens), logits[1])  # and verify again
        path = tree.node_path(tree.num_nodes - 1 - step % 3)
        for cache in (growing, stock):
            commit(cache, held, path)
        assert all(
            torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
            for a, b in zip(growing.layers, stock.layers)
        )
        root = int(torch.randint(3, 60, (1,), generator=g))


def test_use_attention_switches_and_restores():
    model = tiny_model(3)
    before = model.config._attn_implementation
    with use_attention(model, GROUPED_ATTENTION):
        assert model.config._attn_implementation == GROUPED_ATTENTION
    assert model.config._attn_implementation == before
    with pytest.raises(RuntimeError), use_attention(model, GROUPED_ATTENTION):
        raise RuntimeError("inside")
    assert model.config._attn_implementation == before


def test_unsupported_attention_is_refused():
    model = tiny_model(3)
    model.config._attn_implementation = "flash_attention_2"
    cache = DynamicCache(config=model.config)
    with pytest.raises(ValueError, match="cannot take a tree mask.*sdpa"):
        verify(model, cache, 5, Tree.chain(2), torch.tensor([6, 7]))


@pytest.mark.parametrize("attn", ["sdpa", GQA_SDPA, "eager"])
@pytest.mark.parametrize("path_leaf", [None, 0, 3, 5])
def test_commit_equals_plain_prefill_of_accepted_sequence(attn, path_leaf):
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 1, 0)])
    path = () if path_leaf is None else tree.node_path(path_leaf)
    model = tiny_model(4, attn=attn)
    prompt = random_prompt(6, length=8)
    tokens = torch.tensor([20, 21, 22, 23, 24, 25])

    cache = new_cache(model)
    prefill(model, cache, prompt[:, :-1])
    prefix_len = prompt.shape[1] - 1
    verify(model, cache, int(prompt[0, -1]), tree, tokens)
    commit(cache, prefix_len, path)

    accepted = torch.cat([prompt, tokens[list(path)][None]], dim=1)
    plain = new_cache(model)
    prefill(model, plain, accepted)
    assert cache.get_seq_length() == plain.get_seq_length() == accepted.shape[1]
    for ours, theirs in zip(cache.layers, plain.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.values, theirs.values, atol=ATOL, rtol=0)

    # and the next step continues from it: logits of one more token match a plain run
    nxt = torch.tensor([[30]])
    with torch.inference_mode():
        ours = model(input_ids=nxt, cache=cache).logits[0, -1]
    reference = plain_logits(model, torch.cat([accepted, nxt], 1))[-1]
    torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_pending_prompt_folded_into_verify_equals_prefill_then_verify(attn):
    """The first step's verify may carry the prompt: logits and the committed cache equal a prefill
    followed by a verify, and a plain prefill of the accepted sequence."""
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 1, 0)])
    model = tiny_model(4, attn=attn)
    prompt = random_prompt(6, length=8)
    tokens = torch.tensor([20, 21, 22, 23, 24, 25])
    root, before = int(prompt[0, -1]), prompt[0, :-1]

    folded = new_cache(model)
    logits = verify(model, folded, root, tree, tokens, pending=before)
    separate = new_cache(model)
    prefill(model, separate, before[None])
    reference = verify(model, separate, root, tree, tokens)
    torch.testing.assert_close(logits, reference, atol=ATOL, rtol=0)

    path = tree.node_path(5)
    commit(folded, len(before), path)
    plain = new_cache(model)
    prefill(model, plain, torch.cat([prompt, tokens[list(path)][None]], dim=1))
    for ours, theirs in zip(folded.layers, plain.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, atol=ATOL, rtol=0)
