"""Collection as work units on executors: a failed unit is retried a bounded number of times and then
reported by name without stopping the others; two collections writing one folder at once leave one
file per unit; on a local Ray instance (2 CPUs, tiny models saved to folders and loaded by name in
each actor) a collection writes the same files, byte-identical arrays, as one in this process, and
killing an actor's process midway loses no unit and duplicates none; without Ray, naming it says how
to install it. The Ray tests are skipped, with the reason, where Ray is not installed or cannot start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import machine_lock, random_prompt, tiny_model
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tokenizer_models
from transformers import PreTrainedTokenizerFast

from specnb.analysis.collection import CollectConfig, Collection, units_of
from specnb.experiments.collect import collect_units
from specnb.experiments.executors import LocalExecutor, RayExecutor, executor_for, start_ray
from specnb.io.models import ModelPair

ROOT = Path(__file__).resolve().parents[1]
CONFIG = CollectConfig(max_new_tokens=16, eos_token_id=(), top_k=8, super_k=2, super_depth=2, super_size=4)
PROMPTS = {f"p{i}": random_prompt(40 + i, length=5 + i % 4) for i in range(10)}
DESCRIBE = {"pair": "tiny, its first layer as the draft", "draft_dtype": "float32"}


class Item:
    def __init__(self, name: str) -> None:
        self.name = name


def test_a_failed_unit_is_retried_then_reported_by_name_without_stopping_the_others():
    tries: dict[str, int] = {}
    seen = []

    def work(models, unit):
        tries[unit.name] = tries.get(unit.name, 0) + 1
        if unit.name == "bad" or (unit.name == "flaky" and tries["flaky"] == 1):
            raise RuntimeError(f"{unit.name} broke\nsecond line")
        return models + unit.name

    units = [Item(n) for n in ("a", "bad", "flaky", "b")]
    out = LocalExecutor(retries=2).map(lambda: "m:", work, units, on_progress=seen.append)
    assert out.results == {"a": "m:a", "flaky": "m:flaky", "b": "m:b"}
    assert [(f.unit, f.attempts, f.error) for f in out.failures] == [("bad", 3, "RuntimeError: bad broke")]
    assert isinstance(out.failures[0].exception, RuntimeError)
    assert (
        tries == {"a": 1, "bad": 3, "flaky": 2, "b": 1} and out.retried == 3 and out.attempts == {"bad": 3, "flaky": 1}
    )
    assert seen[-1].done == 3 and seen[-1].failed == 1 and seen[-1].total == 4
    assert [p.done for p in seen] == sorted(p.done for p in seen)


def test_without_ray_naming_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ImportError, match=r'pip install "specnb\[ray\]"'):
        executor_for("ray")
    with pytest.raises(ImportError, match='pip install ray|pip install "ray'):
        RayExecutor().map(lambda: None, lambda m, u: None, [Item("a")])
    assert isinstance(executor_for("local"), LocalExecutor)
    with pytest.raises(ValueError, match="unknown executor"):
        executor_for("dask")


def test_no_units_load_nothing_and_need_no_ray(monkeypatch):
    """Either executor maps no units without loading models or importing Ray."""
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray would raise ImportError

    def load():
        raise AssertionError("nothing to run: nothing loads")

    for executor in (LocalExecutor(), RayExecutor()):
        out = executor.map(load, lambda m, u: None, [])
        assert out.results == {} and out.failures == () and out.workers == ()


class FlakyRay:
    """Ray's module as RayExecutor sees it, whose local start fails as a loaded machine's can."""

    def __init__(self, failures: int) -> None:
        self.failures, self.inits, self.shutdowns = failures, 0, 0

    def init(self, **kwargs) -> None:
        self.inits += 1
        if self.inits <= self.failures:
            raise Exception("The current node timed out during startup. This could happen because ...")

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_local_ray_start_that_times_out_is_tried_once_more():
    ray = FlakyRay(failures=1)
    RayExecutor()._init(ray)
    assert ray.inits == 2 and ray.shutdowns == 1
    ray = FlakyRay(failures=2)
    with pytest.raises(RuntimeError, match="Ray could not start on this machine: .*timed out during startup"):
        RayExecutor()._init(ray)
    assert ray.inits == 2 and ray.shutdowns == 2  # each failed start stopped before the next step
    ray = FlakyRay(failures=1)  # a cluster's address: its own start is not ours to retry
    with pytest.raises(RuntimeError, match="at address 'ray://head:10001'"):
        RayExecutor(address="ray://head:10001")._init(ray)
    assert ray.inits == 1


def save_tiny_pair(folder: Path) -> ModelPair:
    """The seeded tiny target saved with `save_pretrained` and a word-level tokenizer; the draft is its
    first layer (the pair as the smoke profile makes it, by name)."""
    vocab = {f"w{i}": i for i in range(61)}
    backend = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0").save_pretrained(folder)
    tiny_model(0, scale=30.0).save_pretrained(folder)
    return ModelPair(str(folder), str(folder), draft_layers=1)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> ModelPair:
    return save_tiny_pair(tmp_path_factory.mktemp("tiny_pair"))


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory, pair) -> Collection:
    """Every prompt collected in this process, with torch pinned to one thread like the Ray actors
    (float sums, and so log q, can depend on the thread count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = collect_units(
            tmp_path_factory.mktemp("local") / "c",
            pair,
            PROMPTS,
            CONFIG,
            describe=DESCRIBE,
            executor=LocalExecutor(),
            progress=False,
        )
    finally:
        torch.set_num_threads(threads)
    return report.check().collection


def assert_same_files(folder: Path, reference: Collection, prompts=PROMPTS) -> None:
    """One whole file per unit, named alike, with byte-identical arrays; no other unit file."""
    names = sorted(u.name for u in units_of(prompts, CONFIG, DESCRIBE))
    assert sorted(p.name for p in folder.glob("*.npz")) == names
    assert sorted(p.name for p in Path(reference.folder).glob("*.npz")) == names
    mine = Collection.load(folder, list(prompts))
    for a, b in zip(mine.prompts, reference.prompts):
        assert a.arrays().keys() == b.arrays().keys()
        for k, v in a.arrays().items():
            assert v.dtype == b.arrays()[k].dtype and v.tobytes() == b.arrays()[k].tobytes(), (a.prompt_id, k)


def test_two_concurrent_collections_into_one_folder_leave_one_file_per_unit(tmp_path, pair, local_reference):
    folder = tmp_path / "shared"
    script = tmp_path / "collect.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from test_executors import CONFIG, DESCRIBE, PROMPTS
        from specnb.experiments.collect import collect_units
        from specnb.io.models import ModelPair
        torch.set_num_threads(1)
        order = list(PROMPTS)[::int(sys.argv[1])]  # one forwards, one backwards: they meet in the middle
        report = collect_units({str(folder)!r}, ModelPair({pair.target!r}, {pair.draft!r}, draft_layers=1),
                               {{p: PROMPTS[p] for p in order}}, CONFIG, describe=DESCRIBE, progress=False)
        report.check()
        print(sorted(r["status"] for r in report.outcome.results.values()))
    """)
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), step], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for step in ("1", "-1")
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert_same_files(folder, local_reference)
    assert not list(folder.glob(".*.tmp")) and sorted(
        p.name for p in folder.iterdir() if not p.name.endswith(".npz")
    ) == ["collection.json"]


# ---- a local Ray instance ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    """A local Ray instance with 2 CPUs for this module (stopped after it); skipped where Ray is not
    installed or cannot start. One at a time on this machine (machine_lock: two test workers)."""
    ray = pytest.importorskip("ray", reason='Ray is not installed (pip install "specnb[ray]")')
    with machine_lock(tmp_path_factory, "ray"):
        try:  # a start that fails leaves nothing running (the session's check for leftover processes)
            start_ray(ray, num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=256 * 2**20)
        except Exception as e:  # no shared memory, no ports...: the tests cannot say anything here
            pytest.skip(f"Ray cannot start here: {type(e).__name__}: {e}")
        yield ray
        ray.shutdown()


def test_ray_collection_writes_the_same_files_as_local(tmp_path, ray_local, pair, local_reference):
    """Through an fsspec URL (file://), with a unit that always fails (a token id outside the
    vocabulary): it is tried 1 + retries times and reported by name; every other unit is written."""
    prompts = {**PROMPTS, "bad": torch.tensor([[5, 999, 7]])}
    folder = tmp_path / "ray"
    seen = []
    report = collect_units(
        f"file://{folder}",
        pair,
        prompts,
        CONFIG,
        describe=DESCRIBE,
        executor=RayExecutor(workers=2, retries=1),
        progress=seen.append,
    )
    assert report.failed == ["bad"] and report.outcome.failures[0].attempts == 2
    assert "IndexError" in report.outcome.failures[0].error
    assert len(report.outcome.workers) == 2 and len({w.pid for w in report.outcome.workers} | {os.getpid()}) == 3
    assert seen[-1].done == len(PROMPTS) and seen[-1].failed == 1
    assert [p.prompt_id for p in report.collection.prompts] == list(PROMPTS)
    assert_same_files(folder, local_reference)
    table = report.table()
    assert table.set_index("prompt_id")["status"].to_dict() == {**{p: "written" for p in PROMPTS}, "bad": "failed"}


def test_killing_a_ray_worker_loses_no_unit_and_duplicates_none(tmp_path, ray_local, pair, local_reference):
    folder = tmp_path / "killed"
    killed: dict[str, int] = {}

    def kill_one(p):
        if not killed and p.done >= 1:
            victim = p.workers[-1].pid
            os.kill(victim, signal.SIGKILL)  # the actor's process, by its id
            killed.update(pid=victim, done=p.done)

    report = collect_units(
        folder, pair, PROMPTS, CONFIG, describe=DESCRIBE, executor=RayExecutor(workers=2, retries=2), progress=kill_one
    )
    print(
        f"killed worker {killed['pid']} after {killed['done']} of {len(PROMPTS)} units; "
        f"{report.outcome.lost_workers} lost, {report.outcome.retried} retried, "
        f"{len(report.outcome.workers)} workers in all"
    )
    assert killed["done"] < len(PROMPTS), "killed too late to test anything"
    assert report.outcome.lost_workers >= 1 and not report.outcome.failures
    assert_same_files(folder, local_reference)  # a temporary file the killed actor left is no unit file


def test_workers_that_cannot_load_the_pair_fail_every_unit_by_name(tmp_path, ray_local):
    """A pair the workers cannot load: each actor fails to start, a bounded number are replaced,
    then every unit is reported with the loader's own error; nothing is written."""
    missing = ModelPair(str(tmp_path / "no_such_model"), str(tmp_path / "no_such_model"))
    prompts = dict(list(PROMPTS.items())[:3])
    report = collect_units(
        tmp_path / "c",
        missing,
        prompts,
        CONFIG,
        describe=DESCRIBE,
        executor=RayExecutor(workers=1, replacements=1),
        progress=False,
    )
    assert report.failed == list(prompts) and report.outcome.lost_workers == 2 and not report.outcome.workers
    assert all("no worker left" in f.error and "no_such_model" in f.error for f in report.outcome.failures), (
        report.outcome.failures[0]
    )
    assert not list((tmp_path / "c").glob("*.npz"))
