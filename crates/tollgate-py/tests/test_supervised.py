"""`Limiter.call` and `Limiter.stream`: the engine's supervised lifecycle
around Python callables (SPEC PY-3, §7-§9)."""

from __future__ import annotations

import asyncio
import time

import httpx2
import openai
import pytest

import tollgate

FAST_RETRY = {"max_attempts": 3, "base_delay": "10ms", "max_delay": "50ms", "jitter": 0.5}


def counters(limiter: tollgate.Limiter, scope: str = "api") -> dict:
    return limiter.snapshot()["scopes"][scope]["counters"]


async def test_call_retries_provider_failures_and_settles_usage() -> None:
    """PY-3, RT-1, RT-2, Q-5, Q-8: a callable that fails with a server
    error twice is called again (a fresh reservation each time) and its
    third result is returned; the result's usage settles the last
    attempt; a failure that is not the provider's is raised at once, as
    it is."""
    limiter = tollgate.Limiter(scopes={"api": {"rpm": 100, "tpm": 10_000}}, retry=FAST_RETRY)
    calls: list[int] = []

    async def flaky(x: int) -> dict:
        calls.append(x)
        if len(calls) < 3:
            raise tollgate.ProviderError("upstream broke", status=503)
        return {"answer": x, "usage": {"prompt_tokens": 7, "completion_tokens": 5}}

    result = await limiter.call(flaky, 42, tokens=100, timeout=5)
    assert result["answer"] == 42 and calls == [42, 42, 42]
    c = counters(limiter)
    assert c["admitted"] == 3 and c["tokens_reserved"] == 300
    assert c["tokens_reported"] == 12 and c["unknown_usage"] == 2

    async def buggy() -> None:
        calls.append(0)
        raise KeyError("not a provider failure")

    calls.clear()
    with pytest.raises(KeyError, match="not a provider failure"):
        await limiter.call(buggy, tokens=10)
    assert calls == [0]
    assert await limiter.call(lambda: "plain function", tokens=1) == "plain function"
    assert limiter.snapshot()["idle"]


async def test_hints_are_floors_and_429_cools_the_scope() -> None:
    """PY-3, RT-3, CD-1: a 429 with `retry-after` cools the whole scope
    for it and the retry comes no earlier; the SDKs' exceptions are read
    by status and headers (an `openai.RateLimitError` with
    `retry-after-ms`)."""
    limiter = tollgate.Limiter(scopes={"api": {"rpm": 100}}, retry=FAST_RETRY)
    starts: list[float] = []

    async def limited() -> str:
        starts.append(time.monotonic())
        if len(starts) == 1:
            response = httpx2.Response(
                429,
                headers={"retry-after-ms": "300"},
                request=httpx2.Request("POST", "http://provider/v1/chat/completions"),
            )
            raise openai.RateLimitError("slow down", response=response, body=None)
        return "ok"

    assert await limiter.call(limited, timeout=5) == "ok"
    assert starts[1] - starts[0] >= 0.3
    assert counters(limiter)["cooldowns"] == 1
    # Another call made now waits out the scope's cooldown first.
    starts.clear()
    limiter2 = tollgate.Limiter(scopes={"api": {"rpm": 100}}, retry={"max_attempts": 1})

    async def refuse() -> None:
        raise tollgate.ProviderError(status=429, retry_after=0.3)

    with pytest.raises(tollgate.UpstreamError) as e:
        await limiter2.call(refuse)
    assert e.value.code == "upstream_rate_limited" and e.value.attempts == 1
    assert isinstance(e.value.__cause__, tollgate.ProviderError)
    before = time.monotonic()
    await limiter2.call(lambda: None)
    assert time.monotonic() - before >= 0.25


async def test_one_deadline_covers_attempts_and_delays() -> None:
    """PY-3, DL-3, DL-6, RT-4: an attempt still running at the deadline is
    cancelled (its coroutine sees CancelledError) and the call fails with
    DeadlineExceeded in phase `transport`; a retry delay that would pass
    the deadline is not slept: the call fails at once with the provider's
    error."""
    limiter = tollgate.Limiter(scopes={"api": {"rpm": 100}}, retry=FAST_RETRY)
    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    start = time.monotonic()
    with pytest.raises(tollgate.DeadlineExceeded) as e:
        await limiter.call(slow, timeout=0.2)
    assert e.value.phase == "transport" and e.value.code == "deadline_exceeded"
    assert time.monotonic() - start < 2
    await asyncio.wait_for(cancelled.wait(), 1)

    async def overloaded() -> None:
        raise tollgate.ProviderError(status=503, retry_after=30)

    start = time.monotonic()
    with pytest.raises(tollgate.UpstreamError) as e:
        await limiter.call(overloaded, timeout=2)
    assert time.monotonic() - start < 1
    assert e.value.code == "upstream_error" and e.value.attempts == 1
    assert limiter.snapshot()["idle"]


async def test_circuit_opens_after_consecutive_failures() -> None:
    """PY-3, CB-1, CB-3: after five calls that gave up on server errors the
    scope's circuit is open: the next call fails with CircuitOpen without
    calling the function; a 4xx or a foreign exception does not count."""
    limiter = tollgate.Limiter(scopes={"api": {"rpm": 1000}}, retry={"max_attempts": 1})
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("refused")

    async def bad_request() -> None:
        raise tollgate.ProviderError(status=400)

    for _ in range(4):
        with pytest.raises(tollgate.UpstreamError):
            await limiter.call(down)
    with pytest.raises(tollgate.UpstreamError) as e:
        await limiter.call(bad_request)
    assert e.value.code == "upstream_rejected" and e.value.status == 400
    with pytest.raises(tollgate.UpstreamError):
        await limiter.call(down)
    assert calls == 5
    with pytest.raises(tollgate.CircuitOpen) as e:
        await limiter.call(down)
    assert calls == 5 and e.value.code == "circuit_open" and e.value.retry_after > 0
    assert limiter.snapshot()["idle"]


async def test_stream_retries_before_the_first_item_never_after() -> None:
    """PY-3, LC-3, LC-5, Q-5: a stream whose setup fails is retried; items
    then flow with the usage the last one reports settling the call; a
    failure after the first item is raised from the iteration and never
    replayed; a stream left early is closed (its generator's `finally`
    runs) and gives its capacity back."""
    limiter = tollgate.Limiter(scopes={"api": {"rpm": 100, "tpm": 1000}}, retry=FAST_RETRY, concurrency=1)
    opened = 0

    async def items(fail_after: int | None = None):
        for i in range(4):
            if fail_after is not None and i == fail_after:
                raise ConnectionError("stream cut")
            await asyncio.sleep(0)
            yield {"i": i, "usage": {"prompt_tokens": 3, "completion_tokens": 4} if i == 3 else None}

    async def open_stream():
        nonlocal opened
        opened += 1
        if opened == 1:
            raise tollgate.ProviderError(kind="connect")
        return items()

    got = [it["i"] async for it in limiter.stream(open_stream, tokens=100, timeout=5)]
    assert got == [0, 1, 2, 3] and opened == 2
    c = counters(limiter)
    assert c["tokens_reported"] == 7 and c["admitted"] == 2

    calls = 0

    def breaking():
        nonlocal calls
        calls += 1
        return items(fail_after=2)

    seen = []
    with pytest.raises(tollgate.UpstreamError) as e:
        async for it in limiter.stream(breaking, tokens=100):
            seen.append(it["i"])
    assert seen == [0, 1] and calls == 1
    assert isinstance(e.value.__cause__, ConnectionError)

    closed = asyncio.Event()

    async def endless():
        try:
            while True:
                await asyncio.sleep(0)
                yield {"usage": None}
        finally:
            closed.set()

    async with limiter.stream(endless, tokens=100) as stream:
        async for _ in stream:
            assert limiter.snapshot()["concurrency_available"] == 0
            break
    await asyncio.wait_for(closed.wait(), 1)
    assert limiter.snapshot()["idle"] and limiter.snapshot()["concurrency_available"] == 1


async def test_stream_deadline_ends_a_stalled_stream() -> None:
    """PY-3, DL-3, DL-6: the call's one deadline covers the stream's
    consumption: a provider that stalls mid-stream is ended at the
    deadline with DeadlineExceeded in phase `stream`, and its capacity is
    back."""
    limiter = tollgate.Limiter(scopes={"api": {"rpm": 100}}, concurrency=1)

    async def stalls():
        yield "first"
        await asyncio.sleep(10)
        yield "never"

    seen = []
    with pytest.raises(tollgate.DeadlineExceeded) as e:
        async for item in limiter.stream(stalls, timeout=0.3):
            seen.append(item)
    assert seen == ["first"] and e.value.phase == "stream"
    assert limiter.snapshot()["idle"]


async def test_bad_input_to_call_and_stream() -> None:
    """PY-3, PY-6: wrong arguments raise at once, with nothing held."""
    limiter = tollgate.Limiter(scopes={"api": {"rpm": 10, "tpm": 100}, "other": {"rpm": 1}})
    with pytest.raises(TypeError, match="callable"):
        limiter.call(42, scope="api")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scope= is required"):
        limiter.call(lambda: None)
    with pytest.raises(tollgate.UnknownScope):
        limiter.stream(lambda: None, scope="nope")
    with pytest.raises(TypeError, match="usage="):
        limiter.call(lambda: None, scope="api", usage=5)
    with pytest.raises(tollgate.ConfigError, match="providers"):
        limiter.call(lambda: None, scope="api", provider="missing")
    with pytest.raises(tollgate.TokenEstimateRequired):
        await limiter.call(lambda: None, scope="api")
    with pytest.raises(tollgate.EstimateExceedsLimit):
        await limiter.call(lambda: None, scope="api", tokens=101)
    with pytest.raises(TypeError, match="async iterable"):
        async for _ in limiter.stream(lambda: 5, scope="other"):
            pass
    with pytest.raises(ValueError, match="kind"):
        tollgate.ProviderError(kind="weird")
    with pytest.raises(TypeError):
        tollgate.ProviderError("no kind nor status")
    assert limiter.snapshot()["idle"]
