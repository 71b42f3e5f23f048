"""Stand-ins for the t4 profile's hub models: tokenizers with the real vocabulary sizes that encode and
decode any text, tiny models with the real architecture and special ids, a hub-cache layout that
`io.sources` and `io.models` read offline (4-bit included), pairs accepted and refused as the real
ones are, an idempotent build that never touches a real model."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from specnb.io.model_configs import config_of, hub_model
from specnb.io.prompts import BUILTIN
from specnb.notebook import dryrun, runner

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
T4_MODELS = [
    "meta-llama/Llama-2-7b-hf",
    "JackFram/llama-160m",
    "Felladrin/Llama-160M-Chat-v1",
    "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B",
]
TRICKY = "Ünïcödé ✓ 🐈 naïve — café\n\n\ttabs  and   spaces, 'quotes' \"double\" 12345 x=y*2 {}[]"


@pytest.fixture(scope="module")
def tokenizers():
    return {"llama2": dryrun.family_tokenizer("llama2", 32000), "llama3": dryrun.family_tokenizer("llama3", 128256)}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf")
    dryrun.install_standins(home, T4_MODELS)
    return home


def offline(home: Path, code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python with the stand-in cache as its only hub (huggingface_hub reads
    HF_HOME when imported, so this cannot happen in the test process)."""
    env = {
        **os.environ,
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_tokenizers_have_the_real_sizes_and_special_ids(tokenizers):
    l2, l3 = tokenizers["llama2"], tokenizers["llama3"]
    assert len(l2) == len(l2.get_vocab()) == 32000 and len(l3) == len(l3.get_vocab()) == 128256
    assert (l2.unk_token_id, l2.bos_token_id, l2.eos_token_id) == (0, 1, 2)
    assert [l2.convert_tokens_to_ids(f"<0x{b:02X}>") for b in (0, 255)] == [3, 258]  # byte fallback
    assert (l3.bos_token_id, l3.eos_token_id) == (128000, 128001)
    assert [
        l3.convert_tokens_to_ids(t) for t in ("<|start_header_id|>", "<|eot_id|>", "<|reserved_special_token_247|>")
    ] == [128006, 128009, 128255]


@pytest.mark.parametrize("family", ["llama2", "llama3"])
def test_tokenizers_encode_and_decode_any_text(tokenizers, family):
    tok = tokenizers[family]
    for text in [p.text for p in BUILTIN] + [TRICKY]:
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
        assert tok.decode(ids, skip_special_tokens=True) == text
    # a random model emits any id, fillers included: each decodes to text
    assert isinstance(tok.decode(list(range(0, len(tok), 997))), str)


def test_tokenizers_are_built_the_same_every_time(tokenizers):
    again = dryrun.family_tokenizer("llama2", 32000)
    assert again.get_vocab() == tokenizers["llama2"].get_vocab()


@pytest.mark.parametrize("hub_id", T4_MODELS)
def test_standin_config_keeps_what_the_code_paths_depend_on(hub_id):
    real, tiny = config_of(hub_id), dryrun.standin_config(hub_model(hub_id))
    same = (
        "model_type",
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "tie_word_embeddings",
        "max_position_embeddings",
        "rope_parameters",
        "rms_norm_eps",
        "hidden_act",
    )
    assert {k: getattr(tiny, k) for k in same} == {k: getattr(real, k) for k in same}
    assert type(tiny) is type(real) and tiny.num_hidden_layers == 2
    assert tiny.num_attention_heads // tiny.num_key_value_heads == real.num_attention_heads // real.num_key_value_heads
    dims = (
        tiny.hidden_size,
        tiny.intermediate_size,
        tiny.num_attention_heads * tiny.head_dim,
        tiny.num_key_value_heads * tiny.head_dim,
    )
    assert all(d % 64 == 0 for d in dims), "bitsandbytes' CPU 4-bit kernel needs multiples of 64"


def test_cache_layout(home):
    for hub_id in T4_MODELS:
        repo = dryrun.repo_folder(home, hub_id)
        commit = (repo / "refs" / "main").read_text()
        snapshot = repo / "snapshots" / commit
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", dryrun.MARKER} <= {
            p.name for p in snapshot.iterdir()
        }
        settings = json.loads((snapshot / "tokenizer_config.json").read_text())
        assert settings["tokenizer_class"] == hub_model(hub_id).tokenizer.tokenizer_class
        assert (snapshot / "generation_config.json").exists() == (hub_model(hub_id).generation_config is not None)


def test_offline_loads_resolve_through_the_cache(home):
    code = """
import torch, bitsandbytes as bnb
from specnb.io.sources import resolve_source
from specnb.io.models import check_pair, describe_model, load_model, load_pair, load_tokenizer, prompt_ids
src = resolve_source("meta-llama/Llama-2-7b-hf")
assert (src.kind, src.status) == ("hub", "cached"), src
model, tok = load_model("meta-llama/Llama-2-7b-hf", "4bit")
assert isinstance(model.model.layers[0].self_attn.q_proj, bnb.nn.Linear4bit)
assert "STAND-IN" in describe_model(model) and "nf4 4-bit" in describe_model(model)
assert model.generation_config.temperature == 0.6  # the real generation_config.json
target, draft, shared = load_pair("meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-1B", "4bit", dtype="float16")
assert target.config.tie_word_embeddings and target.dtype == torch.float16
chat = load_tokenizer("Felladrin/Llama-160M-Chat-v1")
assert chat.chat_template and chat.get_vocab() == tok.get_vocab()
assert chat.decode(prompt_ids(chat, "hi")[0]) == "<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n"
try:
    check_pair(tok, load_tokenizer("meta-llama/Llama-3.2-1B"), "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-3.2-1B")
except ValueError as e:
    print("REFUSED", e)
"""
    proc = offline(home, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    refusal = proc.stdout.split("REFUSED", 1)[1]
    assert "vocab size 32000" in refusal and "vocab size 128256" in refusal


def test_unknown_hub_id_still_fails_offline(home):
    proc = offline(home, "from specnb.io.sources import resolve_source\nresolve_source('meta-llama/Llama-3.1-8B')")
    assert proc.returncode != 0 and "not in the local Hugging Face cache" in proc.stderr


def test_build_is_idempotent_and_rebuilt_when_its_inputs_change(home, monkeypatch):
    weights = dryrun.repo_folder(home, "JackFram/llama-160m") / "snapshots"
    before = {p: p.stat().st_mtime_ns for p in weights.glob("*/model.safetensors")}
    again = dryrun.install_standins(home, T4_MODELS)
    assert {p: p.stat().st_mtime_ns for p in weights.glob("*/model.safetensors")} == before
    assert all((s / dryrun.MARKER).is_file() for s in again.values())
    monkeypatch.setattr(dryrun, "standin_digest", lambda ids: "f" * 64)  # as if this code had changed
    rebuilt = dryrun.install_standins(home, ["JackFram/llama-160m"])
    assert rebuilt["JackFram/llama-160m"].name == "f" * 40
    assert [p.name for p in weights.iterdir()] == ["f" * 40]  # the old snapshot replaced, not kept


def test_never_replaces_a_real_model(tmp_path):
    real = dryrun.repo_folder(tmp_path, "JackFram/llama-160m") / "snapshots" / "abc"
    real.mkdir(parents=True)
    (real / "model.safetensors").write_bytes(b"real weights")
    with pytest.raises(RuntimeError, match="not a specnb stand-in"):
        dryrun.install_standins(tmp_path, ["JackFram/llama-160m"])
    assert (real / "model.safetensors").read_bytes() == b"real weights"


def test_weights_are_seeded_and_members_of_a_family_related():
    from transformers import AutoModelForCausalLM

    def build(hub_id):
        net = AutoModelForCausalLM.from_config(dryrun.standin_config(hub_model(hub_id)), dtype=torch.float32)
        dryrun.standin_weights(net, hub_id, hub_model(hub_id).tokenizer.family)
        return net

    a, b, c = build("meta-llama/Llama-2-7b-hf"), build("meta-llama/Llama-2-7b-hf"), build("JackFram/llama-160m")
    wa, wc = a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight
    assert torch.equal(wa, b.model.layers[0].mlp.up_proj.weight)  # seeded
    assert not torch.equal(wa, wc) and torch.corrcoef(torch.stack([wa.flatten(), wc.flatten()]))[0, 1] > 0.99
    assert torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)  # one vocabulary, one meaning


# ---- published heads' stand-ins ------------------------------------------------------------------

EAGLE = "yuhuili/EAGLE-Vicuna-7B-v1.3"


@pytest.fixture(scope="module")
def eagle_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf-eagle")
    dryrun.install_standins(home, ["lmsys/vicuna-7b-v1.3", EAGLE])
    return home


def test_eagle_standin_loads_and_drafts_on_the_standin_vicuna_offline(eagle_home):
    """The t4-dryrun path of `eagle_heads: yuhuili/EAGLE-Vicuna-7B-v1.3`: the repository resolves from
    the stand-in cache, its file is the published layout and dtype (embed_tokens.weight included),
    the head loads on the 4-bit float16 stand-in Vicuna as a float16 head and drafts; on the float32
    stand-in its greedy output is the target's."""
    code = f"""
import torch
from specnb.core.generation import autoregressive_generate, speculative_generate
from specnb.core.trees import Tree
from specnb.drafters.eagle import EagleDrafter, EagleHead
from specnb.io.eagle_checkpoint import PUBLISHED, load_checkpoint
from specnb.io.models import load_model, prompt_ids
from specnb.io.sources import resolve_source
from specnb.experiments.learned_study import check_models

src = resolve_source({EAGLE!r})
assert (src.kind, src.status) == ("hub", "cached"), src
check_models("lmsys/vicuna-7b-v1.3", "", "train", {EAGLE!r})
checkpoint = load_checkpoint({EAGLE!r})
stored = torch.load(checkpoint.file, weights_only=True)
assert checkpoint.file.name == "pytorch_model.bin" and "snapshots" in str(checkpoint.file)
assert {{t.dtype for t in stored.values()}} == {{PUBLISHED[{EAGLE!r}].torch_dtype}}
assert stored["embed_tokens.weight"].shape == (32000, 64) and stored["fc.weight"].shape == (64, 128)
assert "layers.0.self_attn.q_proj.weight" in stored and not any("input_layernorm" in k for k in stored)
model, tok = load_model("lmsys/vicuna-7b-v1.3", "4bit", dtype="float16")
head = EagleHead.load({EAGLE!r}, model)
assert head.dtype == torch.float16
prompt = prompt_ids(tok, "Tell me about the sea.")[0]
out = speculative_generate(model, EagleDrafter(model, head), prompt, Tree.sparse(8), 12, eos_token_id=())
assert len(out.tokens) == 12 and sum(s.num_drafted for s in out.steps) > 0
model, _ = load_model("lmsys/vicuna-7b-v1.3")
head = EagleHead.load({EAGLE!r}, model)
ref = autoregressive_generate(model, prompt, 16, eos_token_id=())
out = speculative_generate(model, EagleDrafter(model, head), prompt, Tree.sparse(8), 16, eos_token_id=())
assert out.tokens.tolist() == ref.tokens.tolist()
print("accepted", sum(s.num_accepted for s in out.steps), "of", sum(s.num_drafted for s in out.steps))
"""
    proc = offline(eagle_home, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)


def test_install_standins_builds_the_published_heads_by_default(tmp_path, monkeypatch):
    """With no ids: every committed model and every published checkpoint whose base model has a
    committed config (the Llama-2-chat EAGLE head's base has none: it is named, not built)."""
    built = []
    monkeypatch.setattr(dryrun, "_install_repo", lambda home, hub_id, commit, fill: built.append(hub_id))
    monkeypatch.setattr(dryrun, "family_tokenizer", lambda family, size: None)
    dryrun.install_standins(tmp_path)
    assert {EAGLE, "FasterDecoding/medusa-vicuna-7b-v1.3", "lmsys/vicuna-7b-v1.3"} <= set(built)
    assert "yuhuili/EAGLE-llama2-chat-7B" not in built
    with pytest.raises(KeyError, match="EAGLE-llama2-chat-7B"):
        dryrun.install_standins(tmp_path, ["yuhuili/EAGLE-llama2-chat-7B"])


# ---- the t4-dryrun profile end to end (from tests/test_notebooks.py: a file of its own, so that two
# test workers run it beside the smoke run) ----------------------------------------------------------


@pytest.fixture(scope="module")
def t4_dryrun(tmp_path_factory):
    """`run t4-dryrun` as run_notebooks.sh runs it, with specnb's cache (where the runner builds the
    stand-ins, `{cache}/hf-standins`) in a folder of the test's own: a cold build every time."""
    outputs = tmp_path_factory.mktemp("dryrun-outputs")
    cache = tmp_path_factory.mktemp("specnb-cache")
    env = {**os.environ, "SPECNB_CACHE": str(cache)}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "specnb.notebook.runner", "run", "t4-dryrun", "--outputs", str(outputs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return outputs, time.perf_counter() - start, proc.stdout, cache


def test_t4_dryrun_runs_the_t4_code_paths(t4_dryrun):
    from specnb.experiments.pairs import Pair
    from specnb.io.model_configs import hub_model

    outputs, seconds, log, _ = t4_dryrun
    print(f"t4-dryrun: {seconds:.0f} s")  # information, not a timed assertion (docs/performance-cpu.md: the figure)
    assert (
        "stand-ins of 6 hub models and of published heads: FasterDecoding/medusa-vicuna-7b-v1.3, "
        "yuhuili/EAGLE-Vicuna-7B-v1.3;"
    ) in log
    folders = {}
    for nb in NOTEBOOKS:
        folders[nb.stem] = folder = next((outputs / nb.stem).iterdir())
        params = json.loads((folder / "params.json").read_text())
        assert params["status"] == "finished" and params["profile"] == "t4-dryrun", params.get("error")
        assert params["runner"]["standins"]
        if nb.stem != "07_report":  # the report loads no model
            assert params["parameters"]["model_dtype"] == "float16"

    # notebook 02: the brief's three pairs measured; across tokenizers, the shared-vocabulary method
    # refused for that reason and the cross-tokenizer methods run
    t4_pairs = [Pair.from_dict(p) for p in runner.resolve("t4", {}, [], NOTEBOOKS)["02_model_pairs"]["pairs"]]
    valid = [p for p in t4_pairs if hub_model(p.target).tokenizer.family == hub_model(p.draft).tokenizer.family]
    status = pd.read_csv(folders["02_model_pairs"] / "pairs.csv", keep_default_na=False)
    assert (
        list(status["pair"])
        == [p.label for p in t4_pairs]
        == [
            "Felladrin/Llama-160M-Chat-v1 -> meta-llama/Llama-2-7b-hf[4bit]",
            "meta-llama/Llama-3.2-1B -> meta-llama/Llama-3.2-3B[4bit]",
            "Felladrin/Llama-160M-Chat-v1 -> meta-llama/Llama-3.2-3B[4bit]",
        ]
    )
    assert list(status["vocabulary"]) == ["shared", "shared", "different"] and len(valid) == 2
    partial = status[status["status"] == "partial"]
    assert list(partial["pair"]) == ["Felladrin/Llama-160M-Chat-v1 -> meta-llama/Llama-3.2-3B[4bit]"]
    reason = partial["reason"].iloc[0]
    assert reason.startswith("refused chain:4:") and "vocab size 32000" in reason and "vocab size 128256" in reason
    measured = status[status["status"] == "measured"]
    assert list(measured["pair"]) == [p.label for p in valid]
    for loaded in status["target_loaded"]:  # what was loaded, not what was asked
        assert "float16, nf4 4-bit" in loaded and "STAND-IN" in loaded
    assert all("float16" in d and "4-bit" not in d for d in status["draft_loaded"])
    table = pd.read_csv(folders["02_model_pairs"] / "pairs_methods.csv")
    t4_methods = runner.resolve("t4", {}, [], NOTEBOOKS)["02_model_pairs"]["methods"]
    across = [p for p in t4_pairs if p not in valid]
    assert len(table) == 2 * len(t4_methods) + (len(across[0].methods) - 1)
    assert set(table["pair"]) == set(status["pair"])
    assert (table["greedy_mismatches"] == 0).all(), "every greedy output equals the target's (or a numerical tie)"
    # the brief's grid for the three pairs: every preset at every budget, with intervals (3 prompts);
    # across tokenizers, re-drafted, and the rows it cannot have say why
    grid = pd.read_csv(folders["02_model_pairs"] / "grid.csv", keep_default_na=False, na_values=[""])
    t4_grid = runner.resolve("t4", {}, [], NOTEBOOKS)["02_model_pairs"]
    dry_grid = runner.resolve("t4-dryrun", {}, [], NOTEBOOKS)["02_model_pairs"]
    assert list(dict.fromkeys(grid["pair"])) == list(status["pair"])
    assert grid.drop_duplicates("pair")["kind"].tolist() == ["same tokenizer", "same tokenizer", "other tokenizer"]
    presets = grid[grid["shape"].isin(t4_grid["shapes"])]
    assert set(presets["shape"]) == set(t4_grid["shapes"]) and set(presets["budget"]) == set(dry_grid["budgets"])
    assert len(presets) == 3 * len(t4_grid["shapes"]) * len(dry_grid["budgets"])
    assert presets["tau"].notna().all() and (presets["tau_ci_low"] <= presets["tau_ci_high"]).all()
    cross = grid[grid["kind"] == "other tokenizer"]
    blank = cross[cross["tau"].isna()]
    assert set(blank["shape"]) == {"sequoia", "medusa", "hindsight", "oracle"}
    assert blank["note"].str.contains("across tokenizers").all()
    best = pd.read_csv(folders["02_model_pairs"] / "grid_best.csv")
    assert len(best) == 3 * len(set(dry_grid["budgets"]) | set(dry_grid["dynamic_budgets"]))  # dynamic trees beyond

    # notebook 01: the 4-bit Llama-2-7B pair, the replay equal to the real runs step by step
    agreement = pd.read_csv(folders["01_tree_shapes"] / "replay_agreement.csv")
    assert (agreement["mismatched_steps"] == 0).all() and (agreement["steps_compared"] > 0).all()
    for stem in ("01_tree_shapes", "03_tree_attention_timing"):
        curve = pd.read_csv(folders[stem] / "verify_curve.csv")
        assert set(curve["model"]) == {"meta-llama/Llama-2-7b-hf[4bit]", "JackFram/llama-160m"}
        assert set(curve["dtype"]) == {"float16"}

    # notebook 03: Llama-2-7B's heads in float16; every implementation agrees with the reference or
    # says why it could not run here
    check = pd.read_csv(folders["03_tree_attention_timing"] / "reference_check.csv", keep_default_na=False)
    assert set(check["impl"]) == {"sdpa", "per_sequence", "eager", "flex"}
    assert all(ok == "True" or (ok == "" and note) for ok, note in zip(check["ok"].astype(str), check["note"]))
    grid = pd.read_csv(folders["03_tree_attention_timing"] / "attention_grid.csv")
    assert set(grid["dtype"]) == {"float16"} and set(grid["heads"]) == {32} and set(grid["head_dim"]) == {128}


# Each notebook's code cells executed again in one process (conftest.exec_notebook: the run's
# parameters laid over the parameters cell as papermill injects them): what a Colab "rerun" executes,
# without a kernel's start and its imports per notebook
RERUN = """
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
sys.path.insert(0, sys.argv[2])
from conftest import exec_notebook
for path, params in json.loads(sys.argv[1]):
    exec_notebook(path, params)
    plt.close("all")
    print("rerun", path, flush=True)
"""


def test_t4_dryrun_notebooks_resume_in_their_own_folder(t4_dryrun):
    """Colab's "rerun to resume": each t4-dryrun notebook executed again into its finished run folder
    (as an interactive rerun with that run_dir does) recomputes nothing and duplicates nothing:
    every table keeps its rows and every resumable store its lines. Then notebook 05's published
    heads came from their stand-in checkpoint (5 heads, float16, the published layout)."""
    outputs, _, _, cache = t4_dryrun
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(cache / "hf-standins"),
        "SPECNB_CACHE": str(cache),
        "SPECNB_HEADLESS": "1",
    }
    runs, before = [], {}
    for nb in NOTEBOOKS:
        folder = next((outputs / nb.stem).iterdir())
        params = json.loads((folder / "params.json").read_text())["parameters"]
        runs.append((str(nb), {**params, "run_dir": str(folder)}))
        before[nb.stem] = snapshot(folder)
    proc = subprocess.run(
        [sys.executable, "-c", RERUN, json.dumps(runs), str(ROOT / "tests")],
        cwd=ROOT / "notebooks",
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("rerun ") == len(NOTEBOOKS)
    for nb in NOTEBOOKS:
        assert snapshot(next((outputs / nb.stem).iterdir())) == before[nb.stem], nb.stem
    medusa = next((outputs / "05_learned_drafters").iterdir())
    accuracy = pd.read_csv(medusa / "depth_accuracy.csv")
    assert set(accuracy.loc[accuracy["drafter"] == "Medusa heads", "depth"]) == {1, 2, 3, 4, 5}  # the published 5 heads
    assert set(accuracy.loc[accuracy["drafter"] == "EAGLE head", "depth"]) == set(range(1, 7))  # its stand-in, depth 6
    said = json.loads((medusa / "params.json").read_text())["test_prompts"]
    assert said["source"] == "spec_bench" and "lmsys/vicuna-7b-v1.3's conversation format" in said["prompt_format"]


def snapshot(folder: Path) -> tuple[dict, dict]:
    """Rows per table and lines per resumable store in a run folder."""
    tables = {p.name: len(pd.read_csv(p)) for p in folder.glob("*.csv")}
    stores = {p.name: len(p.read_text().splitlines()) for p in folder.rglob("*.jsonl")}
    return tables, stores
