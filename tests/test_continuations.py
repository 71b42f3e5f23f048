"""The target's greedy continuations decoded in batches (`experiments.continuations`): each row equal
token for token to its prompt's batch-1 greedy output, or different only from a token whose top-2
margin was a reported possible tie; files resumed, not decoded again; another target's or length's
continuations never read for this one. On tiny seeded models and on SmolLM2-135M."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_prompt, tiny_model

import specnb.experiments.continuations as continuations
from specnb import autoregressive_generate
from specnb.analysis.quality import compare_greedy, score, tie_margin
from specnb.experiments.continuations import continue_prompts, file_name, tie_table

LENGTHS = {"a": 3, "b": 29, "c": 11, "d": 17, "e": 5}  # very different lengths, two batches of 3 and 2


def tiny_prompts() -> dict[str, torch.Tensor]:
    return {p: random_prompt(i, length=n)[0] for i, (p, n) in enumerate(LENGTHS.items())}


def alone(target, prompt: torch.Tensor, max_new_tokens: int, eos=None) -> list[int]:
    return autoregressive_generate(target, prompt[None], max_new_tokens, eos_token_id=eos).tokens.tolist()


@pytest.mark.parametrize("seed, scale", [(0, 1.0), (3, 30.0)], ids=["flat", "peaked"])
def test_batched_rows_equal_each_prompt_decoded_alone(tmp_path, seed, scale):
    target = tiny_model(seed, scale=scale)
    describe = {"target": f"tiny{seed}"}
    got = continue_prompts(tmp_path, target, describe, tiny_prompts(), 12, eos_token_id=(), batch=3, progress=False)
    assert list(got) == list(LENGTHS)
    threshold = tie_margin(torch.float32)
    for p, prompt in tiny_prompts().items():
        reference = alone(target, prompt, 12, eos=())
        verdict = compare_greedy(got[p].tokens.tolist(), reference, got[p].margins.tolist()).verdict
        assert verdict in ("exact", "tie"), (p, got[p].tokens.tolist(), reference)
        assert verdict == "exact" or got[p].ties(threshold) > 0  # a tie only where the table reports one
        assert len(got[p].margins) == len(got[p].tokens) == 12 and not got[p].stopped
        # the margins are the target's own: its top-1 minus top-2 logit at each chosen token
        torch.testing.assert_close(
            torch.tensor(got[p].margins),
            torch.tensor(score(target, prompt[None], got[p].tokens).margins),
            atol=1e-3,
            rtol=1e-3,
        )
    table = tie_table(got, torch.float32)
    assert list(table["prompt_id"]) == list(LENGTHS) and set(table["batch"]) == {2, 3}


def test_a_stop_token_ends_a_row_and_is_recorded(tmp_path):
    target = tiny_model(3, scale=30.0)
    prompts = tiny_prompts()
    free = {p: alone(target, x, 12, eos=()) for p, x in prompts.items()}
    stop = free["b"][4]  # a token row b makes: it stops there
    got = continue_prompts(tmp_path, target, {"target": "t"}, prompts, 12, eos_token_id=[stop], batch=5, progress=False)
    for p, x in prompts.items():
        assert got[p].tokens.tolist() == alone(target, x, 12, eos=[stop])
        assert got[p].stopped == (stop in got[p].tokens.tolist())
    assert got["b"].stopped and len(got["b"].tokens) <= 5


def test_a_folder_resumes_and_keeps_targets_apart(tmp_path, monkeypatch):
    target, other = tiny_model(0), tiny_model(1)
    first = continue_prompts(tmp_path, target, {"target": "t0"}, tiny_prompts(), 8, eos_token_id=(), progress=False)

    def decode(*args, **kwargs):
        raise AssertionError("decoded again")

    with monkeypatch.context() as m:
        m.setattr(continuations, "autoregressive_generate_batch", decode)
        again = continue_prompts(tmp_path, target, {"target": "t0"}, tiny_prompts(), 8, eos_token_id=(), progress=False)
    assert all(again[p].tokens.tolist() == first[p].tokens.tolist() for p in LENGTHS)
    theirs = continue_prompts(tmp_path, other, {"target": "t1"}, tiny_prompts(), 8, eos_token_id=(), progress=False)
    assert any(theirs[p].tokens.tolist() != first[p].tokens.tolist() for p in LENGTHS)
    assert len(list(tmp_path.glob("*.npz"))) == 2 * len(LENGTHS)
    names = {file_name("a", [1, 2], {"target": "t0"}, n, ()) for n in (8, 9)}
    assert len(names) == 2  # another length: another file


@pytest.mark.slow
def test_smollm2_batched_continuations_equal_batch_one(tmp_path, smollm2):
    """SmolLM2-135M on four Spec-Bench prompts of different lengths, 24 tokens, one batch of four:
    each row equal to the prompt decoded alone, or different only from a reported tie."""
    from specnb import load_prompts
    from specnb.io.models import prompt_ids

    model, tokenizer = smollm2
    prompts = {p.id: prompt_ids(tokenizer, p.text)[0] for p in load_prompts("spec_bench", per_category=1, limit=4)}
    got = continue_prompts(tmp_path, model, {"target": "smollm2"}, prompts, 24, batch=4, progress=False)
    verdicts = []
    for p, prompt in prompts.items():
        reference = alone(model, prompt, 24)
        verdicts.append(compare_greedy(got[p].tokens.tolist(), reference, got[p].margins.tolist()).verdict)
    assert set(verdicts) <= {"exact", "tie"}, verdicts
    assert verdicts.count("exact") >= 3, verdicts


def test_a_collection_on_shared_continuations_equals_the_one_each_would_make(tmp_path):
    """A pair's collection reading continuations decoded for many prompts at once (and shared with
    any other pair of the target) holds, prompt by prompt, the arrays of the same collection made
    from each prompt decoded alone, and the tokens, ranks and super-trees of a collection whose
    continuations come from an exact speculative run (the path every collection took before)."""
    from specnb.analysis.collection import CollectConfig
    from specnb.experiments.collect import collect_units

    target, draft = tiny_model(3, scale=30.0), tiny_model(4, scale=30.0, layers=1)
    prompts = tiny_prompts()
    base = dict(max_new_tokens=12, top_k=8, super_k=3, super_depth=3, super_size=4, eos_token_id=())

    def collected(folder: str, batch: int | None):
        config = CollectConfig(**base, continuation="run" if batch is None else "target")
        given = None
        if batch is not None:
            given = continue_prompts(
                tmp_path / f"{folder}-cont", target, {"target": "t"}, prompts, 12, (), batch, False
            )
        report = collect_units(tmp_path / folder, (target, draft), prompts, config, progress=False, continuations=given)
        return {p.prompt_id: p for p in report.check().collection.prompts}

    together, alone, run = collected("together", 5), collected("alone", 1), collected("run", None)
    for p in LENGTHS:
        for name, value in together[p].arrays().items():
            assert np.array_equal(value, alone[p].arrays()[name]), (p, name)
            if name != "rank_margin":  # the teacher-forced pass is the same; margins too, to rounding
                assert np.array_equal(value, run[p].arrays()[name]), (p, name)
        assert run[p].run_steps is not None and together[p].run_steps is None
