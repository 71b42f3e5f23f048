"""transformers' decoders as baselines (specnb.bench.baselines) and output quality (specnb.analysis.quality).

The recovered per-step statistics are checked against independent evidence: specnb's own chain
(same draft, same greedy chain, so the same steps), the target's forward calls counted by a hook
(one per step, each over the candidates + 1), and the generated length."""

import copy
import math

import pytest
import torch
from conftest import random_prompt, tiny_model

from specnb import SamplingConfig, Tree, autoregressive_generate, speculative_generate, summarize
from specnb.analysis.quality import greedy_equal, perplexity
from specnb.bench.baselines import hf_assisted_generate, hf_generate, hf_prompt_lookup_generate
from specnb.drafters.methods import method_trees


def counts(result):
    return [(s.num_drafted, s.num_accepted, s.num_tokens) for s in result.steps]


@pytest.fixture(scope="module")
def near_target(tiny_target):
    """The target with slightly perturbed layers: agrees with it often, not always (acceptance
    rate about 0.3-0.9 on these prompts), so accepted counts vary from step to step."""
    near = copy.deepcopy(tiny_target)
    torch.manual_seed(5)
    with torch.no_grad():
        for p in near.model.layers.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return near


class ForwardLog:
    """Counts a model's forward calls and the query length of each."""

    def __init__(self, model):
        self.lengths = []
        self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.lengths.append(ids.shape[1])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("prompt_seed", [1, 2, 4])
def test_assisted_steps_equal_specnb_chain(tiny_target, near_target, k, prompt_seed):
    """Same draft, same greedy chain of k tokens: transformers and specnb must take the same steps."""
    ids = random_prompt(prompt_seed, length=5 + prompt_seed)
    reference = autoregressive_generate(tiny_target, ids, max_new_tokens=30, eos_token_id=())
    ours = speculative_generate(tiny_target, near_target, ids, tree=Tree.chain(k), max_new_tokens=30, eos_token_id=())
    theirs = hf_assisted_generate(
        tiny_target, near_target, ids, num_assistant_tokens=k, max_new_tokens=30, eos_token_id=()
    )
    assert theirs.tokens.tolist() == reference.tokens.tolist()
    assert counts(theirs) == counts(ours)
    assert sum(s.num_tokens for s in theirs.steps) == 30
    # the draft length is really fixed: k each step, cut only so as not to pass max_new_tokens
    assert all(s.num_drafted == min(k, 30 - s.position - 1) for s in theirs.steps)
    assert theirs.method == "hf_assisted" and theirs.meta["num_assistant_tokens"] == k


def test_assisted_acceptance_varies_and_is_not_trivial(tiny_target, near_target):
    ids = random_prompt(2, length=7)
    s = summarize(hf_assisted_generate(tiny_target, near_target, ids, 4, max_new_tokens=30, eos_token_id=()))
    assert 0.1 < s.acceptance_rate < 0.95  # neither all nor nothing: the counts carry information


def test_assisted_with_draft_equal_to_target_accepts_everything(tiny_target):
    ids = random_prompt(3)
    r = hf_assisted_generate(tiny_target, tiny_target, ids, 4, max_new_tokens=23, eos_token_id=())
    assert (
        r.tokens.tolist()
        == autoregressive_generate(tiny_target, ids, max_new_tokens=23, eos_token_id=()).tokens.tolist()
    )
    assert counts(r) == [(4, 4, 5)] * 4 + [(2, 2, 3)]
    s = summarize(r)
    assert s.acceptance_rate == 1.0 and s.tau == 23 / 5 and s.rank_acceptance == (1.0,)


def test_assisted_with_a_draft_that_never_agrees(tiny_target):
    ids = random_prompt(1)
    r = hf_assisted_generate(
        tiny_target, tiny_model(9, scale=-30.0, layers=1), ids, 3, max_new_tokens=15, eos_token_id=()
    )
    assert (
        r.tokens.tolist()
        == autoregressive_generate(tiny_target, ids, max_new_tokens=15, eos_token_id=()).tokens.tolist()
    )
    assert summarize(r).acceptance_rate < 0.2
    assert len(r.steps) >= 13  # about one token per target call


def test_one_target_call_per_step(tiny_target, tiny_draft):
    ids = random_prompt(5)
    with ForwardLog(tiny_target) as log:
        r = hf_assisted_generate(tiny_target, tiny_draft, ids, 4, max_new_tokens=17, eos_token_id=())
    assert len(log.lengths) == len(r.steps)
    # the first call carries the prompt; each call verifies the candidates plus the bonus position
    assert log.lengths == [ids.shape[1] + r.steps[0].num_drafted] + [s.num_drafted + 1 for s in r.steps[1:]]


@pytest.mark.parametrize("max_new", [1, 2, 7, 13])
def test_max_new_tokens_exact(tiny_target, max_new):
    ids = random_prompt(5)
    reference = autoregressive_generate(tiny_target, ids, max_new_tokens=max_new, eos_token_id=())
    for r in (
        hf_assisted_generate(tiny_target, tiny_target, ids, 4, max_new_tokens=max_new, eos_token_id=()),
        hf_prompt_lookup_generate(tiny_target, ids, 4, max_new_tokens=max_new, eos_token_id=()),
        hf_generate(tiny_target, ids, max_new_tokens=max_new, eos_token_id=()),
    ):
        assert r.tokens.tolist() == reference.tokens.tolist(), r.method
        assert sum(s.num_tokens for s in r.steps) == max_new
    assert r.steps[-1].num_drafted == 0 and len(r.steps) == max_new  # hf_generate: one step per token


@pytest.mark.parametrize("prompt_seed", [1, 2, 4])
def test_stops_at_eos_like_specnb(tiny_target, prompt_seed):
    ids = random_prompt(prompt_seed, length=5 + prompt_seed)
    plain = autoregressive_generate(tiny_target, ids, max_new_tokens=30, eos_token_id=())
    eos = plain.tokens[6].item()
    reference = autoregressive_generate(tiny_target, ids, max_new_tokens=30, eos_token_id=eos)
    assert len(reference.tokens) < 30
    ours = speculative_generate(tiny_target, tiny_target, ids, tree=Tree.chain(4), max_new_tokens=30, eos_token_id=eos)
    assisted = hf_assisted_generate(tiny_target, tiny_target, ids, 4, max_new_tokens=30, eos_token_id=eos)
    lookup = hf_prompt_lookup_generate(tiny_target, ids, 4, max_new_tokens=30, eos_token_id=eos)
    for r in (assisted, lookup, hf_generate(tiny_target, ids, max_new_tokens=30, eos_token_id=eos)):
        assert r.tokens.tolist() == reference.tokens.tolist(), r.method
        assert sum(s.num_tokens for s in r.steps) == len(reference.tokens)
    # an EOS accepted from the draft counts as accepted, as in specnb (transformers' num_matches
    # says one less); the assistant stops drafting at EOS, so only num_drafted may differ
    assert [s[1:] for s in counts(assisted)] == [s[1:] for s in counts(ours)]
    assert assisted.meta["hf_num_matches"] == tuple(s.num_tokens - 1 for s in assisted.steps)


@pytest.fixture(scope="module")
def eos_models(tiny_target):
    """Copies of the target whose generation config names token 40 as EOS: its greedy output for
    prompt 3 alternates 40, 28, ..."""
    model = copy.deepcopy(tiny_target)
    model.generation_config.eos_token_id = 40
    ids = random_prompt(3)
    plain = autoregressive_generate(model, ids, max_new_tokens=20, eos_token_id=())
    assert plain.tokens.tolist().count(40) > 3
    return model, copy.deepcopy(model), ids, plain


def test_eos_default_is_the_targets_and_empty_means_never(eos_models):
    target, draft, ids, plain = eos_models
    stopped = autoregressive_generate(target, ids, max_new_tokens=20)  # specnb: the config's EOS
    assert len(stopped.tokens) < 20
    for eos, reference in ((None, stopped), ((), plain)):
        for r in (
            hf_assisted_generate(target, draft, ids, 4, max_new_tokens=20, eos_token_id=eos),
            hf_prompt_lookup_generate(target, ids, 4, max_new_tokens=20, eos_token_id=eos),
            hf_generate(target, ids, max_new_tokens=20, eos_token_id=eos),
        ):
            assert r.tokens.tolist() == reference.tokens.tolist(), (eos, r.method)


def test_draft_does_not_stop_at_its_own_eos_when_nothing_stops(eos_models):
    """eos_token_id=(): the assistant drafts the full k even through its config's EOS token."""
    target, draft, ids, plain = eos_models
    r = hf_assisted_generate(target, draft, ids, 4, max_new_tokens=20, eos_token_id=())
    assert counts(r) == [(4, 4, 5)] * 4


def test_prompt_lookup_counts(tiny_target):
    ids = random_prompt(3)  # the target's greedy output falls into a loop that lookup can copy
    reference = autoregressive_generate(tiny_target, ids, max_new_tokens=40, eos_token_id=())
    with ForwardLog(tiny_target) as log:
        r = hf_prompt_lookup_generate(tiny_target, ids, 5, max_new_tokens=40, eos_token_id=())
    assert r.tokens.tolist() == reference.tokens.tolist()
    assert r.method == "hf_prompt_lookup"
    assert sum(s.num_tokens for s in r.steps) == 40
    # num_drafted is what the target verified: its call lengths say so independently
    assert log.lengths == [ids.shape[1] + r.steps[0].num_drafted] + [s.num_drafted + 1 for s in r.steps[1:]]
    assert all(s.num_accepted <= s.num_drafted and s.num_tokens <= s.num_accepted + 1 for s in r.steps)
    s = summarize(r)
    assert s.acceptance_rate > 0.5 and s.tau > 2.0
    assert any(st.num_drafted == 0 for st in r.steps)  # no match yet at the start: a plain step


def test_config_and_model_restored_even_after_an_error(tiny_target, tiny_draft):
    before = tiny_draft.generation_config.to_dict()
    hf_assisted_generate(tiny_target, tiny_draft, random_prompt(1), 6, max_new_tokens=5)
    assert tiny_draft.generation_config.to_dict() == before
    assert "_get_candidate_generator" not in vars(tiny_target)
    with pytest.raises(IndexError):  # token id beyond the vocabulary: fails inside generate
        hf_assisted_generate(tiny_target, tiny_draft, torch.tensor([[3, 500]]), 6, max_new_tokens=5)
    assert tiny_draft.generation_config.to_dict() == before
    assert "_get_candidate_generator" not in vars(tiny_target)


def test_sampling_is_seeded_and_leaves_the_global_generator_alone(tiny_target, near_target):
    ids = random_prompt(2)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    sampled = SamplingConfig(temperature=1.0, seed=7)
    a = hf_assisted_generate(tiny_target, near_target, ids, 3, max_new_tokens=20, sampling=sampled, eos_token_id=())
    assert torch.equal(torch.get_rng_state(), state)
    b = hf_assisted_generate(tiny_target, near_target, ids, 3, max_new_tokens=20, sampling=sampled, eos_token_id=())
    assert a.tokens.tolist() == b.tokens.tolist() and sum(s.num_tokens for s in a.steps) == 20


def test_timing_fields(tiny_target, tiny_draft):
    r = hf_assisted_generate(tiny_target, tiny_draft, random_prompt(1), 4, max_new_tokens=12, eos_token_id=())
    assert all(s.draft_time > 0 and s.verify_time > 0 for s in r.steps)
    spent = r.prefill_time + sum(s.draft_time + s.verify_time for s in r.steps)
    assert spent <= r.total_time


# ---- quality --------------------------------------------------------------------------------


def test_perplexity_matches_a_token_by_token_computation(tiny_target):
    prompt = random_prompt(6, length=5)
    new = torch.tensor([7, 30, 12, 12, 44, 3])
    logp = 0.0
    with torch.no_grad():
        for i in range(len(new)):  # one forward per prefix: independent of the teacher-forced pass
            seq = torch.cat([prompt[0], new[:i]])[None]
            logits = tiny_target(seq).logits[0, -1]
            logp += torch.log_softmax(logits.double(), -1)[new[i]].item()
    assert perplexity(tiny_target, prompt, new) == pytest.approx(math.exp(-logp / len(new)), rel=1e-4)
    assert perplexity(tiny_target, prompt[0], new.tolist()) == pytest.approx(math.exp(-logp / len(new)), rel=1e-4)
    assert math.isnan(perplexity(tiny_target, prompt, []))


def test_greedy_output_has_lower_perplexity_than_random_tokens(tiny_target):
    prompt = random_prompt(7)
    greedy = autoregressive_generate(tiny_target, prompt, max_new_tokens=16, eos_token_id=()).tokens
    noise = torch.randint(3, 61, (16,), generator=torch.Generator().manual_seed(0))
    assert perplexity(tiny_target, prompt, greedy) < perplexity(tiny_target, prompt, noise) / 10


def test_greedy_equal():
    assert greedy_equal(torch.tensor([1, 2, 3]), [1, 2, 3])
    assert not greedy_equal([1, 2, 3], [1, 2])
    assert not greedy_equal([1, 2], None)


# ---- in a sweep -----------------------------------------------------------------------------


class FakeTokenizer:
    chat_template = None

    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[3 + (ord(c) % 50) for c in text]])}


def test_sweep_runs_transformers_methods_beside_trees(tmp_path, tiny_target, near_target):
    from specnb.experiments import sweeps as ex
    from specnb.experiments import tables
    from specnb.experiments.pairs import PairModels
    from specnb.io.prompts import Prompt
    from specnb.io.storage import Sweep

    store = Sweep(tmp_path / "sweep", key=ex.UNIT_KEY)
    prompts = [Prompt("a", "cat1", "abcabcabc"), Prompt("b", "cat2", "hello world")]
    trees = method_trees(["chain:3", "hf_assisted:3", "hf_prompt_lookup:4"])
    pair = PairModels("pair", tiny_target, near_target, FakeTokenizer())
    ex.run_sweep(store, pair, prompts, trees, ex.SweepConfig(12, progress=False))
    units = tables.unit_table(store)
    assert set(units["shape"]) == {"autoregressive", "chain", "hf_assisted", "hf_prompt_lookup"}
    assert units["greedy_equal"].astype(bool).all()  # 8 units, the baselines equal to themselves
    assert units["perplexity"].notna().all()
    # equal outputs, equal perplexity: the column is per prompt, whatever the method
    assert units.groupby("prompt_id")["perplexity"].nunique().eq(1).all()
    chain = units[units["shape"] == "chain"].set_index("prompt_id")
    assisted = units[units["shape"] == "hf_assisted"].set_index("prompt_id")
    for col in ("num_steps", "num_drafted", "num_accepted"):  # same draft, same chain
        assert chain[col].tolist() == assisted[col].tolist()
    table = tables.shape_table(units)
    assert {"speedup", "perplexity", "tau", "acceptance_rate"} <= set(table.columns)
    assert (table["nodes"] == [3, 3, 4]).all()
