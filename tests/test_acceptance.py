"""Acceptance rules as pure functions: hand-checked greedy walks, and lossless sampling tested
statistically against the exact target distribution, with a broken rule to show the test's power."""

import pytest
import torch
from stats import ALPHA, chi_square_pvalue

from specnb import Tree, greedy_accept, speculative_accept
from specnb.core.acceptance import Acceptance
from specnb.core.sampling import SamplingConfig, probabilities, sample, sample_rows, sample_without_replacement

TREE = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


def test_greedy_accept_hand_checked():
    tokens = torch.tensor([5, 6, 7, 8, 9, 4])
    # target argmax at root, then at nodes 0..5
    assert greedy_accept(TREE, tokens, torch.tensor([6, 0, 9, 0, 0, 0, 0])) == Acceptance((1, 4), 0)
    assert greedy_accept(TREE, tokens, torch.tensor([5, 7, 0, 4, 0, 0, 3])) == Acceptance((0, 2, 5), 3)
    assert greedy_accept(TREE, tokens, torch.tensor([1, 7, 0, 4, 0, 0, 3])) == Acceptance((), 1)
    assert greedy_accept(TREE, tokens, torch.tensor([5, 8, 0, 0, 0, 0, 0])) == Acceptance((0, 3), 0)


def toy_distribution(context: tuple, vocab: int, salt: int) -> torch.Tensor:
    """A fixed, peaked distribution per token context (stands in for a model)."""
    g = torch.Generator().manual_seed(hash((context, salt)) % (2**31))
    return torch.softmax(2.5 * torch.randn(vocab, generator=g), -1)


def draft_and_rows(tree, vocab, g):
    """Draft a tree as ModelDrafter does (draws without replacement) and fill p/q rows."""
    n = tree.num_nodes
    tokens = torch.zeros(n, dtype=torch.long)
    context = {-1: ()}
    p = torch.zeros(n + 1, vocab)
    q = torch.zeros(n + 1, vocab)
    p[0], q[0] = toy_distribution((), vocab, 0), toy_distribution((), vocab, 1)
    for row, kids in enumerate(tree.children):
        if kids:
            draws = sample_without_replacement(q[row], len(kids), g)
            for c in kids:
                tokens[c] = draws[tree.ranks[c]]
                context[c] = context[row - 1] + (int(tokens[c]),)
                p[c + 1] = toy_distribution(context[c], vocab, 0)
                q[c + 1] = toy_distribution(context[c], vocab, 1)
    return tokens, p, q


def broken_accept(tree, tokens, p, q, g):
    """A classic bug: on rejection, resample from p instead of the residual max(p - q, 0)."""
    path, row = [], 0
    while True:
        for child in tree.children[row]:
            x = int(tokens[child])
            if float(torch.rand((), generator=g)) * float(q[row][x]) < float(p[row][x]):
                path.append(child)
                row = child + 1
                break
        else:  # the accepted tokens are recorded as every rule records them: only the rule is broken
            return Acceptance(tuple(path), sample(p[row], g), tuple(int(tokens[i]) for i in path))


def first_two_tokens(rule, tree, vocab, trials, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(trials):
        tokens, p, q = draft_and_rows(tree, vocab, g)
        result = rule(tree, tokens, p, q, g)
        emitted = tokens[list(result.path)].tolist() + [result.next_token]
        if len(emitted) == 1:  # the next step would start with the target's own sample
            emitted.append(sample(toy_distribution(tuple(emitted), vocab, 0), g))
        out.append(tuple(emitted[:2]))
    return out


def exact_first_two(vocab):
    first = toy_distribution((), vocab, 0)
    return {(a, b): float(first[a] * toy_distribution((a,), vocab, 0)[b]) for a in range(vocab) for b in range(vocab)}


@pytest.mark.parametrize("tree", [Tree.chain(3), Tree.kary(2, 6), Tree.wide(3)], ids=["chain", "kary", "wide"])
def test_speculative_accept_is_lossless(tree):
    vocab = 5
    samples = first_two_tokens(speculative_accept, tree, vocab, trials=6000, seed=0)
    assert chi_square_pvalue(samples, exact_first_two(vocab)) > ALPHA


@pytest.mark.parametrize("tree", [Tree.chain(3), Tree.kary(2, 6)], ids=["chain", "kary"])
def test_the_same_check_rejects_a_broken_rule(tree):
    vocab = 5
    samples = first_two_tokens(broken_accept, tree, vocab, trials=6000, seed=0)
    assert chi_square_pvalue(samples, exact_first_two(vocab)) < ALPHA


def test_skips_draws_beyond_q_support():
    # q has support {0, 1} but the tree asks for 3 children: the third draw has q = 0 and must be
    # skipped, not treated as a draw from q
    tree = Tree.wide(3)
    q = torch.tensor([0.5, 0.5, 0.0, 0.0])
    p = torch.tensor([0.1, 0.1, 0.4, 0.4])
    rows_p = p.repeat(4, 1)  # leaves need a p row too: the bonus token is drawn there
    rows_q = torch.cat([q[None], torch.zeros(3, 4)])
    g = torch.Generator().manual_seed(0)
    emitted = []
    for _ in range(4000):
        tokens = sample_without_replacement(q, 3, g)
        assert set(tokens[:2].tolist()) == {0, 1}
        d = speculative_accept(tree, tokens, rows_p, rows_q, g)
        emitted.append(d.next_token if not d.path else int(tokens[d.path[0]]))
    assert chi_square_pvalue(emitted, {i: float(p[i]) for i in range(4)}) > ALPHA


def test_sampling_config_and_filters():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    full = probabilities(logits, SamplingConfig(temperature=1.0))
    torch.testing.assert_close(full, torch.softmax(logits, -1))
    top2 = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (top2[0, 2:] == 0).all() and top2.sum().item() == pytest.approx(1.0)
    nucleus = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    # softmax = [0.61, 0.22, 0.14, 0.03]: the first token alone is < 0.7, the first two reach it
    assert (nucleus[0, :2] > 0).all() and (nucleus[0, 2:] == 0).all()
    with pytest.raises(ValueError):
        SamplingConfig(temperature=-1.0)
    with pytest.raises(ValueError):
        SamplingConfig(temperature=1.0, top_p=0.0)


ROW_LOGITS = torch.tensor(
    [
        [2.0, 1.0, 0.5, -1.0, float("-inf"), 0.0, 1.5, -0.5, float("-inf"), 0.2, 1.1],
        [-1.0, 0.0, 3.0, float("-inf"), 0.5, 0.5, -2.0, 1.0, 0.0, 2.5, float("-inf")],
    ]
)


@pytest.mark.parametrize("block", [4, 256])  # three blocks (the last padded), or one block wider than the vocabulary
def test_sample_rows_draws_from_the_tempered_softmax(block):
    g = torch.Generator().manual_seed(0)
    draws = sample_rows(ROW_LOGITS.repeat(20000, 1), 0.7, g, block=block).view(-1, 2)  # [20000, 2]
    for r in range(2):  # each row from its own distribution; -inf logits (weight 0) never drawn
        exact = torch.softmax(ROW_LOGITS[r] / 0.7, -1)
        cells = {i: float(exact[i]) for i in range(11) if exact[i] > 0}  # a draw outside them fails the check
        assert chi_square_pvalue(draws[:, r].tolist(), cells) > ALPHA


def test_sample_rows_check_detects_a_wrong_temperature():
    g = torch.Generator().manual_seed(0)
    draws = sample_rows(ROW_LOGITS[:1].repeat(20000, 1), 1.0, g)
    exact = torch.softmax(ROW_LOGITS[0] / 0.7, -1)
    assert chi_square_pvalue(draws.tolist(), {i: float(exact[i]) for i in range(11) if exact[i] > 0}) < ALPHA
    with pytest.raises(ValueError, match="temperature"):
        sample_rows(ROW_LOGITS, 0.0)


def test_rank_gaps_are_refused_for_sampling():
    tree = Tree.from_paths([(0,), (2,)])
    with pytest.raises(ValueError, match="gaps"):
        speculative_accept(tree, torch.tensor([1, 2]), torch.ones(3, 4) / 4, torch.ones(3, 4) / 4, None)


# ---- deterministic proposals (q=None): n-gram matches, top-k dynamic trees, merged drafts -------

GAPPY = Tree.from_paths([(0,), (2,), (3,), (0, 1), (0, 4), (2, 0)])  # rank gaps, as a merged tree has


def deterministic_draft(tree, vocab):
    """Tokens chosen without sampling: the rank-th most likely token of a draft distribution after
    the node's context, except that node 2 repeats node 0's token (merged drafts can repeat)."""
    tokens = torch.zeros(tree.num_nodes, dtype=torch.long)
    context: dict[int, tuple] = {}
    for i, (parent, rank) in enumerate(zip(tree.parents, tree.ranks)):
        ctx = () if parent < 0 else context[parent] + (int(tokens[parent]),)
        order = torch.argsort(toy_distribution(ctx, vocab, 1), descending=True)
        tokens[i] = order[rank % vocab]
        context[i] = ctx
    tokens[2] = tokens[0]
    p = torch.stack(
        [toy_distribution((), vocab, 0)]
        + [toy_distribution(context[i] + (int(tokens[i]),), vocab, 0) for i in range(tree.num_nodes)]
    )
    return tokens, p


def not_zeroing_accept(tree, tokens, p, q, g):
    """A broken rule: on rejection, keep p as it was instead of zeroing the rejected token."""
    toks, path, row = tokens.tolist(), [], 0
    while True:
        child = next(
            (c for c in tree.children[row] if float(torch.rand((), generator=g)) < float(p[row][toks[c]])), None
        )
        if child is None:  # the accepted tokens recorded as every rule records them
            return Acceptance(tuple(path), sample(p[row], g), tuple(toks[i] for i in path))
        path.append(child)
        row = child + 1


@pytest.mark.parametrize(
    "rule, lossless", [(speculative_accept, True), (not_zeroing_accept, False)], ids=["rule", "broken"]
)
def test_deterministic_proposals_are_lossless(rule, lossless):
    vocab = 5
    tokens, p = deterministic_draft(GAPPY, vocab)
    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(6000):
        result = rule(GAPPY, tokens, p, None, g)
        emitted = tokens[list(result.path)].tolist() + [result.next_token]
        if len(emitted) == 1:
            emitted.append(sample(toy_distribution(tuple(emitted), vocab, 0), g))
        samples.append(tuple(emitted[:2]))
    pvalue = chi_square_pvalue(samples, exact_first_two(vocab))
    assert (pvalue > ALPHA) if lossless else (pvalue < ALPHA)


def test_a_target_known_by_its_greedy_tokens_accepts_as_its_logits_would():
    """`accept` takes the target's greedy token per row (long [N + 1]) where no logits exist (a
    re-draft reads them from a continuation), and only for greedy sampling."""
    from specnb.core.acceptance import accept

    tree = Tree.kary(2, 6)
    tokens = torch.tensor([5, 7, 1, 2, 3, 4])
    logits = torch.randn(tree.num_nodes + 1, 10, generator=torch.Generator().manual_seed(0))
    logits[0, 7], logits[2, 3] = 50.0, 50.0  # the root wants node 1's token, node 1 wants its first child's
    choices = logits.argmax(-1)
    assert accept(tree, tokens, choices, SamplingConfig()) == accept(tree, tokens, logits, SamplingConfig())
    assert accept(tree, tokens, choices, SamplingConfig()).path == (1, 4)
    with pytest.raises(ValueError, match="sampling must be greedy"):
        accept(tree, tokens, choices, SamplingConfig(temperature=1.0))
