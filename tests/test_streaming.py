"""A bounded cache (StreamingLLM's sinks + window) under speculative decoding: with the same policy,
greedy speculative output equals the streaming model's own greedy autoregressive output token for
token, for several trees, both position variants, generations several times longer than the
window, and a bounded draft cache too; sampled output follows the streaming model's distribution
(chi-square with a cut inside the tested span, power shown against the full-cache distribution);
the cut keeps exactly sink + window positions, re-rotated keys equal keys computed at the new
positions, and KV bytes are exact."""

import pytest
import torch
from conftest import random_prompt, tiny_model
from stats import ALPHA, chi_square_pvalue

from specnb import (
    DynamicTreeDrafter,
    EarlyExitDrafter,
    ModelDrafter,
    Tree,
    autoregressive_generate,
    speculative_generate,
)
from specnb.core.cache import new_cache
from specnb.core.sampling import SamplingConfig
from specnb.core.streaming import StreamingCache, kv_bytes
from specnb.core.verification import prefill

TREES = [Tree.chain(4), Tree.kary(2, 10), Tree.sparse(12), Tree.from_paths([(0,), (2,), (0, 1), (0, 1, 3)])]


@pytest.mark.parametrize("positions", ["cache", "original"])
@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.describe())
def test_greedy_speculative_equals_streaming_greedy(tiny_target, tiny_draft, tree, positions):
    policy = StreamingCache(sink=2, window=12, slack=tree.depth, positions=positions)
    for seed in (1, 2):
        ids = random_prompt(seed, length=6 + seed)
        reference = autoregressive_generate(tiny_target, ids, max_new_tokens=80, eos_token_id=(), cache_policy=policy)
        result = speculative_generate(
            tiny_target, tiny_draft, ids, tree=tree, max_new_tokens=80, eos_token_id=(), cache_policy=policy
        )
        assert result.tokens.tolist() == reference.tokens.tolist()
        assert result.evictions > 0 and reference.evictions > 0  # cut several times (80 tokens, a limit of 14 + depth)
        full = autoregressive_generate(tiny_target, ids, max_new_tokens=80, eos_token_id=())
        assert full.tokens.tolist() != reference.tokens.tolist()  # the window changes what the model says


def test_a_bounded_draft_cache_changes_proposals_not_output(tiny_target, tiny_draft):
    target_policy = StreamingCache(sink=2, window=16, slack=6)
    for drafter in (
        ModelDrafter(tiny_draft, cache_policy=StreamingCache(sink=1, window=5, slack=2)),
        ModelDrafter(tiny_draft, cache_policy=StreamingCache(sink=1, window=5, slack=2, positions="original")),
        DynamicTreeDrafter(
            tiny_draft, n=8, top_k=3, max_depth=4, cache_policy=StreamingCache(sink=2, window=6, slack=3)
        ),
    ):
        ids = random_prompt(3, length=8)
        reference = autoregressive_generate(
            tiny_target, ids, max_new_tokens=60, eos_token_id=(), cache_policy=target_policy
        )
        result = speculative_generate(
            tiny_target,
            drafter,
            ids,
            tree=Tree.kary(2, 10),
            max_new_tokens=60,
            eos_token_id=(),
            cache_policy=target_policy,
        )
        assert result.tokens.tolist() == reference.tokens.tolist()
        assert result.meta["draft_evictions"] > 0 and drafter.kv_bytes() > 0


def test_the_cut_keeps_sinks_and_window_and_rerotates_keys(tiny_target):
    policy = StreamingCache(sink=3, window=5, slack=2)
    ids = random_prompt(4, length=12)
    cache = new_cache(tiny_target)
    prefill(tiny_target, cache, ids)
    removed = policy.cut(tiny_target, cache)
    assert removed == 12 - 3 - 5 and cache.get_seq_length() == 8
    # layer 0's keys depend only on the token and its position: the re-rotated window keys equal
    # those the model computes for the same tokens at the positions they now hold (3..7)
    fresh = new_cache(tiny_target)
    kept = torch.cat([ids[:, :3], ids[:, -5:]], dim=1)
    with torch.inference_mode():
        tiny_target(input_ids=kept, position_ids=torch.arange(8)[None], cache=fresh, use_cache=True)
    torch.testing.assert_close(cache.layers[0].keys, fresh.layers[0].keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.layers[0].values, fresh.layers[0].values, atol=0, rtol=0)
    assert policy.cut(tiny_target, cache) == 0  # below the limit: nothing to cut


def test_kv_bytes_are_exact_and_bounded(tiny_target, tiny_draft):
    config = tiny_target.config
    per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    cache = new_cache(tiny_target)
    prefill(tiny_target, cache, random_prompt(5, length=9))
    assert kv_bytes(cache) == 9 * per_token and kv_bytes(None) == 0
    policy = StreamingCache(sink=4, window=24, slack=4)
    tree = Tree.chain(4)
    result = speculative_generate(
        tiny_target,
        tiny_draft,
        random_prompt(5, length=9),
        tree=tree,
        max_new_tokens=120,
        eos_token_id=(),
        cache_policy=policy,
    )
    target_bytes = [s.target_kv_bytes for s in result.steps]
    assert max(target_bytes) <= (policy.sink + policy.window + policy.slack) * per_token  # between steps
    assert result.kv_peak_bytes >= max(target_bytes) and result.kv_bytes > 0
    full = speculative_generate(
        tiny_target, tiny_draft, random_prompt(5, length=9), tree=tree, max_new_tokens=120, eos_token_id=()
    )
    assert full.steps[-1].target_kv_bytes == (9 + 120 - 1) * per_token  # all but the last token


def test_a_self_draft_on_the_target_cache_is_refused(tiny_target):
    with pytest.raises(ValueError, match="cannot run with a cache policy"):
        speculative_generate(
            tiny_target,
            EarlyExitDrafter(tiny_target, 1),
            random_prompt(1),
            max_new_tokens=4,
            cache_policy=StreamingCache(sink=2, window=8),
        )


def streaming_first_two(target, prompt, policy):
    """The exact distribution of the first two tokens of the streaming model: the second is drawn
    after the cut that precedes the first generated token (the prompt fills the cache to the limit)."""
    cache = new_cache(target)
    first = torch.softmax(prefill(target, cache, prompt)[-1], -1)
    out = {}
    for a in range(first.numel()):
        c = new_cache(target)
        prefill(target, c, prompt)
        policy.cut(target, c)
        second = torch.softmax(prefill(target, c, torch.tensor([[a]]))[-1], -1)
        out.update({(a, b): float(first[a] * second[b]) for b in range(second.numel())})
    return out


def test_sampled_streaming_follows_the_streaming_distribution():
    vocab = 7
    target = tiny_model(22, vocab=vocab, scale=8.0, layers=2, hidden=32)
    with torch.no_grad():  # sharper attention, so that what the cut removes changes the distribution
        for layer in target.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    draft = tiny_model(21, vocab=vocab, scale=4.0, layers=1, hidden=16)
    policy = StreamingCache(sink=1, window=2, slack=5)  # limit 8
    prompt = torch.tensor([[3, 6, 5, 6, 4, 3, 3, 5]])  # 8 tokens: cut before the first generated token
    exact = streaming_first_two(target, prompt, policy)
    full = streaming_first_two(target, prompt, StreamingCache(sink=1, window=100, slack=4))  # never cut here
    assert 0.5 * sum(abs(exact[k] - full[k]) for k in exact) > 0.05  # the cut matters (total variation)
    drafter = ModelDrafter(draft)
    samples = []
    for seed in range(6000):
        r = speculative_generate(
            target,
            drafter,
            prompt,
            tree=Tree.chain(3),
            max_new_tokens=3,
            eos_token_id=(),
            cache_policy=policy,
            sampling=SamplingConfig(temperature=1.0, seed=seed),
        )
        samples.append(tuple(r.tokens[:2].tolist()))
        # step 1 is the root alone (the prompt fills the cache to the limit); step 2, after the cut,
        # verifies a drafted node for the second token
        assert [s.num_drafted for s in r.steps[:2]] == [0, 1]
    assert chi_square_pvalue(samples, exact) > ALPHA
    # the test's power: the same samples against the full-cache model's distribution are rejected
    assert chi_square_pvalue(samples, full) < ALPHA


def test_long_generations_run_past_eos_and_the_reading_warns_of_a_window_that_never_evicted(monkeypatch, tmp_path):
    """Notebook 04: a model whose EOS comes first would end every generation at once and no window
    would ever evict, silently. By default each generation runs its length; with stop_at_eos it
    stops, and the reading says the window never evicted."""
    import copy

    from conftest import random_prompt, tiny_model

    from specnb import autoregressive_generate
    from specnb.experiments import long_generation as lg
    from specnb.io.prompts import Prompt
    from specnb.io.storage import Sweep
    from specnb.notebook.readings import long_reading

    model = copy.deepcopy(tiny_model(0, scale=30.0))
    ids = random_prompt(4, length=6)
    first = int(autoregressive_generate(model, ids, max_new_tokens=1, eos_token_id=()).tokens[0])
    model.generation_config.eos_token_id = first  # the model's EOS is its first greedy token
    monkeypatch.setattr(lg, "prompt_ids", lambda tokenizer, text: ids)
    prompt = [Prompt("p", "writing", "unused: prompt_ids is replaced")]
    tables = {}
    for stop in (False, True):
        store = Sweep(tmp_path / f"long-{stop}.jsonl", key=lg.UNIT_KEY)
        config = lg.LongConfig(
            ["autoregressive", "ngram/chain:2"], [8], 2, "cache", 40, progress=False, stop_at_eos=stop
        )
        lg.run_long(store, model, None, None, prompt, config)
        tables[stop] = lg.long_table(store.meta_frame())
    ran, stopped = tables[False], tables[True]
    assert (ran["tokens"] == 40).all() and (ran.loc[ran["window"] == 8, "evictions"] > 0).all()
    assert (stopped["tokens"] == 1).all() and (stopped["evictions"] == 0).all()
    assert "never evicted" not in long_reading(ran)
    assert "warning: window 8 never evicted** for autoregressive, ngram/chain:2" in long_reading(stopped)
