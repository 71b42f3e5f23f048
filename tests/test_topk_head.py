"""TopKHead: the top k of its logits are the float32 head's (near ties built on purpose included),
drafts made with it equal drafts made with the model's own head, and it is used only where it is
exact (greedy, no confidence threshold) and only where it pays."""

from __future__ import annotations

import pytest
import torch
from conftest import random_prompt

from specnb.core.batch import speculative_generate_batch
from specnb.core.drafting import ModelDrafter
from specnb.core.generation import autoregressive_generate, speculative_generate
from specnb.core.sampling import SamplingConfig, top_tokens
from specnb.core.trees import Tree
from specnb.kernels.topk_head import MIN_WEIGHT, TopKHead, draft_head

pytestmark = pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN without bfloat16")


def near_ties(v: int, h: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight whose rows come in pairs differing by far less than bfloat16's rounding, and hidden
    rows of realistic size: the bfloat16 logits cannot order such pairs, the float32 ones can."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(v, h, generator=g) * 0.05).to(torch.bfloat16).float()  # even rows: exact in bfloat16
    odd = w[0::2] + torch.randn(v // 2, h, generator=g) * 1e-5
    w[1::2] = torch.where(odd.to(torch.bfloat16).float() == w[0::2], odd, w[0::2])  # the same in bfloat16
    x = torch.randn(6, h, generator=g).to(torch.bfloat16).float() * 3.0
    return w, x


@pytest.mark.parametrize("k", [1, 3, 16, 64])
@pytest.mark.parametrize("seed", [0, 1])
def test_top_k_is_the_float32_heads(k, seed):
    w, x = near_ties(4096, 96, seed)
    bias = torch.randn(4096, generator=torch.Generator().manual_seed(seed)) * 0.1
    for b in (None, bias):
        head = TopKHead(w, b)
        exact = torch.nn.functional.linear(x, w, b)
        got = head(x, k)
        assert torch.equal(top_tokens(got, k), top_tokens(exact, k))
        if b is None:  # the bfloat16 logits alone: the test's ties defeat them (a bias would separate the pairs)
            assert not torch.equal(top_tokens(head(x, 0), k), top_tokens(exact, k))


def crowded(v: int, h: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows near one common row: the logits crowd within a few bfloat16 errors of each other, so
    the bfloat16 order is noise near the top and only a sound bound keeps the true top k."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(h, generator=g) * 0.05
    return base + torch.randn(v, h, generator=g) * 2e-3, torch.randn(32, h, generator=g) * 3.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_k_in_a_crowd(seed):
    w, x = crowded(4096, 96, seed)
    head = TopKHead(w)
    exact = x @ w.T
    for k in (1, 8):
        assert torch.equal(top_tokens(head(x, k), k), top_tokens(exact, k))
        assert not torch.equal(top_tokens(head(x, 0), k), top_tokens(exact, k))  # bfloat16 alone gets it wrong


def test_bound_holds_and_candidates_are_few():
    w, x = near_ties(8192, 128, 3)
    head = TopKHead(w)
    a = head.approximate(x)
    exact = x @ w.T
    bound = head.bound(x)
    assert bool(((a - exact).abs() <= bound).all())  # the bound of the module docstring, step 2
    assert float(((a - exact).abs() / bound).max()) > 0.05  # and not vacuous: within 20x of the worst error seen
    floor = torch.topk(a - bound, 1, dim=-1).values[:, -1:]
    candidates = int((a + bound >= floor).sum())
    assert candidates < 0.05 * a.numel()  # the recheck reads a few rows, not the head


@pytest.fixture(scope="module")
def pair():
    from conftest import tiny_model

    return tiny_model(0), tiny_model(1)


@pytest.mark.parametrize(
    "tree",
    [Tree.chain(4), Tree.kary(2, 10), Tree.sparse(12), Tree.from_paths([(0,), (2,), (0, 1), (2, 0)])],
    ids=["chain", "kary", "sparse", "gappy"],
)
def test_drafts_equal_the_model_heads(pair, tree):
    """The same drafts, step after step, with the TopKHead as with the model's own head; the output is
    the target's greedy output."""
    target, draft = pair
    lm = draft.get_output_embeddings()
    head = TopKHead(lm.weight, lm.bias)
    for length in (2, 7):
        prompt = random_prompt(length, length + 10)
        plain = speculative_generate(target, ModelDrafter(draft, head=None), prompt, tree, 16, eos_token_id=())
        fast = speculative_generate(target, ModelDrafter(draft, head=head), prompt, tree, 16, eos_token_id=())
        assert [(s.num_drafted, s.num_accepted, s.accepted_ranks) for s in fast.steps] == [
            (s.num_drafted, s.num_accepted, s.accepted_ranks) for s in plain.steps
        ]
        assert fast.tokens.tolist() == autoregressive_generate(target, prompt, 16, eos_token_id=()).tokens.tolist()


def test_used_only_where_exact(pair, monkeypatch):
    """Sampled and confidence-threshold drafts read the model's own head; greedy drafts the TopKHead."""
    target, draft = pair
    lm = draft.get_output_embeddings()
    head = TopKHead(lm.weight, lm.bias)
    calls = []
    monkeypatch.setattr(
        TopKHead, "__call__", lambda self, x, k=0: calls.append(k) or torch.nn.functional.linear(x, lm.weight, lm.bias)
    )
    prompt = random_prompt(3, 8)[0]
    ModelDrafter(draft, head=head).draft(prompt, Tree.kary(2, 6), SamplingConfig())
    assert calls and all(k >= 1 for k in calls)
    calls.clear()
    ModelDrafter(draft, head=head).draft(
        prompt, Tree.kary(2, 6), SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0)
    )
    ModelDrafter(draft, head=head, confidence_threshold=0.5).draft(prompt, Tree.chain(4), SamplingConfig())
    assert calls == []


@pytest.mark.parametrize("tree", [Tree.chain(4), Tree.kary(2, 10), Tree.from_paths([(0,), (2,), (0, 1), (2, 0)])])
def test_rows_drafted_together_draft_the_same_with_the_topk_head(pair, tree):
    """`ModelDrafter.draft_rows`: rows of 3, 9 and 17 tokens drafted in one batch take the same steps and
    tokens with the TopKHead as with the model's own head, the head called with each depth's k on
    greedy drafts; a sampled batch never calls it."""
    target, draft = pair
    lm = draft.get_output_embeddings()
    head = TopKHead(lm.weight, lm.bias)
    prompts = [random_prompt(i, length=n)[0] for i, n in enumerate((3, 9, 17))]
    plain = speculative_generate_batch(target, ModelDrafter(draft, head=None), prompts, tree, 16, eos_token_id=())
    real = TopKHead.__call__
    calls = []

    def counted(self, x, k=0):
        calls.append(k)
        return real(self, x, k)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(TopKHead, "__call__", counted)
        fast = speculative_generate_batch(target, ModelDrafter(draft, head=head), prompts, tree, 16, eos_token_id=())
        assert calls and all(k >= 1 for k in calls)
        calls.clear()
        sampled = SamplingConfig(temperature=1.0, seed=3)
        chain = Tree.chain(4)  # sampling takes trees without rank gaps
        speculative_generate_batch(target, ModelDrafter(draft, head=head), prompts, chain, 8, sampled, ())
        assert calls == []
    for a, b in zip(fast.rows, plain.rows):
        assert [(s.num_drafted, s.num_accepted, s.accepted_ranks) for s in a.steps] == [
            (s.num_drafted, s.num_accepted, s.accepted_ranks) for s in b.steps
        ]
        assert a.tokens.tolist() == b.tokens.tolist()


def test_made_where_it_pays_and_once_per_model(pair):
    _, draft = pair
    assert draft.get_output_embeddings().weight.numel() < MIN_WEIGHT and draft_head(draft) is None  # a tiny head: none
    big = torch.nn.Module()
    big.lm = torch.nn.Linear(256, MIN_WEIGHT // 256 + 1, bias=False)
    big.get_output_embeddings = lambda: big.lm
    first = draft_head(big)
    assert isinstance(first, TopKHead) and draft_head(big) is first  # one copy for every drafter of a model
    assert ModelDrafter(big, head="auto").head is first
