"""EAGLE-2-style dynamic trees: the level-by-level construction is the exact global top n by
cumulative draft log-probability (checked against brute force over the whole top-k tree), greedy
output equals the target's, and sampled output follows the target."""

import pytest
import torch
from conftest import random_prompt
from stats import ALPHA, chi_square_pvalue
from test_generation import first_two, sampling_pair  # noqa: F401 (fixture)

from specnb import Tree, autoregressive_generate, speculative_generate
from specnb.drafters.dynamic import DynamicTreeDrafter, top_n


def brute_force(model, prompt, top_k, depth, n):
    """Score every node of the full top-k tree by running its path as a plain sequence."""
    scores, tokens = {}, {}
    frontier = [()]
    for _ in range(depth):
        nxt = []
        for path in frontier:
            seq = prompt[0].tolist() + [tokens[path[:d]] for d in range(1, len(path) + 1)]
            with torch.inference_mode():
                logq = torch.log_softmax(model(torch.tensor([seq])).logits[0, -1].float(), -1)
            top = torch.topk(logq, top_k)
            base = scores.get(path, 0.0)
            for r, (lq, tok) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                scores[path + (r,)] = base + lq
                tokens[path + (r,)] = tok
                nxt.append(path + (r,))
        frontier = nxt
    return scores, tokens


@pytest.mark.parametrize("n, top_k, depth", [(1, 3, 3), (5, 3, 3), (12, 3, 3), (39, 3, 3), (9, 2, 4)])
def test_level_by_level_is_the_exact_global_top_n(tiny_draft, n, top_k, depth):
    prompt = random_prompt(3)
    scores, tokens = brute_force(tiny_draft, prompt, top_k, depth, n)
    want = Tree.from_paths(top_n(scores, n))
    got = DynamicTreeDrafter(tiny_draft, n=n, top_k=top_k, max_depth=depth).expand(prompt, depth)
    assert got.tree == want
    assert got.tokens.tolist() == [tokens[p] for p in want.paths]
    torch.testing.assert_close(got.scores, torch.tensor([scores[p] for p in want.paths]), atol=1e-4, rtol=0)
    assert not got.tree.has_rank_gaps
    assert got.tree.num_nodes == min(n, sum(top_k**d for d in range(1, depth + 1)))


def test_the_tree_changes_with_the_draft_confidence(tiny_draft):
    drafter = DynamicTreeDrafter(tiny_draft, n=10, top_k=4, max_depth=5)
    shapes = {drafter.expand(random_prompt(seed), 5).tree for seed in range(6)}
    assert len(shapes) > 1  # a static tree would give one shape


@pytest.mark.parametrize("n, top_k, depth", [(8, 4, 4), (16, 8, 6), (3, 2, 2)])
def test_greedy_output_equals_the_target(tiny_target, tiny_draft, n, top_k, depth):
    drafter = DynamicTreeDrafter(tiny_draft, n=n, top_k=top_k, max_depth=depth)
    for seed in (1, 2):
        ids = random_prompt(seed, length=5 + seed)
        reference = autoregressive_generate(tiny_target, ids, max_new_tokens=21, eos_token_id=())
        result = speculative_generate(tiny_target, drafter, ids, max_new_tokens=21, eos_token_id=())
        assert result.tokens.tolist() == reference.tokens.tolist()
        assert all(s.num_drafted <= n and s.tree_depth <= depth for s in result.steps)
        assert max(s.tree_depth for s in result.steps) > 1  # default_tree let it go deep


def test_draft_is_target_accepts_the_rank0_chain(tiny_target):
    drafter = DynamicTreeDrafter(tiny_target, n=6, top_k=3, max_depth=4)
    result = speculative_generate(tiny_target, drafter, random_prompt(2), max_new_tokens=20, eos_token_id=())
    for s in result.steps[:-1]:
        assert s.accepted_ranks == (0,) * s.num_accepted and s.num_accepted >= 1


def test_sampled_output_follows_the_target(sampling_pair):  # noqa: F811
    target, draft, prompt, exact = sampling_pair
    samples = first_two(target, DynamicTreeDrafter(draft, n=5, top_k=3, max_depth=2), prompt, None, runs=2500)
    assert chi_square_pvalue(samples, exact) > ALPHA


@pytest.mark.parametrize("n,top_k,depth", [(6, 3, 4), (12, 4, 6)])
def test_rows_drafted_together_take_each_rows_own_dynamic_trees(tiny_target, tiny_draft, n, top_k, depth):
    """`DynamicTreeDrafter.draft_rows`: three prompts of different lengths in one batch (one draft forward per
    depth for every row, each row's level padded to the widest) take, row by row, the steps of that
    prompt with its own `DynamicTreeDrafter`: the same trees, tokens and acceptances; the output is
    the target's greedy output."""
    from specnb.core.batch import speculative_generate_batch

    prompts = [random_prompt(s, length=m)[0] for s, m in ((3, 5), (4, 17), (5, 9))]
    batch = speculative_generate_batch(
        tiny_target, DynamicTreeDrafter(tiny_draft, n, top_k, depth), prompts, Tree.chain(depth), 20, eos_token_id=()
    )
    shapes = set()
    for prompt, row in zip(prompts, batch.rows):
        alone = speculative_generate(
            tiny_target,
            DynamicTreeDrafter(tiny_draft, n, top_k, depth),
            prompt[None],
            Tree.chain(depth),
            20,
            eos_token_id=(),
        )
        assert row.tokens.tolist() == alone.tokens.tolist()
        assert [(s.child_counts, s.accepted_ranks, s.num_tokens) for s in row.steps] == [
            (s.child_counts, s.accepted_ranks, s.num_tokens) for s in alone.steps
        ]
        shapes |= {s.child_counts for s in row.steps}
    assert len(shapes) > 1  # the trees differ from step to step and row to row
