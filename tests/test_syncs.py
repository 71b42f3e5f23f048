"""Reads from the device (host syncs on CUDA) per generation step do not grow with the number of
tree nodes: every tensor-to-Python conversion is counted while a generation runs, for trees of the
same depth but 3 to 84 nodes. On a CPU the count also includes conversions of tensors that live on
the host by design (masks built there), so it bounds what CUDA would sync; those grow with the
depth (one forward per level), which is why the compared trees share their depth."""

import pytest
import torch
from conftest import random_prompt, tiny_model

from specnb import DynamicTreeDrafter, Meter, ModelDrafter, NgramDrafter, Tree, speculative_generate
from specnb.core.sampling import SamplingConfig

CONVERSIONS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy")
TREES = [Tree.chain(3), Tree.kary(2, 14), Tree.kary(4, 84), Tree.beams(8, 24)]  # all of depth 3


def count_conversions(monkeypatch, run) -> int:
    count = [0]
    for name in CONVERSIONS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            count[0] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    run()
    monkeypatch.undo()
    return count[0]


@pytest.fixture(scope="module")
def nothing_draft():
    """A draft that agrees with nothing: every step accepts 0 tokens, so every run has the same
    number of steps whatever the tree."""
    return tiny_model(9, scale=-30.0, layers=1)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
def test_syncs_per_step_do_not_grow_with_the_tree(monkeypatch, tiny_target, nothing_draft, temperature):
    ids = random_prompt(5)
    per_step = {}
    for tree in TREES:
        drafter = ModelDrafter(nothing_draft)
        results = []
        run = lambda: results.append(  # noqa: E731
            speculative_generate(
                tiny_target,
                drafter,
                ids,
                tree=tree,
                max_new_tokens=10,
                eos_token_id=(),
                sampling=SamplingConfig(temperature=temperature),
            )
        )
        run()  # warm: the first call of a tree makes its index tensors
        per_step[tree.num_nodes] = count_conversions(monkeypatch, run) / len(results[-1].steps)
    # Sampling accepts a draft token now and then (min(1, p/q) > 0 even for this draft), so runs differ by
    # a step or two and the one-off conversions' share per step moves a little; a conversion per tree node
    # would add tens per step on the 84-node tree. Greedy runs have the same steps: equal counts.
    spread = max(per_step.values()) - min(per_step.values())
    assert spread <= (0.5 if temperature else 0.0), per_step


def test_syncs_do_not_grow_with_ngram_or_dynamic_trees(monkeypatch, tiny_target, nothing_draft):
    """Per step, for drafters that shape their own trees (4 or 40 nodes, depth at most 3)."""
    ids = torch.cat([random_prompt(6, length=5)] * 3, dim=1)  # repeats: the n-gram drafter finds matches
    makers = {
        "ngram": lambda n: (NgramDrafter(), Tree.kary(2, n) if n > 4 else Tree.chain(3)),
        "dynamic": lambda n: (DynamicTreeDrafter(nothing_draft, n=n, top_k=8, max_depth=3), Tree.chain(3)),
    }
    for name, make in makers.items():
        per_step = {}
        for n in (4, 40):
            drafter, tree = make(n)
            result = []
            count = count_conversions(
                monkeypatch,
                lambda: result.append(
                    speculative_generate(
                        tiny_target, drafter, ids, tree=tree.truncated(3), max_new_tokens=8, eos_token_id=()
                    )
                ),
            )
            per_step[n] = count / len(result[0].steps)
        assert per_step[4] == per_step[40], (name, per_step)


def test_the_step_syncs_the_device_for_its_clock_only_when_asked(monkeypatch, tiny_target, nothing_draft):
    """The loop's meter waits for the device at each clock reading (3 per step: draft start and end,
    verify end) unless it is `Meter(device, sync=False)`: then no reading syncs; the output is the same."""
    from specnb.core import runtime

    calls = []
    real = runtime.synchronize
    monkeypatch.setattr(runtime, "synchronize", lambda device: calls.append(device) or real(device))
    ids, outputs = random_prompt(5), {}
    for synced in (True, False):
        calls.clear()
        meter = Meter(tiny_target.device, sync=synced)
        result = speculative_generate(
            tiny_target, ModelDrafter(nothing_draft), ids, Tree.chain(3), 8, eos_token_id=(), meter=meter
        )
        outputs[synced] = (result.tokens.tolist(), len(calls), len(result.steps))
    tokens, synced_calls, steps = outputs[True]
    assert synced_calls >= 3 * steps and outputs[False] == (tokens, 0, steps)


def test_kv_accounting_is_the_meters_and_reads_nothing_when_off(monkeypatch, tiny_target, tiny_draft):
    """The KV bytes in the step records and the result come from the meter passed in: with
    `Meter(device, kv=False)` no cache's bytes are read, the records say 0 and the result None; the
    output is the same as with the default meter, which reads them (a peak at least the end's)."""
    from specnb.core import generation

    reads = []
    real = generation.kv_bytes
    monkeypatch.setattr(generation, "kv_bytes", lambda cache: reads.append(1) or real(cache))
    ids = random_prompt(6)
    runs = {}
    for kv in (True, False):
        reads.clear()
        result = speculative_generate(
            tiny_target, ModelDrafter(tiny_draft), ids, Tree.kary(2, 6), 10, eos_token_id=(), meter=Meter("cpu", kv=kv)
        )
        runs[kv] = (result, len(reads))
    (on, on_reads), (off, off_reads) = runs[True], runs[False]
    assert on.tokens.tolist() == off.tokens.tolist()
    assert on_reads >= 2 * len(on.steps) and on.kv_peak_bytes >= on.kv_bytes > 0
    assert all(s.target_kv_bytes > 0 and s.draft_kv_bytes > 0 for s in on.steps)
    assert off_reads == 0 and off.kv_bytes is None and off.kv_peak_bytes is None
    assert all(s.target_kv_bytes == 0 and s.draft_kv_bytes == 0 for s in off.steps)
