"""Model names are resolved before any weights load: a mistyped name, a gated model without access,
a missing repository, an unreachable hub or offline mode each fail at once with a message that
names the model and says what specnb accepts and what to do; no retry storm. Hub answers are
simulated (no hub reaches this machine); the real no-network path is exercised as it is."""

import time

import pytest
from conftest import tiny_model
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
from transformers import AutoModelForCausalLM

import specnb.io.sources as sources
from specnb.io.embedded import EMBEDDED_MODELS
from specnb.io.models import load_model, load_pair
from specnb.io.sources import ModelSourceError, check_sources, resolve_source


def hub_error(cls, message):
    """One of huggingface_hub's errors without the HTTP response it is normally built from."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    return error


@pytest.fixture
def no_weights(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("weights were loaded before the names were checked")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fail)


@pytest.fixture
def hub(monkeypatch):
    """Simulate the hub's answer to auth_check: {repo_id: exception or None}."""
    answers: dict[str, Exception | None] = {}

    def auth_check(repo_id, **kwargs):
        if answers.get(repo_id) is not None:
            raise answers[repo_id]

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "auth_check", auth_check)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return answers


def test_a_mistyped_name_fails_at_once_and_says_what_is_accepted(no_weights):
    start = time.perf_counter()
    with pytest.raises(ModelSourceError) as e:
        load_model("no-such-model-name-xyz")
    assert time.perf_counter() - start < 5  # not transformers' ~49 s of hub retries
    message = str(e.value)
    assert "'no-such-model-name-xyz'" in message and "not a local folder" in message
    assert all(name in message for name in EMBEDDED_MODELS) and "org/name" in message


def test_an_unreachable_hub_is_said_so_without_retries(no_weights, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.perf_counter()
    with pytest.raises(ModelSourceError, match="could not be reached") as e:
        resolve_source("no-such-org/no-such-model")  # no hub on this machine: the real request fails
    assert time.perf_counter() - start < 15
    assert "'no-such-org/no-such-model'" in str(e.value) and "HF_HUB_OFFLINE" in str(e.value)


def test_offline_mode_uses_the_cache_only(no_weights, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sources, "in_hub_cache", lambda repo: repo == "org/cached")
    with pytest.raises(ModelSourceError, match="offline mode is set .* not in the local Hugging Face cache"):
        resolve_source("org/missing")
    cached = resolve_source("org/cached")
    assert cached.kind == "hub" and cached.local_files_only


def test_gated_and_missing_repositories_say_what_to_do(hub, no_weights, monkeypatch):
    monkeypatch.setattr(sources, "in_hub_cache", lambda repo: False)
    hub["meta-llama/Llama-2-7b-hf"] = hub_error(
        GatedRepoError, "Access to model meta-llama/Llama-2-7b-hf is restricted"
    )
    hub["org/typo"] = hub_error(RepositoryNotFoundError, "Repository Not Found")
    with pytest.raises(ModelSourceError) as e:
        resolve_source("meta-llama/Llama-2-7b-hf")
    message = str(e.value)
    assert "gated" in message and "https://huggingface.co/meta-llama/Llama-2-7b-hf" in message
    assert "HF_TOKEN" in message and "huggingface_hub.login()" in message and "papermill" in message
    with pytest.raises(ModelSourceError, match="no such repository"):
        resolve_source("org/typo")
    assert resolve_source("org/fine").local_files_only is False  # the hub said yes


def test_every_problem_of_a_run_is_listed_before_any_load(hub, no_weights, monkeypatch):
    monkeypatch.setattr(sources, "in_hub_cache", lambda repo: False)
    hub["meta-llama/Llama-3.2-1B"] = hub_error(GatedRepoError, "restricted")
    hub["meta-llama/Llama-3.2-3B"] = hub_error(GatedRepoError, "restricted")
    with pytest.raises(ModelSourceError) as e:
        check_sources(["meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-1B", "smollm2-135m"])
    assert str(e.value).startswith("2 models cannot be loaded") and "Llama-3.2-1B" in str(e.value)
    with pytest.raises(ModelSourceError, match="gated"):
        load_pair("meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-1B")


def test_folders_and_embedded_names(tmp_path, no_weights):
    assert resolve_source("smollm2-135m").kind == "embedded"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="without a config.json"):
        resolve_source(str(tmp_path / "empty"))
    tiny_model(1).save_pretrained(tmp_path / "model")
    assert resolve_source(str(tmp_path / "model")).kind == "folder"


def test_a_notebook_sweep_checks_every_pair_first(hub, no_weights, monkeypatch, tmp_path):
    from specnb.drafters.methods import method_trees
    from specnb.experiments import sweeps as ex
    from specnb.experiments.pairs import Pair
    from specnb.io.prompts import Prompt
    from specnb.io.storage import Sweep

    monkeypatch.setattr(sources, "in_hub_cache", lambda repo: False)
    hub["meta-llama/Llama-2-7b-hf"] = hub_error(GatedRepoError, "restricted")
    pairs = [Pair("smollm2-135m", "smollm2-135m"), Pair("meta-llama/Llama-2-7b-hf", "JackFram/llama-160m")]
    with pytest.raises(ModelSourceError, match="Llama-2-7b-hf"):
        ex.run_pairs(
            Sweep(tmp_path / "s.jsonl", ex.UNIT_KEY),
            pairs,
            [Prompt("p", "c", "hi")],
            method_trees(["chain:2"]),
            ex.SweepConfig(4, progress=False),
        )
    assert not (tmp_path / "s.jsonl").exists()  # nothing ran, nothing was stored
