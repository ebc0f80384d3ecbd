"""Acquire, settle and the blocking API (SPEC PY-2), bad input (PY-6)."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import textwrap

import pytest

import tollgate


def available(limiter: tollgate.Limiter, scope: str, dimension: str) -> int:
    limits = limiter.snapshot()["scopes"][scope]["limits"]
    return min(l["available"] for l in limits if l["dimension"] == dimension)


async def test_acquire_settle_refunds_the_difference() -> None:
    """PY-2, Q-5: a lease reserves its estimate; settling below it refunds
    the difference, and leaving the block returns the permit."""
    limiter = tollgate.Limiter(scopes={"openai": {"rpm": 10, "tpm": 1000}}, concurrency=2)
    async with limiter.acquire("openai", tokens=300, timeout=5) as lease:
        assert available(limiter, "openai", "tokens") == 700
        assert available(limiter, "openai", "requests") == 9
        assert limiter.snapshot()["active"] == 1
        lease.settle(input_tokens=100, output_tokens=20)
        assert available(limiter, "openai", "tokens") == 880
        with pytest.raises(tollgate.AlreadySettled) as e:
            lease.settle(total_tokens=1)
        assert e.value.code == "already_settled"
    snap = limiter.snapshot()
    assert snap["idle"] and snap["active"] == 0 and snap["concurrency_available"] == 2
    assert lease.released and lease.settled


def test_released_lease_that_was_never_settled_does_not_say_settled() -> None:
    """PY-2, Q-5: a lease released without a settlement keeps its whole
    estimate counted and says so (`settled` is False); it can no longer be
    settled (RuntimeError), while one settled before its release still
    says settled and refuses a second settlement (AlreadySettled)."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 5, "tpm": 1_000}})
    lease = limiter.acquire_blocking("s", tokens=100)
    lease.release()
    assert available(limiter, "s", "tokens") == 900  # the estimate is still charged
    assert lease.released and lease.settled is False
    with pytest.raises(RuntimeError, match="without being settled"):
        lease.settle(total_tokens=10)
    with pytest.raises(RuntimeError, match="without being settled"):
        lease.refused()
    assert available(limiter, "s", "tokens") == 900 and lease.settled is False
    lease = limiter.acquire_blocking("s", tokens=100)
    lease.settle(total_tokens=10)
    lease.release()
    assert lease.released and lease.settled is True
    with pytest.raises(tollgate.AlreadySettled):
        lease.settle(total_tokens=10)
    assert available(limiter, "s", "tokens") == 890


async def test_plain_await_and_usage_objects() -> None:
    """PY-2, Q-6: `await limiter.acquire()` returns the lease; an SDK usage
    object or dict settles by the Q-6 rules (invalid counters: unknown)."""
    limiter = tollgate.Limiter(scopes={"a": {"tpm": 1000}})
    lease = await limiter.acquire("a", tokens=500)
    lease.settle(usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    lease.release()
    assert available(limiter, "a", "tokens") == 985
    lease = await limiter.acquire("a", tokens=100)
    lease.settle(usage={"prompt_tokens": -1, "completion_tokens": 5})  # invalid: keeps 100
    lease.release()
    assert available(limiter, "a", "tokens") == 885
    assert limiter.snapshot()["scopes"]["a"]["counters"]["unknown_usage"] == 1


def test_blocking_api_and_with_block() -> None:
    """PY-2: the blocking API for threads, as a context manager."""
    limiter = tollgate.Limiter(scopes={"a": {"rpm": 2}}, concurrency=1)
    with limiter.acquire_blocking("a", timeout=1) as lease:
        assert limiter.snapshot()["concurrency_available"] == 0
    assert lease.released
    limiter.acquire_blocking("a").release()
    with pytest.raises(tollgate.DeadlineExceeded) as e:
        limiter.acquire_blocking("a", timeout=0.2)
    assert e.value.code == "admission_wait_deadline_exceeded"
    assert e.value.phase == "rate"
    assert e.value.retry_after is not None and e.value.retry_after > 30
    assert limiter.snapshot()["idle"]


async def test_deadline_while_waiting_gives_everything_back() -> None:
    """PY-2, Q-9, Q-11: a call that cannot be admitted before its deadline
    fails at once with the instant as a hint; nothing is held."""
    limiter = tollgate.Limiter(scopes={"a": {"rpm": 1}})
    async with limiter.acquire("a"):
        pass
    with pytest.raises(tollgate.DeadlineExceeded) as e:
        await limiter.acquire("a", timeout=1)
    assert isinstance(e.value, TimeoutError)
    assert e.value.status == 429
    snap = limiter.snapshot()
    assert snap["idle"]
    assert snap["scopes"]["a"]["counters"]["admitted"] == 1


async def test_bad_input_raises_typed_errors_and_holds_nothing() -> None:
    """PY-6, Q-3: wrong types, an unknown scope, a missing estimate and an
    estimate over the whole limit raise Python exceptions with the
    gateway's codes and messages; nothing is held afterwards."""
    limiter = tollgate.Limiter(scopes={"openai": {"rpm": 10, "tpm": 1000}})
    with pytest.raises(TypeError, match="tokens must be an int"):
        limiter.acquire("openai", tokens="12")
    with pytest.raises(TypeError):
        limiter.acquire("openai", tokens=True)
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        limiter.acquire("openai", tokens=-1)
    with pytest.raises(ValueError, match="timeout"):
        limiter.acquire("openai", tokens=1, timeout=-1)
    with pytest.raises(tollgate.UnknownScope) as e:
        limiter.acquire("anthropic", tokens=1)
    assert e.value.code == "unknown_scope" and "openai" in str(e.value)
    assert isinstance(e.value, KeyError)
    with pytest.raises(tollgate.TokenEstimateRequired) as e:
        await limiter.acquire("openai")
    assert e.value.code == "token_estimate_required"
    with pytest.raises(tollgate.EstimateExceedsLimit) as e:
        await limiter.acquire("openai", tokens=1001, timeout=5)
    assert e.value.code == "estimate_exceeds_limit" and e.value.status == 400
    assert "1001" in e.value.message and isinstance(e.value, ValueError)
    with pytest.raises(tollgate.EstimateExceedsLimit):
        limiter.acquire_blocking("openai", tokens=5000)
    lease = await limiter.acquire("openai", tokens=10)
    with pytest.raises(TypeError):
        lease.settle()
    with pytest.raises(TypeError):
        lease.settle(input_tokens=1.5)
    with pytest.raises(ValueError):
        lease.refused(cost="some")
    lease.release()
    snap = limiter.snapshot()
    assert snap["idle"]
    assert available(limiter, "openai", "tokens") == 990
    assert available(limiter, "openai", "requests") == 9


def test_invalid_configuration_is_located() -> None:
    """PY-2, PY-6, CFG-1, CFG-3: keyword and TOML configuration go through
    the gateway's parser: bad values and bad TOML raise ConfigError naming
    the setting (and, for a file, its line and column)."""
    with pytest.raises(tollgate.ConfigError) as e:
        tollgate.Limiter(scopes={"openai": {"rpm": 0}})
    assert e.value.field == "scopes.openai.rpm" and e.value.code == "invalid_config"
    assert isinstance(e.value, ValueError)
    with pytest.raises(tollgate.ConfigError) as e:
        tollgate.Limiter(scopes={"openai": {"rpm": "many"}})
    assert e.value.kind == "schema" and e.value.field == "scopes.openai.rpm"
    with pytest.raises(tollgate.ConfigError) as e:
        tollgate.Limiter(scopes={"openai": {"rpmm": 5}})
    assert "rpmm" in str(e.value)
    with pytest.raises(TypeError):
        tollgate.Limiter(scopes={"openai": {"rpm": object()}})
    with pytest.raises(TypeError):
        tollgate.Limiter(scopes=[("openai", {})])
    with pytest.raises(tollgate.ConfigError) as e:
        tollgate.Limiter.from_toml_str("[scopes.openai]\nrpm = 5\ntpm = 0\n", origin="lim.toml")
    assert (e.value.file, e.value.field, e.value.line) == ("lim.toml", "scopes.openai.tpm", 3)
    with pytest.raises(tollgate.ConfigError) as e:
        tollgate.Limiter.from_toml_str("[scopes.openai\n")
    assert e.value.kind == "syntax" and e.value.line == 1
    with pytest.raises(tollgate.ConfigError) as e:
        tollgate.Limiter.from_toml("/nonexistent/tollgate.toml")
    assert e.value.kind == "not_found"


def test_huge_timedelta_in_settings_is_a_config_error_not_a_panic() -> None:
    """PY-6, CFG-1: a timedelta setting past 2**63 microseconds
    (`timedelta.max`) raises ConfigError naming the setting (a ValueError),
    neither a Rust panic (`PanicException`, a BaseException) nor a value
    wrapped silently to another duration."""
    try:
        tollgate.Limiter(
            scopes={"s": {"rpm": 1}},
            admission={"default_timeout": datetime.timedelta.max},
        )
    except tollgate.ConfigError as e:
        assert e.field == "admission.default_timeout" and isinstance(e, ValueError)
        return
    except BaseException as e:  # noqa: BLE001 - PanicException is a BaseException
        pytest.fail(f"raised {type(e).__module__}.{type(e).__name__}: {e}")
    pytest.fail("timedelta.max accepted (wrapped to another duration)")


def test_out_of_range_numbers_raise_value_error() -> None:
    """PY-6, CFG-1: out-of-range numbers raise ValueError, as the docs say
    (a setting's is a ConfigError naming it, itself a ValueError): a
    negative `concurrency` or `default_max_tokens`, an int limit past 64
    bits (no OverflowError, no TypeError for an int); a wrong type stays a
    TypeError."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 5}})
    cases = {
        "concurrency": lambda: tollgate.Limiter(scopes={"s": {"rpm": 1}}, concurrency=-1),
        "default_max_tokens": lambda: tollgate.AsyncTransport(limiter, "s", default_max_tokens=-1),
        "scopes.s.rpm": lambda: tollgate.Limiter(scopes={"s": {"rpm": 2**63}}),
    }
    wrong = {}
    for field, make in cases.items():
        try:
            make()
            wrong[field] = "accepted"
        except tollgate.ConfigError as e:
            if e.field != field or not isinstance(e, ValueError):
                wrong[field] = f"ConfigError naming {e.field}"
        except Exception as e:  # noqa: BLE001
            wrong[field] = type(e).__name__
    assert not wrong, wrong
    with pytest.raises(tollgate.ConfigError, match="concurrency"):
        tollgate.Limiter.from_toml_str("[scopes.s]\nrpm = 1\n", concurrency=2**64)
    with pytest.raises(ValueError, match="tokens"):
        limiter.acquire("s", tokens=2**200)
    with pytest.raises(TypeError, match="concurrency must be an int"):
        tollgate.Limiter(scopes={"s": {"rpm": 1}}, concurrency=1.5)


def test_self_referencing_settings_raise_instead_of_crashing_the_interpreter() -> None:
    """PY-6, CFG-1: a dict that contains itself (or settings nested past 64
    levels) raises ConfigError naming the setting, instead of recursing
    until the stack overflows and the interpreter dies (SIGSEGV); run in a
    child process, so that a crash fails this test only."""
    code = textwrap.dedent(
        """
        import tollgate
        d = {"rpm": 1}
        d["again"] = d
        deep = []
        for _ in range(100):
            deep = [deep]
        for scope in (d, {"rpm": 1, "limits": deep}):
            try:
                tollgate.Limiter(scopes={"s": scope})
            except tollgate.ConfigError as e:
                print("raised", e.field)
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"exit status {p.returncode}; stderr {p.stderr[-500:]!r}"
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == "raised scopes.s.again", p.stdout
    assert lines[1].startswith("raised scopes.s.limits[0][0]"), p.stdout


def test_toml_file(tmp_path) -> None:
    """PY-2: the gateway's [scopes.*] syntax from a file, with layered
    limits and the library's defaults (overflow wait)."""
    path = tmp_path / "lim.toml"
    path.write_text(
        '[scopes.openai]\nrpm = 500\ntpm = 200000\nlimits = [{ requests = 10000, per = "1d" }]\n'
        "[admission]\nqueue_capacity = 8\n"
    )
    limiter = tollgate.Limiter.from_toml(path, concurrency=4)
    snap = limiter.snapshot()
    assert snap["overflow"] == "wait" and snap["concurrency_limit"] == 4
    scope = snap["scopes"]["openai"]
    assert scope["queue_capacity"] == 8
    windows = sorted((l["dimension"], l["window"], l["limit"]) for l in scope["limits"])
    assert windows == [("requests", 60.0, 500), ("requests", 86400.0, 10000), ("tokens", 60.0, 200000)]


async def test_refused_starts_a_cooldown() -> None:
    """PY-2, CD-1, Q-16: a lease refused by the provider settles at the
    refusal's cost and cools the whole scope for the server's hint."""
    limiter = tollgate.Limiter(scopes={"a": {"rpm": 100}})
    lease = await limiter.acquire("a")
    lease.refused(retry_after=2.0, cost="free")
    lease.release()
    scope = limiter.snapshot()["scopes"]["a"]
    assert scope["cooldown_remaining"] is not None and 1.0 < scope["cooldown_remaining"] <= 2.0
    assert available(limiter, "a", "requests") == 100
    with pytest.raises(tollgate.DeadlineExceeded) as e:
        await limiter.acquire("a", timeout=0.5)
    assert e.value.phase == "cooldown"
    assert limiter.snapshot()["idle"]


async def test_close_refuses_new_calls() -> None:
    """PY-2, LC-7: after close, acquisitions fail with Closed."""
    limiter = tollgate.Limiter(scopes={"a": {"rpm": 10}})
    await limiter.close()
    with pytest.raises(tollgate.Closed) as e:
        await limiter.acquire("a")
    assert e.value.code == "shutting_down"
    assert limiter.snapshot()["closed"]
