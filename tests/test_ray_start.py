"""A local Ray start that times out (a machine busy on every core can exceed Ray's fixed 30 s wait for
its raylet) stops the GCS server and the raylet it spawned before it reports the failure
(`executors.start_ray`): `ray.shutdown()` cannot, since Ray registers the node only once it is up.
A module of its own: tests/test_executors.py holds its local Ray instance (and the machine's Ray lock)
for the whole of its module."""

from __future__ import annotations

import time

import pytest
from conftest import machine_lock

from specnb.experiments.executors import RayExecutor


class _Clock:
    """node.py's `time` for a start that times out at once: every reading 100 s after the last."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        self.now += 100.0
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_a_ray_start_that_times_out_leaves_no_server_running(tmp_path_factory, monkeypatch):
    """A real local start whose raylet never registers (Ray's own 30 s wait, run out at once): the GCS
    server and the raylet it spawned are stopped before the error is raised, by the executor's start and
    by this module's fixture alike (`start_ray`). `ray.shutdown()` alone leaves them running."""
    ray = pytest.importorskip("ray", reason='Ray is not installed (pip install "specnb[ray]")')
    import psutil
    import ray._private.node as node
    import ray._private.services as services

    def never_up(*args, **kwargs):
        raise RuntimeError("node info not available yet")

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with machine_lock(tmp_path_factory, "ray"):
        monkeypatch.setattr(services, "get_node", never_up)
        monkeypatch.setattr(node, "time", _Clock())
        with pytest.raises(RuntimeError, match="Ray could not start on this machine: .*timed out during startup"):
            RayExecutor(workers=1)._init(ray)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE], [" ".join(p.cmdline())[:80] for p in left]
