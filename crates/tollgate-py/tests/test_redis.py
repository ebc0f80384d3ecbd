"""The Redis shared store from Python (SPEC PY-5, DQ-1, DQ-2): two
processes on one redis-server started by the test spend one budget."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tollgate
from conftest import Record

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import redis_worker  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(7) == b"+PONG\r\n"
    except OSError:
        return False


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server on a free loopback port without persistence, killed
    afterwards; the test is skipped when redis-server is missing, unless
    TOLLGATE_REQUIRE_REDIS=1."""
    binary = shutil.which(os.environ.get("REDIS_SERVER", "redis-server"))
    if binary is None:
        if os.environ.get("TOLLGATE_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server not found and TOLLGATE_REQUIRE_REDIS=1")
        pytest.skip("redis-server not found (set TOLLGATE_REQUIRE_REDIS=1 to fail instead)")
    port = free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not ping(port):
            assert server.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not answer within 10 s"
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()


def test_two_processes_share_one_budget_exactly(redis_url: str) -> None:
    """PY-5, DQ-1, DQ-2, Q-7: two processes, each with eight tasks and its
    own limiter on the same scope kept in one redis-server, spend one
    budget: in the merged independent record no window of one second
    holds more than the limits, and both processes were admitted."""
    seconds = 2.5
    workers = [
        subprocess.Popen(
            [sys.executable, str(HERE / "redis_worker.py"), redis_url, str(seconds), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    outputs = []
    for w in workers:
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, f"worker exited with {w.returncode}; its stderr:\n{err}"
        outputs.append(json.loads(out))
    requests, tokens = Record(), Record()
    for out in outputs:
        assert out["store"] == "shared" and out["idle"]
        assert len(out["records"]) > 0
        for asked, admitted, charge in out["records"]:
            requests.add(asked, admitted)
            tokens.add(asked, admitted, charge)
    assert requests.worst_window(1.0) <= redis_worker.REQUESTS
    assert tokens.worst_window(1.0) <= redis_worker.TOKENS
    # One budget, not two: over the run the two processes together got
    # about what one limiter allows (at most one window's worth more).
    total = len(requests.entries)
    assert total <= redis_worker.REQUESTS * (seconds + 1)


def test_redis_limiter_reports_its_store(redis_url: str) -> None:
    """PY-5, DQ-3: `redis=` builds the limiter on the shared store (its
    snapshot says so); an unreachable store fails closed with
    QuotaStoreUnavailable, holding nothing."""
    assert tollgate.Limiter(scopes={"s": {"rpm": 5}}, redis=redis_url).snapshot()["scopes"]["s"]["store"] == "shared"
    # (The default operation timeout, 50 ms, is for a server nearby; a
    # loaded test machine gets more.)
    limiter = tollgate.Limiter(
        scopes={"s": {"rpm": 5}}, quota_store={"backend": "redis", "url": redis_url, "timeout": "2s"}
    )
    with limiter.acquire_blocking("s", timeout=5):
        assert limiter.snapshot()["scopes"]["s"]["store"] == "shared"
    dead = tollgate.Limiter(
        scopes={"s": {"rpm": 5}}, quota_store={"backend": "redis", "url": f"redis://127.0.0.1:{free_port()}"}
    )
    with pytest.raises(tollgate.QuotaStoreUnavailable) as e:
        dead.acquire_blocking("s", timeout=2)
    assert e.value.code == "quota_store_unavailable" and e.value.status == 503
    assert dead.snapshot()["idle"]
    with pytest.raises(TypeError):
        tollgate.Limiter(scopes={"s": {"rpm": 5}}, redis=redis_url, quota_store={"backend": "local"})
