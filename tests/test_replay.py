"""Collect once, replay many: replayed steps equal real `speculative_generate` steps one by one
(greedy, static and dynamic trees, EOS and shorter generations, tiny models and SmolLM2), all
positions agree with the trajectory, the hindsight tree beats every static shape, an interrupted
collection resumes, and sampled replay agrees with real sampled runs within a stated significance
level (and rejects a wrong acceptance rule)."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import random_prompt, step_tuple, tiny_model
from stats import ALPHA
from test_generation import TREES  # chain, k-ary, wide, beams, sparse and a Medusa tree with rank gaps

import specnb.experiments.collect as collect_module
from specnb import Tree, autoregressive_generate, speculative_generate, summarize
from specnb.analysis.collection import LEGACY_UNITS_FILE, PARAMS_FILE, CollectConfig, Collection, units_of
from specnb.analysis.replay import (
    acceptance_vector,
    dynamic_tree,
    oracle,
    position_table,
    prefix_counts,
    replay,
    replay_dynamic,
    replay_sglang,
    replay_steps,
    sampled_accepted,
    sglang_flags,
    sglang_tree,
    trtllm_flags,
)
from specnb.analysis.tree_design import hindsight_trees, prefix_value, sequoia_trees
from specnb.core.drafting import ModelDrafter
from specnb.core.sampling import SamplingConfig
from specnb.drafters.methods import trees_for
from specnb.experiments.collect import collect
from specnb.io.models import truncate_layers
from specnb.io.tree_spec import parse_custom_trees

MAX_NEW = 24


def sequoia(collection, budgets):
    """Sequoia's DP trees for the collection's measured acceptance vector, per budget."""
    trees = sequoia_trees(acceptance_vector(collection), max(budgets))
    return {n: trees[n] for n in budgets}


PROMPTS = {f"p{i}": random_prompt(10 + i, length=6 + i) for i in range(3)}


@pytest.fixture(scope="module")
def drafts(tiny_target, tiny_draft):
    """A draft that agrees with the target at rank 0 about half the time (its first layer), one that
    agrees with everything (itself) and one that agrees with almost nothing."""
    return {"early": truncate_layers(copy.deepcopy(tiny_target), 1), "self": tiny_target, "random": tiny_draft}


@pytest.fixture(scope="module")
def collections(tmp_path_factory, tiny_target, drafts):
    root = tmp_path_factory.mktemp("collections")
    config = CollectConfig(max_new_tokens=MAX_NEW, eos_token_id=(), top_k=12)
    return {name: collect(root / name, tiny_target, d, PROMPTS, config) for name, d in drafts.items()}


def real_runs(target, draft, tree, max_new=MAX_NEW, eos=()):
    return {
        pid: speculative_generate(target, draft, ids, tree=tree, max_new_tokens=max_new, eos_token_id=eos)
        for pid, ids in PROMPTS.items()
    }


def assert_same_steps(replayed, real):
    for pid, result in real.items():
        assert [step_tuple(s) for s in replayed[pid]] == [step_tuple(s) for s in result.steps], pid


def assert_row_equals_summary(row, summary):
    assert row["steps"] == summary.num_steps and row["accepted"] == summary.num_accepted
    assert row["tau"] == pytest.approx(summary.tau) and row["acceptance_length"] == pytest.approx(
        summary.acceptance_length
    )
    assert row["acceptance_rate"] == pytest.approx(summary.acceptance_rate, nan_ok=True)
    for d, v in enumerate(summary.depth_acceptance, 1):
        assert row[f"depth_{d}_acceptance"] == pytest.approx(v)
    for r, v in enumerate(summary.rank_acceptance):
        assert row[f"rank_{r}_acceptance"] == pytest.approx(v)


@pytest.mark.parametrize("draft_name", ["early", "self", "random"])
@pytest.mark.parametrize("tree_name", list(TREES))
def test_trajectory_steps_equal_real_runs(tiny_target, drafts, collections, draft_name, tree_name):
    tree = TREES[tree_name]
    real = real_runs(tiny_target, drafts[draft_name], tree)
    assert_same_steps(replay_steps(collections[draft_name], tree), real)
    row = replay(collections[draft_name], {(tree_name, tree.num_nodes): tree}, mode="trajectory").iloc[0]
    assert_row_equals_summary(row, summarize(list(real.values())))


@pytest.mark.parametrize("draft_name", ["early", "random"])
def test_a_custom_tree_replays_as_a_real_run_of_it(tiny_target, drafts, collections, draft_name):
    """A tree the user writes is swept beside the presets (at its node count) and its replayed
    steps equal a real greedy `speculative_generate` run with it."""
    custom = parse_custom_trees(
        {"mine": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], "two_one": {"branching": [2, 1]}}
    )
    trees = trees_for(["chain"], [4], custom)
    assert set(trees) == {("chain", 4), ("chain", 6), ("mine", 6), ("two_one", 4)}
    table = replay(collections[draft_name], trees, mode="trajectory").set_index(["shape", "budget"])
    for name, tree in custom.items():
        real = real_runs(tiny_target, drafts[draft_name], tree)
        assert_same_steps(replay_steps(collections[draft_name], tree), real)
        assert_row_equals_summary(table.loc[(name, tree.num_nodes)], summarize(list(real.values())))


@pytest.mark.parametrize("draft_name", ["early", "self", "random"])
def test_the_collection_run_is_stored_and_replays_exactly(collections, draft_name):
    """The continuation's own run (chain:4) is a real run: its stored steps equal the replay."""
    c = collections[draft_name]
    replayed = replay_steps(c, c.config.run)
    for p in c.prompts:
        assert p.run_steps.shape[1] == 4 and len(p.run_steps) > 0
        assert [tuple(int(x) for x in row) for row in p.run_steps] == [
            (s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in replayed[p.prompt_id]
        ]


def test_continuation_is_the_target_greedy_output(tiny_target, collections):
    for pid, ids in PROMPTS.items():
        reference = autoregressive_generate(tiny_target, ids, max_new_tokens=MAX_NEW, eos_token_id=()).tokens.tolist()
        for c in collections.values():
            assert next(p for p in c.prompts if p.prompt_id == pid).tokens.tolist() == reference


def test_data_driven_trees_replay_exactly_and_the_ceiling_beats_every_shape(tiny_target, drafts, collections):
    c = collections["early"]
    acc = acceptance_vector(c)
    assert sum(acc) <= 1 and acc[0] > 0.3
    designed = {("sequoia", n): t for n, t in sequoia(c, [6, 12]).items()}
    designed |= {("hindsight", n): t for n, t in hindsight_trees(prefix_counts(c), [6, 12]).items()}
    for tree in designed.values():
        assert_same_steps(replay_steps(c, tree), real_runs(tiny_target, drafts["early"], tree))
    counts = prefix_counts(c)
    shapes = {
        (s, n): Tree.preset(s, n) for s in ("chain", "wide", "sparse", "kary2", "kary3", "beams2") for n in (6, 12)
    }
    table = replay(c, designed | shapes, mode="all").set_index(["shape", "budget"])
    for n in (6, 12):
        best = table.loc[("hindsight", n), "accepted"]
        assert best == prefix_value(designed[("hindsight", n)], counts)  # sum of counts = replayed acceptance
        assert all(
            best >= table.loc[(s, n), "accepted"]
            for s in ("chain", "wide", "sparse", "kary2", "kary3", "beams2", "sequoia")
        )


def test_eos_and_shorter_generations_replay_exactly(tmp_path, tiny_target, drafts, collections):
    draft = drafts["early"]
    # a shorter generation replayed from the 24-token collection
    for tree in (TREES["chain4"], TREES["sparse16"]):
        assert_same_steps(
            replay_steps(collections["early"], tree, max_new_tokens=13), real_runs(tiny_target, draft, tree, 13)
        )
    # EOS: a token the continuation reaches mid-way ends every run there
    eos = int(collections["early"].prompts[0].tokens[9])
    c = collect(
        tmp_path / "eos", tiny_target, draft, PROMPTS, CollectConfig(max_new_tokens=MAX_NEW, eos_token_id=(eos,))
    )
    assert c.prompts[0].stopped and len(c.prompts[0].tokens) <= 10
    for tree in (TREES["chain4"], TREES["kary2x10"], Tree.chain(9)):
        assert_same_steps(replay_steps(c, tree), real_runs(tiny_target, draft, tree, eos=eos))


def test_all_positions_agree_with_the_trajectory(collections):
    c = collections["early"]
    tree = TREES["sparse16"]
    table = position_table(c, tree)
    assert len(table) == sum(len(p.tokens) for p in c.prompts)
    steps = replay_steps(c, tree)
    for pid, group in table.groupby("prompt_id"):
        visited = group[group["on_trajectory"]]
        assert visited["position"].tolist() == [s.position for s in steps[pid]]
        assert visited["accepted"].tolist() == [s.num_accepted for s in steps[pid]]
    row = replay(c, {("sparse", 16): tree}, mode="all").iloc[0]
    assert row["steps"] == len(table) and row["accepted"] == table["accepted"].sum()
    # one node of rank 0: accepted exactly where the next token is the draft's top-1, except at the
    # last position of each prompt, where the real loop drafts nothing
    ranks = np.concatenate([p.ranks[:-1] for p in c.prompts])
    assert replay(c, {("chain", 1): Tree.chain(1)}).iloc[0]["accepted"] == (ranks == 0).sum()


def test_collection_resumes_after_an_interruption(tmp_path, monkeypatch, tiny_target, drafts):
    config = CollectConfig(max_new_tokens=8, eos_token_id=(), super_k=2, super_depth=2, super_size=4)
    fresh = collect(tmp_path / "fresh", tiny_target, drafts["early"], PROMPTS, config)
    folder = tmp_path / "resumed"
    first = dict(list(PROMPTS.items())[:1])
    collect(folder, tiny_target, drafts["early"], first, config)
    names = [u.name for u in units_of(PROMPTS, config)]
    (folder / f".{names[1]}.0123456789ab.tmp").write_bytes(b"half a file")  # killed while writing p1's file
    calls = []
    original = collect_module.collect_prompt
    monkeypatch.setattr(collect_module, "collect_prompt", lambda *a, **k: calls.append(a[3]) or original(*a, **k))
    resumed = collect(folder, tiny_target, drafts["early"], PROMPTS, config)
    assert calls == ["p1", "p2"], "finished prompts are never collected twice"
    assert (
        sorted(p.name for p in folder.glob("*.npz"))
        == sorted(names)
        == sorted(p.name for p in (tmp_path / "fresh").glob("*.npz"))
    )
    assert (
        resumed.config == fresh.config
        and json.loads((folder / "collection.json").read_text())["config"]["super_k"] == 2
    )
    for a, b in zip(resumed.prompts, fresh.prompts):
        assert a.prompt_id == b.prompt_id and a.arrays().keys() == b.arrays().keys()
        for k in a.arrays():
            np.testing.assert_array_equal(a.arrays()[k], b.arrays()[k], err_msg=k)
    assert Collection.load(folder, ["p2"]).prompts[0].prompt_id == "p2"
    assert [p.prompt_id for p in Collection.load(folder).prompts] == ["p0", "p1", "p2"]
    with pytest.raises(ValueError, match="other parameters"):
        collect(folder, tiny_target, drafts["early"], PROMPTS, CollectConfig(max_new_tokens=9, eos_token_id=()))
    # a changed prompt is a new unit (a new file), never the old one's data
    changed = {"p0": torch.cat([PROMPTS["p0"], PROMPTS["p0"][:, :1]], dim=1)}
    collect(folder, tiny_target, drafts["early"], changed, config)
    assert len(list(folder.glob("*.npz"))) == 4
    with pytest.raises(ValueError, match="collected twice"):
        Collection.load(folder, ["p0"])


def test_a_collection_of_the_earlier_layout_still_loads(tmp_path, tiny_target, drafts, collections):
    """The layout before per-unit records: prompts.jsonl (a Sweep line per prompt) beside the .npz."""
    from specnb.io.storage import Sweep, write_arrays, write_json

    c = collections["early"]
    folder = tmp_path / "old"
    write_json(folder / PARAMS_FILE, json.loads((c.folder / PARAMS_FILE).read_text()))
    units = Sweep(folder / LEGACY_UNITS_FILE, ("prompt_id",))
    for i, p in enumerate(c.prompts):
        write_arrays(folder / f"{p.prompt_id}-{i:08x}.npz", p.arrays())
        units.add(
            {"prompt_id": p.prompt_id},
            [],
            meta={
                "category": p.category,
                "file": f"{p.prompt_id}-{i:08x}.npz",
                "stopped": p.stopped,
                **{f"{k}_s": v for k, v in p.times.items()},
            },
        )
    old = Collection.load(folder)
    assert [p.prompt_id for p in old.prompts] == [p.prompt_id for p in c.prompts] and old.config == c.config
    assert replay(old, {("chain", 4): TREES["chain4"]}).equals(replay(c, {("chain", 4): TREES["chain4"]}))
    with pytest.raises(ValueError, match="earlier layout"):
        collect(folder, tiny_target, drafts["early"], PROMPTS, c.config)


@pytest.fixture(scope="module")
def super_collection(tmp_path_factory, tiny_target, drafts):
    config = CollectConfig(
        max_new_tokens=16, eos_token_id=(), top_k=8, super_k=3, super_depth=3, super_size=9, super_chunk=5
    )
    return collect(tmp_path_factory.mktemp("super"), tiny_target, drafts["early"], PROMPTS, config)


@torch.inference_mode()
def brute_force_top(draft, seq, k, depth, size):
    """Every node of the draft's top-k expansion to `depth`, each scored by a plain forward over
    the sequence and its path; the top `size` in (score desc, depth, path) order."""
    nodes = []
    frontier = [((), [], 0.0)]
    for _ in range(depth):
        grown = []
        for path, toks, score in frontier:
            ids = torch.tensor([seq + toks])
            logp = torch.log_softmax(draft(input_ids=ids).logits[0, -1].float(), -1)
            top = torch.topk(logp, k)
            for r, (v, x) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                grown.append((path + (r,), toks + [x], score + v))
        nodes += grown
        frontier = grown
    nodes.sort(key=lambda n: (-n[2], len(n[0]), n[0]))
    return nodes[:size]


def test_super_trees_equal_brute_force_and_the_real_drafter(drafts, super_collection):
    c, draft = super_collection, drafts["early"]
    p = c.prompts[1]
    for t in (0, 7, 15):
        seq = p.prompt.tolist() + p.tokens[:t].tolist()
        expect = brute_force_top(draft, seq, 3, 3, 9)
        tree, tokens = dynamic_tree(c, p.prompt_id, t, 9)
        got = {path: tok for path, tok in zip(tree.paths, tokens)}
        assert got == {path: toks[-1] for path, toks, _ in expect}
        scores = sorted(p.super_score[t].tolist(), reverse=True)
        assert scores == pytest.approx([s for *_, s in expect], abs=1e-4)
        # the library's own drafter puts the same tokens on that tree
        drafted = ModelDrafter(draft).draft(torch.tensor([seq]), tree, SamplingConfig(), None)
        assert drafted.tokens.tolist() == tokens


def test_super_trees_feed_only_the_final_trees_off_path_nodes(
    tmp_path, monkeypatch, tiny_target, drafts, super_collection
):
    """Best first: the draft is fed exactly the off-path nodes of each final top-M that are not at
    the last depth (their children were needed), never a node the pruning drops; the same trees
    whatever the chunk of positions grown together."""
    fed = []
    real = collect_module.forward

    def counting(model, cache, ids, *rest, **kw):
        if rest:  # positions and a mask: super-tree nodes (the teacher-forced forward passes neither)
            fed.append(len(ids))
        return real(model, cache, ids, *rest, **kw)

    monkeypatch.setattr(collect_module, "forward", counting)
    config = dataclasses.replace(super_collection.config, super_chunk=3)
    c = collect(tmp_path, tiny_target, drafts["early"], PROMPTS, config)
    expected = 0
    for p, q in zip(c.prompts, super_collection.prompts):
        for t in range(len(p.tokens)):
            n = int(p.super_size[t])
            on_path = {int(i) for i in p.super_on_path[t] if i >= 0}
            expected += sum(1 for i in range(n) if i not in on_path and p.super_depth[t, i] < config.super_depth)
            for name in ("super_size", "super_token", "super_parent", "super_rank", "super_depth"):
                assert np.array_equal(getattr(p, name)[t], getattr(q, name)[t]), (p.prompt_id, t, name)
    assert sum(fed) == expected and max(fed) <= 3


@pytest.mark.parametrize("budget", [4, 9])
def test_dynamic_trees_replay_equals_real_steps(tiny_target, drafts, super_collection, budget):
    """At every step the replay says a real run visits, a real step with that position's dynamic
    tree accepts what the replay says."""
    c = super_collection
    steps = replay_steps(c, budget)
    for p in c.prompts:
        for s in steps[p.prompt_id]:
            tree, _ = dynamic_tree(c, p.prompt_id, s.position, budget)
            seq = torch.tensor([p.prompt.tolist() + p.tokens[: s.position].tolist()])
            real = speculative_generate(
                tiny_target,
                drafts["early"],
                seq,
                tree=tree,
                max_new_tokens=c.config.max_new_tokens - s.position,
                eos_token_id=(),
            )
            assert step_tuple(real.steps[0])[1:] == step_tuple(s)[1:], (p.prompt_id, s.position)
    dyn = replay_dynamic(c, [budget], mode="all").iloc[0]
    orc = oracle(c, [budget], mode="all").iloc[0]
    assert dyn["accepted"] <= orc["accepted"] and orc["acceptance_length"] <= budget
    top = position_table(c, budget)
    assert top["accepted"].sum() == dyn["accepted"]
    assert replay_dynamic(c, [budget], mode="trajectory").iloc[0]["steps"] == sum(len(v) for v in steps.values())


@pytest.mark.parametrize("k", [None, 1, 3])
def test_oracle_is_the_longest_prefix_of_ranks_below_k(super_collection, k):
    c = super_collection
    limit = c.config.top_k if k is None else k
    for n in (1, 2, 5, 9):
        expected = 0
        for p in c.prompts:
            for t in range(len(p.tokens)):
                cap = min(n, c.config.max_new_tokens - t - 1)
                path = p.ranks[t : t + cap]
                expected += next((i for i, r in enumerate(path) if r >= limit), len(path))
        row = oracle(c, [n], k=k).iloc[0]
        assert row["accepted"] == expected and row["top_k"] == limit
    with pytest.raises(ValueError, match="rank limit"):
        oracle(c, [2], k=c.config.top_k + 1)


@pytest.mark.parametrize("budget", [2, 4, 9])
def test_oracle_bounds_every_tree_of_its_budget(super_collection, budget):
    """No static tree (the hindsight one is the best of them) and no dynamic tree accepts more."""
    c = super_collection
    orc = oracle(c, [budget], mode="all").iloc[0]["accepted"]
    best_static = hindsight_trees(prefix_counts(c), [budget])[budget]
    assert replay(c, {("hindsight", budget): best_static}, mode="all").iloc[0]["accepted"] <= orc
    assert replay_dynamic(c, [budget], mode="all").iloc[0]["accepted"] <= orc


def test_super_trees_on_a_subset_replay_dynamic_trees_on_that_subset(tmp_path, tiny_target, drafts, super_collection):
    """Super-trees collected for some prompts only: the subset's arrays equal a full collection's,
    dynamic rows and steps come from the subset alone, static rows from every prompt; another
    subset on resume is refused."""
    config = super_collection.config
    c = collect(tmp_path / "c", tiny_target, drafts["early"], PROMPTS, config, describe={"super_prompts": ["p0", "p2"]})
    assert [p.super_size is not None for p in c.prompts] == [True, False, True]
    sub = c.super_tree_prompts()
    assert [p.prompt_id for p in sub.prompts] == ["p0", "p2"]
    for mine, full in zip(sub.prompts, [super_collection.prompts[0], super_collection.prompts[2]]):
        for k, v in full.arrays().items():
            np.testing.assert_array_equal(mine.arrays()[k], v, err_msg=k)
    only = Collection.load(super_collection.folder, ["p0", "p2"])
    dyn, expect = replay_dynamic(c, [4]).iloc[0], replay_dynamic(only, [4]).iloc[0]
    assert dyn["prompts"] == 2 and (dyn["accepted"], dyn["steps"]) == (expect["accepted"], expect["steps"])
    assert set(replay_steps(c, 4)) == {"p0", "p2"}
    assert replay(c, {("chain", 3): Tree.chain(3)}).iloc[0]["prompts"] == 3
    with pytest.raises(ValueError, match="other parameters"):
        collect(tmp_path / "c", tiny_target, drafts["early"], PROMPTS, config, describe={"super_prompts": ["p0"]})
    with pytest.raises(ValueError, match="not collected"):
        collect(tmp_path / "d", tiny_target, drafts["early"], PROMPTS, config, describe={"super_prompts": ["p9"]})


def test_pooled_rows_carry_intervals_across_prompts(collections):
    """tau and acceptance rate with the bootstrap interval over the prompts' own sums: the pooled
    value inside it, and its ends equal `spread.ratio_interval` of the per-prompt rows."""
    from specnb.analysis.spread import ratio_interval

    c = collections["early"]
    tree = {("kary2", 6): Tree.kary(2, 6)}
    row = replay(c, tree, mode="trajectory").iloc[0]
    per = replay(c, tree, mode="trajectory", per_prompt=True)
    assert row["tau_ci_low"] <= row["tau"] <= row["tau_ci_high"]
    assert (row["tau_ci_low"], row["tau_ci_high"]) == ratio_interval(per["tokens"], per["steps"])
    assert (row["acceptance_rate_ci_low"], row["acceptance_rate_ci_high"]) == ratio_interval(
        per["accepted"], per["drafted"]
    )


def test_replay_refuses_what_it_cannot_replay(collections, super_collection):
    with pytest.raises(ValueError, match="rank"):
        replay(collections["early"], {("wide", 13): Tree.wide(13)})  # ranks stored below top_k = 12 only
    with pytest.raises(ValueError, match="super-tree"):
        replay_dynamic(collections["early"], [4])
    with pytest.raises(ValueError, match="exceeds"):
        replay_dynamic(super_collection, [10])
    with pytest.raises(ValueError, match="mode"):
        replay(collections["early"], {("chain", 2): Tree.chain(2)}, mode="some")
    with pytest.raises(ValueError, match="cannot replay"):
        replay(collections["early"], {("chain", 2): Tree.chain(2)}, max_new_tokens=MAX_NEW + 1)


# ---- sampling ----------------------------------------------------------------------------------

SAMPLED_CASES = [("p0", "kary3x12", Tree.kary(3, 12)), ("p1", "wide3", Tree.wide(3))]
REAL_RUNS = 150


@pytest.fixture(scope="module")
def sampling_pair():
    """Smoother models than the greedy fixtures, so acceptance is neither ~0 nor ~1."""
    return tiny_model(0, scale=10.0), tiny_model(1, scale=10.0, layers=1)


@pytest.fixture(scope="module")
def real_sampled(sampling_pair):
    """Accepted draft tokens of the first step of many real sampled runs (temperature 1, one seed
    each), per case."""
    target, draft = sampling_pair
    out = {}
    for pid, name, tree in SAMPLED_CASES:
        out[name] = np.array(
            [
                speculative_generate(
                    target,
                    draft,
                    PROMPTS[pid],
                    tree=tree,
                    max_new_tokens=tree.depth + 1,
                    eos_token_id=(),
                    sampling=SamplingConfig(temperature=1.0, seed=seed),
                )
                .steps[0]
                .num_accepted
                for seed in range(REAL_RUNS)
            ]
        )
    return out


def sampled_z(collection, real):
    """z of replayed minus real mean accepted length at each case's prompt (position 0)."""
    zs = {}
    first = {
        p.prompt_id: int(sum(len(q.tokens) for q in collection.prompts[:i])) for i, p in enumerate(collection.prompts)
    }
    for pid, name, tree in SAMPLED_CASES:
        per_sample = sampled_accepted(collection, tree)[first[pid]]  # [R] at position 0
        se = np.sqrt(per_sample.var(ddof=1) / len(per_sample) + real[name].var(ddof=1) / len(real[name]))
        zs[name] = (per_sample.mean() - real[name].mean()) / se
    return zs


def sampled_collection(folder, pair):
    config = CollectConfig(
        max_new_tokens=3, eos_token_id=(), temperature=1.0, samples=300, sample_chunk=300, cover_tree="kary3:12"
    )
    return collect(folder, *pair, {pid: PROMPTS[pid] for pid, _, _ in SAMPLED_CASES}, config)


def test_sampled_replay_agrees_with_real_sampled_runs(tmp_path, monkeypatch, sampling_pair, real_sampled):
    from scipy import stats

    bound = stats.norm.ppf(1 - ALPHA / 2)
    c = sampled_collection(tmp_path / "good", sampling_pair)
    zs = sampled_z(c, real_sampled)
    assert all(abs(z) < bound for z in zs.values()), zs
    row = replay(c, {("kary3", 12): Tree.kary(3, 12)}).iloc[0]
    assert row["tau_position_ci_low"] < row["tau"] < row["tau_position_ci_high"] and 1 < row["tau"] < 3
    assert row["accepted"] == pytest.approx(sum(sampled_accepted(c, Tree.kary(3, 12)).mean(1)))
    with pytest.raises(ValueError, match="all positions"):
        replay(c, {("chain", 2): Tree.chain(2)}, mode="trajectory")

    def no_residuals(p, q, children):
        """Wrong: every child checked against the original p and q, as if drawn independently."""
        rows = torch.arange(children.shape[0])[:, None]
        x = children.clamp_min(0)
        return torch.where(children >= 0, (p[rows, x] / q[rows, x].clamp_min(1e-30)).clamp(max=1.0), 0.0), p

    monkeypatch.setattr(collect_module, "sibling_alphas", no_residuals)
    wrong = sampled_z(sampled_collection(tmp_path / "wrong", sampling_pair), real_sampled)
    assert max(abs(z) for z in wrong.values()) > bound, wrong


# ---- a real model ------------------------------------------------------------------------------


@pytest.mark.slow
def test_trajectory_steps_equal_real_runs_smollm2(tmp_path, smollm2):
    """SmolLM2-135M (float32) with its first 8 layers as the draft: the teacher-forced ranks give
    the real runs' steps exactly."""
    from specnb.io.models import prompt_ids
    from specnb.io.prompts import BUILTIN

    model, tokenizer = smollm2
    early = truncate_layers(copy.deepcopy(model), 8)
    prompts = {p.id: prompt_ids(tokenizer, p.text) for p in BUILTIN[:2]}
    c = collect(tmp_path / "smol", model, early, prompts, CollectConfig(max_new_tokens=24))
    trees = {"chain4": Tree.chain(4), "sparse12": Tree.sparse(12), "sequoia8": sequoia(c, [8])[8]}
    for name, tree in trees.items():
        steps = replay_steps(c, tree)
        for pid, ids in prompts.items():
            real = speculative_generate(model, early, ids, tree=tree, max_new_tokens=24)
            assert [step_tuple(s) for s in real.steps] == [step_tuple(s) for s in steps[pid]], (name, pid)


@pytest.mark.parametrize("budget", [4, 9])
def test_dynamic_replay_equals_the_dynamic_drafter(tiny_target, drafts, super_collection, budget):
    """The library's DynamicTreeDrafter (one definition: top n by cumulative log q, ties canonical)
    run end to end makes the steps the replay of the super-trees says, one by one."""
    from specnb.drafters.dynamic import DynamicTreeDrafter

    c = super_collection
    replayed = replay_steps(c, budget)
    drafter = DynamicTreeDrafter(drafts["early"], n=budget, top_k=c.config.super_k, max_depth=c.config.super_depth)
    compared = 0
    for p in c.prompts:
        real = speculative_generate(
            tiny_target,
            drafter,
            torch.tensor([p.prompt.tolist()]),
            max_new_tokens=c.config.max_new_tokens,
            eos_token_id=(),
        )
        assert real.tokens.tolist() == p.tokens.tolist()
        assert [step_tuple(s) for s in real.steps] == [step_tuple(s) for s in replayed[p.prompt_id]]
        compared += len(real.steps)
    assert compared > 10


# ---- SGLang's tree rule replayed (analysis.replay.sglang_pool, sglang_tree, replay_sglang) ----

SGLANG_FLAGS = [(2, 2, 3), (3, 2, 4), (2, 1, 2), (3, 2, 6)]  # (num-steps, topk, budget = num-draft-tokens - 1)


@torch.inference_mode()
def brute_force_sglang(draft, seq, steps, topk, budget):
    """SGLang's EAGLE tree built as its code builds it (python/sglang/srt/speculative/eagle_utils.py,
    select_top_k_tokens and organize_draft_results, commit 003ddbc), one plain draft forward per node:
    the root's top-k with their probabilities; then num-steps - 1 times every frontier node's top-k
    children scored by the product of probabilities, all of them added to the pool and the k best
    kept as the next frontier; the budget best of the pool verified. Ties broken as specnb's order."""

    def top(tokens):
        p = torch.softmax(draft(input_ids=torch.tensor([seq + tokens])).logits[0, -1].float(), -1)
        v, x = torch.topk(p, topk)
        return v.tolist(), x.tolist()

    order = lambda c: (-c[0], len(c[1]), c[1])  # noqa: E731
    v, x = top([])
    frontier = [(v[r], (r,), [x[r]]) for r in range(topk)]
    pool = list(frontier)
    for _ in range(steps - 1):
        grown = []
        for score, path, tokens in frontier:
            v, x = top(tokens)
            grown += [(score * v[r], path + (r,), tokens + [x[r]]) for r in range(topk)]
        pool += grown
        frontier = sorted(grown, key=order)[:topk]
    return {path: tokens[-1] for _, path, tokens in sorted(pool, key=order)[:budget]}


def test_sglang_trees_equal_sglangs_own_rule_run_on_the_draft(drafts, super_collection):
    """At several positions and flags, the tree read from the collected super-tree is the one SGLang's
    rule builds from the draft model itself, token for token; where the 9-node super-tree holds fewer
    of its nodes than are verified, what it holds is part of that tree."""
    c, draft = super_collection, drafts["early"]
    p = c.prompts[1]
    compared = partial = 0
    for steps, topk, budget in SGLANG_FLAGS:
        for t in (0, 5, 11):
            seq = p.prompt.tolist() + p.tokens[:t].tolist()
            tree, tokens = sglang_tree(c, p.prompt_id, t, steps, topk, budget)
            expect = brute_force_sglang(draft, seq, steps, topk, budget)
            assert tree.num_nodes == budget and dict(zip(tree.paths, tokens)) == expect, (steps, topk, budget, t)
            compared += 1
    assert compared == 12
    pruned = prune_super_trees(c, 4)  # a super-tree of 4 nodes holds part of the pool only
    for steps, topk, budget in SGLANG_FLAGS:
        for t in (0, 5, 11):
            tree, tokens = sglang_tree(pruned, p.prompt_id, t, steps, topk, budget)
            assert (
                dict(zip(tree.paths, tokens)).items()
                <= brute_force_sglang(draft, p.prompt.tolist() + p.tokens[:t].tolist(), steps, topk, budget).items()
            )
            partial += tree.num_nodes < budget
    assert partial >= 3


def prune_super_trees(c, size):
    """The collection with each position's super-tree cut to its `size` best nodes, as if collected so."""
    prompts = []
    for p in c.prompts:
        on = p.super_on_path.astype(np.int64)
        prompts.append(
            dataclasses.replace(
                p,
                super_size=np.minimum(p.super_size, size).astype(p.super_size.dtype),
                **{
                    f"super_{n}": getattr(p, f"super_{n}")[:, :size]
                    for n in ("parent", "rank", "depth", "token", "score")
                },
                super_on_path=np.where(on < size, on, size).astype(p.super_on_path.dtype),
            )
        )
    return dataclasses.replace(c, config=dataclasses.replace(c.config, super_size=size), prompts=tuple(prompts))


def test_pruned_super_trees_replay_sglang_exactly_or_refuse(super_collection):
    """Cut to 4 nodes, the super-trees still replay every flag setting they can decide with the full
    ones' values, and refuse, saying why, the ones where the continuation's node is missing but may
    be verified."""
    full, pruned = super_collection, prune_super_trees(super_collection, 4)
    flags = [(2, 2, 3), (3, 2, 4), (2, 2, 4), (3, 2, 5)]
    exact, cut = replay_sglang(full, flags, mode="all"), replay_sglang(pruned, flags, mode="all")
    assert not exact.attrs["skipped"] and len(cut.attrs["skipped"]) >= 1
    assert all("lack the continuation's node" in why for why in cut.attrs["skipped"])
    assert len(cut) >= 1
    for r in cut.itertuples():
        assert r.accepted == exact.set_index(["shape", "budget"]).loc[(r.shape, r.budget), "accepted"]


def test_sglang_replay_equals_real_steps_with_sglangs_own_trees(tiny_target, drafts, super_collection):
    """Every position: a real speculative step with the tree SGLang's rule builds from the draft model
    accepts what the replay counts, summed over positions, for every flag setting the replay does not
    refuse; the ones it refuses are those where the super-trees cannot tell."""
    c = super_collection
    flags = [(2, 2, 3), (2, 1, 2), (3, 2, 4), (3, 2, 6)]
    rows = replay_sglang(c, flags, mode="all")
    assert len(rows) + len(rows.attrs["skipped"]) == len(flags) and len(rows) >= 3
    for r in rows.itertuples():
        real = 0
        for p in c.prompts:
            for t in range(c.config.max_new_tokens):
                seq = p.prompt.tolist() + p.tokens[:t].tolist()
                paths = list(brute_force_sglang(drafts["early"], seq, r.num_steps, r.topk, r.budget))
                out = speculative_generate(
                    tiny_target,
                    drafts["early"],
                    torch.tensor([seq]),
                    tree=Tree.from_paths(paths),
                    max_new_tokens=c.config.max_new_tokens - t,
                    eos_token_id=(),
                )
                real += out.steps[0].num_accepted
        assert r.accepted == real, r.shape


def test_sglang_flags_reduce_to_a_chain_and_to_the_dynamic_tree(super_collection):
    """topk 1 drafts a chain of num-steps tokens; a frontier as wide as the budget keeps every node of
    the dynamic (top-n by cumulative probability) tree: the same tau, position by position."""
    c = super_collection
    chain = replay(c, {("chain", 3): Tree.chain(3)}, mode="trajectory").iloc[0]
    as_chain = replay_sglang(c, [(3, 1, 3)], mode="trajectory").iloc[0]
    assert as_chain["tau"] == chain["tau"] and as_chain["steps"] == chain["steps"]
    dynamic = replay_dynamic(c, [2], mode="all").iloc[0]
    wide = replay_sglang(c, [(3, 2, 2)], mode="all").iloc[0]
    assert wide["accepted"] == dynamic["accepted"] and wide["tau"] == dynamic["tau"]
    flags = sglang_flags(3, 3, [2, 4])
    assert (2, 1, 2) in flags and (1, 2, 2) in flags and (3, 2, 4) in flags
    assert (3, 1, 2) not in flags, "topk 1: SGLang sets num-draft-tokens to num-steps + 1"
    assert (1, 2, 4) not in flags, "the pool of one level of 2 holds 2 nodes, not 4"


# ---- TensorRT-LLM's dynamic tree replayed (replay.trtllm_flags; its rule is SGLang's) ----


@torch.inference_mode()
def brute_force_trtllm(draft, seq, depth, topk, total):
    """TensorRT-LLM's EAGLE-2 dynamic tree as its code builds it (tensorrt_llm/_torch/speculative/
    eagle3_dynamic_tree.py, commit 057c8a6: `update_draft_tokens_and_scores`, `_select_topk_draft_tokens`,
    `_resample_final_tokens`), one plain draft forward per node: the history holds the root's top-K
    (scores: their softmax probabilities), then for each of max_draft_len - 1 levels every frontier
    node's top-K children, K x K of them, scored by the product of probabilities; the next frontier is
    the top K of those K x K; the final tree is the top max_total_draft_tokens of the whole history by
    score. Ties broken as specnb's order (TensorRT-LLM leaves them to torch.topk)."""

    def top(tokens):
        p = torch.softmax(draft(input_ids=torch.tensor([seq + tokens])).logits[0, -1].float(), -1)
        v, x = torch.topk(p, topk)
        return v.tolist(), x.tolist()

    order = lambda c: (-c[0], len(c[1]), c[1])  # noqa: E731
    v, x = top([])
    history = [(v[r], (r,), [x[r]]) for r in range(topk)]  # level 1: all K kept
    frontier = list(history)
    for _ in range(1, depth):
        candidates = []  # K x K: each frontier node's own top-K children
        for score, path, tokens in frontier:
            v, x = top(tokens)
            candidates += [(score * v[r], path + (r,), tokens + [x[r]]) for r in range(topk)]
        history += candidates
        frontier = sorted(candidates, key=order)[:topk]
    return {path: tokens[-1] for _, path, tokens in sorted(history, key=order)[:total]}


def test_trtllm_dynamic_trees_equal_its_own_rule_run_on_the_draft(drafts, super_collection):
    """At several positions and flag settings TensorRT-LLM accepts (max_total_draft_tokens in
    [max_draft_len, topK x max_draft_len]), the tree replayed from the collected super-tree is the one
    TensorRT-LLM's code grows from the draft model itself, token for token."""
    c, draft = super_collection, drafts["early"]
    p = c.prompts[1]
    flags = [f for f in trtllm_flags(2, 3, [2, 3, 4]) if f[1] > 1]
    assert (2, 2, 3) in flags and (3, 2, 4) in flags and all(d <= n <= k * d for d, k, n in flags)
    compared = 0
    for depth, topk, total in flags:
        for t in (0, 5, 11):
            seq = p.prompt.tolist() + p.tokens[:t].tolist()
            tree, tokens = sglang_tree(c, p.prompt_id, t, depth, topk, total)
            if tree.num_nodes < total:
                continue  # the 9-node super-tree holds too few of this pool (replay_sglang refuses such flags)
            assert dict(zip(tree.paths, tokens)) == brute_force_trtllm(draft, seq, depth, topk, total)
            compared += 1
    assert compared >= 10


def test_trtllm_flags_are_the_ones_its_config_accepts():
    """max_draft_len <= max_total_draft_tokens <= topK x max_draft_len (llm_args.py), topK 1 only as its
    linear worker (a chain, N = D), within the super-trees' depth and children."""
    flags = trtllm_flags(4, 3, [2, 4, 8])
    assert (1, 2, 2) in flags and (2, 2, 4) in flags and (2, 4, 8) in flags and (3, 1, 3) not in flags
    assert (1, 2, 4) not in flags and (3, 2, 2) not in flags  # 4 > 2 x 1; 2 < max_draft_len 3
    assert all((k > 1 and d <= n <= k * d) or (k == 1 and n == d) for d, k, n in flags)
    assert all(d <= 3 and k <= 4 for d, k, n in flags)


def test_each_engine_gets_its_setting_and_its_difference_from_the_best_tree(tmp_path, super_collection):
    """`engine_choice`: TensorRT-LLM's dynamic-tree flags by replaying its rule (within its config's
    bounds, its line), SGLang's likewise, current vLLM's chain, and the static engines' trees, each in
    the engine table with its speed-up's difference from the best tree of all, paired on the prompts
    both answer (a dynamic tree on the super-tree prompts); deploy.txt carries the vLLM chain and
    TensorRT-LLM's dynamic flags beside the static lines."""
    from test_heldout import curve

    from specnb.analysis import engine_choice, heldout
    from specnb.experiments import replay_study
    from specnb.io import tree_results

    c = super_collection
    trees = trees_for(["chain", "kary2", "wide"], [2, 3, 4], {})
    held = heldout.score(c, trees, [2, 3, 4], k=3, seed=0)
    speed, choice = heldout.choose(held.table, held.trees, curve(), "t", "d")
    grown = {e: engine_choice.grown_tree(e, c, [2, 3, 4], curve(), "t", "d") for e in engine_choice.GROWN}
    trt = grown["tensorrt_llm_dynamic"]
    assert set(trt["budget"]) <= {2, 3, 4} and len(trt)
    assert all(
        (k > 1 and s <= n <= k * s) or (k == 1 and n == s)
        for s, k, n in zip(trt["num_steps"], trt["topk"], trt["budget"])
    )
    for r in trt.itertuples():
        assert ("use_dynamic_tree=True" in r.line) == (r.topk > 1) and f"max_draft_len={r.num_steps}" in r.line
    per = trt.attrs["per_prompt"]
    assert set(per["budget"]) == set(trt["budget"]) and per["prompt_id"].nunique() == len(
        c.super_tree_prompts().prompts
    )
    table = engine_choice.engine_table(held, speed, held.trees, grown).set_index("setting")
    assert list(table.index) == list(engine_choice.RELEASES)
    best = table[table["verdict"] == "the best tree"]
    assert len(best) >= 1 and (best["versus_best"] == 0).all()
    for key in ("tensorrt_llm_dynamic", "sglang", "vllm_chain"):
        row = table.loc[key]
        assert row["versus_best_ci_low"] <= row["versus_best"] <= row["versus_best_ci_high"]
        assert row["verdict"] in ("tied", "behind", "ahead", "the best tree")
    assert table.loc["tensorrt_llm_dynamic", "prompts_compared"] == len(c.super_tree_prompts().prompts)
    engines = engine_choice.static_trees(speed, held.trees)
    results = replay_study.tree_results("d -> t", c, held, choice, device="cpu", grown=grown, engines=engines)
    tree_results.write(tmp_path, results)
    deploy = (tmp_path / tree_results.DEPLOY_FILE).read_text()
    assert "# vLLM 0.21 on (current" in deploy and "num_speculative_tokens" in deploy
    assert (
        "# TensorRT-LLM, EAGLE-2 dynamic tree" in deploy and results.engines["tensorrt_llm_dynamic"]["line"] in deploy
    )
