"""The Redis shared store from Python (SPEC PY-5, DQ-1, DQ-2): two
processes on one redis-server started by the test spend one budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tollgate
from conftest import Record, free_port

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import redis_worker  # noqa: E402


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


def test_a_settlement_from_python_reaches_the_store(redis_url: str) -> None:
    """PY-5, Q-5, DQ-6: `lease.settle()` gives the difference back in the
    store, not only in the process: after 20 reservations of 100 tokens
    settled at 0 and one settled at 30, exactly 30 of the minute's 2,000
    tokens are spent, so 1,971 more wait and 1,970 are admitted. (The
    settlement's round trip used to start outside the runtime and was
    lost: every reservation kept its whole estimate in Redis.)"""
    limiter = tollgate.Limiter(
        scopes={"s": {"limits": [{"tokens": 2_000, "per": "1m"}]}},
        quota_store={"backend": "redis", "url": redis_url, "timeout": "2s"},
    )
    for _ in range(20):
        with limiter.acquire_blocking("s", tokens=100, timeout=5) as lease:
            lease.settle(total_tokens=0)
    with limiter.acquire_blocking("s", tokens=100, timeout=5) as lease:
        lease.settle(total_tokens=30)
    with pytest.raises(tollgate.DeadlineExceeded):
        limiter.acquire_blocking("s", tokens=1_971, timeout=0.3)
    with limiter.acquire_blocking("s", tokens=1_970, timeout=5) as lease:
        lease.settle(total_tokens=1_970)
    assert limiter.snapshot()["idle"]
