"""A run's memory estimate before any model loads (`notebook.estimate`): the arithmetic by hand on a
tiny config in a local folder, the estimate growing with the parameters that size it, a run far
beyond this machine refused with its figures, and every profile's own parameters accepted."""

import re

import pytest
from transformers import LlamaConfig

from specnb.analysis.memory import weight_bytes
from specnb.core.trees import Tree
from specnb.experiments.checks import ParameterError
from specnb.notebook.estimate import (
    RUNTIME,
    RunMemory,
    available_bytes,
    check_run_memory,
    forward_bytes,
    notebook_memory,
    widest_rank,
)
from specnb.notebook.places import PROFILES
from specnb.notebook.profiles import declared_parameters, notebooks, resolve

GIB24 = (24 * 2**30, "24 GiB, the test's machine")
T4_MEMORY = 15e9  # a T4's 15 GB


def tiny_config(layers: int = 3) -> LlamaConfig:
    # odd sizes; head size 6: q, o 24 x 24; k, v 24 x 12 (2 kv heads); gate, up 24 x 40; down 40 x 24
    return LlamaConfig(
        vocab_size=101,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=6,
        tie_word_embeddings=False,
    )


@pytest.fixture
def tiny(tmp_path):
    """A model folder holding only a config.json: sized without weights."""
    folder = tmp_path / "tiny"
    tiny_config().save_pretrained(folder)
    return str(folder)


def defaults(notebook: str, **changes) -> dict:
    params = declared_parameters(next(nb for nb in notebooks() if nb.stem == notebook))
    return {**params, **changes}


@pytest.mark.parametrize(
    "dtype_bytes, expected",
    [
        # hidden 5 x (4*24 + 3*40) x 4 = 4320; mask 5 x 12 x (1 + 4) = 300; scores 2 x 4 x 5 x 12 x 4 = 1920;
        # logits 5 x 101 x 4 = 2020; one float32 softmax, no cast (float32 already) 5 x 101 x 4 = 2020
        (4, 4320 + 300 + 1920 + 2020 + 2020),
        # float16: hidden 2160, mask 5 x 12 x 3 = 180, scores 1920, logits 1010, cast + softmax 4040
        (2, 2160 + 180 + 1920 + 1010 + 4040),
    ],
)
def test_forward_bytes_by_hand(dtype_bytes, expected):
    assert forward_bytes(tiny_config(), rows=5, cache=7, dtype_bytes=dtype_bytes) == expected


def test_a_tiny_pair_by_hand(tiny):
    params = defaults(
        "06_batch_size",
        target=tiny,
        draft=tiny,
        batches=[1, 2, 3],
        shapes=["chain"],
        budgets=[2, 5],
        k=4,
        max_prompts=3,
        max_prompt_tokens=50,
        max_new_tokens=7,
    )
    m = notebook_memory("06_batch_size", params, device="cpu")
    # parameters: embeddings and LM head 2 x 101 x 24 = 4848; a layer 576 + 288 + 288 + 576 + 3 x 960 + 2 x 24 = 4656,
    # three of them 13968; the final norm 24: 18840, float32 on a CPU, target and draft
    assert m.weights == 2 * 18840 * 4
    # a token's keys and values: 2 x 3 layers x 2 kv heads x 6 x 4 bytes = 288; 50 + 7 + the root + 5 nodes,
    # 3 rows, 2 models
    assert m.kv_cache == 3 * 2 * 288 * (50 + 7 + 1 + 5)
    # log q (7 + 1) x 101 x 4 x 2 = 6464; ranks 7 x 17 x 13 = 1547; child table 6 x 17 x 8 = 816;
    # 6 arrays of 21 positions x 5 nodes x 8 = 5040
    assert m.arrays == 6464 + 1547 + 816 + 5040
    assert m.verify == max(
        forward_bytes(tiny_config(), 6, 57, 4, batch=3),
        forward_bytes(tiny_config(), 50, 0, 4, logits_rows=1, batch=3),
        forward_bytes(tiny_config(), 57, 0, 4, float_rows=7),
    )
    assert m.total == m.weights + m.kv_cache + m.verify + m.arrays + RUNTIME["cpu"]
    assert m.describe().startswith("06_batch_size: ~1.0 GB = weights")


def test_02_holds_a_model_a_later_pair_uses(tmp_path):
    big, small = tmp_path / "big", tmp_path / "small"
    tiny_config(layers=7).save_pretrained(big)
    tiny_config(layers=2).save_pretrained(small)
    pairs = [
        {"target": str(big), "draft": str(small)},
        # the largest pair (its tree's forward), while big is still held: pair 3 uses it
        {"target": str(small), "draft": str(small), "draft_layers": 1, "methods": ["chain:2048"]},
        {"target": str(big), "draft": str(small)},
    ]
    m = notebook_memory("02_model_pairs", defaults("02_model_pairs", pairs=pairs, methods=["chain:4"]), device="cpu")
    w_big, w_small = (weight_bytes(tiny_config(n)).total * 2 for n in (7, 2))  # float16 bytes x 2: float32
    assert m.weights == w_big + 2 * w_small  # the one-layer draft is counted whole: it is cut after loading
    assert "pair 2 of 3" in m.notes[0] and "3 models held" in m.notes[0]


@pytest.mark.parametrize(
    "notebook, name, small, large, part",
    [
        ("01_tree_shapes", "budgets", [4], [2048], "verify"),  # a tiny model: below, the perplexity forward dominates
        ("01_tree_shapes", "budgets", [4], [64], "arrays"),
        ("01_tree_shapes", "max_new_tokens", 8, 256, "kv_cache"),
        ("01_tree_shapes", "max_new_tokens", 8, 256, "verify"),
        ("01_tree_shapes", "super_k", 0, 8, "super_trees"),  # 0: none; one node per position per round whatever k
        ("01_tree_shapes", "dynamic_budgets", [4], [64], "super_trees"),
        ("06_batch_size", "batches", [1], [8], "kv_cache"),
        ("06_batch_size", "batches", [1], [8], "verify"),
        ("04_long_generation", "max_new_tokens", 64, 2048, "kv_cache"),
        ("03_tree_attention_timing", "batches", [1], [8], "grid"),
    ],
)
def test_the_estimate_grows_with_what_sizes_it(tiny, notebook, name, small, large, part):
    base = defaults(notebook, target=tiny, draft=tiny)
    lo = notebook_memory(notebook, {**base, name: small}, device="cpu")
    hi = notebook_memory(notebook, {**base, name: large}, device="cpu")
    assert lo.parts()[part] < hi.parts()[part] and lo.total < hi.total


@pytest.mark.parametrize("shape", ["chain", "wide", "sparse", "kary2", "kary3", "beams4"])
@pytest.mark.parametrize("nodes", [1, 2, 5, 64, 300])
def test_widest_rank_is_the_presets(shape, nodes):
    widest = max(Tree.preset(shape, nodes).ranks)
    if shape == "sparse":  # a bound: below len(SPARSE_ACCEPTANCE), reached at 300 nodes
        assert widest <= widest_rank(shape, nodes) and (nodes < 300 or widest == widest_rank(shape, nodes))
    else:
        assert widest_rank(shape, nodes) == widest


def test_an_unsized_model_counts_zero_and_says_so():
    m = notebook_memory("04_long_generation", defaults("04_long_generation", target="no-such-model", draft=""), "cpu")
    assert m.weights == m.kv_cache == 0 and "no-such-model" in m.describe()


def test_a_huge_budget_is_refused_with_its_figures():
    params = resolve("cpu", {"budgets": [100000]}, [], notebooks(), PROFILES)["01_tree_shapes"]
    memory = notebook_memory("01_tree_shapes", params)
    assert memory.total > 10 * GIB24[0]  # the 100000-node mask alone is 10^10 x 5 bytes, whatever the models
    with pytest.raises(ParameterError) as refused:
        check_run_memory({"01_tree_shapes": params, "04_long_generation": {}}, GIB24)
    message = str(refused.value)
    assert message.startswith("01_tree_shapes: ~") and "04_long_generation" not in message
    assert re.search(r"verify activations \d+\.\d GB: budgets", message), message
    assert "25.8 GB (24 GiB, the test's machine)" in message


@pytest.mark.parametrize("profile", ["cpu", "course", "smoke", "t4-dryrun"])
def test_every_profile_fits_24_gib(profile):
    resolved = resolve(profile, {}, [], notebooks(), PROFILES)
    check_run_memory(resolved, GIB24)


def test_the_t4_profile_fits_a_t4():
    """Sized for CUDA (float16, 4-bit targets) whatever this machine has."""
    pytest.importorskip("bitsandbytes")
    resolved = resolve("t4", {}, [], notebooks(), PROFILES)
    for notebook, params in resolved.items():
        memory = notebook_memory(notebook, params, device="cuda")
        loads_models = notebook != "07_report"  # the report reads the runs' tables only
        assert (memory.weights > 2e9) == loads_models and memory.total < T4_MEMORY, memory.describe()


def test_available_bytes_says_where_it_comes_from():
    limit, where = available_bytes()
    assert limit > 0 and where


def test_run_memory_is_a_frozen_sum():
    m = RunMemory("x", "cpu", "float32", weights=3, kv_cache=4, runtime=5)
    assert m.total == 12 and list(m.parts())[:2] == ["weights", "kv_cache"]
    with pytest.raises(AttributeError):
        m.weights = 1  # type: ignore[misc]
