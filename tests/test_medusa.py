"""Medusa heads: the drafter is exact (greedy output = the target's), heads read the verify pass's
hidden rows, typical acceptance follows Medusa's formula and is labelled lossy, checkpoints keep the
published key layout."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import random_prompt, step_tuple

from specnb.core.acceptance import greedy_accept, typical_accept, typical_thresholds
from specnb.core.generation import autoregressive_generate, speculative_generate
from specnb.core.sampling import SamplingConfig, TypicalAcceptance, top_tokens
from specnb.core.trees import Tree
from specnb.drafters.hidden_rows import final_norm, last_hidden
from specnb.drafters.medusa import MedusaDrafter, MedusaHeads
from specnb.io.medusa_checkpoint import check_layout, load_checkpoint

K = 3


def random_heads(target: torch.nn.Module, seed: int = 0, share: bool = True) -> MedusaHeads:
    heads = MedusaHeads.from_target(target, K, share_lm_head=share)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for h in heads:
            h[0].linear.weight.copy_(torch.randn(h[0].linear.weight.shape, generator=g) * 0.3)
    return heads


TREES = [
    Tree.chain(3),
    Tree.kary(2, 7),
    Tree.sparse(12).truncated(K),
    Tree.from_paths([(0,), (2,), (0, 1), (2, 0), (2, 0, 3)]),
]


@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.describe())
@pytest.mark.parametrize("length", [1, 2, 9])
def test_greedy_output_equals_target(tiny_target, tree, length):
    drafter = MedusaDrafter(tiny_target, random_heads(tiny_target))
    prompt = random_prompt(length, length)
    ref = autoregressive_generate(tiny_target, prompt, 20, eos_token_id=())
    out = speculative_generate(tiny_target, drafter, prompt, tree, 20, eos_token_id=())
    assert out.tokens.tolist() == ref.tokens.tolist()
    assert not final_norm(drafter.target)._forward_hooks  # released after the generation: no hook left on the model


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
    out = speculative_generate(
        tiny_target,
        drafter,
        random_prompt(2, 6),
        Tree.sparse(10).truncated(K),
        16,
        eos_token_id=(),
        sampling=SamplingConfig(temperature=0.8, seed=1),
    )
    assert out.tokens.numel() == 16 and out.method == "speculative"


def test_tree_deeper_than_heads_refused(tiny_target):
    with pytest.raises(ValueError, match="Medusa heads"):
        speculative_generate(
            tiny_target, MedusaDrafter(tiny_target, random_heads(tiny_target)), random_prompt(0), Tree.chain(K + 1), 8
        )


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
    p[0] = torch.tensor(
        [0.5, 0.3, 0.15, 0.05]
    )  # node 0 (tok 3): .05 fails; node 1 (tok 1): passes; node 2 (tok 0): passes
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
    out = speculative_generate(
        tiny_target,
        drafter,
        prompt,
        Tree.sparse(10).truncated(K),
        16,
        eos_token_id=(),
        sampling=SamplingConfig(temperature=0.7, typical=TypicalAcceptance()),
    )
    assert "lossy" in out.method and TypicalAcceptance().lossy
    greedy = speculative_generate(
        tiny_target,
        drafter,
        prompt,
        Tree.sparse(10).truncated(K),
        16,
        eos_token_id=(),
        sampling=SamplingConfig(typical=TypicalAcceptance()),
    )
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
    assert sorted(state) == sorted(
        f"{i}.{k}" for i in range(K) for k in ("0.linear.weight", "0.linear.bias", "1.weight")
    )
    assert state["0.0.linear.weight"].shape == (h, h) and state["2.1.weight"].shape == (v, h)
    assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (K, 1) and "config_disagrees" not in config
    loaded = MedusaHeads.load(tmp_path / "heads", tiny_target)
    assert loaded.shares_lm_head == share
    x = torch.randn(4, h)
    assert torch.equal(loaded(x), heads(x))


def test_loaded_heads_take_the_targets_dtype_and_hold_the_checkpoints_tensors(tiny_target, tmp_path):
    """Published heads (their own projections; float32 on disk here) for a float16 target: every
    parameter float16 (on a T4 the published heads would otherwise take 2.96 GB instead of 1.48),
    and no random float32 initialisation first: the heads hold the checkpoint's tensors."""
    heads = random_heads(tiny_target, share=False)
    with torch.no_grad():
        heads[1][-1].weight.add_(0.01)  # trained projections: not the target's LM head
    heads.save(tmp_path / "h", "tiny")
    half = copy.deepcopy(tiny_target).half()
    loaded = MedusaHeads.load(tmp_path / "h", half)
    assert {p.dtype for p in loaded.parameters()} == {torch.float16} and not loaded.shares_lm_head
    state = {k: v.half() for k, v in heads.published_state_dict().items()}
    direct = MedusaHeads.from_state_dict(state)
    assert all(t.data_ptr() == state[k].data_ptr() for k, t in direct.state_dict().items())
    x = torch.randn(4, heads.hidden_size)
    torch.testing.assert_close(loaded(x.half()).float(), heads(x), atol=0.5, rtol=0.02)  # float16 rounding


def test_heads_for_a_float16_target_train_in_float32(tiny_target, tmp_path):
    """A T4 user training heads: the target is float16, the trainable parameters stay float32 (AdamW
    on float16 parameters tends to NaN), the shared projection stays the target's own float16 one."""
    half = copy.deepcopy(tiny_target).half()
    for share in (True, False):
        heads = MedusaHeads.from_target(half, K, share_lm_head=share)
        assert {p.dtype for p in heads.trainable()} == {torch.float32}
        assert heads.shares_lm_head == share and (heads[0][-1].weight.dtype == torch.float16) == share
    cfg = TrainConfig(num_heads=K, max_new_tokens=MAX_NEW, epochs=20, batch_size=64, lr=1e-2, heldout=0.0)
    out = train_or_load(half, "tiny-float16", [p for _, _, p in PROMPTS], cfg, folder=tmp_path, progress=False)
    assert math.isfinite(out.log["loss_last"]) and out.log["loss_last"] < out.log["loss_first"]
    assert {p.dtype for p in out.heads.trainable()} == {torch.float32}


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


# ---- training, collection, replay -----------------------------------------------------------------

from specnb.analysis.collection import CollectConfig  # noqa: E402
from specnb.analysis.head_collection import accuracy_by_depth, rank_accuracy  # noqa: E402
from specnb.analysis.replay import replay, replay_steps  # noqa: E402
from specnb.analysis.tree_design import medusa_tree  # noqa: E402
from specnb.training import distillation  # noqa: E402
from specnb.training.distillation import DistillConfig, continuation_view, distill, distill_cached, heldout_prompts  # noqa: E402
from specnb.training.medusa import (  # noqa: E402
    LossTargets,
    TrainConfig,
    collect_heads,
    heads_loss,
    heldout_rank_accuracy,
    split_prompts,
    train_or_load,
)

PROMPTS = [
    ("p0", "x", random_prompt(20, 2)[0]),
    ("p1", "x", random_prompt(21, 6)[0]),
    ("p2", "y", random_prompt(22, 9)[0]),
]
MAX_NEW = 20


@pytest.mark.parametrize("prompt_rows", [False, True])
def test_distill_rows_are_the_targets_hidden_states(tiny_target, prompt_rows):
    prompts = [random_prompt(30, 5)[0], random_prompt(31, 8)[0]]
    config = DistillConfig(K, 12, gen_batch=1, prompt_rows=prompt_rows, samples=0)
    data = distill(tiny_target, prompts, config, eos_token_id=-1, progress=False)
    for i, (prompt, new) in enumerate(data.sequences):
        seq = torch.tensor(prompt + new)
        assert (
            list(new)
            == autoregressive_generate(tiny_target, seq[None, : len(prompt)], 12, eos_token_id=()).tokens.tolist()
        )
        mine = torch.nonzero(data.prompt == i)[:, 0]
        hidden, labels, soft = data.hidden[mine], data.labels[mine], data.soft_row[mine]
        first = 0 if prompt_rows else len(prompt) - 1 - K  # the first row with a label (head K in the continuation)
        plain = last_hidden(tiny_target, seq[:-1])
        assert len(hidden) == len(seq) - 2 - first  # every row up to the last with a label (head 1)
        assert torch.allclose(hidden, plain[first : first + len(hidden)], atol=1e-5)
        lm_head = tiny_target.get_output_embeddings().weight
        for r in range(len(hidden)):
            t = first + r
            for d in range(1, K + 1):
                inside = t + 1 + d < len(seq) and (prompt_rows or t + 1 + d >= len(prompt))
                assert int(labels[r, d - 1]) == (int(seq[t + 1 + d]) if inside else -100)
                # the soft target is the row whose LM head predicts that same position: row t + d
                want = int(mine[r + d]) if inside and r + d < len(hidden) else -1
                assert int(soft[r, d - 1]) == want
                if want >= 0 and t + d >= len(prompt) - 1:  # on the greedy continuation its argmax is the label
                    assert int((data.hidden[want] @ lm_head.T).argmax()) == int(labels[r, d - 1])


def test_data_without_prompt_rows_is_a_view_of_the_data_with_them(tiny_target, tmp_path, monkeypatch):
    """Medusa's rows (no prompt rows) are the continuation view of EAGLE's (prompt rows), greedy and
    sampled segments alike, field for field; `distill_cached` makes one distillation for both."""
    prompts = [random_prompt(36, 5)[0], random_prompt(37, 9)[0], random_prompt(38, 3)[0]]
    narrow_config = DistillConfig(K, 10, gen_batch=2, samples=1, sample_temperature=1.5, seed=3)
    narrow = distill(tiny_target, prompts, narrow_config, eos_token_id=-1, progress=False)
    wide = distill(tiny_target, prompts, replace(narrow_config, prompt_rows=True), eos_token_id=-1, progress=False)
    assert len(wide.hidden) > len(narrow.hidden)
    view = continuation_view(wide, K)
    for name in ("hidden", "labels", "soft_row", "prompt", "segment", "position", "token"):
        assert torch.equal(getattr(view, name), getattr(narrow, name)), name
    assert torch.equal(view.greedy_rows(), narrow.greedy_rows())
    assert view.sequences == narrow.sequences and view.sampled == narrow.sampled
    with pytest.raises(ValueError, match="not data of this num_heads"):
        continuation_view(wide, K + 3)
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    config = DistillConfig(num_heads=K, max_new_tokens=10, gen_batch=2, samples=1, seed=3)
    calls = []
    monkeypatch.setattr(
        "specnb.training.distillation.distill",
        lambda target, prompts, config, **k: calls.append(config.prompt_rows) or wide,
    )
    assert torch.equal(distill_cached(tiny_target, "tiny", prompts, config, progress=False).hidden, view.hidden)
    assert torch.equal(
        distill_cached(tiny_target, "tiny", prompts, replace(config, prompt_rows=True), progress=False).hidden,
        wide.hidden,
    )
    assert calls == [True]  # one distillation, with prompt rows, for both


def test_sampled_continuations_add_rows_of_the_same_prompt(tiny_target):
    prompts = [random_prompt(34, 5)[0], random_prompt(35, 7)[0]]
    greedy = distill(
        tiny_target, prompts, DistillConfig(K, 10, gen_batch=2, samples=0), eos_token_id=-1, progress=False
    )
    config = DistillConfig(K, 10, gen_batch=2, samples=2, sample_temperature=1.5)
    data = distill(tiny_target, prompts, config, eos_token_id=-1, progress=False)
    assert data.sequences == greedy.sequences and sorted(j for j, _ in data.sampled) == [0, 0, 1, 1]
    mask = data.greedy_rows()  # the greedy continuations' rows, in the same order as distilling greedily alone
    # (equal up to float rounding: the sampled rows share their batch, and a batch's size changes the matmul kernels)
    assert int(mask.sum()) == len(greedy.hidden) and torch.allclose(data.hidden[mask], greedy.hidden, atol=1e-5)
    assert any(new != greedy.sequences[j][1] for j, new in data.sampled)  # sampling, not the greedy path again
    for j, new in data.sampled:  # each sampled continuation's rows: the target's own, labelled by it
        seq = torch.tensor(list(data.sequences[j][0]) + list(new))
        first = len(data.sequences[j][0]) - 1 - K
        rows = torch.nonzero(data.prompt == j)[:, 0]
        plain = last_hidden(tiny_target, seq[:-1])[first : len(seq) - 2]
        block = [
            r
            for r in rows.tolist()
            if r + len(plain) <= len(data.hidden) and torch.allclose(data.hidden[r : r + len(plain)], plain, atol=1e-5)
        ]
        assert len(block) == 1, "each sampled continuation's rows are in the data once"
        for d in range(1, K + 1):  # labelled by the sampled tokens
            assert data.labels[block[0] : block[0] + len(plain), d - 1].tolist() == [
                int(seq[t + 1 + d]) if len(data.sequences[j][0]) <= t + 1 + d < len(seq) else -100
                for t in range(first, first + len(plain))
            ]
    assert len(data.hidden) == len(greedy.hidden) + sum(
        len(greedy.sequences[j][0]) + len(new) - 2 - (len(greedy.sequences[j][0]) - 1 - K) for j, new in data.sampled
    )


def test_continuations_end_at_eos_and_repeat_with_the_seed(tiny_target):
    prompts = [random_prompt(46, 5)[0], random_prompt(49, 5)[0]]  # continuations that do not repeat one token
    plain = [autoregressive_generate(tiny_target, p[None], 12, eos_token_id=()).tokens.tolist() for p in prompts]
    k = next(i for i in range(3, 12) if plain[0][i] not in plain[0][:i])  # prompt 0 ends after k + 1 tokens
    eos = plain[0][k]
    config = DistillConfig(K, 12, gen_batch=2, samples=3, sample_temperature=1.5)
    data = distill(tiny_target, prompts, config, eos_token_id=eos, progress=False)
    for j, (_, new) in enumerate(data.sequences):  # greedy: the plain continuation up to and including its first eos
        assert list(new) == (plain[j][: plain[j].index(eos) + 1] if eos in plain[j] else plain[j])
    assert len(data.sequences[0][1]) == k + 1
    for _, new in data.sampled:  # a sampled row stops at its eos too (the batch goes on feeding it padding)
        assert eos not in new[:-1] and (new[-1] == eos or len(new) == 12)
    again = distill(tiny_target, prompts, config, eos_token_id=eos, progress=False)
    other = distill(tiny_target, prompts, replace(config, seed=1), eos_token_id=eos, progress=False)
    assert again.sampled == data.sampled and torch.equal(again.hidden, data.hidden)
    assert other.sampled != data.sampled and other.sequences == data.sequences


def test_long_prompts_get_no_sampled_continuations(tiny_target):
    prompts = [random_prompt(36, 5)[0], random_prompt(37, 12)[0], random_prompt(38, 6)[0]]
    config = DistillConfig(K, 6, gen_batch=3, samples=2, sample_temperature=1.5)
    full = distill(tiny_target, prompts, config, eos_token_id=-1, progress=False)
    data = distill(tiny_target, prompts, replace(config, max_sampled_prompt=8), eos_token_id=-1, progress=False)
    assert sorted(j for j, _ in data.sampled) == [0, 0, 2, 2] and data.sequences == full.sequences
    for j in (0, 2):  # the short prompts' sampled rows: the target's own on prompt + that continuation
        for new in [n for i, n in data.sampled if i == j]:
            seq = torch.tensor(list(prompts[j].tolist()) + list(new))
            plain = last_hidden(tiny_target, seq[:-1])[len(prompts[j]) - 1 - K : len(seq) - 2]
            rows = data.hidden[(data.prompt == j) & ~data.greedy_rows()]
            assert any(
                torch.allclose(rows[r : r + len(plain)], plain, atol=1e-5) for r in range(len(rows) - len(plain) + 1)
            )
    assert int(((data.prompt == 1) & ~data.greedy_rows()).sum()) == 0


@pytest.mark.parametrize("native", [False, True])
def test_bfloat16_distillation(tiny_target, native, monkeypatch):
    monkeypatch.setattr(distillation, "fast_bfloat16", lambda device: native)
    prompts = [random_prompt(39, 5)[0], random_prompt(40, 7)[0]]
    config = DistillConfig(K, 8, gen_batch=2, samples=0)
    exact = distill(tiny_target, prompts, config, eos_token_id=-1, progress=False)
    data = distill(tiny_target, prompts, replace(config, distill_bfloat16=True), eos_token_id=-1, progress=False)
    assert next(tiny_target.parameters()).dtype == torch.float32  # the target itself is left as it was
    if not native:  # emulated bfloat16 would be slower: the float32 target generates, unchanged
        assert torch.equal(data.hidden, exact.hidden) and data.sequences == exact.sequences
        return
    low = copy.deepcopy(tiny_target).to(torch.bfloat16)
    want = distill(low, prompts, config, eos_token_id=-1, progress=False)
    assert torch.equal(data.hidden, want.hidden) and data.sequences == want.sequences  # the copy's rows
    assert data.hidden.dtype == torch.float32
    assert not torch.equal(data.hidden, exact.hidden)  # bfloat16 rounding: close to the target's rows, not equal
    for j, (p, new) in enumerate(data.sequences):  # and close to the float32 target's on the same tokens
        plain = last_hidden(tiny_target, torch.tensor(list(p) + list(new))[:-1])[len(p) - 1 - K :]
        rows = data.hidden[data.prompt == j]
        assert torch.allclose(rows, plain[: len(rows)], atol=0.1, rtol=0.05)


def test_long_prompts_give_prompt_rows_only(tiny_target):
    prompts = [random_prompt(32, 5)[0], random_prompt(33, 12)[0]]
    config = DistillConfig(K, 6, gen_batch=2, prompt_rows=True, max_continued_prompt=8, samples=0)
    data = distill(tiny_target, prompts, config, eos_token_id=-1, progress=False)
    assert [len(new) for _, new in data.sequences] == [6, 0]
    long = data.prompt == 1
    assert torch.allclose(data.hidden[long], last_hidden(tiny_target, prompts[1])[: 12 - 2], atol=1e-5)
    with pytest.raises(ValueError, match="prompt_rows"):
        TrainConfig(prompt_rows=False, max_continued_prompt=8)


def test_heldout_prompts_are_spread_and_splits_span_categories():
    assert heldout_prompts(10, 0.2) == (0, 9) and heldout_prompts(10, 0.0) == () and len(heldout_prompts(50, 0.1)) == 5
    prompts = [(str(i), c, torch.arange(3)) for c in "abc" for i in range(8 * "abc".index(c), 8 * "abc".index(c) + 8)]
    train, test = split_prompts(prompts)
    assert [p[1] for p in test] == list("abcabc") and {p[1] for p in train[:3]} == set("abc")
    assert not {p[0] for p in train} & {p[0] for p in test} and len(train) + len(test) == len(prompts)


@pytest.mark.parametrize("soft", [False, True])
def test_soft_and_hard_training_both_learn(tiny_target, soft, tmp_path):
    cfg = TrainConfig(
        num_heads=K,
        max_new_tokens=MAX_NEW,
        epochs=100,
        batch_size=64,
        lr=1e-2,
        heldout=0.0,
        num_layers=2,
        soft_labels=soft,
    )
    out = train_or_load(tiny_target, "tiny", [p for _, _, p in PROMPTS], cfg, folder=tmp_path, progress=False)
    assert out.heads.num_layers == 2 and out.log["loss_last"] < 0.5 * out.log["loss_first"]
    again = MedusaHeads.load(str(tmp_path), tiny_target)
    assert again.num_layers == 2 and again.shares_lm_head


def test_sampled_softmax_with_every_unseen_token_is_the_full_softmax(tiny_target):
    """loss_vocab="sampled" with all unseen tokens drawn (inclusion 1, no shift) is the full-vocabulary
    cross-entropy; with fewer, their logits are raised by log(unseen / drawn)."""
    heads = random_heads(tiny_target)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, tiny_target.config.hidden_size, generator=g)
    labels = torch.randint(0, 40, (6, K), generator=g)
    labels[0, 1] = -100
    vocab = torch.unique(labels[labels >= 0])
    remap = torch.full((heads.vocab_size,), -1, dtype=torch.long)
    remap[vocab] = torch.arange(len(vocab))
    unseen = torch.nonzero(remap < 0)[:, 0]
    none = torch.full_like(labels, -1)
    with torch.no_grad():
        full = heads_loss(heads, x, labels, none, x, LossTargets(None, None))
        remapped = torch.where(labels >= 0, remap[labels.clamp_min(0)], -100)
        seen = heads_loss(heads, x, remapped, none, x, LossTargets(vocab, None))
        sampled = heads_loss(heads, x, remapped, none, x, LossTargets(vocab, None), negatives=unseen)
        shifted = LossTargets(vocab, None, shift=math.log(len(unseen) / 5))
        lifted = heads_loss(heads, x, remapped, none, x, shifted, negatives=unseen[:5])
    torch.testing.assert_close(sampled, full)
    assert float(seen) < float(full)  # the seen-only softmax leaves the unseen tokens' mass out
    z = [heads(x)[d] for d in range(K)]  # by hand: five unseen columns, each counted len(unseen) / 5 times
    want = sum(
        torch.nn.functional.cross_entropy(
            torch.cat([z[d][:, vocab], z[d][:, unseen[:5]] + math.log(len(unseen) / 5)], -1),
            torch.where(labels[:, d] >= 0, remap[labels[:, d].clamp_min(0)], -100),
            ignore_index=-100,
        )
        for d in range(K)
    )
    torch.testing.assert_close(lifted, want)


def test_sampled_softmax_pushes_unseen_tokens_down(tiny_target, tmp_path):
    """The seen-only softmax never lowers a token that is no label; the sampled one does."""
    top_unseen = {}
    for vocab in ("seen", "sampled"):
        cfg = TrainConfig(
            num_heads=K,
            max_new_tokens=MAX_NEW,
            epochs=60,
            batch_size=64,
            lr=1e-2,
            heldout=0.0,
            loss_vocab=vocab,
            negatives=64,
        )
        out = train_or_load(
            tiny_target, "tiny", [p for _, _, p in PROMPTS], cfg, folder=tmp_path / vocab, progress=False
        )
        data = distill_cached(
            tiny_target, "tiny", [p for _, _, p in PROMPTS], cfg.distill_config(), progress=False
        )  # its rows
        seen = torch.zeros(out.heads.vocab_size, dtype=torch.bool)
        seen[data.labels[data.labels >= 0]] = True
        with torch.no_grad():
            top = out.heads(data.hidden).topk(5, -1).indices  # [K, R, 5]
        top_unseen[vocab] = float((~seen[top]).float().mean())
    assert top_unseen["sampled"] < 0.5 * top_unseen["seen"], top_unseen


@pytest.fixture(scope="module")
def trained(tiny_target, tmp_path_factory):
    """Heads trained on the test prompts' own continuations (a memorising fit: drafts get accepted)."""
    cfg = TrainConfig(
        num_heads=K,
        max_new_tokens=MAX_NEW,
        epochs=300,
        batch_size=64,
        lr=1e-2,
        heldout=0.0,
        loss_vocab="full",
        share_lm_head=False,
    )
    return train_or_load(
        tiny_target, "tiny", [p for _, _, p in PROMPTS], cfg, folder=tmp_path_factory.mktemp("heads"), progress=False
    )


def test_training_learns_and_caches(trained, tiny_target):
    assert trained.log["loss_last"] < 0.5 * trained.log["loss_first"] and not trained.log["cached"]
    again = train_or_load(
        tiny_target, "tiny", [p for _, _, p in PROMPTS], TrainConfig(), folder=trained.folder, progress=False
    )
    assert again.log["cached"]
    x = torch.randn(5, tiny_target.config.hidden_size)
    assert torch.equal(again.heads(x), trained.heads(x))


@pytest.fixture(scope="module")
def head_collection(tiny_target, trained):
    return collect_heads(
        tiny_target,
        trained.heads,
        PROMPTS,
        CollectConfig(MAX_NEW, top_k=8, run_tree="sparse:6", eos_token_id=()),
        progress=False,
    )


def medusa_trees(collection):
    acc = [[max(a, 1e-3) for a in row] for row in rank_accuracy(collection, 8)]
    return {
        "chain3": Tree.chain(3),
        "kary2": Tree.kary(2, 9),
        "gaps": Tree.from_paths([(1,), (3,), (3, 0), (3, 2)]),
        "medusa12": medusa_tree(acc, 12),
    }


@pytest.mark.parametrize("max_new", [MAX_NEW, 11])
def test_replayed_steps_equal_real_steps(tiny_target, trained, head_collection, max_new):
    accepted = 0
    for name, tree in medusa_trees(head_collection).items():
        replayed = replay_steps(head_collection, tree, max_new_tokens=max_new)
        for pid, _, ids in PROMPTS:
            real = speculative_generate(
                tiny_target, MedusaDrafter(tiny_target, trained.heads), ids[None], tree, max_new, eos_token_id=()
            )
            assert [step_tuple(s) for s in replayed[pid]] == [step_tuple(s) for s in real.steps], (name, pid)
            accepted += sum(s.num_accepted for s in real.steps)
    assert accepted > 20  # the heads do get drafts accepted: the comparison is not vacuous
    for p in head_collection.prompts:  # the collection's own run, too
        run = replay_steps(head_collection, head_collection.config.run.truncated(K))[p.prompt_id]
        assert [(s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in run] == [
            tuple(r) for r in p.run_steps.tolist()
        ]


def test_one_token_prompt_refused(tiny_target, trained):
    with pytest.raises(ValueError, match="one token"):
        collect_heads(
            tiny_target, trained.heads, [("a", "x", random_prompt(1, 1)[0])], CollectConfig(8), progress=False
        )


def test_accuracy_tables(head_collection):
    acc = accuracy_by_depth(head_collection, ks=(1, 8))
    top1 = acc[acc.k == 1].set_index("head").top_k_accuracy
    ranks = rank_accuracy(head_collection, 8)
    assert top1[1] == pytest.approx(ranks[0][0]) and acc[acc.k == 8].top_k_accuracy.iloc[0] == pytest.approx(
        sum(ranks[0])
    )
    table = replay(head_collection, {("chain", 1): Tree.chain(1)})
    # every position, the last of each prompt (no room for a draft) counted as a miss
    hits = sum(int((p.head_ranks[: len(p.tokens) - 1, 0] == 0).sum()) for p in head_collection.prompts)
    assert table.depth_1_acceptance[0] == pytest.approx(hits / sum(len(p.tokens) for p in head_collection.prompts))


def explore_graph(acc, n):
    """Medusa's gen_results.explore_graph (max_child = len(acc[d])), restated as the reference."""
    value = lambda p: float(np.prod([acc[d][r] for d, r in enumerate(p)]))  # noqa: E731
    chosen = [(0,)]
    for _ in range(n - 1):
        best, best_v = None, -1.0
        for v in sorted(chosen, key=lambda p: (len(p), p)):
            for nb in ([v[:-1] + (v[-1] + 1,)] if v[-1] + 1 < len(acc[len(v) - 1]) else []) + (
                [v + (0,)] if len(v) < len(acc) else []
            ):
                if nb not in chosen and value(nb) > best_v:
                    best, best_v = nb, value(nb)
        chosen.append(best)
    return Tree.from_paths(chosen)


@pytest.mark.parametrize("n", [1, 5, 20])
def test_medusa_tree_is_medusas_search(n):
    acc = [[0.5, 0.2, 0.1, 0.05], [0.3, 0.15, 0.12, 0.01], [0.2, 0.1, 0.02, 0.01]]
    assert medusa_tree(acc, n) == explore_graph(acc, n)


def test_method_specs(tiny_target):
    from specnb.drafters.methods import build_drafter, parse_method

    exact, lossy = parse_method("medusa/kary2:6"), parse_method("medusa_typical_lossy/kary2:6")
    assert exact.tree == Tree.kary(2, 6) and not exact.lossy and exact.typical is None and not exact.needs_draft_model
    assert lossy.lossy and "lossy" in lossy.label and lossy.typical == TypicalAcceptance()
    heads = random_heads(tiny_target)
    assert isinstance(build_drafter(exact, tiny_target, None, medusa_heads=heads), MedusaDrafter)
    with pytest.raises(ValueError, match="Medusa heads"):
        build_drafter(exact, tiny_target, None)


def test_trees_are_designed_on_other_prompts_than_they_are_scored_on(head_collection, trained):
    """Loaded heads have no training split: Medusa's and Sequoia's trees are designed from the first
    half of the test prompts and scored on the other half; trained heads are designed from the
    training split's held-out rows and scored on every test prompt."""

    from specnb.experiments.learned_study import tree_design

    loaded = tree_design(head_collection, None)
    ids = [p.prompt_id for p in head_collection.prompts]
    assert [p.prompt_id for p in loaded.measured.prompts] == ids[1:]
    assert loaded.accuracy == rank_accuracy(replace(head_collection, prompts=head_collection.prompts[:1]))
    assert "designed from 1 test prompts (p0)" in loaded.note and "the other 2 (p1, p2)" in loaded.note
    own = tree_design(head_collection, trained)
    assert own.measured is head_collection and own.accuracy == heldout_rank_accuracy(trained.accuracy)
    with pytest.raises(ValueError, match="need >= 2 test prompts"):
        tree_design(replace(head_collection, prompts=head_collection.prompts[:1]), None)


def test_learned_reading_names_a_winner_only_outside_the_spread():
    """Notebook 05's reading: 'wins' where the next drafter's tau lies below the leader's 95%
    interval; a lead inside it is reported as within the spread."""
    import pandas as pd

    from specnb.experiments.learned_study import learned_reading

    rows = [
        ("A", "sparse", "preset", 8, 2.0, 1.9, 2.1),
        ("B", "kary8", "preset", 8, 1.5, 1.4, 1.6),
        ("A", "sparse", "preset", 16, 2.0, 1.7, 2.3),
        ("B", "kary8", "preset", 16, 1.95, 1.8, 2.1),
    ]
    taus = pd.DataFrame(rows, columns=["drafter", "shape", "kind", "budget", "tau", "tau_ci_low", "tau_ci_high"])
    accuracy = pd.DataFrame(columns=["drafter", "depth", "k", "top_k_accuracy"])
    text = learned_reading(accuracy, taus, pd.DataFrame(), None)
    assert "8 nodes: A wins with sparse (preset), tau 2.00 [1.90, 2.10], 1.33x" in text
    assert "16 nodes: A leads, within the spread, with sparse" in text and "1.95: inside that interval)" in text
