"""End-to-end: greedy speculative output equals plain greedy output token for token; sampled
output follows the target's distribution (chi-square); stops at EOS and max_new_tokens exactly."""

import copy

import pytest
import torch
from conftest import random_prompt, tiny_model
from stats import ALPHA, chi_square_pvalue
from test_acceptance import broken_accept

import specnb
import specnb.core.acceptance
from specnb import ModelDrafter, Tree, autoregressive_generate, speculative_generate, summarize
from specnb.core.cache import new_cache
from specnb.core.drafting import as_drafter
from specnb.core.sampling import SamplingConfig
from specnb.core.verification import prefill

TREES = {
    "chain4": Tree.chain(4),
    "kary2x10": Tree.kary(2, 10),
    "wide5": Tree.wide(5),
    "beams3x9": Tree.beams(3, 9),
    "sparse16": Tree.sparse(16),
    "medusa_gaps": Tree.from_paths([(0,), (2,), (0, 1), (0, 1, 3)]),
}


def test_autoregressive_matches_transformers_generate(tiny_target):
    ids = random_prompt(3)
    ours = autoregressive_generate(tiny_target, ids, max_new_tokens=20, eos_token_id=())
    theirs = tiny_target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False, eos_token_id=None
    )[0, ids.shape[1] :]
    assert torch.equal(ours.tokens, theirs)
    s = summarize(ours)
    assert s.tau == 1.0 and s.num_steps == 20


def rank0_chain(tree: Tree) -> int:
    return max((len(p) for p in tree.paths if set(p) == {0}), default=0)


CASES = [("llama", name, kind) for name in TREES for kind in ("random_draft", "draft_is_target", "agrees_with_nothing")]
CASES += [("qwen2", name, "random_draft") for name in ("chain4", "sparse16")]


@pytest.mark.parametrize("arch, name, draft_kind", CASES)
def test_greedy_speculative_equals_greedy(arch, name, draft_kind, tiny_target, tiny_draft):
    target = tiny_target if arch == "llama" else tiny_model(0, arch="qwen2", scale=30.0)
    draft = {
        "random_draft": tiny_draft,
        "draft_is_target": target,
        "agrees_with_nothing": tiny_model(9, scale=-30.0, layers=1),
    }[draft_kind]
    tree = TREES[name]
    for prompt_seed in (1, 2):
        ids = random_prompt(prompt_seed, length=5 + prompt_seed)
        reference = autoregressive_generate(target, ids, max_new_tokens=23, eos_token_id=())
        result = speculative_generate(target, draft, ids, tree=tree, max_new_tokens=23, eos_token_id=())
        assert result.tokens.tolist() == reference.tokens.tolist()
        s = summarize(result)
        assert s.num_tokens == 23
        if draft_kind == "draft_is_target":
            # the draft's top-1 is the target's argmax: each step accepts the tree's whole
            # rank-0 chain (cut to the step's tree), and nothing off it
            for st in result.steps:
                assert st.accepted_ranks == (0,) * st.num_accepted
                assert (
                    st.num_accepted == rank0_chain(tree.truncated(st.tree_depth)) or st.num_tokens < st.num_accepted + 1
                )
        if draft_kind == "agrees_with_nothing":
            assert s.acceptance_rate < 0.2


def test_eos_inside_an_accepted_path(tiny_target):
    ids = random_prompt(4)
    plain = autoregressive_generate(tiny_target, ids, max_new_tokens=30, eos_token_id=())
    eos = plain.tokens[6].item()
    first = plain.tokens.tolist().index(eos)  # the first occurrence stops generation
    reference = autoregressive_generate(tiny_target, ids, max_new_tokens=30, eos_token_id=eos)
    assert reference.tokens.tolist() == plain.tokens[: first + 1].tolist()
    result = speculative_generate(
        tiny_target, tiny_target, ids, tree=Tree.chain(4), max_new_tokens=30, eos_token_id=eos
    )
    assert result.tokens.tolist() == reference.tokens.tolist()
    last = result.steps[-1]
    if first % 5 != 4:  # EOS is not the bonus position of a 5-token step: it cut an accepted path
        assert last.num_tokens <= last.num_accepted


@pytest.mark.parametrize("max_new", [1, 2, 7, 13])
def test_max_new_tokens_exact_with_deep_tree(tiny_target, max_new):
    ids = random_prompt(5)
    reference = autoregressive_generate(tiny_target, ids, max_new_tokens=max_new, eos_token_id=())
    result = speculative_generate(
        tiny_target, tiny_target, ids, tree=Tree.chain(4), max_new_tokens=max_new, eos_token_id=()
    )
    assert result.tokens.tolist() == reference.tokens.tolist()
    assert len(result.tokens) == max_new
    assert result.steps[-1].num_drafted == (max_new - 1) % 5  # the last tree was cut to fit


def test_drafter_cache_is_reused_across_steps_and_prompts(tiny_target, tiny_draft):
    drafter = ModelDrafter(tiny_draft)
    for seed in (1, 2, 1):
        ids = random_prompt(seed)
        reference = autoregressive_generate(tiny_target, ids, max_new_tokens=15, eos_token_id=())
        result = speculative_generate(
            tiny_target, drafter, ids, tree=Tree.kary(2, 6), max_new_tokens=15, eos_token_id=()
        )
        assert result.tokens.tolist() == reference.tokens.tolist()


def count_forwards(model):
    """Calls of `model`'s forward and the query tokens each one fed, recorded by a hook."""
    calls: list[int] = []
    handle = model.register_forward_hook(
        lambda module, args, kwargs, out: calls.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    return calls, handle


def test_the_prompt_goes_through_the_first_verify(tiny_target, tiny_draft):
    """No target forward of its own for the prompt: one target call per step."""
    calls, handle = count_forwards(tiny_target)
    try:
        ids = random_prompt(2, length=9)
        result = speculative_generate(
            tiny_target, tiny_draft, ids, tree=Tree.kary(2, 6), max_new_tokens=12, eos_token_id=()
        )
    finally:
        handle.remove()
    assert len(calls) == len(result.steps)
    assert calls[0] == ids.shape[1] + result.steps[0].num_drafted  # the prompt (its last token the root) + the tree
    assert result.prefill_time < result.total_time


def test_the_draft_keeps_the_accepted_nodes_it_fed(tiny_target):
    """draft = target accepts every node: the accepted nodes fed for deeper levels keep their keys
    and values, so each step feeds the draft only the accepted leaf and the bonus token; the draft's
    cache then equals a plain prefill of the sequence."""
    draft = copy.deepcopy(tiny_target)
    drafter = ModelDrafter(draft)
    ids = random_prompt(3, length=7)
    calls, handle = count_forwards(draft)
    try:
        result = speculative_generate(tiny_target, drafter, ids, tree=Tree.chain(4), max_new_tokens=16, eos_token_id=())
    finally:
        handle.remove()
    reference = autoregressive_generate(tiny_target, ids, max_new_tokens=16, eos_token_id=())
    assert result.tokens.tolist() == reference.tokens.tolist()
    assert [s.num_accepted for s in result.steps] == [4, 4, 4, 0]  # 5 + 5 + 5 + the last bonus = 16 tokens
    # per step: one forward that advances the cache, then one per fed level (depth 4 is only chosen)
    assert calls[:4] == [7, 1, 1, 1]  # the prompt, then levels 1..3
    assert calls[4:12] == [2, 1, 1, 1] * 2, calls  # the depth-4 leaf and the bonus token: depths 1..3 kept
    seq = torch.cat([ids[0], result.tokens])[:-1]  # the drafter last drafted from all but the final bonus token
    plain = new_cache(draft)
    prefill(draft, plain, seq[None])
    held = len(drafter._committed)
    assert held == len(seq)
    for mine, theirs in zip(drafter._cache.layers, plain.layers):
        torch.testing.assert_close(mine.keys[..., :held, :], theirs.keys, atol=1e-4, rtol=0)
        torch.testing.assert_close(mine.values[..., :held, :], theirs.values, atol=1e-4, rtol=0)


def test_a_drafter_must_subclass_drafter(tiny_target):
    class NotADrafter:
        def draft(self, tokens, tree, sampling, generator):
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="subclass of specnb.Drafter"):
        speculative_generate(tiny_target, NotADrafter(), random_prompt(1), max_new_tokens=3)


def test_one_token_prompt(tiny_target, tiny_draft):
    ids = torch.tensor([[7]])
    reference = autoregressive_generate(tiny_target, ids, max_new_tokens=9, eos_token_id=())
    result = speculative_generate(tiny_target, tiny_draft, ids, tree=Tree.kary(2, 6), max_new_tokens=9, eos_token_id=())
    assert result.tokens.tolist() == reference.tokens.tolist()


# ---- lossless sampling through real (tiny) models ------------------------------------------

VOCAB = 7


def target_first_two(target, prompt):
    """The target's exact distribution of its first two sampled tokens after `prompt` (temperature 1)."""
    vocab = target.config.vocab_size
    with torch.inference_mode():
        first = torch.softmax(target(prompt).logits[0, -1], -1)
        exact = {}
        for a in range(vocab):
            second = torch.softmax(target(torch.cat([prompt, torch.tensor([[a]])], 1)).logits[0, -1], -1)
            for b in range(vocab):
                exact[(a, b)] = float(first[a] * second[b])
    return exact


@pytest.fixture(scope="module")
def sampling_pair():
    target = tiny_model(20, vocab=VOCAB, scale=4.0, layers=1, hidden=16)
    draft = tiny_model(21, vocab=VOCAB, scale=4.0, layers=1, hidden=16)
    prompt = torch.tensor([[3, 5, 4]])
    return target, draft, prompt, target_first_two(target, prompt)


def first_two(target, draft, prompt, tree, runs):
    """The first two tokens of `runs` sampled generations; `draft` is a model or any drafter."""
    drafter = as_drafter(draft)  # a model: one ModelDrafter, reused across runs
    out = []
    for seed in range(runs):
        r = speculative_generate(
            target,
            drafter,
            prompt,
            tree=tree,
            max_new_tokens=3,
            eos_token_id=(),
            sampling=SamplingConfig(temperature=1.0, seed=seed),
        )
        out.append(tuple(r.tokens[:2].tolist()))
    return out


@pytest.mark.parametrize("tree", [Tree.chain(3), Tree.kary(2, 6)], ids=["chain", "kary"])
def test_sampled_output_follows_the_target(sampling_pair, tree):
    target, draft, prompt, exact = sampling_pair
    samples = first_two(target, draft, prompt, tree, runs=2500)
    assert chi_square_pvalue(samples, exact) > ALPHA


def test_sampling_check_detects_a_broken_rule(sampling_pair, monkeypatch):
    target, draft, prompt, exact = sampling_pair
    monkeypatch.setattr(specnb.core.acceptance, "speculative_accept", broken_accept)
    samples = first_two(target, draft, prompt, Tree.kary(2, 6), runs=2500)
    assert chi_square_pvalue(samples, exact) < ALPHA


class OwnTreeDrafter(specnb.Drafter):
    """A drafter that shapes its own tree each step (as dynamic, n-gram and merged drafters do):
    the target's own argmax as rank 0 plus a wrong sibling at rank 3, then a chain of the draft
    model's guesses under rank 0, with a depth that varies step to step. Deterministic proposals."""

    def __init__(self, target, draft):
        self.target, self.draft_model, self.observed = target, draft, []

    def reset(self):
        self.observed = []

    @torch.no_grad()
    def draft(self, tokens, tree, sampling, generator):
        depth = min(tree.depth, 1 + len(self.observed) % 3)
        seq = tokens.reshape(1, -1)
        paths, out = [], []
        for d in range(depth):
            guess = int(self.draft_model(seq).logits[0, -1].argmax())
            if d == 0:
                right = int(self.target(seq).logits[0, -1].argmax())
                paths += [(0,), (3,)]
                out += [right, (right + 1) % 61]
                guess = right
            else:
                paths.append((0,) * (d + 1))
                out.append(guess)
            seq = torch.cat([seq, torch.tensor([[guess]])], dim=1)
        tree = Tree.from_paths(paths)
        order = {p: i for i, p in enumerate(paths)}
        tokens = torch.tensor([out[order[p]] for p in tree.paths], dtype=torch.long)
        return specnb.Draft(tokens, None, tree)

    def observe(self, draft, acceptance):
        self.observed.append((draft.tree.num_nodes, acceptance.num_accepted))


def test_a_drafter_may_shape_its_own_tree(tiny_target, tiny_draft):
    ids = random_prompt(4)
    reference = autoregressive_generate(tiny_target, ids, max_new_tokens=25, eos_token_id=())
    drafter = OwnTreeDrafter(tiny_target, tiny_draft)
    result = speculative_generate(tiny_target, drafter, ids, tree=Tree.chain(3), max_new_tokens=25, eos_token_id=())
    assert result.tokens.tolist() == reference.tokens.tolist()
    assert [s.num_drafted for s in result.steps] == [n for n, _ in drafter.observed]
    assert [s.num_accepted for s in result.steps] == [a for _, a in drafter.observed]
    assert {s.num_drafted for s in result.steps} >= {2, 3, 4}  # the drafter's trees, not chain(3)
    assert all(s.num_accepted >= 1 and s.accepted_ranks[0] == 0 for s in result.steps[:-1])
    # sampled, with gaps in the ranks: allowed because the proposals are deterministic
    sampled = speculative_generate(
        tiny_target,
        drafter,
        ids,
        tree=Tree.chain(3),
        max_new_tokens=25,
        eos_token_id=(),
        sampling=SamplingConfig(temperature=1.0),
    )
    assert sampled.tokens.numel() == 25


class TooDeepDrafter(OwnTreeDrafter):
    def draft(self, tokens, tree, sampling, generator):
        return specnb.Draft(torch.zeros(tree.depth + 1, dtype=torch.long), None, Tree.chain(tree.depth + 1))


def test_a_drafter_tree_deeper_than_allowed_is_refused(tiny_target, tiny_draft):
    with pytest.raises(ValueError, match="deeper"):
        speculative_generate(
            tiny_target, TooDeepDrafter(tiny_target, tiny_draft), random_prompt(4), tree=Tree.chain(3), max_new_tokens=8
        )
