"""Processes made by fork() after the package was used (PY-2, DQ-6).

Each test runs fork_worker.py in its own interpreter (the test process
itself never forks) and bounds it with a timeout: a child that hangs fails
the test instead of stalling the run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def run(*args: str) -> dict:
    worker = subprocess.run(
        [sys.executable, str(HERE / "fork_worker.py"), *args],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert worker.returncode == 0, f"exited with {worker.returncode}; stderr:\n{worker.stderr}"
    assert "Fatal Python error" not in worker.stderr, worker.stderr
    return json.loads(worker.stdout)


def test_a_forked_child_waits_and_is_woken() -> None:
    """PY-2: after the parent used a limiter (so the runtime and the
    notifier thread run in it), a child made by os.fork() makes its own
    limiter, and its blocking and asyncio acquisitions that must wait for
    the window are admitted (they hung before: the parent's threads are
    not in the child). A limiter, a transport, an acquisition not yet
    awaited and a lease made before the fork are refused in the child
    with a RuntimeError that says so (the lease's settlement would have
    gone to the parent's state), the child exits
    normally (atexit and finalization included), and the parent's limiter
    still works afterwards."""
    out = run("waits")
    assert out["child_exit"] == 0, out
    child = out["child"]
    assert child["ok"], child
    assert child["result"]["admitted"] == 6
    refusals = child["result"]["refusals"]
    assert len(refusals) == 7
    for message in refusals:
        assert "made in another process (before fork())" in message, refusals


def test_a_fork_pool_works_after_the_parent_used_the_package() -> None:
    """PY-2: multiprocessing's "fork" start method (the default on Linux
    before Python 3.14) after the parent used a limiter: every worker
    process makes a limiter whose acquisitions wait and are admitted."""
    assert run("pool")["admitted"] == [6, 6, 6, 6]


def test_a_forked_childs_settlements_are_its_own(redis_url: str) -> None:
    """DQ-6, PY-5: a parent and its forked child each settle 20
    reservations of 100 tokens at 0 on one scope kept in Redis, the
    child's after the parent's. Every settlement counts once: afterwards
    the minute's whole budget of 4,000 tokens is free. (A child that named
    its settlements as its parent names its next ones had them taken for
    repeats, and its refunds were lost.)"""
    out = run("redis", redis_url)
    assert out["child_exit"] == 0, out
    assert out["child"]["ok"], out["child"]
