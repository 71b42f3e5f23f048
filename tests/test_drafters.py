"""The drafters of issue #5: n-gram lookup, early-exit and 4-bit self-drafts, merged drafts, adaptive
draft length. Every drafter keeps greedy output equal to the target's and sampled output exact; each
drafter's own claims (matches, shared weights and cache, merge rule, length rules) hand-checked."""

import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import random_prompt, tiny_model
from stats import ALPHA, chi_square_pvalue
from test_acceptance import not_zeroing_accept
from test_generation import VOCAB, first_two, rank0_chain, target_first_two
from transformers.generation.candidate_generator import AssistedCandidateGenerator, PromptLookupCandidateGenerator

import specnb.core.acceptance
from specnb import (
    AdaptiveLength,
    Draft,
    Drafter,
    EarlyExitDrafter,
    MergedDrafter,
    ModelDrafter,
    NgramDrafter,
    SamplingConfig,
    TokenTrie,
    Tree,
    autoregressive_generate,
    early_exit_model,
    quantized_self_draft,
    speculative_generate,
    summarize,
)
from specnb.core.cache import new_cache
from specnb.core.verification import prefill, verify
from specnb.io.models import load_model, prompt_ids, truncate_layers

GREEDY = SamplingConfig()
TREES = {"chain4": Tree.chain(4), "kary2x10": Tree.kary(2, 10), "sparse12": Tree.sparse(12)}
MAX_NEW = 23


def repetitive_prompt(seed: int) -> torch.Tensor:
    """A random phrase said three times: the n-gram drafter has something to find."""
    phrase = random_prompt(seed, length=5)
    return torch.cat([phrase, phrase, phrase[:, :3]], dim=1)


def tokens_of(draft: Draft) -> list[int]:
    return draft.tokens.tolist()


def token_paths(tree: Tree, tokens: list[int]) -> set[tuple[int, ...]]:
    return {tuple(tokens[j] for j in tree.node_path(i)) for i in range(tree.num_nodes)}


class Recorder(Drafter):
    """Wraps a drafter and keeps every draft it returns (tokens and tree)."""

    def __init__(self, drafter):
        self.drafter, self.drafts = drafter, []
        self.shares_target_cache = drafter.shares_target_cache

    def reset(self):
        self.drafter.reset()
        self.drafts = []

    def bind_target_cache(self, cache):
        self.drafter.bind_target_cache(cache)

    def observe(self, draft, acceptance):
        self.drafter.observe(draft, acceptance)

    def draft(self, tokens, tree, sampling, generator):
        d = self.drafter.draft(tokens, tree, sampling, generator)
        self.drafts.append((tokens_of(d), d.tree if d.tree is not None else tree))
        return d


class FixedDrafter(Drafter):
    """Proposes the same (tree, tokens) every step, cut to the requested depth."""

    def __init__(self, tree: Tree, tokens: list[int]):
        self.tree, self.tokens, self.observed = tree, tokens, []

    def reset(self):
        self.observed = []

    def draft(self, tokens, tree, sampling, generator):
        own = self.tree.truncated(tree.depth)
        return Draft(torch.tensor(self.tokens[: own.num_nodes], dtype=torch.long), None, own)

    def observe(self, draft, acceptance):
        self.observed.append(acceptance)


# ---- every drafter: greedy output equals the target's; sampling runs -------------------------


def make_drafter(kind: str, target, draft):
    layers = len(target.model.layers)
    return {
        "ngram": lambda: NgramDrafter(),
        "ngram_latest_chain": lambda: NgramDrafter(max_ngram=2, order="latest", max_branches=1),
        "early_exit_1": lambda: EarlyExitDrafter(target, 1),
        "early_exit_all": lambda: EarlyExitDrafter(target, layers),
        "merged": lambda: MergedDrafter(
            [(NgramDrafter(), Tree.kary(2, 6)), (EarlyExitDrafter(target, 1), Tree.chain(4)), (draft, Tree.sparse(6))]
        ),
        "adaptive": lambda: AdaptiveLength(ModelDrafter(draft), start=2),
        "adaptive_early_exit": lambda: AdaptiveLength(EarlyExitDrafter(target, layers), start=1),
        "threshold": lambda: ModelDrafter(tiny_model(1, scale=3.0, layers=1), confidence_threshold=0.3),
    }[kind]()


KINDS = [
    "ngram",
    "ngram_latest_chain",
    "early_exit_1",
    "early_exit_all",
    "merged",
    "adaptive",
    "adaptive_early_exit",
    "threshold",
]
CASES = [(k, t) for k in KINDS for t in TREES if not (k == "threshold" and t != "chain4")]


@pytest.mark.parametrize("kind, tree_name", CASES)
def test_greedy_output_equals_the_targets(kind, tree_name, tiny_target, tiny_draft):
    drafter = make_drafter(kind, tiny_target, tiny_draft)
    tree = TREES[tree_name]
    drafted = 0
    for seed in (1, 2):
        ids = repetitive_prompt(seed)
        reference = autoregressive_generate(tiny_target, ids, max_new_tokens=MAX_NEW, eos_token_id=())
        result = speculative_generate(tiny_target, drafter, ids, tree=tree, max_new_tokens=MAX_NEW, eos_token_id=())
        assert result.tokens.tolist() == reference.tokens.tolist()
        drafted += summarize(result).num_drafted
        assert all(s.tree_depth <= tree.depth and s.draft_time >= 0.0 for s in result.steps)
    assert drafted > 0


@pytest.mark.parametrize("kind", KINDS)
def test_every_drafter_samples(kind, tiny_target, tiny_draft):
    drafter = make_drafter(kind, tiny_target, tiny_draft)
    tree = Tree.chain(4) if kind == "threshold" else Tree.kary(2, 6)
    result = speculative_generate(
        tiny_target,
        drafter,
        repetitive_prompt(1),
        tree=tree,
        max_new_tokens=MAX_NEW,
        eos_token_id=(),
        sampling=SamplingConfig(temperature=1.0),
    )
    assert result.tokens.numel() == MAX_NEW
    assert summarize(result).num_drafted > 0


# ---- sampled output follows the target (chi-square, as in test_generation) -------------------


@pytest.fixture(scope="module")
def sampling_models():
    target = tiny_model(20, vocab=VOCAB, scale=4.0, layers=2, hidden=16)
    draft = tiny_model(21, vocab=VOCAB, scale=4.0, layers=1, hidden=16)
    prompt = torch.tensor([[3, 5, 4, 6, 3, 5, 4, 6, 3, 5]])  # the n-gram drafter proposes 4, 6, 3 ...
    return target, draft, prompt, target_first_two(target, prompt)


SAMPLED = {
    "ngram": lambda target, draft: (NgramDrafter(), Tree.kary(2, 6)),
    "merged": lambda target, draft: (
        MergedDrafter([(ModelDrafter(draft), Tree.kary(2, 4)), (NgramDrafter(), Tree.chain(3))]),
        Tree.chain(3),
    ),
    "threshold": lambda target, draft: (ModelDrafter(draft, confidence_threshold=0.5), Tree.chain(3)),
}


@pytest.mark.parametrize("kind", SAMPLED)
def test_sampled_output_follows_the_target(sampling_models, kind):
    target, draft, prompt, exact = sampling_models
    drafter, tree = SAMPLED[kind](target, draft)
    samples = first_two(target, drafter, prompt, tree, runs=2500)
    assert chi_square_pvalue(samples, exact) > ALPHA


def test_ngram_sampling_check_detects_a_broken_rule(sampling_models, monkeypatch):
    target, draft, prompt, exact = sampling_models
    monkeypatch.setattr(specnb.core.acceptance, "speculative_accept", not_zeroing_accept)
    samples = first_two(target, NgramDrafter(), prompt, Tree.kary(2, 6), runs=2500)
    assert chi_square_pvalue(samples, exact) < ALPHA


# ---- n-gram lookup ---------------------------------------------------------------------------


def ngram_draft(seq, tree, **kwargs):
    d = NgramDrafter(**kwargs).draft(torch.tensor(seq), tree, GREEDY)
    return d.tree, tokens_of(d)


def test_ngram_several_matches_make_several_branches():
    seq = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3]  # (1, 2, 3) was followed by 4 9 1 ... and 5 7 1 ...
    tree, tokens = ngram_draft(seq, Tree.kary(2, 8))  # depth 3, 8 nodes
    assert tree.paths == ((0,), (1,), (0, 0), (1, 0), (0, 0, 0), (1, 0, 0))
    assert tokens == [4, 5, 9, 7, 1, 1]  # earliest match = rank 0
    tree, tokens = ngram_draft(seq, Tree.kary(2, 8), order="latest")
    assert tokens == [5, 4, 7, 9, 1, 1]
    tree, tokens = ngram_draft(seq, Tree.chain(5), max_branches=1)
    assert tree == Tree.chain(5) and tokens == [4, 9, 1, 2, 3]


def test_ngram_longer_match_first_and_shared_prefixes():
    seq = [5, 6, 7, 8, 0, 5, 6, 7, 9, 0, 5]
    # (0, 5) occurred once, followed by 6 7 9; (5,) twice, also followed by 6 7 8: one trunk, two leaves
    drafter = NgramDrafter(max_ngram=3)
    d = drafter.draft(torch.tensor(seq), Tree.kary(2, 14), GREEDY)  # depth 3, 14 nodes
    assert d.tree.paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 1))
    assert tokens_of(d) == [6, 7, 9, 8]
    assert drafter.last_ngram == 2 and drafter.last_matches == 2
    tree, tokens = ngram_draft(seq, Tree.chain(3))  # a budget of 3 nodes leaves no room for the second
    assert tree == Tree.chain(3) and tokens == [6, 7, 9]
    tree, tokens = ngram_draft(seq, Tree.kary(2, 14), min_ngram=2)  # (5,) alone is no match now
    assert tokens == [6, 7, 9]


def test_ngram_no_match_is_an_empty_tree_and_a_plain_step(tiny_target):
    d = NgramDrafter().draft(torch.tensor([[4, 5, 6, 7]]), Tree.chain(4), GREEDY)
    assert d.tree.num_nodes == 0 and d.tokens.numel() == 0 and d.q is None
    # verification of an empty tree: the target's logits at the root, as a plain forward gives
    ids = torch.tensor([[4, 5, 6, 7]])
    cache = new_cache(tiny_target)
    prefill(tiny_target, cache, ids[:, :-1])
    logits = verify(tiny_target, cache, 7, d.tree, d.tokens)
    plain = prefill(tiny_target, new_cache(tiny_target), ids)[-1]
    torch.testing.assert_close(logits[0], plain, rtol=1e-4, atol=1e-4)
    assert logits.shape[0] == 1
    result = speculative_generate(
        tiny_target, NgramDrafter(), ids, tree=Tree.chain(4), max_new_tokens=1, eos_token_id=()
    )
    assert result.steps[0].num_drafted == 0 and result.steps[0].num_tokens == 1


@pytest.mark.parametrize("seed", range(6))
def test_ngram_chain_is_transformers_prompt_lookup(seed):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 4, (1, 40), generator=g)  # 4 symbols: many matches of every size
    theirs = PromptLookupCandidateGenerator(num_output_tokens=5, max_matching_ngram_size=2, max_length=1000)
    ours = NgramDrafter(max_ngram=2, min_ngram=1, max_branches=1)
    for t in range(3, 41):
        candidate, _ = theirs.get_candidates(seq[:, :t])
        d = ours.draft(seq[:, :t], Tree.chain(5), GREEDY)
        assert tokens_of(d) == candidate[0, t:].tolist(), t


def test_ngram_index_follows_the_sequence_and_resets():
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 5, (60,), generator=g)
    grown = NgramDrafter()
    for t in range(2, 61, 3):  # the index grows with the sequence ...
        fresh = NgramDrafter().draft(seq[:t], Tree.kary(2, 8), GREEDY)
        d = grown.draft(seq[:t], Tree.kary(2, 8), GREEDY)
        assert (d.tree, tokens_of(d)) == (fresh.tree, tokens_of(fresh))
    other = seq.flip(0)[:30]  # ... and is rebuilt for a sequence that does not extend it
    assert tokens_of(grown.draft(other, Tree.kary(2, 8), GREEDY)) == tokens_of(
        NgramDrafter().draft(other, Tree.kary(2, 8), GREEDY)
    )


def test_ngram_accepts_on_a_repetitive_prompt(tiny_target):
    result = speculative_generate(
        tiny_target, NgramDrafter(), repetitive_prompt(3), tree=Tree.kary(2, 8), max_new_tokens=40, eos_token_id=()
    )
    assert summarize(result).acceptance_length > 0


def test_token_trie_shares_prefixes_and_ranks_by_first_appearance():
    trie = TokenTrie()
    for path in ([7, 8], [7, 9], [3], [7, 8, 1]):
        node = -1
        for token in path:
            node = trie.add(node, token)
    tree, tokens, order = trie.build()
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (0, 0, 0))
    assert tokens.tolist() == [7, 3, 8, 9, 1] and order == (0, 3, 1, 2, 4)


# ---- early exit ------------------------------------------------------------------------------


def test_early_exit_shares_the_targets_weights(tiny_target):
    total = len(tiny_target.model.layers)
    view = early_exit_model(tiny_target, 1)
    target_ptrs = {p.data_ptr() for p in tiny_target.parameters()}
    assert {p.data_ptr() for p in view.parameters()} <= target_ptrs
    assert view.lm_head.weight.data_ptr() == tiny_target.lm_head.weight.data_ptr()
    assert view.model.norm.weight.data_ptr() == tiny_target.model.norm.weight.data_ptr()
    first = [p.data_ptr() for p in tiny_target.model.layers[0].parameters()]
    assert [p.data_ptr() for p in view.model.layers[0].parameters()] == first
    assert len(view.model.layers) == 1 and view.config.num_hidden_layers == 1
    assert len(tiny_target.model.layers) == total and tiny_target.config.num_hidden_layers == total
    # the view computes what a separately truncated copy computes
    ids = random_prompt(1)
    separate = truncate_layers(copy.deepcopy(tiny_target), 1)
    with torch.no_grad():
        torch.testing.assert_close(view(ids).logits, separate(ids).logits)


def snapshot(cache):
    return [(layer.keys.clone(), layer.values.clone()) if layer.is_initialized else None for layer in cache.layers]


@pytest.mark.parametrize("length", [1, 6])
def test_early_exit_leaves_the_target_cache_as_it_found_it(length):
    target = tiny_model(0, scale=30.0, layers=3)
    ids = random_prompt(2, length=length)
    cache = new_cache(target)
    if length > 1:
        prefill(target, cache, ids[:, :-1])
    before = snapshot(cache)
    drafter = EarlyExitDrafter(target, 2)
    drafter.bind_target_cache(cache)
    d = drafter.draft(ids, Tree.kary(2, 10), GREEDY)
    after = snapshot(cache)
    assert len(before) == len(after) == 3
    for b, a in zip(before, after):
        assert (b is None and a is None) or (torch.equal(b[0], a[0]) and torch.equal(b[1], a[1]))
    # and the draft used that cache: it equals a draft from a cache of the drafter's own
    own = EarlyExitDrafter(target, 2).draft(ids, Tree.kary(2, 10), GREEDY)
    assert tokens_of(d) == tokens_of(own)


def test_early_exit_refuses_another_models_cache(tiny_target):
    drafter = EarlyExitDrafter(tiny_target, 1)
    with pytest.raises(ValueError, match="not the target's"):
        drafter.bind_target_cache(new_cache(tiny_model(3, layers=3)))
    drafter.bind_target_cache(new_cache(tiny_target))
    with pytest.raises(RuntimeError, match="all but the last"):  # an empty cache for a 7-token sequence
        drafter.draft(random_prompt(1), Tree.chain(2), GREEDY)


@pytest.mark.parametrize("tree_name", TREES)
def test_early_exit_drafts_what_a_separate_truncated_model_drafts(tree_name):
    target = tiny_model(0, scale=30.0, layers=3)
    shared = Recorder(EarlyExitDrafter(target, 2))
    separate = Recorder(ModelDrafter(truncate_layers(copy.deepcopy(target), 2)))
    tree = TREES[tree_name]
    ids = repetitive_prompt(4)
    a = speculative_generate(target, shared, ids, tree=tree, max_new_tokens=MAX_NEW, eos_token_id=())
    b = speculative_generate(target, separate, ids, tree=tree, max_new_tokens=MAX_NEW, eos_token_id=())
    assert a.tokens.tolist() == b.tokens.tolist()
    assert shared.drafts == separate.drafts


@pytest.mark.parametrize("tree_name", TREES)
def test_early_exit_at_all_layers_is_the_target(tiny_target, tree_name):
    tree = TREES[tree_name]
    drafter = EarlyExitDrafter(tiny_target, len(tiny_target.model.layers))
    result = speculative_generate(
        tiny_target, drafter, random_prompt(5), tree=tree, max_new_tokens=MAX_NEW, eos_token_id=()
    )
    for step in result.steps:  # each step accepts the whole rank-0 chain, nothing off it
        assert step.num_accepted == rank0_chain(tree.truncated(step.tree_depth))
        assert step.accepted_ranks == (0,) * step.num_accepted
    if tree_name == "chain4":
        assert summarize(result).acceptance_rate == 1.0


# ---- 4-bit self-draft ------------------------------------------------------------------------


def test_quantized_self_draft(tmp_path):
    import bitsandbytes as bnb
    from test_models import WORDS_A, save_tiny_model

    folder = save_tiny_model(tmp_path / "tiny", WORDS_A, seed=0)
    target, _ = load_model(str(folder))
    drafter = quantized_self_draft(str(folder))
    assert isinstance(drafter, ModelDrafter)
    assert isinstance(drafter.model.model.layers[0].mlp.up_proj, bnb.nn.Linear4bit)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    reference = autoregressive_generate(target, ids, max_new_tokens=20, eos_token_id=())
    result = speculative_generate(target, drafter, ids, tree=Tree.kary(2, 6), max_new_tokens=20, eos_token_id=())
    assert result.tokens.tolist() == reference.tokens.tolist()
    assert summarize(result).acceptance_length > 0.5  # a close copy: most first guesses are right


# ---- merged drafts ---------------------------------------------------------------------------


def test_merged_tree_is_the_union_of_the_token_paths():
    a = FixedDrafter(Tree.kary(2, 6), [10, 11, 12, 13, 14, 15])  # 10 -> 12 13, 11 -> 14 15
    b = FixedDrafter(Tree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)]), [10, 16, 13, 20])  # 10 13 20, 16
    merged = MergedDrafter([(a, a.tree), (b, b.tree)])
    d = merged.draft(torch.tensor([[1, 2]]), Tree.chain(3), GREEDY)
    paths = token_paths(d.tree, tokens_of(d))
    want = token_paths(a.tree, a.tokens) | token_paths(b.tree, b.tokens)
    assert paths == want and d.tree.num_nodes == len(want) == 8 and d.q is None
    assert d.tree.paths == ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 1, 0))
    assert tokens_of(d) == [10, 11, 16, 12, 13, 14, 15, 20]
    assert merged.last_sources == ((0, 1), (0,), (1,), (0,), (0, 1), (0,), (0,), (1,))
    assert len(merged.last_times) == 2
    # the requested depth cuts every component
    d = merged.draft(torch.tensor([[1, 2]]), Tree.chain(1), GREEDY)
    assert tokens_of(d) == [10, 11, 16]


@pytest.mark.parametrize("tree_name", TREES)
def test_merged_with_real_drafters_is_the_union(tiny_target, tiny_draft, tree_name):
    tree = TREES[tree_name]
    ids = repetitive_prompt(2)
    parts = [
        (NgramDrafter(), Tree.kary(3, 9)),
        (ModelDrafter(tiny_draft), tree),
        (EarlyExitDrafter(tiny_target, 1), Tree.chain(3)),
    ]
    d = MergedDrafter(parts).draft(ids, tree, GREEDY)
    want = set()
    for drafter, own in parts:
        drafter.reset()
        alone = drafter.draft(ids, own.truncated(tree.depth), GREEDY)
        want |= token_paths(alone.tree or own.truncated(tree.depth), tokens_of(alone))
    assert token_paths(d.tree, tokens_of(d)) == want and d.tree.num_nodes == len(want)


def test_merged_branch_of_the_target_is_accepted_whole(tiny_target, tiny_draft):
    target_first = MergedDrafter([(ModelDrafter(tiny_target), Tree.chain(4)), (tiny_draft, Tree.kary(2, 6))])
    result = speculative_generate(
        tiny_target, target_first, random_prompt(6), tree=Tree.chain(4), max_new_tokens=MAX_NEW, eos_token_id=()
    )
    for step in result.steps:
        assert step.num_accepted == step.tree_depth  # the target's own chain, every token of it
    # the same with the target's component second: its nodes come after the other's
    drafter = MergedDrafter([(tiny_draft, Tree.kary(2, 6)), (ModelDrafter(tiny_target), Tree.chain(4))])
    result = speculative_generate(
        tiny_target, drafter, random_prompt(6), tree=Tree.chain(4), max_new_tokens=MAX_NEW, eos_token_id=()
    )
    assert all(step.num_accepted == step.tree_depth for step in result.steps)


def test_merged_components_observe_their_own_acceptance(tiny_target):
    # a component that is the target: its chain is always accepted whole, so its length grows by 2
    adaptive = AdaptiveLength(ModelDrafter(tiny_target), start=1)
    wrong = FixedDrafter(Tree.wide(2), [0, 0])  # pad tokens: never the target's choice
    merged = MergedDrafter([(wrong, wrong.tree), (adaptive, Tree.chain(30))])
    speculative_generate(
        tiny_target, merged, random_prompt(7), tree=Tree.chain(30), max_new_tokens=MAX_NEW, eos_token_id=()
    )
    assert adaptive.lengths[:3] == [1, 3, 5]
    assert all(a.path == () for a in wrong.observed)  # its token was never the accepted one


# ---- adaptive draft length -------------------------------------------------------------------


def transformers_lengths(start: int, drafted_accepted: list[tuple[int, int]]) -> list[int]:
    """transformers' own update_candidate_strategy, run on a stand-in generator."""
    config = SimpleNamespace(num_assistant_tokens_schedule="heuristic", assistant_confidence_threshold=0)
    gen = SimpleNamespace(assistant_generation_config=config, num_assistant_tokens=start)
    out = [start]
    for drafted, accepted in drafted_accepted:
        scores = torch.zeros(1, drafted + 1, 3)  # one row per candidate, plus the bonus row
        AssistedCandidateGenerator.update_candidate_strategy(gen, None, scores, accepted)
        out.append(gen.num_assistant_tokens)
    return out


def test_heuristic_length_matches_transformers():
    script = [True, True, False, False, False, False, False, False, True, False]  # all accepted?
    drafter = AdaptiveLength(FixedDrafter(Tree.chain(100), list(range(100))), start=3)
    history = []
    for all_accepted in script:
        d = drafter.draft(torch.tensor([1]), Tree.chain(100), GREEDY)
        accepted = d.tree.depth if all_accepted else d.tree.depth // 2
        history.append((d.tree.depth, accepted))
        drafter.observe(d, specnb.Acceptance(tuple(range(accepted)), 0))
    assert drafter.lengths + [drafter.length] == transformers_lengths(3, history)
    assert drafter.lengths == [3, 5, 7, 6, 5, 4, 3, 2, 1, 3]


@pytest.mark.parametrize("schedule, after_reset", [("heuristic", 7), ("heuristic_transient", 3), ("constant", 3)])
def test_heuristic_length_across_prompts(schedule, after_reset):
    drafter = AdaptiveLength(FixedDrafter(Tree.chain(100), list(range(100))), start=3, schedule=schedule)
    for _ in range(2):  # two all-accepted steps
        d = drafter.draft(torch.tensor([1]), Tree.chain(100), GREEDY)
        drafter.observe(d, specnb.Acceptance(tuple(range(d.tree.depth)), 0))
    drafter.reset()
    assert drafter.length == after_reset


def test_adaptive_length_in_the_loop(tiny_target, tiny_draft):
    drafter = AdaptiveLength(ModelDrafter(tiny_draft), start=4)
    tree = Tree.chain(6)
    result = speculative_generate(
        tiny_target, drafter, repetitive_prompt(1), tree=tree, max_new_tokens=40, eos_token_id=()
    )
    length = 4
    for step in result.steps:
        assert step.tree_depth == min(length, tree.depth, 40 - step.position - 1)
        length = length + 2 if step.num_accepted == step.tree_depth else max(1, length - 1)
    assert len({s.tree_depth for s in result.steps}) > 1


# ---- confidence threshold --------------------------------------------------------------------


def draft_probability(model, seq: list[int], token: int) -> float:
    with torch.no_grad():
        return float(torch.softmax(model(torch.tensor([seq])).logits[0, -1], -1)[token])


def test_confidence_threshold_stops_after_the_first_unsure_token(tiny_target):
    draft = tiny_model(1, scale=3.0, layers=1)
    ids = repetitive_prompt(2)
    plain = Recorder(ModelDrafter(draft))
    zero = Recorder(ModelDrafter(draft, confidence_threshold=0.0))
    one = Recorder(ModelDrafter(draft, confidence_threshold=1.0))
    half = Recorder(ModelDrafter(draft, confidence_threshold=0.5))
    runs = {}
    for name, drafter in [("plain", plain), ("zero", zero), ("one", one), ("half", half)]:
        runs[name] = speculative_generate(
            tiny_target, drafter, ids, tree=Tree.chain(5), max_new_tokens=MAX_NEW, eos_token_id=()
        )
    assert zero.drafts == plain.drafts  # threshold 0 is the fixed chain
    for (tokens, _), step in zip(one.drafts, runs["one"].steps):  # threshold 1: one token a step
        assert len(tokens) == min(1, MAX_NEW - step.position - 1)
    # threshold 0.5: every token but the last had q >= 0.5, the last had q < 0.5 or ended the chain
    prefix = ids[0].tolist()
    lengths = set()
    for (tokens, tree), step in zip(half.drafts, runs["half"].steps):
        allowed = min(5, MAX_NEW - step.position - 1)
        qs = [draft_probability(draft, prefix + tokens[:i], tokens[i]) for i in range(len(tokens))]
        assert all(q >= 0.5 for q in qs[:-1]) and tree == Tree.chain(len(tokens))
        assert (qs and qs[-1] < 0.5) or len(tokens) == allowed
        lengths.add(len(tokens))
        prefix += runs["half"].tokens[step.position : step.position + step.num_tokens].tolist()
    assert len(lengths) > 1
    for result in runs.values():
        assert result.tokens.tolist() == runs["plain"].tokens.tolist()


def test_confidence_threshold_needs_a_chain(tiny_draft):
    with pytest.raises(ValueError, match="chains"):
        ModelDrafter(tiny_draft, confidence_threshold=0.5).draft(random_prompt(1), Tree.kary(2, 4), GREEDY)


# ---- SmolLM2-135M (real model; a few seconds each) -------------------------------------------


REPEAT = "Repeat this list exactly, twice: apples, pears, plums, figs, dates, limes, kiwis."


@pytest.fixture(scope="module")
def smollm(smollm2):
    """SmolLM2-135M (the session's, loaded once), the repetitive prompt, and the target's own greedy
    output after it."""
    model, tokenizer = smollm2
    ids = prompt_ids(tokenizer, REPEAT)
    return model, ids, autoregressive_generate(model, ids, max_new_tokens=16)


@pytest.fixture(scope="module")
def smollm_first8(smollm):
    """A separate copy of SmolLM2's first 8 layers (made once for both trees)."""
    return truncate_layers(copy.deepcopy(smollm[0]), 8)


@pytest.mark.slow
@pytest.mark.parametrize("tree", [Tree.chain(4), Tree.kary(2, 8)], ids=["chain4", "kary2x8"])
def test_smollm_early_exit_greedy_equals_plain(smollm, smollm_first8, tree):
    model, ids, reference = smollm
    shared = Recorder(EarlyExitDrafter(model, 8))
    result = speculative_generate(model, shared, ids, tree=tree, max_new_tokens=16)
    assert result.tokens.tolist() == reference.tokens.tolist()
    separate = Recorder(ModelDrafter(smollm_first8))
    speculative_generate(model, separate, ids, tree=tree, max_new_tokens=16)
    same = sum(a == b for a, b in zip(shared.drafts, separate.drafts))
    assert same >= len(separate.drafts) - 1  # float rounding may flip a near-tie, rarely


@pytest.mark.slow
def test_smollm_ngram_on_a_repetitive_prompt(smollm):
    model, ids, reference = smollm
    result = speculative_generate(model, NgramDrafter(), ids, tree=Tree.kary(2, 8), max_new_tokens=16)
    assert result.tokens.tolist() == reference.tokens.tolist()
    assert summarize(result).acceptance_length > 0.5
