"""Method specs (`specnb.drafters.methods`): parsing with clear refusals, and every drafter and baseline
running as units of one sweep, each output checked against the target's greedy output."""

import pytest
import torch

from specnb import Tree
from specnb.drafters.methods import method_trees, parse_method
from specnb.experiments import sweeps as ex
from specnb.experiments import tables
from specnb.experiments.pairs import PairModels
from specnb.io.prompts import Prompt
from specnb.io.storage import Sweep


def test_method_specs_parse_and_refuse_clearly():
    assert parse_method("chain:4").label == "chain"
    assert parse_method("ngram/kary2:8").tree == Tree.kary(2, 8)
    m = parse_method("early_exit12/chain:4")
    assert (m.drafter, m.arg, m.label) == ("early_exit", 12, "early_exit12/chain")
    assert parse_method("confidence0.4/chain:8").arg == 0.4
    assert parse_method("dynamic:16").tree.depth == 6 and parse_method("dynamic:16").label == "dynamic"
    assert parse_method("adaptive/chain:4").tree == Tree.chain(8)
    assert parse_method("hf_assisted:4").tree == Tree.chain(4)
    for bad, msg in [
        ("chain", "shape:budget"),
        ("foo/chain:4", "unknown drafter"),
        ("early_exit/chain:4", "number"),
        ("adaptive/kary2:4", "chains"),
        ("ngram/blob:3", "unknown tree shape"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_method(bad)


def test_every_method_runs_in_a_sweep_and_equals_greedy(tmp_path, tiny_target, tiny_draft):
    class Tok:  # prompt text -> ids, as a tokenizer would
        chat_template = None

        def __call__(self, text, return_tensors=None, add_special_tokens=True):
            return {"input_ids": torch.tensor([[3 + (ord(c) % 50) for c in text]])}

    specs = [
        "chain:3",
        "ngram/kary2:6",
        "early_exit1/chain:3",
        "merged/kary2:4",
        "adaptive/chain:2",
        "confidence0.5/chain:4",
        "dynamic:6",
        "hf_assisted:3",
        "hf_prompt_lookup:3",
    ]
    store = Sweep(tmp_path / "s.jsonl", key=ex.UNIT_KEY)
    prompts = [Prompt("a", "writing", "abcabcabcab"), Prompt("b", "qa", "xyzzy xyz")]
    pair = PairModels("tiny", tiny_target, tiny_draft, Tok())
    ex.run_sweep(store, pair, prompts, method_trees(specs), ex.SweepConfig(12, progress=False))
    units = tables.unit_table(store)
    assert len(units) == len(prompts) * (len(specs) + 1)
    assert units["greedy_equal"].all(), units[~units["greedy_equal"]][["shape", "budget", "prompt_id"]]
    assert set(units["shape"]) == {tables.BASELINE} | {s.split(":")[0] for s in specs}
