"""EAGLE heads: the drafter is exact (greedy output = the target's, for every tree shape), its tree
draft equals drafting each root-to-node path as a plain sequence (feature cache and tree mask), the
head reads the target's own features across steps, sampled output follows the target (chi-square,
with power checks), training lowers EAGLE's loss and is cached, and the distillation data path is
one module both trainers use."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import random_prompt, step_tuple, tiny_model
from stats import ALPHA, chi_square_pvalue
from test_acceptance import broken_accept
from test_generation import VOCAB, first_two, target_first_two

import specnb.core.acceptance
from specnb.core.cache import new_cache
from specnb.core.generation import autoregressive_generate, speculative_generate
from specnb.core.masks import causal_visible
from specnb.core.sampling import SamplingConfig, top_tokens
from specnb.core.trees import Tree
from specnb.core.verification import prefill
from specnb.drafters.dynamic import top_n
from specnb.drafters.eagle import EagleDrafter, EagleDynamicDrafter, EagleHead
from specnb.drafters.hidden_rows import final_norm, last_hidden
from specnb.training import distillation
from specnb.training import eagle as eagle_training
from specnb.training import medusa as medusa_training
from specnb.training.distillation import DistillConfig, distill, distill_cached
from specnb.training.eagle import EagleConfig, chain_ranks, depth_top_tokens, eagle_loss, head_accuracy, train_or_load

TREES = {
    "chain4": Tree.chain(4),
    "kary2x10": Tree.kary(2, 10),
    "sparse12": Tree.sparse(12),
    "beams3x9": Tree.beams(3, 9),
    "gappy": Tree.from_paths([(0,), (2,), (0, 1), (2, 0), (2, 0, 3)]),
}


@torch.no_grad()
def reference_logits(head: EagleHead, target: torch.nn.Module, seq: torch.Tensor, path: list[int]) -> torch.Tensor:
    """Float [V]: the head's logits after `seq` (long [T], its last token the root) and then the
    draft tokens `path`, run as one plain causal sequence without a cache: rows (f_t, seq[t+1]) from
    the target's plain forward, then (g, y) for each token y of the path, g the previous row's output."""
    feats = last_hidden(target, seq[:-1]).float()  # [T - 1, H]
    tokens = seq[1:].clone()
    g = None
    for step in range(len(path) + 1):
        if step:
            feats = torch.cat([feats, g[None]])
            tokens = torch.cat([tokens, torch.tensor([path[step - 1]])])
        n = len(tokens)
        g = head(feats[None], tokens[None], torch.arange(n)[None], causal_visible(n, 0)[None])[0, -1]
    return head.project(g)


def random_head(target: torch.nn.Module, seed: int = 0) -> EagleHead:
    return EagleHead.from_target(target, seed=seed).eval()


# ---- exact under greedy ----------------------------------------------------------------------


@pytest.mark.parametrize("tree_name", TREES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_output_equals_target(tiny_target, tree_name, arch):
    target = tiny_target if arch == "llama" else tiny_model(0, arch="qwen2", scale=30.0)
    drafter = EagleDrafter(target, random_head(target))
    drafted = 0
    for length in (1, 2, 9):
        prompt = random_prompt(length, length)
        ref = autoregressive_generate(target, prompt, 20, eos_token_id=())
        out = speculative_generate(target, drafter, prompt, TREES[tree_name], 20, eos_token_id=())
        assert out.tokens.tolist() == ref.tokens.tolist()
        drafted += sum(s.num_drafted for s in out.steps)
        assert not final_norm(target)._forward_hooks  # released after the generation: no hook left on the model
    assert drafted > 0


def test_trained_head_gets_drafts_accepted_and_stays_exact(tiny_target, trained):
    """A head fitted on the target's continuations drafts what the target says: output unchanged,
    more than one token per step."""
    drafter = EagleDrafter(tiny_target, trained.head)
    for _, _, prompt in [p for i, p in enumerate(PROMPTS) if i not in trained.heldout_prompts]:
        ref = autoregressive_generate(tiny_target, prompt[None], MAX_NEW, eos_token_id=())
        out = speculative_generate(tiny_target, drafter, prompt[None], Tree.sparse(10), MAX_NEW, eos_token_id=())
        assert out.tokens.tolist() == ref.tokens.tolist()
        assert len(out.steps) < 0.6 * MAX_NEW


# ---- the tree draft is the path drafts --------------------------------------------------------


@pytest.mark.parametrize("tree_name", ["kary2x10", "sparse12", "beams3x9"])
def test_tree_draft_equals_each_path_drafted_as_a_sequence(tiny_target, tree_name):
    """q at the root and at every node with children equals the head's distribution after that
    node's root-to-node path fed as a plain causal sequence (temperature 1: q = softmax(logits))."""
    tree = TREES[tree_name]
    head = random_head(tiny_target, 1)
    drafter = EagleDrafter(tiny_target, head)
    prompt = random_prompt(4, 8)
    drafter.bind_target_cache(None)
    prefill(tiny_target, new_cache(tiny_target), prompt[:, :-1])  # what the loop does: the hook reads prompt[:-1]
    draft = drafter.draft(prompt[0], tree, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    drafter.release()
    tokens = draft.tokens.tolist()
    torch.testing.assert_close(
        draft.q[0], torch.softmax(reference_logits(head, tiny_target, prompt[0], []), -1), atol=1e-5, rtol=1e-4
    )
    checked = 0
    for i in range(tree.num_nodes):
        if not tree.children[i + 1]:
            assert float(draft.q[i + 1].abs().sum()) == 0.0  # leaves are never fed
            continue
        path = [tokens[j] for j in tree.node_path(i)]
        want = torch.softmax(reference_logits(head, tiny_target, prompt[0], path), -1)
        torch.testing.assert_close(draft.q[i + 1], want, atol=1e-5, rtol=1e-4)
        checked += 1
    assert checked == sum(1 for i in range(tree.num_nodes) if tree.children[i + 1]) and checked >= 3


@pytest.mark.parametrize("tree_name", ["chain4", "kary2x10", "gappy"])
def test_each_steps_draft_reads_the_targets_features(tiny_target, tree_name):
    """In a real generation, every node's greedy token is the rank-r token of the head after the
    node's path, the head run from scratch on the target's plain-forward features of the sequence so
    far: the features committed across steps (verify rows of the root and the accepted nodes) are
    the target's, at the right positions."""
    tree = TREES[tree_name]
    head = random_head(tiny_target, 2)
    drafter = EagleDrafter(tiny_target, head)
    drafts = []
    original = drafter.draft

    def spy(tokens, step_tree, sampling, generator=None):
        d = original(tokens, step_tree, sampling, generator)
        drafts.append((tokens.clone(), d.tree if d.tree is not None else step_tree, d.tokens.tolist()))
        return d

    drafter.draft = spy
    speculative_generate(tiny_target, drafter, random_prompt(6, 5), tree, 16, eos_token_id=())
    assert len(drafts) > 3
    for seq, step_tree, tokens in drafts:
        for i in range(step_tree.num_nodes):
            parent = [tokens[j] for j in step_tree.node_path(i)[:-1]]
            rank = step_tree.ranks[i]
            want = top_tokens(reference_logits(head, tiny_target, seq, parent), rank + 1)[rank]
            assert tokens[i] == int(want)


def test_one_token_prompt_drafts_nothing_first(tiny_target):
    drafter = EagleDrafter(tiny_target, random_head(tiny_target))
    out = speculative_generate(tiny_target, drafter, random_prompt(3, 1), Tree.chain(3), 10, eos_token_id=())
    assert out.steps[0].num_drafted == 0 and out.steps[1].num_drafted == 3
    assert (
        out.tokens.tolist()
        == autoregressive_generate(tiny_target, random_prompt(3, 1), 10, eos_token_id=()).tokens.tolist()
    )


def test_sampling_refuses_rank_gaps(tiny_target):
    with pytest.raises(ValueError, match="gaps"):
        speculative_generate(
            tiny_target,
            EagleDrafter(tiny_target, random_head(tiny_target)),
            random_prompt(0),
            TREES["gappy"],
            8,
            sampling=SamplingConfig(temperature=1.0),
        )


# ---- EAGLE-2 dynamic trees ------------------------------------------------------------------------


@pytest.mark.parametrize("n, top_k, depth", [(1, 3, 3), (7, 3, 3), (20, 4, 4)])
def test_dynamic_tree_is_the_exact_global_top_n(tiny_target, n, top_k, depth):
    """The level-by-level tree is the top n of the whole top-k tree scored by brute force (each
    node's path run as a plain sequence through the head)."""
    head = random_head(tiny_target, 3)
    prompt = random_prompt(8, 6)
    scores, tokens, frontier = {}, {}, [()]
    for _ in range(depth):
        nxt = []
        for path in frontier:
            logq = torch.log_softmax(
                reference_logits(head, tiny_target, prompt[0], [tokens[path[:d]] for d in range(1, len(path) + 1)]), -1
            )
            top = top_tokens(logq, top_k)
            for r, tok in enumerate(top.tolist()):
                scores[path + (r,)] = scores.get(path, 0.0) + float(logq[tok])
                tokens[path + (r,)] = tok
                nxt.append(path + (r,))
        frontier = nxt
    want = Tree.from_paths(top_n(scores, n))
    drafter = EagleDynamicDrafter(tiny_target, head, n=n, top_k=top_k, max_depth=depth)
    drafter.bind_target_cache(None)
    prefill(tiny_target, new_cache(tiny_target), prompt[:, :-1])
    got = drafter.expand(prompt[0], depth)
    drafter.release()
    assert got.tree == want and got.tokens.tolist() == [tokens[p] for p in want.paths]
    torch.testing.assert_close(got.scores, torch.tensor([scores[p] for p in want.paths]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("n, top_k, depth", [(6, 2, 4), (24, 4, 6)])
def test_dynamic_greedy_output_equals_target(tiny_target, trained, n, top_k, depth):
    for head in (random_head(tiny_target), trained.head):
        drafter = EagleDynamicDrafter(tiny_target, head, n=n, top_k=top_k, max_depth=depth)
        for length in (1, 5):
            prompt = random_prompt(length + 30, length)
            ref = autoregressive_generate(tiny_target, prompt, 20, eos_token_id=())
            out = speculative_generate(tiny_target, drafter, prompt, None, 20, eos_token_id=())
            assert out.tokens.tolist() == ref.tokens.tolist()
            assert all(s.num_drafted <= n and s.tree_depth <= depth for s in out.steps)
            assert max(s.num_drafted for s in out.steps) == n


# ---- lossless under sampling ------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampling_models():
    target = tiny_model(20, vocab=VOCAB, scale=4.0, layers=2, hidden=16)
    prompt = torch.tensor([[3, 5, 4, 6, 3]])
    return target, EagleHead.from_target(target, seed=5).eval(), prompt, target_first_two(target, prompt)


class WrongQDrafter(EagleDrafter):
    """A broken drafter: draws its tokens from q but reports a flattened q (q^(1/3), renormalised)."""

    def draft(self, tokens, tree, sampling, generator=None):
        d = super().draft(tokens, tree, sampling, generator)
        if d.q is None:  # an empty draft (the last token's step)
            return d
        flat = d.q ** (1 / 3)
        return type(d)(d.tokens, flat / flat.sum(-1, keepdim=True).clamp_min(1e-30), d.tree)


@pytest.mark.parametrize("tree", [Tree.chain(3), Tree.kary(2, 6)], ids=["chain", "kary"])
def test_sampled_output_follows_the_target(sampling_models, tree):
    target, head, prompt, exact = sampling_models
    samples = first_two(target, EagleDrafter(target, head), prompt, tree, runs=2500)
    assert chi_square_pvalue(samples, exact) > ALPHA


def test_dynamic_sampled_output_follows_the_target(sampling_models):
    target, head, prompt, exact = sampling_models
    samples = first_two(target, EagleDynamicDrafter(target, head, n=5, top_k=3, max_depth=3), prompt, None, runs=2500)
    assert chi_square_pvalue(samples, exact) > ALPHA


def test_sampling_check_detects_a_broken_rule(sampling_models, monkeypatch):
    target, head, prompt, exact = sampling_models
    monkeypatch.setattr(specnb.core.acceptance, "speculative_accept", broken_accept)
    samples = first_two(target, EagleDrafter(target, head), prompt, Tree.kary(2, 6), runs=2500)
    assert chi_square_pvalue(samples, exact) < ALPHA


def test_sampling_check_detects_a_drafter_misreporting_q(sampling_models):
    target, head, prompt, exact = sampling_models
    samples = first_two(target, WrongQDrafter(target, head), prompt, Tree.kary(2, 6), runs=2500)
    assert chi_square_pvalue(samples, exact) < ALPHA


# ---- the data path: one module, both trainers ----------------------------------------------------


def defined(module) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_both_trainers_use_the_one_distillation_module():
    assert medusa_training.training_split is distillation.training_split is eagle_training.training_split
    assert medusa_training.training_log is distillation.training_log is eagle_training.training_log
    assert medusa_training.heldout_prompts is distillation.heldout_prompts is eagle_training.heldout_prompts
    shared = defined(distillation)
    assert {"distill", "continuations", "sequence_rows", "distill_cached", "training_split", "DistillData"} <= shared
    assert not shared & defined(medusa_training) and not shared & defined(eagle_training), "written twice"


def test_medusa_keeps_its_data_cache_key():
    """Moving the data parameters into DistillConfig left Medusa's data keys as they were."""
    key = medusa_training.TrainConfig(samples=2, max_sampled_prompt=300, distill_bfloat16=True).distill_config().key()
    assert key == {
        "num_heads": 4,
        "max_new_tokens": 128,
        "gen_batch": 16,
        "prompt_rows": False,
        "max_continued_prompt": None,
        "samples": 2,
        "sample_temperature": 0.7,
        "seed": 0,
        "distill_bfloat16": True,
        "sampler": "sample_rows",
        "max_sampled_prompt": 300,
    }


@pytest.mark.parametrize("prompt_rows", [False, True])
def test_rows_carry_segments_positions_and_next_tokens(tiny_target, prompt_rows, tmp_path, monkeypatch):
    """Every row's hidden state is the target's at seq[position] of its segment's sequence, its token
    is seq[position + 1], a segment's positions are consecutive; the cached copy reads back the same."""
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    prompts = [random_prompt(50, 5)[0], random_prompt(51, 7)[0]]
    config = DistillConfig(
        num_heads=2, max_new_tokens=8, gen_batch=2, prompt_rows=prompt_rows, samples=1, sample_temperature=1.5
    )
    data = distill_cached(tiny_target, "tiny", prompts, config, progress=False)
    seqs = [list(p) + list(new) for p, new in data.sequences] + [
        list(data.sequences[j][0]) + list(b) for j, b in data.sampled
    ]
    seen = set()
    for s in torch.unique(data.segment).tolist():
        rows = torch.nonzero(data.segment == s)[:, 0]
        assert rows.tolist() == list(range(int(rows[0]), int(rows[-1]) + 1))  # consecutive rows
        pos = data.position[rows]
        assert pos.tolist() == list(range(int(pos[0]), int(pos[0]) + len(rows)))
        match = [
            i
            for i, q in enumerate(seqs)
            if len(q) > int(pos[-1]) + 1
            and data.token[rows].tolist() == q[int(pos[0]) + 1 : int(pos[-1]) + 2]
            and torch.allclose(data.hidden[rows], last_hidden(tiny_target, torch.tensor(q))[pos], atol=1e-5)
        ]
        assert match, f"segment {s} is no sequence's rows"
        seen.add(match[0])
        assert (int(pos[0]) == 0) == (prompt_rows and bool(data.greedy_rows()[rows[0]]))
    assert len(seen) == len(seqs) == 4
    again = distill_cached(tiny_target, "tiny", prompts, config, progress=False)  # from disk
    for name in ("segment", "position", "token", "hidden", "labels"):
        assert torch.equal(getattr(again, name), getattr(data, name))
    direct_config = DistillConfig(2, 8, gen_batch=2, prompt_rows=prompt_rows, samples=0)
    direct = distill(tiny_target, prompts, direct_config, eos_token_id=-1, progress=False)
    assert torch.equal(direct.token[direct.segment == 0], data.token[data.segment == 0])


# ---- training ----------------------------------------------------------------------------------

PROMPTS = [
    ("p0", "x", random_prompt(20, 4)[0]),
    ("p1", "x", random_prompt(21, 6)[0]),
    ("p2", "y", random_prompt(22, 9)[0]),
    ("p3", "y", random_prompt(23, 5)[0]),
]
MAX_NEW = 20
CONFIG = EagleConfig(
    data=DistillConfig(
        num_heads=2, max_new_tokens=MAX_NEW, gen_batch=4, prompt_rows=True, samples=1, sample_temperature=1.0
    ),
    heldout=0.25,
    epochs=150,
    batch_rows=64,
    lr=3e-3,
    warmup=0.05,
)


@pytest.fixture(scope="module")
def trained(tiny_target, tmp_path_factory):
    """A head fitted to the training prompts' own continuations (memorising: drafts get accepted)."""
    import os

    cache = tmp_path_factory.mktemp("cache")
    before = os.environ.get("SPECNB_CACHE")
    os.environ["SPECNB_CACHE"] = str(cache)
    try:
        out = train_or_load(tiny_target, "tiny", [p for _, _, p in PROMPTS], CONFIG, progress=False, depth=3)
    finally:
        if before is None:
            del os.environ["SPECNB_CACHE"]
        else:
            os.environ["SPECNB_CACHE"] = before
    return out


def test_training_lowers_the_loss_and_caches(trained, tiny_target, tmp_path):
    assert not trained.log["cached"] and trained.log["loss_last"] < 0.3 * trained.log["loss_first"]
    assert trained.heldout_prompts == (0,) and trained.folder.parent.name == "eagle-heads"
    assert (trained.folder / "pytorch_model.bin").is_file()  # EAGLE's published layout (io.eagle_checkpoint)
    acc = trained.accuracy
    assert set(acc["split"]) == {"before", "after"} and set(acc["depth"]) == {1, 2, 3}
    assert (acc["rows"] > 0).all()
    again = train_or_load(
        tiny_target, "tiny", [p for _, _, p in PROMPTS], CONFIG, folder=trained.folder, progress=False
    )
    assert again.log["cached"] and again.log["steps"] == trained.log["steps"]
    for (name, a), (_, b) in zip(trained.head.state_dict().items(), again.head.state_dict().items()):
        assert torch.equal(a, b), name
    assert again.accuracy.equals(trained.accuracy)


def test_trained_head_predicts_its_training_continuations(trained, tiny_target, monkeypatch):
    """On the rows it was trained on, depth-1 top-1 accuracy is high and far above the untrained head's."""
    monkeypatch.setenv("SPECNB_CACHE", str(trained.folder.parent.parent))
    data = distill_cached(tiny_target, "tiny", [p for _, _, p in PROMPTS], CONFIG.data, progress=False)
    rows = torch.nonzero(data.prompt != 0)[:, 0]
    fitted = head_accuracy(trained.head, data, rows, depth=2, ks=(1,))
    fresh = head_accuracy(EagleHead.from_target(tiny_target, seed=9), data, rows, depth=2, ks=(1,))
    assert float(fitted["top_k_accuracy"].iloc[0]) > 0.8
    assert float(fitted["top_k_accuracy"].iloc[0]) > float(fresh["top_k_accuracy"].iloc[0]) + 0.3


def test_chain_ranks_are_the_continuations_ranks(trained, tiny_target, monkeypatch):
    """chain_ranks at a row: the index of the continuation's depth-d token among depth_top_tokens'
    top k there, k when absent, -1 past the segment's end or on prompt text; head_accuracy reads them."""
    monkeypatch.setenv("SPECNB_CACHE", str(trained.folder.parent.parent))
    data = distill_cached(tiny_target, "tiny", [p for _, _, p in PROMPTS], CONFIG.data, progress=False)
    idx = torch.nonzero(data.segment == int(data.segment[data.prompt == 1][0]))[:, 0]  # one segment of prompt 1
    k, depth = 3, 3
    ranks = chain_ranks(trained.head, data, idx, depth, k)
    top = depth_top_tokens(trained.head, data.hidden[idx], data.token[idx], data.position[idx], depth, k)
    plen = len(data.sequences[1][0])
    n = len(idx)
    for i in range(n):
        for d in range(1, depth + 1):
            if i + d >= n or int(data.position[idx[i]]) + 1 + d < plen:
                assert ranks[i, d - 1] == -1
                continue
            hit = (top[d - 1, i] == data.token[idx[i + d]]).nonzero()
            assert ranks[i, d - 1] == (int(hit[0, 0]) if len(hit) else k)
    assert (ranks >= 0).any() and (ranks == -1).any()
    acc = head_accuracy(trained.head, data, idx, depth, ks=(1, k))
    for d in range(1, depth + 1):
        have = ranks[:, d - 1] >= 0
        want = float((ranks[have, d - 1] == 0).float().mean())
        assert acc[(acc["depth"] == d) & (acc["k"] == 1)]["top_k_accuracy"].item() == pytest.approx(want)


def test_depth_accuracy_is_what_a_chain_draft_drafts(trained, tiny_target):
    """depth_top_tokens' depth-d tokens at a row are the greedy chain drafter's depth-d tokens when
    the sequence ends at that row's root: the accuracy table measures what drafting does."""
    _, _, prompt = PROMPTS[1]
    seq = torch.cat([prompt, autoregressive_generate(tiny_target, prompt[None], 12, eos_token_id=()).tokens])
    feats = last_hidden(tiny_target, seq[:-1])
    top = depth_top_tokens(trained.head, feats, seq[1:], torch.arange(len(seq) - 1), 3, 1)[:, :, 0]  # [3, n]
    for root in (len(prompt), len(prompt) + 4, len(seq) - 4):
        want = [int(top[d, root - 1]) for d in range(3)]  # row root - 1 = (f_{root-1}, x_root)
        got = []
        for _ in range(3):
            got.append(int(reference_logits(trained.head, tiny_target, seq[: root + 1], got).argmax()))
        assert got == want


def test_loss_parts_are_eagles(tiny_target):
    """eagle_loss = smooth-L1 to the next feature + 0.1 x cross-entropy against the target's
    distribution there (no noise), checked by hand on one window."""
    head = random_head(tiny_target, 4)
    g = torch.Generator().manual_seed(0)
    n, h = 6, tiny_target.config.hidden_size
    feats, target = torch.randn(1, n, h, generator=g), torch.randn(1, n, h, generator=g)
    tokens, positions = torch.randint(3, 60, (1, n), generator=g), torch.arange(n)[None]
    valid = torch.tensor([[True] * (n - 1) + [False]])
    config = EagleConfig(noise=0.0)
    with torch.no_grad():
        loss, parts = eagle_loss(head, feats, tokens, positions, target, valid, config)
        out = head(feats, tokens, positions, causal_visible(n, 0)[None])[0, : n - 1]
        v = torch.nn.functional.smooth_l1_loss(out, target[0, : n - 1])
        p = torch.softmax(head.project(target[0, : n - 1]), -1)
        ce = -(p * torch.log_softmax(head.project(out), -1)).sum(-1).mean()
    torch.testing.assert_close(loss, v + 0.1 * ce)
    assert parts["vloss"] == pytest.approx(float(v), rel=1e-5) and parts["ploss"] == pytest.approx(float(ce), rel=1e-5)


def test_cross_entropy_on_sampled_rows_is_the_full_one_when_all_are_drawn(tiny_target):
    """ce_rows >= the rows with a target computes the same loss as ce_rows = 0 (all rows); fewer
    rows give the cross-entropy of the drawn rows only (the regression still sees every row)."""
    head = random_head(tiny_target, 6)
    g = torch.Generator().manual_seed(1)
    n, h = 9, tiny_target.config.hidden_size
    args = (
        torch.randn(1, n, h, generator=g),
        torch.randint(3, 60, (1, n), generator=g),
        torch.arange(n)[None],
        torch.randn(1, n, h, generator=g),
        torch.tensor([[True] * (n - 1) + [False]]),
    )
    with torch.no_grad():
        full, parts = eagle_loss(head, *args, EagleConfig(noise=0.0))
        drawn, _ = eagle_loss(head, *args, EagleConfig(noise=0.0, ce_rows=n - 1), torch.Generator().manual_seed(0))
        few, few_parts = eagle_loss(head, *args, EagleConfig(noise=0.0, ce_rows=3), torch.Generator().manual_seed(0))
    torch.testing.assert_close(drawn, full)
    assert few_parts["vloss"] == pytest.approx(parts["vloss"]) and few_parts["ploss"] != pytest.approx(parts["ploss"])


# ---- replay: a collection of the head's ranks answers every static tree -----------------------

REPLAY_TREES = {
    "chain4": Tree.chain(4),
    "kary2x10": Tree.kary(2, 10),
    "sparse12": Tree.sparse(12),
    "gappy": Tree.from_paths([(0,), (2,), (0, 1), (2, 0), (2, 0, 3)]),
    "wide5": Tree.wide(5),
}


@pytest.fixture(scope="module")
def eagle_collection(tiny_target, trained):
    from specnb.analysis.collection import CollectConfig

    return eagle_training.collect_eagle(
        tiny_target,
        trained.head,
        PROMPTS,
        CollectConfig(MAX_NEW, top_k=8, run_tree="sparse:6", eos_token_id=()),
        depth=4,
        progress=False,
    )


@pytest.mark.parametrize("max_new", [MAX_NEW, 11])
def test_replayed_steps_equal_real_steps(tiny_target, trained, eagle_collection, max_new):
    """Every static tree replayed from one EAGLE collection takes the steps a real run takes, step
    for step (accepted count, ranks, depth), rank gaps and a shorter generation included."""
    from specnb.analysis.replay import replay_steps

    accepted = deep = 0
    for name, tree in REPLAY_TREES.items():
        replayed = replay_steps(eagle_collection, tree, max_new_tokens=max_new)
        for pid, _, ids in PROMPTS:
            real = speculative_generate(
                tiny_target, EagleDrafter(tiny_target, trained.head), ids[None], tree, max_new, eos_token_id=()
            )
            assert [step_tuple(s) for s in replayed[pid]] == [step_tuple(s) for s in real.steps], (name, pid)
            accepted += sum(s.num_accepted for s in real.steps)
            deep += sum(s.num_accepted >= 2 for s in real.steps)
    assert accepted > 40 and deep > 5  # drafts are accepted, beyond depth 1 too: the comparison is not vacuous
    for p in eagle_collection.prompts:  # the collection's own run
        run = replay_steps(eagle_collection, Tree.sparse(6))[p.prompt_id]
        assert [(s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in run] == [
            tuple(r) for r in p.run_steps.tolist()
        ]


def test_depth_ranks_follow_the_continuation_not_a_shift(eagle_collection):
    """An EAGLE head's depth-d rank at step t is not its depth-1 rank at step t + d - 1 (the chain
    reads predicted features, not the target's): the collection stores them per depth."""
    import numpy as np

    differ = sum(
        int((p.head_ranks[: len(p.tokens) - 1, 1] != p.head_ranks[1:, 0]).sum()) for p in eagle_collection.prompts
    )
    assert differ > 0
    assert all(
        p.head_ranks.shape == (len(p.tokens), 4) and p.head_ranks.dtype == np.int16 for p in eagle_collection.prompts
    )


def test_replay_refuses_a_tree_deeper_than_the_collection(eagle_collection):
    from specnb.analysis.replay import replay

    with pytest.raises(ValueError, match="depth 5 on a head collection of depth 4"):
        replay(eagle_collection, {("chain", 5): Tree.chain(5)})


@pytest.fixture(scope="module")
def eagle_dynamic_collection(tiny_target, trained):
    from specnb.analysis.collection import CollectConfig

    return eagle_training.collect_eagle(
        tiny_target,
        trained.head,
        PROMPTS,
        CollectConfig(MAX_NEW, top_k=8, run_tree="sparse:6", eos_token_id=(), super_k=3, super_size=12),
        depth=4,
        progress=False,
    )


@pytest.mark.parametrize("budget", [1, 5, 12])
@pytest.mark.parametrize("max_new", [MAX_NEW, 9])
def test_redrafted_dynamic_trees_replay_real_dynamic_runs(
    tiny_target, trained, eagle_dynamic_collection, budget, max_new
):
    """EAGLE-2's trees re-drafted at every position from one collection (the largest budget, 12)
    replay every smaller budget step for step as real EagleDynamicDrafter runs take them."""
    from specnb.analysis.replay import replay_dynamic, replay_steps

    c = eagle_dynamic_collection
    assert c.has_super_trees and c.config.super_size == 12
    replayed = replay_steps(c, budget, max_new_tokens=max_new)
    accepted = 0
    for pid, _, ids in PROMPTS:
        drafter = EagleDynamicDrafter(tiny_target, trained.head, n=budget, top_k=3, max_depth=4)
        real = speculative_generate(tiny_target, drafter, ids[None], None, max_new, eos_token_id=())
        assert [step_tuple(s) for s in replayed[pid]] == [step_tuple(s) for s in real.steps], pid
        accepted += sum(s.num_accepted for s in real.steps)
    assert accepted > (5 if budget > 1 else 0)
    table = replay_dynamic(c, [budget], mode="trajectory", max_new_tokens=max_new).iloc[0]
    assert table["steps"] == sum(len(v) for v in replayed.values())
