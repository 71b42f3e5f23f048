"""Cross-tokenizer drafting (specnb.drafters.retokenize, specnb.drafters.cross_tokenizer) and its
baseline, transformers' universal assisted generation (specnb.bench.baselines.hf_uag_generate).

Two hand-made vocabularies built in code (tests/vocabularies.py): byte-level BPE for the target,
SentencePiece-style BPE with byte fallback for the draft, splitting words differently. Checked:
tokens as bytes; the re-encoding of hand-picked joins; the draft's view of the target's sequence
equal to a fresh encoding after any sequence of updates (and to the tokenizer's own encoding of
the whole text, on the real SmolLM2 and Qwen2.5 tokenizers); greedy output equal to the target's
for several pairs and trees; sampled output following the target (chi-square); the draft's cache
equal to a fresh prefill of the accepted text after 200+ tokens; method specs, refusals, sweeps.
"""

import random

import pytest
import torch
from conftest import installed, tiny_model
from stats import ALPHA, chi_square_pvalue
from test_acceptance import not_zeroing_accept
from vocabularies import D_VOCAB, T_VOCAB, TEXT, bigram_llama, draft_tokenizer, target_tokenizer

import specnb.core.acceptance
from specnb import (
    DynamicTreeDrafter,
    ModelDrafter,
    SamplingConfig,
    Tree,
    autoregressive_generate,
    speculative_generate,
    summarize,
)
from specnb.bench.baselines import hf_uag_generate
from specnb.core.cache import new_cache
from specnb.core.forward import forward
from specnb.drafters.cross_tokenizer import CrossTokenizerDrafter
from specnb.drafters.methods import build_drafter, method_trees, parse_method
from specnb.drafters.retokenize import Mirror, TokenText, continue_text, window_start

GREEDY = SamplingConfig()
MAX_NEW = 30


@pytest.fixture(scope="module")
def vocabs():
    t, d = target_tokenizer(), draft_tokenizer()
    return t, d, TokenText.of(t), TokenText.of(d)


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def names(tokenizer, ids) -> list[str] | None:
    return None if ids is None else tokenizer.convert_ids_to_tokens(ids)


# ---- tokens as bytes --------------------------------------------------------------------------


TEXTS = [
    " hello the cat",
    "hello",
    "caf\u00e9 \u00e9t\u00e9",
    "x = f(1, 2)\n    return x",
    "\u4f60\u597d \U0001f642",
    "a  b\n\nc",
]


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_give_back_the_text(vocabs, text):
    t, d, tt, dt = vocabs
    assert tt.join(ids_of(t, text)) == text.encode()
    # the SentencePiece-style draft puts one dummy space before a text that has none
    assert dt.join(ids_of(d, text)) == (b"" if text.startswith(" ") else b" ") + text.encode()
    assert not tt.prefix_space and dt.prefix_space
    assert tt.pieces[t.eos_token_id] is None and dt.pieces[d.eos_token_id] is None  # specials: barriers


def test_a_missing_model_skips_a_test_except_where_ci_requires_it(monkeypatch):
    """conftest's `installed`: a model not installed skips the test, fails it under
    SPECNB_REQUIRE_MODELS=1 (CI), and any other error of the load is the test's own."""
    from specnb.io.embedded import ModelNotInstalledError

    def missing(name):
        raise ModelNotInstalledError(f"embedded model {name!r} is not installed")

    def broken(name):
        raise OSError("a corrupt file")

    assert installed(str.upper, "qwen") == "QWEN"
    monkeypatch.delenv("SPECNB_REQUIRE_MODELS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="qwen not installed here"):
        installed(missing, "qwen")
    monkeypatch.setenv("SPECNB_REQUIRE_MODELS", "1")
    with pytest.raises(pytest.fail.Exception, match="SPECNB_REQUIRE_MODELS=1 but qwen is not installed"):
        installed(missing, "qwen")
    with pytest.raises(OSError, match="corrupt"):
        installed(broken, "qwen")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_real_tokenizers_give_back_the_text(name):
    from specnb.io.models import load_tokenizer

    text = TokenText.of(installed(load_tokenizer, name))
    for s in TEXTS + ["def f(x):\n\treturn x ** 2  # \u00e9\n"]:
        assert text.join(text.encode(s)) == s.encode()
    assert text.piece(len(text.pieces) + 5) is None  # a model's padding ids have no text


def test_a_tokenizer_that_changes_text_is_refused():
    from tokenizers import normalizers

    t = target_tokenizer()
    t.backend_tokenizer.normalizer = normalizers.Lowercase()
    with pytest.raises(ValueError, match="changes text"):
        TokenText.of(t)


# ---- the look-behind rule and re-encoding ------------------------------------------------------


@pytest.mark.parametrize(
    "side, left, new, want",
    [
        ("t", b" hel", b"lo the cat", ["lo", "\u0120the", "\u0120cat"]),  # the committed `Ġhel` is kept
        ("d", b" the c", b"at", ["a", "t"]),  # `▁c` + `at` would merge into `▁ca t`: forced boundary
        ("d", b"", b"hello", ["he", "llo"]),  # no dummy space inside a text
        ("d", b" the", b" cat sat", ["\u2581ca", "t", "\u2581sat"]),
        ("t", b"the", b" caf\xc3", ["\u0120ca", "f"]),  # a half character at the end is cut
        ("t", b" caf\xc3", b"\xa9 the", ["\u00a9", "\u0120the"]),  # a committed half character finished
        ("d", b" caf\xc3", b"\xa9 the", ["<0xA9>", "\u2581the"]),
        ("t", b" caf\xc3", b"x", None),  # it does not finish the character
        ("t", b" the", b"", []),
    ],
)
def test_continue_text(vocabs, side, left, new, want):
    t, d, tt, dt = vocabs
    tokenizer, text = (t, tt) if side == "t" else (d, dt)
    (got,) = continue_text(text, left, [new])
    assert names(tokenizer, got) == want


def test_window_start_is_the_last_safe_boundary():
    pieces = [b"x", b"=", b"1", b";", b" y", b"  ", b" z", None, b"a", b"b"]
    assert window_start(pieces[:7], 64) == 5  # " z" follows whitespace: not safe; "  " follows "y": safe
    assert window_start(pieces[:5], 64) == 4  # " y" follows ";"
    assert window_start(pieces[:4], 64) == 0  # no space at all: the start
    assert window_start(pieces, 64) == 8  # right after a special token
    assert window_start(pieces[:8], 64) == 8  # the last token is special: an empty window
    assert window_start(pieces[:4], 2) == 2  # nothing safe within the look-behind: the cut


def random_sequence(rng: random.Random, vocab: TokenText, text: str, tokenizer, length: int) -> list[int]:
    """Mostly the tokens of real text, with random tokens (byte pieces, half characters) mixed in."""
    words = ids_of(tokenizer, text)
    out = []
    while len(out) < length:
        out += words[: rng.randint(1, len(words))] if rng.random() < 0.6 else [rng.randrange(len(vocab.pieces))]
    return out[:length]


@pytest.mark.parametrize("direction", ["target_to_draft", "draft_to_target"])
def test_mirror_after_any_updates_equals_a_fresh_one(vocabs, direction):
    t, d, tt, dt = vocabs
    source, dest, tokenizer = (tt, dt, t) if direction == "target_to_draft" else (dt, tt, d)
    rng = random.Random(0)
    for trial in range(20):
        seq = random_sequence(rng, source, TEXT + " caf\u00e9 the\n  mat", tokenizer, 80)
        mirror = Mirror(source, dest)
        length = 1
        while length < len(seq):
            length = max(1, length + rng.randint(-3, 6))  # grow, and now and then step back
            view = mirror.update(seq[:length])
            fresh = Mirror(source, dest)
            assert view == fresh.update(seq[:length]) and mirror.pending == fresh.pending, (trial, length)


@pytest.mark.slow
def test_mirror_of_real_text_is_the_tokenizers_own_encoding():
    """The look-behind rule on the real tokenizers: Qwen2.5 tokens of a text, mirrored into SmolLM2
    tokens step by step, equal SmolLM2's encoding of the whole text (and the other way round)."""
    from specnb.io.models import load_tokenizer

    qwen = TokenText.of(installed(load_tokenizer, "qwen2.5-coder-0.5b"))
    smol = TokenText.of(load_tokenizer("smollm2-135m"))
    text = (
        "Here is the code:\n\n```python\ndef mean(xs):\n    total = 0\n    for x in xs:  # sum\n        total += x\n"
        "    return total / len(xs)\n```\nIt costs O(n) \u2014 caf\u00e9s, na\u00efve, 12345 and \U0001f642 too.  Done."
    )
    for source, dest in ((qwen, smol), (smol, qwen)):
        seq = source.encode(text)
        mirror = Mirror(source, dest)
        for n in range(1, len(seq) + 1):
            mirror.update(seq[:n])
        assert mirror.ids == dest.encode(text) and mirror.pending == b""


# ---- greedy: output equals the target's ----------------------------------------------------------


def pair(kind: str, t, d):
    if kind == "bigram":  # the same text, split differently: the draft knows what the target writes
        return bigram_llama(t, TEXT, T_VOCAB), bigram_llama(d, TEXT, D_VOCAB)
    if kind == "bigram_other_word":  # the draft's text differs in one word: some rejections
        return bigram_llama(t, TEXT, T_VOCAB), bigram_llama(d, " hello the cat sat at the mat", D_VOCAB)
    if kind == "random":  # random tokens: byte pieces, half characters, specials
        return tiny_model(3, vocab=len(t), scale=30.0), tiny_model(4, vocab=len(d), scale=30.0, layers=1)
    raise ValueError(kind)


TREES = {"chain4": Tree.chain(4), "kary2x10": Tree.kary(2, 10), "sparse12": Tree.sparse(12), "dynamic10": None}


def cross_drafter(draft, tree_name, d, t):
    inner = DynamicTreeDrafter(draft, n=10, top_k=4, max_depth=5) if tree_name == "dynamic10" else ModelDrafter(draft)
    return CrossTokenizerDrafter(inner, d, t)


@pytest.mark.parametrize("kind", ["bigram", "bigram_other_word", "random"])
@pytest.mark.parametrize("tree_name", TREES)
def test_greedy_output_equals_the_targets(vocabs, kind, tree_name):
    t, d, tt, dt = vocabs
    target, draft = pair(kind, t, d)
    drafter = cross_drafter(draft, tree_name, dt, tt)
    prompts = [" hello the", " the cat sat on the ma", "caf\u00e9 \u00e9"] if kind != "random" else ["x", " hello"]
    accepted = 0
    for text in prompts:
        ids = torch.tensor([ids_of(t, text)])
        reference = autoregressive_generate(target, ids, max_new_tokens=MAX_NEW, eos_token_id=())
        result = speculative_generate(
            target, drafter, ids, tree=TREES[tree_name], max_new_tokens=MAX_NEW, eos_token_id=()
        )
        assert result.tokens.tolist() == reference.tokens.tolist(), text
        s = summarize(result)
        accepted += s.num_accepted
        assert s.num_drafted <= s.num_draft_tokens or tree_name == "dynamic10" or kind == "random"
        assert all(st.draft_tokens is not None for st in result.steps)
    if kind == "bigram":
        assert accepted > MAX_NEW  # the draft knows the text: most steps accept several target tokens


@pytest.mark.slow
def test_greedy_on_a_real_pair(smollm2):
    """SmolLM2-135M (the session's) drafts for Qwen2.5-Coder-0.5B: identical greedy output, and it accepts."""
    from specnb.io.models import load_model, prompt_ids

    target, t = installed(load_model, "qwen2.5-coder-0.5b")
    draft, d = smollm2
    ids = prompt_ids(t, "Write a Python function that returns the sum of a list, with a docstring.")
    reference = autoregressive_generate(target, ids, max_new_tokens=24)
    for tree in (Tree.chain(4), Tree.sparse(8)):
        result = speculative_generate(target, CrossTokenizerDrafter(draft, d, t), ids, tree=tree, max_new_tokens=24)
        assert result.tokens.tolist() == reference.tokens.tolist()
        assert summarize(result).acceptance_length > 0.3


def test_special_tokens_end_paths(vocabs):
    """A draft EOS inside a path ends it with the target's EOS; the target stops there."""
    t, d, tt, dt = vocabs
    target = bigram_llama(t, " hello the cat sat on<|endoftext|>", T_VOCAB)
    draft = bigram_llama(d, " hello the cat sat on</s>", D_VOCAB)
    ids = torch.tensor([ids_of(t, " the cat")])
    reference = autoregressive_generate(target, ids, max_new_tokens=MAX_NEW, eos_token_id=t.eos_token_id)
    assert reference.tokens[-1] == t.eos_token_id and len(reference.tokens) < MAX_NEW
    drafter = CrossTokenizerDrafter(draft, dt, tt)
    result = speculative_generate(
        target, drafter, ids, tree=Tree.chain(8), max_new_tokens=MAX_NEW, eos_token_id=t.eos_token_id
    )
    assert result.tokens.tolist() == reference.tokens.tolist()
    assert result.steps[-1].num_accepted >= 2  # the EOS came from the draft's own `</s>`


# ---- sampling: lossless ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampling_pair(vocabs):
    """Flat bigram models (hot 1): the target's law of its first two tokens is known exactly."""
    t, d, tt, dt = vocabs
    target = bigram_llama(t, TEXT, T_VOCAB, hot=1.0)
    draft = bigram_llama(d, " hello the cat sat at the mat", D_VOCAB, hot=2.0)
    prompt = torch.tensor([ids_of(t, " hello the")])
    with torch.inference_mode():
        first = torch.softmax(target(prompt).logits[0, -1].double(), -1)
        exact = {}
        for a in torch.nonzero(first > 1e-12).flatten().tolist():
            second = torch.softmax(target(torch.tensor([[a]])).logits[0, -1].double(), -1)  # a bigram: a alone decides
            for b in torch.nonzero(second > 1e-12).flatten().tolist():
                exact[(a, b)] = float(first[a] * second[b])
    return target, CrossTokenizerDrafter(draft, dt, tt), prompt, exact


def first_two(target, drafter, prompt, tree, runs=2500) -> tuple[list, int]:
    samples, proposed = [], 0
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
        samples.append(tuple(r.tokens[:2].tolist()))
        proposed += r.steps[0].num_drafted
    return samples, proposed


@pytest.mark.parametrize("tree", [Tree.chain(3), Tree.kary(2, 6)], ids=["chain", "kary"])
def test_sampled_output_follows_the_target(sampling_pair, tree):
    target, drafter, prompt, exact = sampling_pair
    samples, proposed = first_two(target, drafter, prompt, tree)
    assert len(exact) >= 25 and proposed >= 2500  # many cells, and the draft proposed every time
    assert chi_square_pvalue(samples, exact) > ALPHA


def test_sampling_check_detects_a_broken_rule(sampling_pair, monkeypatch):
    target, drafter, prompt, exact = sampling_pair
    monkeypatch.setattr(specnb.core.acceptance, "speculative_accept", not_zeroing_accept)
    samples, _ = first_two(target, drafter, prompt, Tree.kary(2, 6))
    assert chi_square_pvalue(samples, exact) < ALPHA


# ---- the draft's cache never drifts ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["accepting", "random"])
@pytest.mark.parametrize("tree_name", ["chain4", "kary2x10", "dynamic10"])
def test_draft_cache_equals_a_fresh_prefill_after_200_tokens(vocabs, kind, tree_name):
    """ "accepting": the target writes `Ġhel`, then `lo` (the draft's view `▁he l` becomes `▁he llo`),
    and "é" one byte at a time (`Ã`, then `©`: a half character pending), and accepts draft paths;
    "random": random tokens, half characters and specials everywhere."""
    t, d, tt, dt = vocabs
    if kind == "accepting":
        target = bigram_llama(t, " hello the café sat on the mat", T_VOCAB)
        draft = bigram_llama(d, " hello the café sat at the mat", D_VOCAB)
    else:
        target, draft = pair("random", t, d)
    drafter = cross_drafter(draft, tree_name, dt, tt)
    ids = torch.tensor([ids_of(t, " hello the cat")])
    tree = TREES[tree_name] or Tree.chain(5)
    result = speculative_generate(target, drafter, ids, tree=tree, max_new_tokens=240, eos_token_id=())
    assert len(result.tokens) == 240
    assert summarize(result).num_accepted > (100 if kind == "accepting" else -1)
    seq = ids[0].tolist() + result.tokens.tolist()
    view = Mirror(tt, dt).update(seq)
    assert drafter.draft_view(seq) == view
    # bring the draft's cache to the whole sequence, drafting nothing (one level, no node fed)
    if isinstance(drafter.inner, DynamicTreeDrafter):
        drafter.inner.expand(torch.tensor(view), 1)
    else:
        drafter.inner.draft(torch.tensor(view), Tree.chain(1), GREEDY)
    cache = new_cache(draft)
    forward(draft, cache, torch.tensor(view))
    held = drafter.inner._cache
    assert held.get_seq_length() == len(view)
    for mine, fresh in zip(held.layers, cache.layers):
        torch.testing.assert_close(mine.keys, fresh.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(mine.values, fresh.values, rtol=1e-4, atol=1e-4)


def test_accepted_draft_nodes_keep_their_keys_and_values(vocabs):
    """When the target accepts a draft path, the next step feeds the draft 1-2 tokens, not the path."""
    t, d, tt, dt = vocabs
    target, draft = pair("bigram", t, d)
    fed = []
    handle = draft.register_forward_pre_hook(lambda m, a, k: fed.append(k["input_ids"].shape[1]), with_kwargs=True)
    try:
        speculative_generate(
            target,
            CrossTokenizerDrafter(draft, dt, tt),
            torch.tensor([ids_of(t, " hello the")]),
            tree=Tree.chain(4),
            max_new_tokens=MAX_NEW,
            eos_token_id=(),
        )
    finally:
        handle.remove()
    firsts = fed[::4][1:]  # each step: one forward before its first level, then one per depth
    assert max(firsts) <= 3


# ---- transformers' universal assisted generation ------------------------------------------------


@pytest.mark.parametrize("kind", ["bigram", "bigram_other_word", "random"])
def test_universal_assisted_generation_equals_the_target(vocabs, kind):
    t, d, tt, dt = vocabs
    target, draft = pair(kind, t, d)
    if kind == "random":  # transformers refuses equal config vocabulary sizes; these differ (278, 306)
        assert target.config.vocab_size != draft.config.vocab_size
    ids = torch.tensor([ids_of(t, " hello the")])
    reference = autoregressive_generate(target, ids, max_new_tokens=MAX_NEW, eos_token_id=())
    r = hf_uag_generate(target, draft, ids, (t, d), num_assistant_tokens=4, max_new_tokens=MAX_NEW, eos_token_id=())
    assert r.tokens.tolist() == reference.tokens.tolist()
    assert sum(s.num_tokens for s in r.steps) == MAX_NEW and r.method == "hf_uag"
    assert all(s.draft_tokens == 4 for s in r.steps)  # draft tokens, fixed; candidates vary
    assert all(s.num_accepted <= s.num_drafted for s in r.steps)
    if kind == "bigram":  # it accepts (less than specnb here: its windows and alignment, see docs/cross-tokenizer.md)
        assert summarize(r).num_accepted > 5


def test_universal_assisted_generation_refuses_equal_vocabulary_sizes(tiny_target, tiny_draft, vocabs):
    t, d, _, _ = vocabs
    with pytest.raises(ValueError, match="same vocabulary size"):
        hf_uag_generate(tiny_target, tiny_draft, torch.tensor([[3, 4]]), (t, d))


# ---- method specs, refusals, sweeps ------------------------------------------------------------


def test_method_specs(vocabs, tiny_target):
    t, d, tt, dt = vocabs
    chain = parse_method("xtok/chain:4")
    assert (chain.label, chain.tree, chain.replayable, chain.shared_vocabulary) == (
        "xtok/chain",
        Tree.chain(4),
        False,
        False,
    )
    dynamic = parse_method("xtok/dynamic:16")
    assert dynamic.label == "xtok/dynamic" and dynamic.tree == Tree.chain(6)
    assert not parse_method("hf_uag:4").shared_vocabulary and parse_method("chain:4").shared_vocabulary
    assert parse_method("hf_uag:4").tree == Tree.chain(4)
    drafter = build_drafter(dynamic, tiny_target, tiny_target, target_tokenizer=tt, draft_tokenizer=dt)
    assert isinstance(drafter, CrossTokenizerDrafter) and isinstance(drafter.inner, DynamicTreeDrafter)
    assert drafter.inner.n == 16
    with pytest.raises(ValueError, match="tokenizers"):
        build_drafter(chain, tiny_target, tiny_target)
    with pytest.raises(ValueError, match="hf_uag"):
        parse_method("xtok/hf_assisted:4")


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory, vocabs):
    """The bigram pair saved as two model folders, with their tokenizers."""
    t, d, _, _ = vocabs
    folders = []
    for model, tokenizer, name in (
        (bigram_llama(t, TEXT, T_VOCAB), t, "target"),
        (bigram_llama(d, TEXT, D_VOCAB), d, "draft"),
    ):
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(str(folder))
    return folders


def test_load_pair_refuses_and_names_the_cross_tokenizer_option(saved_pair):
    from specnb.io.models import load_pair

    target, draft = saved_pair
    with pytest.raises(ValueError, match=r"share one vocabulary.*xtok/chain:4.*hf_uag:4.*cross_tokenizer=True"):
        load_pair(target, draft)
    target_model, draft_model, tokenizer = load_pair(target, draft, cross_tokenizer=True)
    assert target_model.config.vocab_size == T_VOCAB and draft_model.config.vocab_size == D_VOCAB


def test_sweep_of_a_mismatched_pair_refuses_shared_vocabulary_methods(saved_pair, tmp_path):
    from specnb.experiments import sweeps as ex
    from specnb.experiments import tables
    from specnb.experiments.pairs import Pair
    from specnb.io.prompts import Prompt
    from specnb.io.storage import Sweep

    target, draft = saved_pair
    store = Sweep(tmp_path / "sweep.jsonl", key=ex.UNIT_KEY)
    specs = ["chain:2", "xtok/chain:3", "xtok/dynamic:6", "hf_uag:3", "ngram/chain:2"]
    pairs = [Pair(target, draft, methods=specs)]
    prompts = [Prompt("p", "test", " hello the cat"), Prompt("q", "test", " the mat")]
    status = ex.run_pairs(store, pairs, prompts, method_trees(specs), ex.SweepConfig(12, progress=False))
    row = status.iloc[0]
    assert (row["status"], row["vocabulary"]) == ("partial", "different")  # chain:2 refused, the others run
    assert row["reason"].startswith("refused chain:2:") and "xtok/chain:4" in row["reason"]
    units = tables.unit_table(store)
    assert set(units["shape"]) == {"autoregressive", "xtok/chain", "xtok/dynamic", "hf_uag", "ngram/chain"}
    assert units["greedy_equal"].astype(bool).all()
    table = tables.shape_table(units)
    xtok = table[table["shape"] == "xtok/chain"].iloc[0]
    assert xtok["accepted"] > 0 and xtok["draft_tokens_per_accepted"] > 0
    versus = tables.head_to_head(table, units)
    assert list(versus["ours"]) == ["xtok/chain:3"] and list(versus["theirs"]) == ["hf_uag:3"]
    only_shared = [Pair(target, draft, methods=["chain:2"])]
    assert ex.run_pairs(store, only_shared, prompts, {}, ex.SweepConfig(12, progress=False))["status"].tolist() == [
        "skipped"
    ]


# ---- re-drafting a collected continuation (notebook 01 on a cross-tokenizer pair) --------------------


@pytest.mark.parametrize("kind", ["bigram_other_word", "random"])
@pytest.mark.parametrize("tree_name", ["chain4", "sparse12", "dynamic10"])
def test_redraft_takes_the_steps_of_a_real_run(vocabs, kind, tree_name):
    from specnb.analysis.redraft import redraft

    t, d, tt, dt = vocabs
    target, draft = pair(kind, t, d)
    tree = TREES[tree_name] or Tree.chain(5)
    for text, eos in ((" hello the", ()), (" the cat", (ids_of(t, " mat")[0],))):
        ids = torch.tensor([ids_of(t, text)])
        real = speculative_generate(
            target, cross_drafter(draft, tree_name, dt, tt), ids, tree=tree, max_new_tokens=MAX_NEW, eos_token_id=eos
        )
        again = redraft(
            cross_drafter(draft, tree_name, dt, tt),
            ids[0].tolist(),
            real.tokens.tolist(),
            tree,
            MAX_NEW,
            frozenset(eos),
        )
        assert [
            (s.position, s.num_drafted, s.num_accepted, s.num_tokens, s.accepted_ranks, s.child_counts, s.draft_tokens)
            for s in again.steps
        ] == [
            (s.position, s.num_drafted, s.num_accepted, s.num_tokens, s.accepted_ranks, s.child_counts, s.draft_tokens)
            for s in real.steps
        ]
        assert len(again.draft_paths) == len(again.steps)


@pytest.mark.parametrize("kind", ["bigram_other_word", "random"])
@pytest.mark.parametrize("tree_name", ["chain4", "kary2x10", "sparse12", "dynamic10"])
def test_prompts_redrafted_together_take_each_prompts_own_steps(vocabs, kind, tree_name):
    """Three prompts of different lengths re-drafted at once (`CrossTokenizerRows`: one draft forward
    per depth for every row, rows leaving as they finish, a row's view re-encoded from an earlier
    point fed again there; dynamic trees by `DynamicTreeDrafter.draft_rows`, each row its own tree) take, prompt
    by prompt, the steps of that prompt re-drafted alone, which a test above holds equal to a real
    run's, up to the continuation's end and its last short steps."""
    from specnb.analysis.redraft import redraft, redraft_rows
    from specnb.drafters.cross_tokenizer import CrossTokenizerRows

    t, d, tt, dt = vocabs
    target, draft = pair(kind, t, d)
    tree = TREES[tree_name] or Tree.chain(5)  # dynamic10: its depth cap (`cross_drafter`'s max_depth)
    batch = DynamicTreeDrafter(draft, n=10, top_k=4, max_depth=5) if tree_name == "dynamic10" else draft
    texts = [" hello the", " the cat sat on the ma", " a"]
    prompts = [ids_of(t, text) for text in texts]
    conts = [
        speculative_generate(
            target, cross_drafter(draft, "chain4", dt, tt), torch.tensor([p]), max_new_tokens=n, eos_token_id=()
        ).tokens.tolist()
        for p, n in zip(prompts, (MAX_NEW, MAX_NEW - 7, MAX_NEW))
    ]  # one continuation shorter than max_new_tokens: its row leaves first
    together = redraft_rows(CrossTokenizerRows(batch, dt, tt, 3), prompts, conts, tree, MAX_NEW, [frozenset()] * 3)
    shapes = set()
    for p, c, mine in zip(prompts, conts, together):
        alone = redraft(cross_drafter(draft, tree_name, dt, tt), p, c, tree, MAX_NEW)
        assert mine.steps == alone.steps and mine.draft_paths == alone.draft_paths
        shapes |= {s.child_counts for s in mine.steps}
    assert len(shapes) > 1  # trees of several shapes: cut near the end, and a dynamic tree's own


def test_redraft_of_a_same_vocabulary_drafter_equals_the_replay(tiny_target, tiny_draft):
    """On a shared vocabulary the re-draft is what `replay` computes from ranks (and a real run)."""
    from conftest import random_prompt

    from specnb.analysis.redraft import redraft

    ids = random_prompt(2, length=8)
    for tree in (Tree.chain(4), Tree.kary(2, 8)):
        real = speculative_generate(tiny_target, tiny_draft, ids, tree=tree, max_new_tokens=MAX_NEW, eos_token_id=())
        again = redraft(ModelDrafter(tiny_draft), ids[0].tolist(), real.tokens.tolist(), tree, MAX_NEW)
        assert [(s.num_drafted, s.num_accepted, s.num_tokens, s.accepted_ranks) for s in again.steps] == [
            (s.num_drafted, s.num_accepted, s.num_tokens, s.accepted_ranks) for s in real.steps
        ]
        assert list(again.draft_paths) == [s.accepted_ranks for s in again.steps]


def test_a_cross_tokenizer_collection_is_redrafted(vocabs, tmp_path):
    from specnb.analysis import replay
    from specnb.experiments import redraft_study, replay_study, tables
    from specnb.experiments import sweeps as ex
    from specnb.experiments.pairs import PairModels
    from specnb.io.prompts import Prompt
    from specnb.io.storage import Sweep

    t, d, tt, dt = vocabs
    target, draft = pair("bigram_other_word", t, d)
    prompts = [Prompt("p", "a", " hello the"), Prompt("q", "b", " the cat sat on the ma")]
    trees = method_trees(["chain:2", "chain:4", "kary2:6"])
    models = PairModels("pair", target, draft, t, draft_tokenizer=d)
    collection = replay_study.collect_pair(
        tmp_path / "collection",
        models,
        prompts,
        trees,
        replay_study.PairCollectConfig(16, super_k=0, super_depth=3, dynamic_budgets=(6,)),
    ).collection
    assert collection.config.cross_tokenizer and collection.prompts[0].ranks is None
    with pytest.raises(ValueError, match="re-drafted"):
        replay.replay(collection, trees)
    with pytest.raises(ValueError, match="redraft_with"):
        replay_study.replay_table(collection, trees, [2, 4, 6], [6])
    again = redraft_study.redrafter(draft, t, d)
    table, every = replay_study.replay_table(collection, trees, [2, 4, 6], [6], redraft_with=again)
    assert list(zip(table["shape"], table["budget"])) == [("chain", 2), ("chain", 4), ("kary2", 6), ("dynamic", 6)]
    assert (table["tau"] >= 1).all() and table["acceptance_rate"].between(0, 1).all() and table["tau_all"].isna().all()
    assert (table["draft_tokens_per_accepted"] > 0).all() and set(every) == set(trees)
    # the collection's own run and an end-to-end xtok run agree with the re-draft step for step
    store = Sweep(tmp_path / "sweep.jsonl", key=ex.UNIT_KEY)
    ex.run_sweep(
        store, models, prompts, method_trees(["xtok/dynamic:6", "xtok/kary2:6"]), ex.SweepConfig(16, progress=False)
    )
    agreement = replay_study.replay_agreement(
        store, "pair", collection, ["xtok/dynamic:6", "xtok/kary2:6"], redraft_with=again
    )
    assert (agreement["identical_steps"] == agreement["steps_compared"]).all() and (
        agreement["steps_compared"] > 0
    ).all()
    frame = replay_study.replayed_steps_frame(collection, trees[("kary2", 6)], "kary2", redraft_with=again)
    frequency = tables.node_frequency(frame, trees[("kary2", 6)])
    assert 0 < frequency[(0,)] <= 1


def test_a_custom_tree_is_redrafted_as_it_runs_across_tokenizers(vocabs, tmp_path):
    """A tree the user writes, on a pair of two tokenizers: re-drafted beside the presets from one
    collection, and an end-to-end xtok run of it (the method naming it) agrees step for step."""
    from specnb.drafters.methods import trees_for
    from specnb.experiments import redraft_study, replay_study
    from specnb.experiments import sweeps as ex
    from specnb.experiments.pairs import PairModels
    from specnb.io.prompts import Prompt
    from specnb.io.storage import Sweep
    from specnb.io.tree_spec import parse_custom_trees

    t, d, tt, dt = vocabs
    target, draft = pair("bigram_other_word", t, d)
    prompts = [Prompt("p", "a", " hello the"), Prompt("q", "b", " the cat sat on the ma")]
    custom = parse_custom_trees({"mine": [[0], [1], [0, 0], [0, 0, 0], [1, 0]]})
    trees = trees_for(["chain"], [2], custom)
    models = PairModels("pair", target, draft, t, draft_tokenizer=d)
    config = replay_study.PairCollectConfig(16, super_k=0, super_depth=3)
    collection = replay_study.collect_pair(tmp_path / "collection", models, prompts, trees, config).collection
    again = redraft_study.redrafter(draft, t, d)
    table, _ = replay_study.replay_table(collection, trees, [2, 5], [], redraft_with=again)
    assert list(zip(table["shape"], table["budget"])) == [("chain", 2), ("chain", 5), ("mine", 5)]
    store = Sweep(tmp_path / "sweep.jsonl", key=ex.UNIT_KEY)
    ex.run_sweep(store, models, prompts, method_trees(["xtok/mine"], custom), ex.SweepConfig(16, progress=False))
    agreement = replay_study.replay_agreement(store, "pair", collection, ["xtok/mine"], again, custom)
    assert (agreement["identical_steps"] == agreement["steps_compared"]).all() and (
        agreement["steps_compared"] > 0
    ).all()
    mine = table.set_index("shape").loc["mine"]
    assert mine["tau"] == pytest.approx(agreement.set_index("method").loc["xtok/mine", "tau_replayed"])


def test_a_target_is_measured_alone_once_per_prompt(saved_pair, tmp_path):
    """Two pairs of one target: the second copies the first's target-alone units."""
    from specnb.experiments import sweeps as ex
    from specnb.experiments import tables
    from specnb.experiments.pairs import Pair
    from specnb.io.prompts import Prompt
    from specnb.io.storage import Sweep

    target, draft = saved_pair
    store = Sweep(tmp_path / "sweep.jsonl", key=ex.UNIT_KEY)
    pairs = [Pair(target, draft, methods=["xtok/chain:3"]), Pair(target, target, methods=["chain:2"])]
    ex.run_pairs(store, pairs, [Prompt("p", "test", " hello the cat")], {}, ex.SweepConfig(8, progress=False))
    units = tables.unit_table(store)
    alone = units[units["shape"] == "autoregressive"].set_index("pair")
    assert alone.loc[pairs[1].label, "baseline_of"] == pairs[0].label
    assert alone.loc[pairs[1].label, "tokens"] == alone.loc[pairs[0].label, "tokens"]
    assert units["greedy_equal"].astype(bool).all() and len(units) == 4


def test_xtok_methods_are_refused_for_a_tokenizer_without_a_byte_rule(tmp_path):
    """A WordLevel tokenizer cannot be read as bytes: the pair's xtok methods are refused, with the
    reason, before any weights load; hf_uag (text through decode and encode) still runs."""
    from test_models import WORDS_A, WORDS_B, save_tiny_model

    from specnb.experiments import sweeps as ex
    from specnb.experiments import tables
    from specnb.experiments.pairs import Pair
    from specnb.io.prompts import Prompt
    from specnb.io.storage import Sweep

    target = save_tiny_model(tmp_path / "a", WORDS_A, seed=0)
    draft = save_tiny_model(tmp_path / "b", WORDS_B, seed=1)
    store = Sweep(tmp_path / "sweep.jsonl", key=ex.UNIT_KEY)
    pairs = [Pair(str(target), str(draft), methods=["xtok/chain:2", "hf_uag:2"])]
    status = ex.run_pairs(store, pairs, [Prompt("p", "test", "the cat sat")], {}, ex.SweepConfig(4, progress=False))
    row = status.iloc[0]
    assert (
        row["status"] == "partial" and row["reason"].startswith("refused xtok/chain:2:") and "as bytes" in row["reason"]
    )
    assert set(tables.unit_table(store)["shape"]) == {"autoregressive", "hf_uag"}


def test_results_report_the_wrapped_drafters_cache_and_its_evictions(vocabs):
    """A cross-tokenizer drafter holds its wrapped drafter's KV cache: every step and the result
    report its bytes (once 0: the wrapper did not forward them), and a bounded draft cache's cuts."""
    from specnb.core.streaming import StreamingCache

    t, d, tt, dt = vocabs
    target, draft = pair("bigram_other_word", t, d)
    ids = torch.tensor([ids_of(t, " hello the cat")])
    drafter = CrossTokenizerDrafter(ModelDrafter(draft), dt, tt)
    result = speculative_generate(target, drafter, ids, tree=Tree.chain(4), max_new_tokens=40, eos_token_id=())
    assert all(s.draft_kv_bytes > 0 for s in result.steps)
    assert result.steps[-1].draft_kv_bytes == drafter.inner.kv_bytes() == drafter.kv_bytes()
    bounded = CrossTokenizerDrafter(ModelDrafter(draft, cache_policy=StreamingCache(2, 8, 6)), dt, tt)
    speculative_generate(target, bounded, ids, tree=Tree.chain(4), max_new_tokens=40, eos_token_id=())
    assert bounded.evictions == bounded.inner.evictions > 0
