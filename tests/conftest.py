"""Seeded tiny models built from a config (transformers' test habit): they download nothing and
odd sizes catch shape bugs. `scale` multiplies the LM head so random models have peaked,
distinguishable next-token distributions instead of near-uniform ones."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specnb.io.embedded import ModelNotInstalledError
from specnb.notebook.runner import skip_iri_formats

skip_iri_formats()  # before nbformat is imported (by the report, nbclient, papermill)

ROOT = Path(__file__).resolve().parents[1]
Loaded = TypeVar("Loaded")
pytest_plugins = ["working_folder"]  # every test leaves the process in the folder it found it in

# notebook runs in the tests: a cell that runs past this fails its run with a clear error
# (specnb.notebook.runner.cell_timeout) instead of waiting on a kernel that stopped answering
os.environ.setdefault("SPECNB_CELL_TIMEOUT", "600")
os.environ.setdefault("SPECNB_DECODE_MS", "skip")  # the runner measures no decode step in tests (`notebook.estimate`)

# pytest-xdist (run_tests.sh runs three workers on two cores): each worker's torch, and the notebook
# kernels and subprocesses it starts, on one thread, so the workers do not fight for the cores
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def tiny_model(
    seed: int,
    vocab: int = 61,
    arch: str = "llama",
    attn: str = "sdpa",
    scale: float = 1.0,
    layers: int = 2,
    hidden: int = 48,
) -> torch.nn.Module:
    torch.manual_seed(seed)
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden + 4,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kwargs, attn_implementation=attn))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**kwargs, attn_implementation=attn))
    else:
        raise ValueError(arch)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.eval()


def step_tuple(s) -> tuple:
    """What a step did, to compare a replayed step with a real one: position, drafted, accepted,
    tokens added, tree depth, the accepted ranks and the children counts."""
    return (s.position, s.num_drafted, s.num_accepted, s.num_tokens, s.tree_depth, s.accepted_ranks, s.child_counts)


def random_prompt(seed: int, length: int = 7, vocab: int = 61) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, length), generator=g)  # ids 0-2 are pad/bos/eos


# transformers' deprecations that go through its logger, not `warnings` (pytest.ini makes the others
# errors): each one a test triggers through specnb's calls fails that test
LOGGED_DEPRECATIONS = ("is deprecated", "Ignoring clean_up_tokenization_spaces")


class _Deprecations(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(p in message for p in LOGGED_DEPRECATIONS):
            self.seen.append(message)


@pytest.fixture(autouse=True)
def no_logged_deprecations():
    handler = _Deprecations()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    assert not handler.seen, f"transformers logged a deprecation for specnb's call: {handler.seen[0][:300]}"


REQUIRE_CHROMIUM = "SPECNB_REQUIRE_CHROMIUM"  # set by .ci/run, which installs Debian's chromium
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")  # the render tests' headless browser


@pytest.fixture(scope="session")
def chromium() -> str:
    """Headless Chromium's executable for the render tests. Without one they skip, except where
    SPECNB_REQUIRE_CHROMIUM=1 (CI): there a missing browser fails them, so a render test never
    silently stops running."""
    browser = next((found for b in BROWSERS if (found := shutil.which(b))), None)
    if browser is None and os.environ.get(REQUIRE_CHROMIUM) == "1":
        pytest.fail(f"{REQUIRE_CHROMIUM}=1 but no Chromium on PATH ({', '.join(BROWSERS)}): .ci/run installs it")
    if browser is None:
        pytest.skip(f"no headless Chromium here (none of {', '.join(BROWSERS)} on PATH)")
    return browser


@pytest.fixture(scope="session")
def tiny_target() -> torch.nn.Module:
    return tiny_model(0, scale=30.0)


@pytest.fixture(scope="session")
def tiny_draft() -> torch.nn.Module:
    """A different random model: agrees with the target now and then."""
    return tiny_model(1, scale=30.0, layers=1)


REQUIRE_MODELS = "SPECNB_REQUIRE_MODELS"  # set by .ci/run, which installs every embedded model the tests load


def installed(load: Callable[[str], Loaded], name: str) -> Loaded:
    """`load(name)` of an embedded model, which may not be installed here (`run_tests.sh` installs
    SmolLM2-135M only). Where it is not, the test skips, except where SPECNB_REQUIRE_MODELS=1 (CI,
    which installs them): there it fails, so a real-model test never silently stops running. Any
    other error of the load fails the test."""
    try:
        return load(name)
    except ModelNotInstalledError as e:
        if os.environ.get(REQUIRE_MODELS) == "1":
            pytest.fail(f"{REQUIRE_MODELS}=1 but {name} is not installed (.ci/run installs it): {e}")
        pytest.skip(f"{name} not installed here: {e}")


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (embedded GGUF) and its tokenizer, loaded once per session: de-quantizing
    the GGUF takes ~20 s. Shared: tests copy it before changing it."""
    from specnb.io.models import load_model

    return load_model("smollm2-135m")


# ---- no test leaves a process behind ---------------------------------------------------------------


def _descendants() -> dict[int, psutil.Process]:
    """This process's living descendants (zombies are gone already: only their exit status is left)."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found[child.pid] = child
        except psutil.Error:
            pass
    return found


def _started_since(before: set[int]) -> dict[int, psutil.Process]:
    """Descendants started since `before` was taken, other than those a process already alive then
    started (a module fixture's Ray instance starts workers while a test uses it: the fixture
    answers for them, checked when the session ends)."""
    me = os.getpid()
    left = {}
    for pid, proc in _descendants().items():
        if pid in before:
            continue
        try:
            ancestors = {p.pid for p in proc.parents()}
            chain = ancestors - {me} - {p.pid for p in psutil.Process(me).parents()}
        except psutil.Error:
            continue
        if not chain & before:
            left[pid] = proc
    return left


def _describe(procs: dict[int, psutil.Process]) -> str:
    said = []
    for pid, proc in procs.items():
        try:
            said.append(f"{pid}: {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            said.append(f"{pid}: (gone)")
    return "; ".join(said)


def _wait_and_stop(find, grace: float = 15.0) -> str:
    """What `find()` still returns after `grace` seconds (shutdowns take a moment), described; those
    are then killed, so that one test's leak does not slow or break the next. "" when none."""
    deadline = time.monotonic() + grace
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    said = _describe(left)
    for proc in left.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(left.values()), timeout=5)
    return said


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every kernel and subprocess a test starts is gone when it ends (a Jupyter kernel started by a
    test once stayed alive to the end of the suite)."""
    before = set(_descendants())
    yield
    left = _wait_and_stop(lambda: _started_since(before))
    assert not left, f"the test left processes running (now killed): {left}"


@pytest.fixture(scope="session", autouse=True)
def no_process_left_at_the_end():
    """And every process a module or session fixture started is gone once the fixtures are torn down
    (this one is torn down last)."""
    before = set(_descendants())
    yield
    left = _wait_and_stop(lambda: {pid: p for pid, p in _descendants().items() if pid not in before})
    assert not left, f"fixtures left processes running (now killed): {left}"


# ---- the test workers (pytest-xdist, run_tests.sh) --------------------------------------------------

# the files that take longest, longest first (their seconds on three workers, at 129b45b), handed to the
# workers first so that none is left with a long one at the end (the order holds because run_tests.sh passes
# --no-loadscope-reorder: xdist otherwise hands out the files with the most tests first, and the longest,
# with few tests, went last)
LONGEST_FIRST = (
    "test_notebooks.py",  # 405 s
    "test_dryrun.py",  # 316 s
    "test_executors.py",  # 219 s (Ray)
    "test_user_clone.py",  # 136 s
    "test_colab.py",  # 114 s
    "test_cross_tokenizer.py",  # 92 s
    "test_execution.py",  # 91 s
    "test_eagle.py",  # 89 s
    "test_real_model.py",  # 77 s
    "test_drafters.py",  # 66 s
    "test_batch.py",  # 56 s
)


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="run the files, and the tests in each file, in an order shuffled by SEED (the same on every "
        "worker): a test that depends on what ran before it fails in some order",
    )


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("shuffle")
    if seed is not None:
        shuffle(items, seed)
        print(f"[tests] order shuffled with --shuffle {seed}")
    elif os.environ.get("PYTEST_XDIST_WORKER"):  # a serial run keeps the files' order
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the order within a file kept


def shuffle(items: list, seed: int) -> None:
    """`items` reordered in place: the files in a random order, each file's tests shuffled among
    themselves and kept together (xdist's --dist loadfile hands a file to one worker)."""
    import random

    rng = random.Random(seed)
    files: dict[Path, list] = {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    order = list(files)
    rng.shuffle(order)
    for path in order:
        rng.shuffle(files[path])
    items[:] = [item for path in order for item in files[path]]


_HELD: set[str] = set()  # the machine locks this process holds


@contextlib.contextmanager
def machine_lock(tmp_path_factory, name: str):
    """Held by one test worker at a time, across workers (a file lock in the folder their temporary
    folders share): what two workers must not do at once on one machine, such as each starting a
    local Ray instance. Re-entrant within a process: a worker that holds it (a module's Ray instance)
    and asks again goes on, where a second flock of its own would wait on itself for ever."""
    if name in _HELD:
        yield
        return
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this run
    with open(root / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _HELD.add(name)
        try:
            yield
        finally:
            _HELD.discard(name)
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- the smoke run, once per session ------------------------------------------------------------


def linked_model_cache(folder: Path) -> Path:
    """A specnb cache folder (SPECNB_CACHE) holding nothing but links to the embedded models already
    installed in this machine's cache: a run there de-quantizes nothing again, but trains and
    distills from nothing (medusa-heads, eagle-heads, medusa-distill start empty) as in a user's
    first run."""
    from specnb.io.embedded import EMBEDDED_MODELS, cache_dir

    folder.mkdir(parents=True, exist_ok=True)
    real = cache_dir()
    names = [n for m in EMBEDDED_MODELS.values() for n in (m.name, m.gguf_name)]
    for entry in sorted(real.iterdir()) if real.is_dir() else []:
        if any(entry.name.startswith(n) for n in names) and ".tmp" not in entry.name:
            (folder / entry.name).symlink_to(entry)
    return folder


SMOKE_RAY_NOTEBOOK = "01_tree_shapes"  # the smoke run collects its units on a local Ray instance


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """`run smoke` for every notebook, once per session, shared by every test that reads its outputs
    (tests/test_notebooks.py; tests/test_user_clone.py relies on it for the notebooks its clone does
    not run). As a user's first run: offline with an empty Hugging Face home, and a specnb cache with
    the embedded models installed (linked: set-up's work, which the clone test does from nothing) and
    nothing else. Notebook 01 runs with `-p executor ray` (one actor) where Ray is installed (its own runner call,
    holding the machine's Ray lock): the local executor's run of 01 is the user's-clone test's, so the
    suite runs 01 twice, not three times. Where Ray cannot start, 01 runs again on the local executor
    and the Ray test skips with the error (`smoke_ray_error`). Returns the outputs folder and the
    seconds the run took."""
    from specnb.io import embedded
    from specnb.notebook import registry, runner

    embedded.install(runner.profile_models("smoke"))  # as run_notebooks.sh does first (a no-op once installed)
    outputs = tmp_path_factory.mktemp("outputs")
    home = tmp_path_factory.mktemp("smoke-home")
    env = {
        **os.environ,
        "SPECNB_CACHE": str(linked_model_cache(home / "specnb-cache")),
        "HF_HOME": str(home / "empty-hf-home"),
        "HF_HUB_OFFLINE": "1",
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "specnb.notebook.runner", "run", "smoke", *args, "--outputs", str(outputs)]
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)

    start = time.perf_counter()
    last = (SMOKE_RAY_NOTEBOOK, registry.report_notebook().stem)  # the report reads 01-03: it runs after them
    others = [a for nb in runner.notebooks() if nb.stem not in last for a in ("--notebook", nb.stem)]
    proc = run(*others)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # one actor: it loads the pair once and collects both prompts (two would each load it, on a
    # machine whose two cores the other test worker shares); many actors: tests/test_executors.py
    with_ray = ["-p", "executor", "ray", "-p", "ray_workers", "1"] if importlib.util.find_spec("ray") else []
    with machine_lock(tmp_path_factory, "ray"):  # one local Ray instance at a time on this machine
        proc = run("--notebook", SMOKE_RAY_NOTEBOOK, *with_ray)
    if proc.returncode and with_ray and "Ray could not start" in (error := smoke_ray_error(outputs)):
        (outputs / "smoke-ray-error.txt").write_text(error)
        shutil.rmtree(outputs / SMOKE_RAY_NOTEBOOK)
        proc = run("--notebook", SMOKE_RAY_NOTEBOOK)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = run("--notebook", registry.report_notebook().stem)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return outputs, time.perf_counter() - start


def smoke_ray_error(outputs: Path) -> str:
    """The error that stopped the smoke run's Ray notebook ("" if it finished, or ran on the local executor)."""
    kept = outputs / "smoke-ray-error.txt"
    if kept.exists():
        return kept.read_text()
    folder = next((outputs / SMOKE_RAY_NOTEBOOK).iterdir())
    return json.loads((folder / "params.json").read_text()).get("error", "")


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout


def tiny_notebook(path: Path, parameters: str, *cells: str) -> Path:
    """A notebook of code cells for the runner's own tests: `parameters` (the tagged cell, e.g.
    'mode: str = "ok"  # help'), then `cells`; Python 3's kernelspec."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    tagged = nbformat.v4.new_code_cell(parameters)
    tagged.metadata["tags"] = ["parameters"]
    nb.cells = [tagged, *(nbformat.v4.new_code_cell(c) for c in cells)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return Path(path)


def processes_under(folder: Path) -> list[int]:
    """Ids of the processes whose working directory or executable lies under `folder` (a clone's
    runner and its papermill kernels, which start in its notebooks/ with its .venv's python)."""
    root, found = Path(folder).resolve(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        for link in ("cwd", "exe"):
            try:
                if Path(os.readlink(proc / link)).is_relative_to(root):
                    found.append(int(proc.name))
                    break
            except OSError:
                continue
    return found


def wait_for_no_process_under(folder: Path, seconds: float) -> bool:
    """True once no process runs under `folder` (`processes_under`), False after `seconds`."""
    deadline = time.time() + seconds
    while processes_under(folder):
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


def user_clone(dest: Path) -> Path:
    """`git clone` of this checkout into `dest`, with the working tree's uncommitted changes laid
    over it (modified, new and deleted files) and committed there, so that the clone is what
    committing would land."""
    try:
        git("rev-parse", "--git-dir")
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout, nothing to clone: {e}")
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dest)], check=True)
    for name in git("ls-files", "-z", "--modified", "--others", "--exclude-standard").split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    for name in git("ls-files", "-z", "--deleted").split("\0"):
        if name:
            (dest / name).unlink(missing_ok=True)
    if git("status", "--porcelain", cwd=dest):  # committed there, so a clone of the clone has them too
        git("add", "-A", cwd=dest)
        git(
            "-c",
            "user.name=specnb tests",
            "-c",
            "user.email=tests@specnb.invalid",
            "commit",
            "-q",
            "-m",
            "the working tree's uncommitted changes",
            cwd=dest,
        )
    return dest


# ---- a notebook's first cells in this process ----------------------------------------------------


def run_set_up_cells(stem: str, params: dict, monkeypatch, forbidden: tuple[str, ...] = ("load_model", "load_pair")):
    """Notebook `stem`'s parameters cell, `params` laid over it (as papermill injects them), its Colab
    cell and its set-up cell, executed in this process with every `forbidden` call made to fail (names
    in `specnb.io.models`, `specnb.io.sources`, `specnb.io.embedded` or `learned_study`; default: the
    model loads): what a notebook checks before it loads anything, without a kernel's start-up.
    Returns the cells' namespace; an error of the set-up cell propagates."""
    import specnb.experiments.learned_study
    import specnb.io.embedded
    import specnb.io.models
    import specnb.io.sources

    def called(*args, **kwargs):
        raise AssertionError(f"called before the set-up cell's checks: one of {forbidden}")

    modules = (specnb.io.models, specnb.io.sources, specnb.io.embedded, specnb.experiments.learned_study)
    for name in forbidden:
        owners = [m for m in modules if hasattr(m, name)]
        assert owners, f"nothing named {name}"
        for module in owners:
            monkeypatch.setattr(module, name, called)
    return exec_notebook(ROOT / "notebooks" / f"{stem}.ipynb", params, cells=3)  # the Colab cell does nothing here


def exec_notebook(path: Path, params: dict, cells: int | None = None) -> dict:
    """The notebook's first `cells` code cells (default all) executed in this process: the parameters
    cell, `params` laid over it (as papermill injects them), then the others. Returns their namespace."""
    import nbformat

    code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    namespace: dict = {}
    exec(code[0], namespace)
    namespace.update(params)
    for source in code[1:cells]:
        exec(source, namespace)
    return namespace
