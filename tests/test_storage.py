import json
import os
import signal
import subprocess
import sys
import textwrap

from specnb.io.storage import Sweep, environment, write_json


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
    script.write_text(textwrap.dedent(f"""
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
    """))
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
