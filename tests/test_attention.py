"""Tree attention: every implementation equals the eager reference, ragged batches keep their
sequences apart, and the masked SDPA call computes what a stock transformers attention layer
computes for `masks.prefix_tree_mask`.

Tolerance: float32, max abs error <= attention.TOLERANCE[float32] = 1e-5 on standard-normal
inputs (outputs are O(1); the implementations differ only in summation order)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import eager_attention_forward

from specnb import Tree
from specnb.bench.attention import (
    CAUSAL,
    IMPLEMENTATIONS,
    REFERENCE,
    TOLERANCE,
    AttentionInputs,
    TreeBatch,
    Unsupported,
    check_against_reference,
    flex_unsupported,
    max_abs_error,
    random_inputs,
    tree_attention,
)
from specnb.core.masks import prefix_tree_mask

ATOL = TOLERANCE[torch.float32]
FAST = [i for i in IMPLEMENTATIONS if i not in ("flex", REFERENCE)]


def random_tree(seed: int, n: int) -> Tree:
    rng = random.Random(seed)
    return Tree.from_parents([rng.randint(-1, i - 1) for i in range(n)])


# prefix lengths that are multiples of no block size (FlexAttention's 128, SDPA CPU's 32/64/...)
RAGGED = TreeBatch((37, 129, 5), (random_tree(1, 11), random_tree(2, 7), Tree.chain(3)))


def run(x: AttentionInputs, impl: str) -> torch.Tensor:
    try:
        return tree_attention(x, impl)
    except Unsupported as e:
        pytest.skip(f"{impl}: {e}")


def skip_flex_where_unsupported(impl: str) -> None:
    reason = flex_unsupported("cpu", torch.float32) if impl == "flex" else None
    if reason:
        pytest.skip(reason)


# ---- the mask --------------------------------------------------------------------------------


def test_mask_hand_checked():
    """Prefix 2, tree: nodes 0 and 1 children of the root, node 2 child of node 0; second sequence
    prefix 1 with a one-node tree (padded to P = 2, M = 3)."""
    batch = TreeBatch((2, 1), (Tree.from_parents([-1, -1, 0]), Tree.chain(1)))
    #            prefix  tree slots
    expected = torch.tensor(
        [
            [[1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 1, 0, 1]],
            [
                [1, 0, 1, 0, 0],
                [0, 0, 0, 1, 0],  # padding row: its own slot only
                [0, 0, 0, 0, 1],
            ],
        ],
        dtype=torch.bool,
    )[:, None]
    assert torch.equal(batch.allowed(), expected)
    assert torch.equal(batch.query_valid(), torch.tensor([[True, True, True], [True, False, False]]))
    additive = batch.additive(torch.float32)
    assert torch.equal(additive == 0, expected) and (additive[~expected] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize("seed", range(6))
def test_each_sequence_mask_is_prefix_tree_mask(seed):
    """Unpadded, sequence b's rows are exactly what verification hands a stock model."""
    rng = random.Random(seed)
    trees = tuple(random_tree(seed * 10 + b, rng.randint(1, 12)) for b in range(3))
    batch = TreeBatch(tuple(rng.randint(1, 40) for _ in trees), trees)
    allowed = batch.allowed()
    P = batch.prefix_capacity
    for b, (p, tree) in enumerate(zip(batch.prefix_lens, trees)):
        n = tree.num_nodes
        rows = allowed[b, 0, :n]
        unpadded = torch.cat([rows[:, :p], rows[:, P : P + n]], dim=1)
        assert torch.equal(unpadded, prefix_tree_mask(tree.ancestor_mask(), p)[0, 0])
        assert not rows[:, p:P].any() and not rows[:, P + n :].any(), "padding is never attended"


def test_batch_and_inputs_are_checked():
    with pytest.raises(ValueError, match="one prefix length per tree"):
        TreeBatch((3, 4), (Tree.chain(2),))
    with pytest.raises(ValueError, match="at least the root"):
        TreeBatch((0,), (Tree.chain(2),))
    batch = TreeBatch.uniform(5, Tree.chain(3), 2)
    x = random_inputs(batch, 4, 8)
    with pytest.raises(ValueError, match="k and v"):
        AttentionInputs(x.q, x.k[:, :, :-1], x.v, batch)
    with pytest.raises(ValueError, match="multiple"):
        AttentionInputs(x.q, x.k[:, :3], x.v[:, :3], batch)
    with pytest.raises(ValueError, match="unknown tree attention"):
        tree_attention(x, "magic")


def test_spread_batch_is_ragged():
    batch = TreeBatch.spread(1024, Tree.sparse(8), 4)
    assert batch.prefix_lens[0] == 1024 and batch.prefix_lens[-1] == 512 and len(set(batch.prefix_lens)) == 4
    assert TreeBatch.spread(100, Tree.chain(2), 1).prefix_lens == (100,)


# ---- every implementation equals the reference ----------------------------------------------


@pytest.mark.parametrize("impl", FAST)
@pytest.mark.parametrize("seed", range(8))
def test_random_trees_equal_reference(impl, seed):
    rng = random.Random(100 + seed)
    batch_size = 1 + seed % 3
    trees = tuple(random_tree(rng.randint(0, 10**6), rng.randint(1, 20)) for _ in range(batch_size))
    prefixes = tuple(rng.choice([1, 5, 37, 64, 129]) for _ in trees)
    heads, kv_heads = rng.choice([(4, 4), (4, 2), (6, 3)])
    x = random_inputs(TreeBatch(prefixes, trees), heads, rng.choice([8, 16, 24]), kv_heads, seed=seed)
    out, ref = run(x, impl), run(x, REFERENCE)
    assert out.shape == x.q.shape
    # padding rows too: every implementation gives them their own slot's value
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_ragged_batch_equals_reference(impl):
    skip_flex_where_unsupported(impl)
    x = random_inputs(RAGGED, heads=4, head_dim=16, kv_heads=2, seed=3)
    torch.testing.assert_close(run(x, impl), run(x, REFERENCE), atol=ATOL, rtol=0)


def test_check_against_reference_rows():
    x = random_inputs(TreeBatch.uniform(37, Tree.sparse(10), 2), 4, 8)
    rows = check_against_reference(x, FAST)
    assert [r["impl"] for r in rows] == FAST
    assert all(r["ok"] and r["max_abs_error"] <= r["tolerance"] == ATOL for r in rows)


@pytest.mark.parametrize("prefixes", [(37,), (129, 37)])
def test_causal_is_chain_attention(prefixes):
    """CAUSAL = the same queries as a chain; its uniform form (torch's lower-right causal bias) and
    its ragged form both equal the tree implementation given chains."""
    chains = tuple(Tree.chain(9) for _ in prefixes)
    x = random_inputs(TreeBatch(prefixes, tuple(Tree.sparse(9) for _ in prefixes)), 4, 8)
    as_chain = AttentionInputs(x.q, x.k, x.v, TreeBatch(prefixes, chains))
    torch.testing.assert_close(run(x, CAUSAL), run(as_chain, REFERENCE), atol=ATOL, rtol=0)


def test_each_path_as_a_plain_sequence():
    """The tree call's row for node i equals causal attention over prefix + the path to i, run as a
    sequence on its own (no tree, no padding)."""
    tree = random_tree(7, 12)
    x = random_inputs(TreeBatch.uniform(29, tree), 4, 8)
    out = run(x, "sdpa")
    for i in range(tree.num_nodes):
        path = torch.tensor(tree.node_path(i))
        k = torch.cat([x.k[:, :, :29], x.k[:, :, 29 + path]], dim=2)
        v = torch.cat([x.v[:, :, :29], x.v[:, :, 29 + path]], dim=2)
        alone = torch.nn.functional.scaled_dot_product_attention(x.q[:, :, i : i + 1], k, v)  # last query sees all
        torch.testing.assert_close(out[:, :, i : i + 1], alone, atol=ATOL, rtol=0)


# ---- sequences never see each other ----------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_sequences_never_see_each_other(impl):
    """Overwrite sequence 1's keys and values (prefix and tree) and every padding slot with large
    values: the real rows of sequences 0 and 2 do not change. Overwriting a node's key does change
    its descendants (the test can fail)."""
    skip_flex_where_unsupported(impl)
    x = random_inputs(RAGGED, heads=4, head_dim=16, kv_heads=2, seed=5)
    before = run(x, impl)
    k, v = x.k.clone(), x.v.clone()
    P = RAGGED.prefix_capacity
    k[1], v[1] = 50.0, -50.0
    for b, (p, tree) in enumerate(zip(RAGGED.prefix_lens, RAGGED.trees)):
        k[b, :, p:P], v[b, :, p:P] = 50.0, 50.0
        k[b, :, P + tree.num_nodes :], v[b, :, P + tree.num_nodes :] = 50.0, 50.0
    after = run(AttentionInputs(x.q, k, v, RAGGED), impl)
    valid = RAGGED.query_valid()
    for b in (0, 2):
        torch.testing.assert_close(after[b][:, valid[b]], before[b][:, valid[b]], atol=ATOL, rtol=0)
    assert (after[1][:, valid[1]] - before[1][:, valid[1]]).abs().max() > 1.0

    k2 = x.k.clone()
    k2[0, :, P + 0] = 50.0  # node 0 of sequence 0: seen by itself and its descendants only
    moved = (run(AttentionInputs(x.q, k2, x.v, RAGGED), impl)[0] - before[0]).abs().amax(dim=(0, 2)) > 1e-3
    tree = RAGGED.trees[0]
    sees = [0 in tree.node_path(i) for i in range(tree.num_nodes)]
    assert moved[: tree.num_nodes].tolist() == sees


# ---- what a stock model computes -------------------------------------------------------------


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2)])
def test_sdpa_equals_stock_attention_with_prefix_tree_mask(heads, kv_heads):
    """Per sequence, the padded batched call equals transformers' own sdpa (bool mask) and eager
    (additive mask) attention given `prefix_tree_mask` on the unpadded keys, as in verification."""
    x = random_inputs(RAGGED, heads=heads, head_dim=16, kv_heads=kv_heads, seed=9)
    out = run(x, "sdpa")
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    P = RAGGED.prefix_capacity
    for b, (p, tree) in enumerate(zip(RAGGED.prefix_lens, RAGGED.trees)):
        n = tree.num_nodes
        keep = torch.cat([torch.arange(p), P + torch.arange(n)])
        q, k, v = x.q[b : b + 1, :, :n], x.k[b : b + 1, :, keep], x.v[b : b + 1, :, keep]
        mask = prefix_tree_mask(tree.ancestor_mask(), p)
        stock, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=16**-0.5)  # [1, n, H, D]
        torch.testing.assert_close(out[b : b + 1, :, :n], stock.transpose(1, 2), atol=ATOL, rtol=0)
        additive = torch.zeros(mask.shape).masked_fill_(~mask, torch.finfo(torch.float32).min)
        eager, _ = eager_attention_forward(module, q, k, v, additive, scaling=16**-0.5)
        torch.testing.assert_close(out[b : b + 1, :, :n], eager.transpose(1, 2), atol=ATOL, rtol=0)


def test_reduced_precision_within_its_tolerance():
    x32 = random_inputs(TreeBatch.uniform(37, Tree.sparse(12), 2), 4, 16)
    x = AttentionInputs(x32.q.bfloat16(), x32.k.bfloat16(), x32.v.bfloat16(), x32.batch)
    ref = run(x32, REFERENCE)
    for impl in FAST:
        assert max_abs_error(run(x, impl), ref, x.batch) <= TOLERANCE[torch.bfloat16]


def test_random_inputs_are_drawn_on_the_device_in_the_dtype(monkeypatch):
    """The t4 grid draws ~1.6 billion values at its largest point: every draw must happen on the
    device, in the dtype asked for, never on the host and copied (issue: 26 GB moved on Colab)."""
    calls = []
    real = torch.randn

    def spy(*args, **kwargs):
        calls.append((kwargs.get("device"), kwargs.get("dtype"), kwargs.get("generator").device))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "randn", spy)
    x = random_inputs(RAGGED, heads=4, head_dim=16, kv_heads=2, dtype=torch.bfloat16, device="cpu", seed=1)
    assert len(calls) == 3 and all(c == (torch.device("cpu"), torch.bfloat16, torch.device("cpu")) for c in calls)
    assert x.q.dtype == x.k.dtype == x.v.dtype == torch.bfloat16
    again = random_inputs(RAGGED, heads=4, head_dim=16, kv_heads=2, dtype=torch.bfloat16, device="cpu", seed=1)
    assert torch.equal(x.q, again.q) and torch.equal(x.v, again.v), "seeded"
