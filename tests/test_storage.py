import json
import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from specnb.io.storage import ResultFolder, Sweep, environment, read_arrays, write_arrays, write_json


def test_sweep_resumes_and_keeps_each_row_once(tmp_path):
    path = tmp_path / "sweep.jsonl"
    s = Sweep(path, key=["shape", "budget"])
    s.add({"shape": "chain", "budget": 4}, [{"x": 1}, {"x": 2}])
    s.add({"shape": "chain", "budget": 4}, [{"x": 99}])  # already stored: ignored
    with path.open("a") as f:
        f.write('{"key": {"shape": "kary2", "bud')  # an interrupted write
    again = Sweep(path, key=["shape", "budget"])
    assert len(again) == 1 and {"shape": "chain", "budget": 4} in again
    assert {"shape": "kary2", "budget": 4} not in again
    again.add({"shape": "kary2", "budget": 4}, [{"x": 3}])
    frame = Sweep(path, key=["shape", "budget"]).frame()
    assert frame["x"].tolist() == [1, 2, 3]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_killed_sweep_resumes_without_loss_or_duplicates(tmp_path):
    """Kill a real process midway through a sweep, resume it, and count rows."""
    path = tmp_path / "sweep.jsonl"
    script = tmp_path / "work.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        from specnb.io.storage import Sweep
        s = Sweep({str(path)!r}, key=["i"])
        for i in range(40):
            if {{"i": i}} in s:
                continue
            time.sleep(0.02)
            s.add({{"i": i}}, [{{"i2": i * i, "part": p}} for p in range(3)])
            if i == 15 and len(sys.argv) > 1:
                print("ready", flush=True)
                time.sleep(60)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script), "stop"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(Sweep(path, key=["i"])) == 16
    subprocess.run([sys.executable, str(script)], check=True)
    frame = Sweep(path, key=["i"]).frame()
    assert len(frame) == 40 * 3
    assert sorted(frame["i"].unique().tolist()) == list(range(40))
    assert not frame.duplicated(["i", "part"]).any()
    assert (frame["i2"] == frame["i"] ** 2).all()


def test_environment_and_json(tmp_path):
    env = environment()
    assert env["packages"]["torch"] and env["device"]
    out = write_json(tmp_path / "a" / "params.json", {"env": env, "n": 3})
    assert json.loads(out.read_text())["n"] == 3


def test_concurrent_writers_of_one_file_leave_one_whole_file(tmp_path):
    """Each writer stages its own temporary file (a shared one would interleave two writers' bytes)."""
    path = tmp_path / "unit.npz"

    def write(i: int) -> set:
        write_arrays(path, {"x": np.full(50_000, i)})
        return set(read_arrays(path)["x"].tolist())  # a reader sees one writer's whole file

    with ThreadPoolExecutor(4) as pool:
        seen = list(pool.map(write, range(16)))
    assert all(len(s) == 1 for s in seen) and len(set(read_arrays(path)["x"].tolist())) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["unit.npz"]


@pytest.mark.parametrize("url", [False, True], ids=["path", "fsspec_url"])
def test_result_folder_keeps_whole_files_and_the_first_writers_json(tmp_path, url):
    root = tmp_path / "results"
    folder = ResultFolder(f"file://{root}" if url else str(root))
    assert folder.names(".npz") == [] and folder.read_json("params.json") is None and not folder.exists("u.npz")
    assert folder.create_json("params.json", {"a": 1}) == {"a": 1}
    assert folder.create_json("params.json", {"a": 2}) == {"a": 1}  # the first writer's stays
    folder.write_arrays("u.npz", {"x": np.arange(3)})
    (root / ".v.npz.0123456789ab.tmp").write_bytes(b"half a file")  # a writer killed midway
    assert folder.names(".npz") == ["u.npz"] and folder.exists("u.npz")
    np.testing.assert_array_equal(folder.read_arrays("u.npz")["x"], np.arange(3))
    assert folder.read_arrays("u.npz", ["x"]).keys() == {"x"}
    assert sorted(p.name for p in root.iterdir()) == [".v.npz.0123456789ab.tmp", "params.json", "u.npz"]
