"""Batched speculative generation (`core.batch`, `core.ragged`): rows of very different lengths and
acceptance in one batch, each row's greedy output equal to its own batch-1 greedy output for every
preset shape, rows finishing early and leaving the batch, per-row host drafters, the target alone
batched, and lossless sampling per row (chi-square at batch 3, with a power check against a broken
rule). Ragged blocks: a row's logits equal that row run alone; commits move exactly the columns asked."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import random_prompt, tiny_model
from stats import ALPHA, chi_square_pvalue
from test_acceptance import not_zeroing_accept

import specnb.core.acceptance
from specnb import EarlyExitDrafter, ModelDrafter, NgramDrafter, Tree, autoregressive_generate, speculative_generate
from specnb.core.batch import autoregressive_generate_batch, prefill_batch, speculative_generate_batch
from specnb.core.ragged import RaggedCache, block_forward, commit, select_rows
from specnb.core.sampling import SamplingConfig
from specnb.core.streaming import StreamingCache
from specnb.drafters.dynamic import DynamicTreeDrafter

LENGTHS = (3, 29, 11)  # very different prompt lengths in one batch
SHAPES = {
    "chain4": Tree.chain(4),
    "kary2x6": Tree.kary(2, 6),
    "sparse12": Tree.sparse(12),
    "wide5": Tree.wide(5),
    "beams2x8": Tree.beams(2, 8),
}


def prompts(lengths=LENGTHS, seed=0):
    return [random_prompt(seed + i, length=n)[0] for i, n in enumerate(lengths)]


def test_rows_of_very_different_lengths_are_prefilled_in_groups_and_keep_their_own_logits(tiny_target):
    """Prompts of 1, 2, 3, 40 and 41 tokens: one padded forward would be 5 x 41 for 87 tokens, so they
    are prefilled in groups of similar length and stacked; every row, and the one of no tokens, then
    gets the logits of its tokens run alone, and a batched greedy generation equals each alone."""
    from specnb.core.batch import PADDING

    lengths = (2, 3, 40, 1, 41)
    rows = prompts(lengths, seed=9)
    assert len(rows) * max(lengths) > PADDING * sum(lengths)  # the grouped path
    ragged = RaggedCache.empty(tiny_target, len(rows))
    prefill_batch(tiny_target, ragged, [r.tolist()[:-1] for r in rows])
    assert ragged.lengths == [n - 1 for n in lengths] and ragged.width == max(lengths) - 1
    last = torch.tensor([[r[-1].item()] for r in rows])
    positions = torch.tensor(ragged.lengths)[:, None]
    one = torch.ones(len(rows), 1, 1, dtype=torch.bool)
    logits = block_forward(tiny_target, ragged, last, positions, one, torch.ones(len(rows), 1, dtype=torch.bool))
    for b, row in enumerate(rows):
        with torch.inference_mode():
            alone = tiny_target(row[None]).logits[0, -1]
        torch.testing.assert_close(logits[b, 0], alone, rtol=1e-4, atol=1e-4)
    batch = autoregressive_generate_batch(tiny_target, rows, max_new_tokens=6, eos_token_id=())
    for b, row in enumerate(rows):
        assert (
            batch.rows[b].tokens.tolist()
            == autoregressive_generate(tiny_target, row[None], 6, eos_token_id=()).tokens.tolist()
        )


def test_a_ragged_block_gives_each_row_its_own_logits(tiny_target):
    """Rows of 3, 29 and 11 tokens prefilled together, then one block of two tokens per row: every
    row's logits equal the same tokens run alone (no row sees another's tokens or padding)."""
    rows = prompts()
    ragged = RaggedCache.empty(tiny_target, len(rows))
    prefill_batch(tiny_target, ragged, [r.tolist() for r in rows])
    assert ragged.lengths == list(LENGTHS) and ragged.width == max(LENGTHS)
    nxt = torch.tensor([[5, 6], [7, 8], [9, 10]])
    positions = torch.tensor(ragged.lengths)[:, None] + torch.arange(2)[None]
    causal = torch.ones(2, 2, dtype=torch.bool).tril()[None].expand(3, 2, 2)
    logits = block_forward(tiny_target, ragged, nxt, positions, causal, torch.ones(3, 2, dtype=torch.bool))
    for b, row in enumerate(rows):
        with torch.inference_mode():
            alone = tiny_target(torch.cat([row, nxt[b]])[None]).logits[0, -2:]
        torch.testing.assert_close(logits[b], alone, rtol=1e-4, atol=1e-4)
    commit(ragged, [[1], [], [0, 1]])  # row 0 keeps the second token only, row 1 nothing, row 2 both
    assert ragged.lengths == [4, 29, 13] and ragged.width == 29
    keys = ragged.cache.layers[0].keys
    assert keys.shape[0] == 3
    select_rows(ragged, [2, 0])
    assert ragged.lengths == [13, 4] and ragged.cache.layers[0].keys.shape[0] == 2


@pytest.mark.parametrize("shape", SHAPES)
def test_each_rows_greedy_output_is_its_own_batch1_greedy_output(tiny_target, tiny_draft, shape):
    rows = prompts()
    batch = speculative_generate_batch(
        tiny_target, tiny_draft, rows, tree=SHAPES[shape], max_new_tokens=21, eos_token_id=()
    )
    assert batch.batch_size == 3 and batch.tokens == 3 * 21
    for row, result in zip(rows, batch.rows):
        alone = autoregressive_generate(tiny_target, row[None], max_new_tokens=21, eos_token_id=())
        assert result.tokens.tolist() == alone.tokens.tolist()
        assert sum(s.num_tokens for s in result.steps) == 21
        single = speculative_generate(
            tiny_target, tiny_draft, row[None], tree=SHAPES[shape], max_new_tokens=21, eos_token_id=()
        )
        assert [s.num_accepted for s in result.steps] == [s.num_accepted for s in single.steps], (
            "the same drafts are accepted alone and in a batch (greedy)"
        )


def test_rows_of_different_acceptance_finish_early_and_leave_the_batch(tiny_target):
    """The draft is the target for one row's trees and a stranger for the others: acceptance
    differs per row; one row stops at its EOS long before the others, and the batch goes on."""
    rows = prompts()
    alone = [
        autoregressive_generate(tiny_target, r[None], max_new_tokens=30, eos_token_id=()).tokens.tolist() for r in rows
    ]
    stop = next(j for j in range(2, 30) if all(alone[1][j] not in a[: j + 4] for a in (alone[0], alone[2])))
    eos = alone[1][stop]  # row 1 stops there; the others stop later or never
    batch = speculative_generate_batch(
        tiny_target, tiny_target, rows, tree=Tree.kary(2, 6), max_new_tokens=30, eos_token_id=eos
    )
    for want, result in zip(alone, batch.rows):
        cut = want[: want.index(eos) + 1] if eos in want else want
        assert result.tokens.tolist() == cut
    ends = alone[1].index(eos) + 1
    assert len(batch.rows[1].tokens) == ends and min(len(batch.rows[0].tokens), len(batch.rows[2].tokens)) > ends
    assert all(s.num_accepted == s.tree_depth for r in batch.rows for s in r.steps[:-1]), "draft = target: all accepted"


def test_host_drafters_draft_per_row(tiny_target):
    rows = prompts((5, 30, 12), seed=3)
    drafters = [NgramDrafter() for _ in rows]
    batch = speculative_generate_batch(
        tiny_target, drafters, rows, tree=Tree.kary(2, 8), max_new_tokens=24, eos_token_id=()
    )
    for row, result in zip(rows, batch.rows):
        assert (
            result.tokens.tolist()
            == autoregressive_generate(tiny_target, row[None], max_new_tokens=24, eos_token_id=()).tokens.tolist()
        )
    with pytest.raises(ValueError, match="one drafter per prompt"):
        speculative_generate_batch(tiny_target, drafters[:2], rows)
    on_the_target = [EarlyExitDrafter(tiny_target, 1) for _ in rows]  # drafts on the target's own cache
    with pytest.raises(ValueError, match="EarlyExitDrafter drafts on the target's own cache.*batch size 1"):
        speculative_generate_batch(tiny_target, on_the_target, rows)


def test_the_target_alone_batched(tiny_target):
    rows = prompts()
    batch = autoregressive_generate_batch(tiny_target, rows, max_new_tokens=17, eos_token_id=())
    alone = [autoregressive_generate(tiny_target, row[None], max_new_tokens=17, eos_token_id=()) for row in rows]
    for result, single in zip(batch.rows, alone):
        assert result.tokens.tolist() == single.tokens.tolist()
        assert len(result.steps) == 17
    assert batch.tokens_per_s > 0
    # the batch's KV peak: one cache padded to its longest row holds at least every row's own peak
    assert {r.kv_peak_bytes for r in batch.rows} == {batch.rows[0].kv_peak_bytes}
    assert batch.rows[0].kv_peak_bytes >= sum(single.kv_peak_bytes for single in alone) > 0


@pytest.fixture(scope="module")
def sampled_rows():
    """Three prompts of different lengths and the exact law of each one's first two tokens at T = 1."""
    target = tiny_model(11, vocab=13, scale=2.0)  # 169 cells for the first two tokens
    draft = tiny_model(12, vocab=13, scale=8.0, layers=1)  # peaked and wrong: a broken rule shows
    rows = [random_prompt(20 + i, length=n, vocab=13)[0] for i, n in enumerate((2, 9, 5))]
    exact = []
    with torch.inference_mode():
        for row in rows:
            first = torch.softmax(target(row[None]).logits[0, -1].double(), -1)  # [V]
            extended = torch.cat([row[None].expand(first.numel(), -1), torch.arange(first.numel())[:, None]], 1)
            second = torch.softmax(target(extended).logits[:, -1].double(), -1)  # [V, V]: after each first token
            joint = first[:, None] * second
            exact.append({(a, b): float(joint[a, b]) for a in range(joint.shape[0]) for b in range(joint.shape[1])})
    return target, draft, rows, exact


def first_two_per_row(target, draft, rows, tree, runs):
    samples = [[] for _ in rows]
    for seed in range(runs):
        batch = speculative_generate_batch(
            target,
            draft,
            rows,
            tree=tree,
            max_new_tokens=3,
            eos_token_id=(),
            sampling=SamplingConfig(temperature=1.0, seed=1000 * seed),
        )
        for b, r in enumerate(batch.rows):
            samples[b].append(tuple(r.tokens[:2].tolist()))
    return samples


@pytest.mark.parametrize("tree", [Tree.chain(3), Tree.kary(2, 6)], ids=["chain", "kary"])
def test_sampled_rows_follow_the_target(sampled_rows, tree):
    target, draft, rows, exact = sampled_rows
    for b, samples in enumerate(first_two_per_row(target, draft, rows, tree, runs=1500)):
        assert chi_square_pvalue(samples, exact[b]) > ALPHA, f"row {b}"


def test_the_batch_sampling_check_detects_a_broken_rule(sampled_rows, monkeypatch):
    target, draft, rows, exact = sampled_rows
    monkeypatch.setattr(specnb.core.acceptance, "speculative_accept", not_zeroing_accept)
    samples = first_two_per_row(target, draft, rows, Tree.kary(2, 6), runs=1500)
    assert min(chi_square_pvalue(s, exact[b]) for b, s in enumerate(samples)) < ALPHA


def test_the_batch_drafter_follows_a_row_that_rewrites_what_it_held(tiny_draft):
    """A row's sequence may depart from what its cache holds (a cross-tokenizer view re-encodes the
    text from an earlier point): the row keeps the common prefix, is fed from there, and drafts
    exactly what a fresh drafter drafts after the new sequence; the other row is untouched."""
    greedy, tree = specnb.core.batch.SamplingConfig(), Tree.kary(2, 6)
    drafter = ModelDrafter(tiny_draft)
    drafter.draft_rows([[3, 4, 5], [6, 7]], tree, greedy, [None, None])  # the batch starts
    drafter.draft_rows([[3, 4, 5, 1], [6, 7, 2]], tree, greedy, [None, None])  # each extends its row
    later = [[3, 9, 5, 1, 4], [6, 7, 2, 8]]  # row 0 rewrites its second token; row 1 extends
    drafts = drafter.draft_rows(later, tree, greedy, [None, None])
    fresh = ModelDrafter(tiny_draft).draft_rows(later, tree, greedy, [None, None])
    assert [d.tokens.tolist() for d in drafts] == [d.tokens.tolist() for d in fresh]
    again = drafter.draft_rows(
        [[3, 9, 5, 1, 4], [6, 7, 2, 8]], tree, greedy, [None, None]
    )  # nothing new: the root again
    assert [d.tokens.tolist() for d in again] == [d.tokens.tolist() for d in fresh]


@pytest.mark.parametrize(
    "tree", [Tree.chain(3), Tree.kary(2, 6), Tree.preset("sparse", 8)], ids=["chain", "kary", "sparse"]
)
@pytest.mark.parametrize("itself", [False, True], ids=["draft", "target_as_draft"])
def test_rows_drafted_together_take_the_steps_of_one_sequence(tiny_target, tiny_draft, tree, itself):
    """`ModelDrafter` drafts one sequence on its own cache (`draft`, keeping the accepted nodes) or
    rows together on a ragged cache (`draft_rows`): a batch of one prompt takes the steps of the same
    prompt alone, token for token (greedy: the target's own output). The target as its own draft
    accepts every node, so the accepted ranks compared are not all empty. One drafter reused both
    ways (reset between generations) drafts as a fresh one. Both keep the accepted nodes they fed
    (`observe`, `observe_rows`): the draft model is fed the same tokens either way."""
    draft = copy.deepcopy(tiny_target if itself else tiny_draft)  # a model of its own: its forwards counted alone
    prompt = random_prompt(5, length=9)
    expected = autoregressive_generate(tiny_target, prompt, max_new_tokens=20, eos_token_id=())
    fed: list[int] = []
    hook = draft.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].numel()), with_kwargs=True)
    (batched,) = speculative_generate_batch(
        tiny_target, ModelDrafter(draft), [prompt[0]], tree, 20, eos_token_id=()
    ).rows
    fed_rows, fed[:] = sum(fed), []
    single = speculative_generate(tiny_target, ModelDrafter(draft), prompt, tree, 20, eos_token_id=())
    hook.remove()
    assert torch.equal(batched.tokens, expected.tokens) and torch.equal(single.tokens, expected.tokens)
    assert [s.accepted_ranks for s in batched.steps] == [s.accepted_ranks for s in single.steps]
    assert any(s.num_accepted for s in batched.steps) == itself
    assert fed_rows == sum(fed)
    drafter = ModelDrafter(draft)
    for seed in (6, 7):
        ids = random_prompt(seed, length=4)
        (rows,) = speculative_generate_batch(tiny_target, drafter, [ids[0]], tree, 8, eos_token_id=()).rows
        again = speculative_generate(tiny_target, drafter, ids, tree, 8, eos_token_id=())
        alone = speculative_generate(tiny_target, ModelDrafter(draft), ids, tree, 8, eos_token_id=())
        assert torch.equal(rows.tokens, alone.tokens) and torch.equal(again.tokens, alone.tokens)
        assert [s.accepted_ranks for s in again.steps] == [s.accepted_ranks for s in alone.steps]


@pytest.mark.parametrize(
    "options,named",
    [
        ({"cache_policy": StreamingCache(sink=1, window=5, slack=2)}, "cache_policy"),
        ({"confidence_threshold": 0.5}, "confidence_threshold"),
    ],
)
def test_rows_drafted_together_refuse_the_options_of_one_sequence(tiny_target, tiny_draft, options, named):
    """A bounded draft cache and a confidence threshold shape one sequence's drafts: rows drafted
    together (`draft_rows`, `speculative_generate_batch`) refuse them before any model runs, by name."""
    drafter = ModelDrafter(tiny_draft, **options)
    with pytest.raises(ValueError, match=named):
        speculative_generate_batch(tiny_target, drafter, prompts(), Tree.chain(3), 4, eos_token_id=())
    with pytest.raises(ValueError, match=named):
        drafter.draft_rows([[3, 4, 5], [6, 7]], Tree.chain(3), SamplingConfig(), [None, None])
    with pytest.raises(ValueError, match="cache_policy"):
        DynamicTreeDrafter(tiny_draft, 6, 3, 4, cache_policy=StreamingCache(1, 5, 2)).draft_rows(
            [[3, 4, 5]], Tree.chain(4), SamplingConfig(), [None]
        )
    with pytest.raises(ValueError, match="target's own cache"):
        speculative_generate_batch(tiny_target, EarlyExitDrafter(tiny_target, 1), prompts(), Tree.chain(3), 4)
    with pytest.raises(ValueError, match="target's own cache"):  # called directly, too
        EarlyExitDrafter(tiny_target, 1).draft_rows([[3, 4, 5]], Tree.chain(3), SamplingConfig(), [None])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rows_of_very_different_lengths_read_only_their_own_keys_with_a_plain_reads_logits(monkeypatch, arch):
    """`core.ragged.row_spans`: rows of 3 to 70 committed tokens in one batch on a CPU model's attention
    (`kernels.gqa_sdpa`) read their committed keys in runs of rows, each up to its own longest row, and
    the scratch after them (`split_sdpa`, parts joined by their log-sum-exp): a tree verified on top
    gives the logits of the plain read of every key, to float rounding, and the split read was taken."""
    from specnb.core import ragged
    from specnb.core.batch import RaggedTarget, prefill_batch
    from specnb.kernels.gqa_sdpa import register

    model = tiny_model(11, arch=arch, attn=register())
    lengths = [3, 5, 60, 70, 4, 6]
    sequences = [random_prompt(20 + i, length=n)[0].tolist() for i, n in enumerate(lengths)]
    tree = Tree.kary(2, 6)
    tokens = torch.stack([random_prompt(40 + i, length=tree.num_nodes)[0] for i in range(len(lengths))])
    split = ragged.row_spans
    taken = []

    def verify(spans) -> torch.Tensor:
        monkeypatch.setattr(ragged, "row_spans", spans)
        monkeypatch.setattr(ragged, "RUN_COST", 8)  # a run costs little next to rows this short
        target = RaggedTarget(RaggedCache.empty(model, len(sequences)))
        prefill_batch(model, target.ragged, [s[:-1] for s in sequences])
        logits = target.verify(model, [s[-1] for s in sequences], [tree] * len(sequences), tokens)
        monkeypatch.undo()
        return logits

    def spy(*args):
        taken.append(split(*args))
        return taken[-1]

    plain, mine = verify(lambda *args: None), verify(spy)
    assert taken and taken[-1] is not None and len(taken[-1].runs) > 1
    assert torch.allclose(plain, mine, atol=1e-5, rtol=1e-5)
    assert torch.equal(plain.argmax(-1), mine.argmax(-1))


def test_the_cheapest_runs_split_rows_where_their_lengths_jump():
    from specnb.core.ragged import cheapest_runs

    assert cheapest_runs([10, 12, 100, 90, 11], 0) == (
        [(0, 1, 10), (1, 2, 12), (2, 3, 100), (3, 4, 90), (4, 5, 11)],
        223,
    )
    assert cheapest_runs([10, 12, 100, 90, 11], 40) == ([(0, 2, 12), (2, 4, 100), (4, 5, 11)], 355)
    assert cheapest_runs([10, 12, 100, 90, 11], 1000) == ([(0, 5, 100)], 1500)
    assert cheapest_runs([], 40) == ([], 0)
