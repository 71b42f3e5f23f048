"""Greedy equality is reported as exact, tie or mismatch: a divergence where the target's top two
logits are closer than the dtype's tie margin is a numerical tie, any other is a mismatch. Checked on
a half-precision tiny model with a near-tie injected into its LM head, and against a random
divergence without one."""

import copy
import math

import pytest
import torch
from conftest import random_prompt, tiny_model

from specnb import autoregressive_generate, speculative_generate
from specnb.analysis.quality import TIE_MARGIN, compare_greedy, score


@pytest.fixture(scope="module")
def half_model():
    return tiny_model(3, scale=10.0).to(torch.float16)


def second_choice(model, prompt, tokens, j):
    """The target's second most likely token after prompt + tokens[:j]."""
    seq = torch.cat([prompt[0], torch.tensor(tokens[:j], dtype=torch.long)])[None]
    with torch.inference_mode():
        return int(torch.topk(model(seq).logits[0, -1].float(), 2).indices[1])


def test_exact_and_a_plain_mismatch(half_model):
    prompt = random_prompt(11)
    reference = autoregressive_generate(half_model, prompt, max_new_tokens=12, eos_token_id=()).tokens.tolist()
    assert compare_greedy(reference, reference, None, torch.float16).verdict == "exact"
    # a different token where the target was not close to a tie: a mismatch, with its position
    j = 5
    other = reference[:j] + [second_choice(half_model, prompt, reference, j)]
    quality = score(half_model, prompt, other)
    assert quality.margins[j] > TIE_MARGIN[torch.float16]  # this model is decisive here
    eq = compare_greedy(other, reference, quality.margins, torch.float16)
    assert (eq.verdict, eq.position) == ("mismatch", j) and not eq.equal
    assert compare_greedy(other, None).verdict == "mismatch"


def test_an_injected_near_tie_is_reported_as_a_tie(half_model):
    """Make the target's top two tokens at one position almost equal (their LM-head rows nearly the
    same): a divergence there is a numerical tie, and speculative decoding still equals greedy."""
    model = tiny_model(3, scale=10.0).to(torch.float16)
    prompt = random_prompt(11)
    reference = autoregressive_generate(model, prompt, max_new_tokens=12, eos_token_id=()).tokens.tolist()
    j = 5
    rival = second_choice(model, prompt, reference, j)
    seq = torch.cat([prompt[0], torch.tensor(reference[:j])])[None]
    with torch.inference_mode():
        h = model(seq, output_hidden_states=True).hidden_states[-1][0, -1].float()  # what the LM head reads there
    with torch.no_grad():  # the rival's row: the winner's, moved along h so that its logit is 0.02 lower
        head = model.lm_head.weight
        head[rival] = (head[reference[j]].float() - 0.02 * h / h.dot(h)).half()
    reference = autoregressive_generate(model, prompt, max_new_tokens=12, eos_token_id=()).tokens.tolist()
    other = reference[:j] + [rival if reference[j] != rival else second_choice(model, prompt, reference, j)]
    quality = score(model, prompt, other)
    assert quality.margins[j] < TIE_MARGIN[torch.float16]
    eq = compare_greedy(other, reference, quality.margins, torch.float16)
    assert (eq.verdict, eq.position) == ("tie", j) and eq.equal and eq.margin == quality.margins[j]
    # the same divergence in float32 terms is judged against the float32 margin
    assert compare_greedy(other, reference, [10.0] * 12, torch.float32).verdict == "mismatch"
    # and the speculative output of this half-precision target, on CPU, is still exactly greedy
    spec = speculative_generate(
        model, tiny_model(4, scale=10.0).to(torch.float16), prompt, max_new_tokens=12, eos_token_id=()
    )
    assert (
        compare_greedy(spec.tokens, reference, score(model, prompt, spec.tokens).margins, torch.float16).verdict
        == "exact"
    )


def test_score_gives_perplexity_and_margins(tiny_target):
    prompt = random_prompt(2)
    out = autoregressive_generate(tiny_target, prompt, max_new_tokens=6, eos_token_id=()).tokens
    s = score(tiny_target, prompt, out)
    assert len(s.margins) == 6 and all(m >= 0 for m in s.margins)
    assert s.perplexity >= 1.0 and math.isfinite(s.perplexity)
    assert math.isnan(score(tiny_target, prompt, []).perplexity)


def test_the_tie_margin_takes_the_measured_logit_gap(tiny_target):
    """A 4-bit target on a GPU decodes with one kernel and verifies with another: the margin below
    which a flip is a tie comes from the gap measured between them, when that exceeds the dtype's
    convention (float16: 0.1)."""
    from specnb.analysis.quality import logit_gap, tie_margin

    ids = random_prompt(7, length=9)
    tokens = autoregressive_generate(tiny_target, ids, max_new_tokens=6, eos_token_id=()).tokens
    exact = logit_gap(tiny_target, ids, tokens)
    assert 0.0 <= exact < 1e-3, "float32 on CPU: the two paths agree to rounding"
    skewed = copy.deepcopy(tiny_target)  # a verify kernel that rounds differently: several rows come out 0.25 higher
    skewed.lm_head.register_forward_hook(lambda m, a, out: out + 0.25 if out.shape[1] > 1 else out)
    assert logit_gap(skewed, ids, tokens) == pytest.approx(0.25, abs=1e-3)
    assert tie_margin(torch.float16) == 0.1 and tie_margin(torch.float16, 0.3) == 0.6
    a, b = [5, 6, 7], [5, 9, 7]
    assert compare_greedy(a, b, [1.0, 0.4, 1.0], torch.float16).verdict == "mismatch"
    wide = compare_greedy(a, b, [1.0, 0.4, 1.0], torch.float16, gap=0.3)
    assert wide.verdict == "tie" and wide.threshold == 0.6 and wide.margin == 0.4
