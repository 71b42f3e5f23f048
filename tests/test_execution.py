"""What ends a notebook run other than its last cell, through the runner's own command on a tiny
notebook (no model): each ends in one line and a record, never a traceback, and takes its kernel
with it (`specnb.notebook.execution`).

    a dead kernel            failed, "the kernel died (killed by SIGKILL)", and whether the
                             out-of-memory killer's count moved
    Ctrl-C, SIGTERM, SIGHUP  interrupted, rerun resumes the same folder
    the runner SIGKILLed     its kernel ends by itself within seconds (ipykernel's parent poller)
    a second run             refused while a live run holds the folder, naming it
    unwritable outputs       refused before anything runs
And the README's parameters that cannot work, refused by the runner before any model loads."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import processes_under, tiny_notebook, wait_for_no_process_under

from specnb.io.storage import write_json
from specnb.notebook import runner
from specnb.notebook.execution import death, oom_kills

TINY = """import os, signal, time
from pathlib import Path
folder = Path(run_dir)
(folder / "kernel.pid").write_text(str(os.getpid()))
(folder / "kernel.cwd").write_text(os.getcwd())
os.write(2, b"kernel-stderr-line\\n")  # what a C library or the kernel's logger prints, below the cells' output
if mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "sleep" and not (folder / "slept").exists():  # once: the resumed run goes on
    (folder / "slept").write_text("")
    time.sleep(300)
print("done")"""


@pytest.fixture
def books(tmp_path: Path) -> Path:
    folder = tmp_path / "books"
    (folder / "profiles").mkdir(parents=True)
    (folder / "profiles" / "cpu.yaml").write_text("# the tiny notebook's own values\n")
    tiny_notebook(
        folder / "01_tiny.ipynb", 'mode: str = "ok"  # ok, sleep, kill\nrun_dir: str = ""  # set by the runner', TINY
    )
    return folder


RUN_ENV = {"SPECNB_DECODE_MS": "skip", "SPECNB_CELL_TIMEOUT": "600"}  # no decode check; a cell's own limit


def run_args(books: Path, outputs: Path, mode: str) -> list[str]:
    """The runner's arguments for the tiny notebook in `mode`."""
    return ["run", "cpu", "--notebooks-folder", str(books), "--outputs", str(outputs), "-p", "mode", mode]


def start(books: Path, outputs: Path, mode: str, log: Path) -> subprocess.Popen:
    """The runner's command on the tiny notebook, in a session of its own (as a terminal's job)."""
    cmd = [sys.executable, "-m", "specnb.notebook.runner", *run_args(books, outputs, mode)]
    with open(log, "w") as out:
        return subprocess.Popen(
            cmd, env=os.environ | RUN_ENV, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_for(path_glob: str, root: Path, seconds: float = 120) -> Path:
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = list(root.glob(path_glob))
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {path_glob} under {root} after {seconds} s")


def record_of(outputs: Path) -> dict:
    (folder,) = (outputs / "01_tiny").iterdir()
    return json.loads((folder / "params.json").read_text())


def test_a_dead_kernel_is_a_failed_record_with_its_cause(tmp_path, books):
    outputs, log = tmp_path / "out", tmp_path / "run.log"
    proc = start(books, outputs, "kill", log)
    assert proc.wait(180) == 1, log.read_text()
    text = log.read_text()
    assert "!! 01_tiny FAILED: the kernel died (killed by SIGKILL)" in text, text
    # the kernel killed itself: where the out-of-memory count is readable it did not move, and the message says so
    said = "not by the out-of-memory killer" if oom_kills() is not None else "most likely out of memory"
    assert said in text, text
    assert "Traceback" not in text, text
    record = record_of(outputs)
    assert record["status"] == "failed" and record["error"].startswith("the kernel died (killed by SIGKILL)")
    assert "| failed |" in (outputs / "index.md").read_text()
    # the kernel's own stderr is in its run folder, and the failure names the file
    (folder,) = (outputs / "01_tiny").iterdir()
    assert "kernel-stderr-line" not in text and "kernel-stderr-line" in (folder / "kernel.log").read_text()
    assert f"the kernel's own messages: {folder.resolve() / 'kernel.log'}" in record["error"]


def test_the_kernels_own_stderr_goes_to_its_run_folder_not_the_terminal(tmp_path, books, capfd):
    """A kernel stopped mid-message may log its dying words (a traceback from its control channel) on
    its stderr: that stream goes to kernel.log beside the notebook, the cells' output stays in it."""
    outputs = tmp_path / "out"
    assert runner.main(run_args(books, outputs, "ok")) == 0
    (folder,) = (outputs / "01_tiny").iterdir()
    assert "kernel-stderr-line" not in capfd.readouterr().err
    assert "kernel-stderr-line" in (folder / "kernel.log").read_text()
    assert "done" in (folder / "01_tiny.ipynb").read_text()


def test_a_sigkill_is_blamed_on_memory_only_where_the_out_of_memory_count_moved():
    assert "out of memory: the out-of-memory killer ended it" in death(-signal.SIGKILL, 3, 4)
    assert "not by the out-of-memory killer" in death(-signal.SIGKILL, 3, 3)
    assert "most likely out of memory" in death(-signal.SIGKILL, None, None)  # no count to read
    assert death(-signal.SIGSEGV, 3, 3) == "the kernel died (killed by SIGSEGV); rerun to resume"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_run_takes_its_kernel_and_is_recorded_interrupted(tmp_path, books, sig, capsys, monkeypatch):
    outputs, log = tmp_path / "out", tmp_path / "run.log"
    proc = start(books, outputs, "sleep", log)
    folder = wait_for("01_tiny/*/slept", outputs).parent
    kernel = int((folder / "kernel.pid").read_text())
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # Ctrl-C: the terminal's process group (the kernel has its own session)
    else:
        proc.send_signal(sig)
    assert proc.wait(60) == 130, log.read_text()
    assert not Path(f"/proc/{kernel}").exists(), "the kernel outlived the runner"
    text = log.read_text()
    assert "Traceback" not in text and f"!! 01_tiny INTERRUPTED: stopped by {sig.name}" in text, text
    record = record_of(outputs)
    assert record["status"] == "interrupted" and sig.name in record["error"]
    assert "| interrupted |" in (outputs / "index.md").read_text()
    # the same command again resumes in the same folder and finishes (in this process: `rerun`)
    assert rerun(books, outputs, monkeypatch) == 0
    assert f"== 01_tiny: resuming {folder}" in capsys.readouterr().out
    assert record_of(outputs)["status"] == "finished"


def rerun(books: Path, outputs: Path, monkeypatch) -> int:
    """`start`'s command run again, by its entry (`runner.main`) in this process with `start`'s
    environment: the runner's own process is what the tests above stop and kill."""
    for name, value in RUN_ENV.items():
        monkeypatch.setenv(name, value)
    return runner.main(run_args(books, outputs, "sleep"))


def test_a_run_leaves_the_process_where_it_stood_and_its_kernel_in_the_notebooks_folder(tmp_path, books, monkeypatch):
    """The runner in this process (as a test worker runs it): the kernel starts in the notebooks'
    folder, and the process never leaves its own, so nothing it removes later can be under it."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for name, value in RUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert runner.main(run_args(books, tmp_path / "out", "ok")) == 0
    assert os.getcwd() == str(here)
    (folder,) = (tmp_path / "out" / "01_tiny").iterdir()
    assert (folder / "kernel.cwd").read_text() == str(books.resolve())


def test_a_run_started_from_a_removed_folder_runs_from_the_notebooks_folder(tmp_path, books, monkeypatch, capsys):
    """A process standing in a folder that was removed (a test worker once was, after another test's
    folder went): papermill, and any process started from there (torch's import among them), fail on
    the missing folder. The runner moves to the notebooks' folder, says so, and runs."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    for name, value in RUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert runner.main(run_args(books, tmp_path / "out", "ok")) == 0
    assert f"the current folder was removed; running from {books}" in capsys.readouterr().out
    assert os.getcwd() == str(books) and record_of(tmp_path / "out")["status"] == "finished"
    probe = subprocess.run(
        [sys.executable, "-c", "import torch, os; print(os.getcwd())"], capture_output=True, text=True
    )
    assert probe.returncode == 0 and probe.stdout.strip() == str(books), probe.stderr[-2000:]


def test_a_killed_runner_leaves_no_kernel_behind(tmp_path, books):
    outputs = tmp_path / "out"
    proc = start(books, outputs, "sleep", tmp_path / "run.log")
    wait_for("01_tiny/*/slept", outputs)
    assert processes_under(books), "the kernel runs in the notebooks' folder"
    proc.kill()
    proc.wait()
    assert wait_for_no_process_under(books, 15), "the kernel outlived its runner by 15 s"


def test_a_second_run_on_a_live_folder_is_refused_naming_it(tmp_path, books, capsys, monkeypatch):
    outputs = tmp_path / "out"
    first = start(books, outputs, "sleep", tmp_path / "first.log")
    folder = wait_for("01_tiny/*/slept", outputs).parent
    before = (folder / "params.json").read_text()
    assert rerun(books, outputs, monkeypatch) == 2
    text = capsys.readouterr().err
    assert f"{folder} is being written by a live run (pid {first.pid} on" in text and "nothing was run" in text, text
    assert (folder / "params.json").read_text() == before and len(list((outputs / "01_tiny").iterdir())) == 1
    first.terminate()
    assert first.wait(60) == 130


def test_runs_finish_and_leave_no_kernel(tmp_path, books):
    outputs = tmp_path / "out"
    proc = start(books, outputs, "ok", tmp_path / "run.log")
    assert proc.wait(180) == 0, (tmp_path / "run.log").read_text()
    assert record_of(outputs)["status"] == "finished"
    assert wait_for_no_process_under(books, 5)


def test_an_outputs_folder_that_cannot_be_written_is_refused_first(tmp_path, books, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc = runner.main(["run", "cpu", "--notebooks-folder", str(books), "--outputs", str(blocker / "outputs")])
    err = capsys.readouterr().err
    assert rc == 2 and f"runs cannot be written to {blocker / 'outputs'}" in err and "nothing was run" in err, err


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("budgets", "[0]", "budgets"),
        ("budgets", "[-4, 8]", "budgets"),
        ("budgets", "[100000]", "budgets"),
        ("max_new_tokens", "0", "max_new_tokens"),
        ("max_new_tokens", "abc", "max_new_tokens"),
        ("top_k", "1", "top_k"),
        ("prompts", "no/such/prompts.jsonl", "prompt file"),  # a missing file: found before any model loads
        ("prompts", "auto", "prompts='auto' is gone"),
        ("target_quantization", "3bit", "target_quantization"),
        ("custom_trees", "{mine2: abc}", "mine2"),
        ("custom_trees", "{mine: [[0], [1.9]]}", "whole numbers"),
        ("custom_trees", "{mine: {branching: [100, 99]}}", "10,000 nodes"),
    ],
)
def test_parameters_that_cannot_work_are_refused_before_anything_runs(tmp_path, capsys, monkeypatch, name, value, says):
    monkeypatch.setattr(runner, "install_models", lambda resolved: pytest.fail("a model was installed"))
    argv = ["run", "smoke", "--notebook", "01_tree_shapes", "--outputs", str(tmp_path / "out"), "-p", name, value]
    rc = runner.main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "nothing was run" in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "01_tree_shapes").exists()


def test_a_number_in_exponent_form_is_a_number():
    """YAML 1.1 reads `-p lr 1e-3` as a string; the runner reads it as the number it is."""
    assert runner.parse_value("1e-3") == 0.001 and runner.parse_value("3E5") == 300000.0
    assert runner.parse_value("abc") == "abc" and runner.parse_value("[0, 1]") == [0, 1]


def test_an_outputs_folder_that_fails_mid_run_ends_in_one_line(tmp_path, books, capsys, monkeypatch):
    """A disk that fills while a run writes: one line, the file and the fix; no traceback."""
    import errno

    def full(nb, profile, params, settings, folder):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "params.json"))

    monkeypatch.setattr(runner, "_execute", full)
    monkeypatch.setenv("SPECNB_DECODE_MS", "skip")
    rc = runner.main(["run", "cpu", "--notebooks-folder", str(books), "--outputs", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot write " in err and "No space left on device" in err and "resume" in err, err


def test_a_malformed_prompts_file_is_refused_before_anything_runs_and_a_good_one_is_made_absolute(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(runner, "install_models", lambda resolved: pytest.fail("a model was installed"))
    monkeypatch.chdir(tmp_path)  # the file named from where the command is typed, not the notebooks' folder
    (tmp_path / "mine.jsonl").write_text('{"question_id": 1, "category": "x", "turns": ["hi"]}\n{not json\n')
    argv = ["run", "smoke", "--notebook", "01_tree_shapes", "--outputs", str(tmp_path / "out")]
    assert runner.main([*argv, "-p", "prompts", "mine.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "prompts" in err and "mine.jsonl:2: not a Spec-Bench record" in err and "nothing was run" in err, err
    (tmp_path / "mine.jsonl").write_text('{"question_id": 1, "category": "x", "turns": ["hi"]}\n')
    resolved = runner.resolve("smoke", {"prompts": "mine.jsonl"}, [], [runner.NOTEBOOKS / "01_tree_shapes.ipynb"])
    assert resolved["01_tree_shapes"]["prompts"] == str(tmp_path / "mine.jsonl")


def test_a_disk_too_full_to_start_on_is_refused_leaving_nothing(tmp_path, books, capsys, monkeypatch):
    outputs = tmp_path / "out"
    full = shutil.disk_usage(tmp_path)._replace(free=10 * 2**20)
    monkeypatch.setattr(runner.shutil, "disk_usage", lambda path: full)
    for name, value in RUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert runner.main(run_args(books, outputs, "ok")) == 2
    err = capsys.readouterr().err
    assert f"runs cannot be written to {outputs}: 10 MB free on its disk" in err and "nothing was run" in err, err
    assert not outputs.exists(), "no empty run folder, no lock left behind"


def test_a_disk_that_fills_up_mid_run_leaves_a_failed_record_that_names_the_file_and_the_index(
    tmp_path, books, capsys, monkeypatch
):
    outputs = tmp_path / "out"
    real = runner._write_record

    def full_disk(nb, folder, record, plan):  # the appendices and the whole record no longer fit
        real(nb, folder, record, plan)
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / f"{nb.stem}.report.html"))

    monkeypatch.setattr(runner, "_write_record", full_disk)
    for name, value in RUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert runner.main(run_args(books, outputs, "ok")) == 2
    err = capsys.readouterr().err
    assert "cannot write " in err and "01_tiny.report.html: No space left on device" in err, err
    record = record_of(outputs)
    assert record["status"] == "failed" and "01_tiny.report.html: No space left on device" in record["error"]
    assert (outputs / "index.md").exists() and "| failed |" in (outputs / "index.md").read_text()


def test_write_json_names_the_file_a_full_disk_refused(tmp_path, monkeypatch):
    from pathlib import Path as P

    def no_space(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no file named

    monkeypatch.setattr(P, "write_text", no_space)
    with pytest.raises(OSError) as e:
        write_json(tmp_path / "params.json", {"a": 1})
    assert e.value.filename == str(tmp_path / "params.json") and e.value.errno == errno.ENOSPC
