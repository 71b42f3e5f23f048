"""Medusa heads: the drafter is exact (greedy output = the target's), heads read the verify pass's
hidden rows, typical acceptance follows Medusa's formula and is labelled lossy, checkpoints keep the
published key layout."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import random_prompt, tiny_model
from specnb.core.acceptance import TypicalAcceptance, greedy_accept, typical_accept, typical_thresholds
from specnb.core.generation import autoregressive_generate, speculative_generate
from specnb.core.sampling import top_tokens
from specnb.core.trees import Tree
from specnb.drafters.medusa import MedusaDrafter, MedusaHeads, head_ranks, last_hidden
from specnb.io.medusa_checkpoint import check_layout, load_checkpoint

K = 3


def random_heads(target: torch.nn.Module, seed: int = 0, share: bool = True) -> MedusaHeads:
    heads = MedusaHeads.from_target(target, K, share_lm_head=share)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for h in heads:
            h[0].linear.weight.copy_(torch.randn(h[0].linear.weight.shape, generator=g) * 0.3)
    return heads


TREES = [Tree.chain(3), Tree.kary(2, 7), Tree.sparse(12).truncated(K), Tree.from_paths([(0,), (2,), (0, 1), (2, 0), (2, 0, 3)])]


@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.describe())
@pytest.mark.parametrize("length", [1, 2, 9])
def test_greedy_output_equals_target(tiny_target, tree, length):
    drafter = MedusaDrafter(tiny_target, random_heads(tiny_target))
    prompt = random_prompt(length, length)
    ref = autoregressive_generate(tiny_target, prompt, 20, eos_token_id=())
    out = speculative_generate(tiny_target, drafter, prompt, tree, 20, eos_token_id=())
    assert out.tokens.tolist() == ref.tokens.tolist()
    assert drafter._hook is None  # released after the generation


def test_heads_read_the_row_before_the_root(tiny_target):
    """Each step's draft equals the heads applied to the plain forward's hidden state of the token
    before the root (index identity), up to float noise in the tree-masked verify."""
    heads = random_heads(tiny_target, 3)
    drafter = MedusaDrafter(tiny_target, heads)
    prompt = random_prompt(5, 8)
    tree = Tree.kary(3, 12)
    drafts = []
    original = drafter.draft
    def spy(tokens, step_tree, sampling, generator=None):
        d = original(tokens, step_tree, sampling, generator)
        drafts.append((tokens.clone(), step_tree, d.tokens.clone()))
        return d
    drafter.draft = spy
    speculative_generate(tiny_target, drafter, prompt, tree, 16, eos_token_id=())
    assert len(drafts) > 3
    for seq, tree, tokens in drafts:
        h = last_hidden(tiny_target, seq)[-2]
        with torch.no_grad():
            top = top_tokens(heads(h), 8)
        want = torch.stack([top[d - 1, r] for d, r in zip(tree.depths, tree.ranks)])
        assert tokens.tolist() == want.tolist()


def test_sampling_runs_with_deterministic_proposals(tiny_target):
    drafter = MedusaDrafter(tiny_target, random_heads(tiny_target))
    out = speculative_generate(tiny_target, drafter, random_prompt(2, 6), Tree.sparse(10).truncated(K), 16, temperature=0.8,
                               seed=1, eos_token_id=())
    assert out.tokens.numel() == 16 and out.method == "speculative"


def test_tree_deeper_than_heads_refused(tiny_target):
    with pytest.raises(ValueError, match="Medusa heads"):
        speculative_generate(tiny_target, MedusaDrafter(tiny_target, random_heads(tiny_target)),
                             random_prompt(0), Tree.chain(K + 1), 8)


# ---- typical acceptance -----------------------------------------------------------------------


def test_typical_threshold_formula():
    p = torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]])
    rule = TypicalAcceptance()
    for row, thr in zip(p, typical_thresholds(p, rule)):
        h = -sum(float(x) * math.log(float(x) + 1e-5) for x in row)
        assert float(thr) == pytest.approx(min(0.09, 0.3 * math.exp(-h)), rel=1e-5)


def test_typical_accept_hand_checked():
    # root row: p = (.5, .3, .15, .05) -> H = 1.14, thr = min(.09, .3 e^-H) = .0960 -> .09: tokens 0,1,2 pass
    tree = Tree.from_paths([(0,), (1,), (2,), (0, 0), (1, 0), (1, 0, 0)])
    tokens = torch.tensor([3, 1, 0, 2, 0, 1])
    v = 4
    p = torch.full((7, v), 0.0)
    p[0] = torch.tensor([0.5, 0.3, 0.15, 0.05])  # node 0 (tok 3): .05 fails; node 1 (tok 1): passes; node 2 (tok 0): passes
    p[1] = torch.tensor([0.25, 0.25, 0.25, 0.25])
    p[2] = torch.tensor([0.97, 0.01, 0.01, 0.01])  # child node 4 (tok 0) passes
    p[3] = torch.tensor([0.25, 0.25, 0.25, 0.25])
    p[5] = torch.tensor([0.01, 0.95, 0.02, 0.02])  # node 5 (tok 1) passes: p = .95
    argmax = p.argmax(-1)
    result = typical_accept(tree, tokens, p, argmax)
    assert result.path == (1, 4, 5)
    assert result.next_token == int(argmax[6]) and result.tokens == (1, 0, 1)
    # ties in length break by the larger sum of log p
    tree2 = Tree.from_paths([(0,), (1,)])
    p2 = torch.tensor([[0.3, 0.6, 0.1, 0.0], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.float)
    assert typical_accept(tree2, torch.tensor([0, 1]), p2, p2.argmax(-1)).path == (1,)


def test_typical_on_one_hot_p_is_greedy():
    """When p is one-hot (temperature -> 0) only the argmax passes: typical = greedy acceptance."""
    tree = Tree.kary(2, 10)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        tokens = torch.randint(0, 5, (10,), generator=g)
        argmax = torch.randint(0, 5, (11,), generator=g)
        p = torch.nn.functional.one_hot(argmax, 5).float()
        a, b = typical_accept(tree, tokens, p, argmax), greedy_accept(tree, tokens, argmax)
        assert (a.path, a.next_token) == (b.path, b.next_token)


def test_typical_generation_is_labelled_lossy(tiny_target):
    drafter = MedusaDrafter(tiny_target, random_heads(tiny_target))
    prompt = random_prompt(4, 6)
    out = speculative_generate(tiny_target, drafter, prompt, Tree.sparse(10).truncated(K), 16, temperature=0.7,
                               typical=TypicalAcceptance(), eos_token_id=())
    assert "lossy" in out.method and TypicalAcceptance().lossy
    greedy = speculative_generate(tiny_target, drafter, prompt, Tree.sparse(10).truncated(K), 16, typical=TypicalAcceptance(),
                                  eos_token_id=())
    assert greedy.tokens.tolist() == autoregressive_generate(tiny_target, prompt, 16, eos_token_id=()).tokens.tolist()


# ---- checkpoints --------------------------------------------------------------------------------


@pytest.mark.parametrize("share", [True, False])
def test_save_load_round_trip_in_published_layout(tiny_target, tmp_path, share):
    heads = random_heads(tiny_target, 5, share=share)
    if not share:
        with torch.no_grad():
            heads[1][-1].weight.add_(0.01)
    heads.save(tmp_path / "heads", "tiny")
    state, config = load_checkpoint(tmp_path / "heads")
    v, h = tiny_target.config.vocab_size, tiny_target.config.hidden_size
    assert sorted(state) == sorted(f"{i}.{k}" for i in range(K) for k in ("0.linear.weight", "0.linear.bias", "1.weight"))
    assert state["0.0.linear.weight"].shape == (h, h) and state["2.1.weight"].shape == (v, h)
    assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (K, 1) and "config_disagrees" not in config
    loaded = MedusaHeads.load(tmp_path / "heads", tiny_target)
    assert loaded.shares_lm_head == share
    x = torch.randn(4, h)
    assert torch.equal(loaded(x), heads(x))


def test_load_reads_heads_from_keys_not_config(tmp_path, tiny_target):
    """The published config says 2 heads while the weights hold more: the keys win."""
    heads = random_heads(tiny_target)
    heads.save(tmp_path / "h", "tiny")
    cfg = tmp_path / "h" / "config.json"
    cfg.write_text(cfg.read_text().replace(f'"medusa_num_heads": {K}', '"medusa_num_heads": 2'))
    state, config = load_checkpoint(tmp_path / "h")
    assert config["medusa_num_heads"] == K and "config_disagrees" in config
    with pytest.raises(ValueError, match="missing"):
        check_layout({k: v for k, v in state.items() if k != "1.0.linear.bias"})
