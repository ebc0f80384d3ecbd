"""Adversarial review of the Python package: each test shows one defect
(the SPEC rule or the docs it breaks are in its docstring). They fail on
the code as reviewed."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import textwrap
import time

import httpx2
import openai
import pytest

import tollgate


def idle(limiter: tollgate.Limiter) -> bool:
    return limiter.snapshot()["idle"]


class Slow:
    """An async iterator of `n` items, one every 50 ms."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def __aiter__(self) -> "Slow":
        return self

    async def __anext__(self) -> dict:
        await asyncio.sleep(0.05)
        self.i += 1
        if self.i > self.n:
            raise StopAsyncIteration
        return {"i": self.i}


async def test_aclose_while_another_task_iterates_ends_the_stream() -> None:
    """LC-5, PY-3, docs/python.md ("`aclose()` ... ends it early: the
    iteration is cancelled, the iterator and the iterable are closed, the
    permit returned") and the stub ("aclose() ... giving its capacity
    back"): a consumer task iterates a supervised stream; another task
    calls `aclose()` on it. `aclose()` returns, but the `__anext__` in
    flight puts the stream back (`State::Open`) when its item arrives: the
    consumer keeps receiving items and the permit stays held until the
    iterable runs out."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 100}}, concurrency=1)
    stream = limiter.stream(lambda: Slow(20), scope="s", timeout=10)
    got: list[int] = []

    async def consume() -> None:
        async for item in stream:
            got.append(item["i"])

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.12)  # two items out, the third on its way
    await stream.aclose()
    at_close = len(got)
    await asyncio.sleep(0.3)
    try:
        assert len(got) <= at_close + 1, f"items after aclose(): {got[at_close:]}"
        assert idle(limiter), "aclose() returned, yet the stream still holds its permit"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_huge_timedelta_in_settings_is_a_config_error_not_a_panic() -> None:
    """docs/python.md ("a wrong type raises tollgate.ConfigError naming the
    setting"; "out-of-range numbers ValueError"), the brief's "no Rust
    panic surfacing": `config::to_toml` converts a timedelta to
    microseconds with unchecked i64 arithmetic (src/config.rs:172).
    `datetime.timedelta.max` overflows it: a debug build raises
    `pyo3_runtime.PanicException` (a BaseException, not caught by
    `except Exception`), a release build wraps silently to another
    value."""
    try:
        tollgate.Limiter(
            scopes={"s": {"rpm": 1}},
            admission={"default_timeout": datetime.timedelta.max},
        )
    except ValueError:
        return
    except BaseException as e:  # noqa: BLE001 - PanicException is a BaseException
        pytest.fail(f"raised {type(e).__module__}.{type(e).__name__}: {e}")
    # A release build wraps the product: accepted with some other value.
    pytest.fail("timedelta.max accepted (wrapped to another duration)")


def test_self_referencing_settings_raise_instead_of_crashing_the_interpreter() -> None:
    """Brief (bad input: "clear Python exceptions, never a crash"),
    docs/python.md ("a wrong type raises ... ConfigError"):
    `config::to_toml` recurses without a depth bound, so a dict that
    contains itself (or any deeply nested list) overflows the Rust stack:
    the process dies with SIGSEGV instead of raising (Python's own
    `json.dumps` raises `ValueError: Circular reference detected`)."""
    code = textwrap.dedent(
        """
        import tollgate
        d = {"rpm": 1}
        d["again"] = d
        try:
            tollgate.Limiter(scopes={"s": d})
        except (TypeError, ValueError) as e:
            print("raised", type(e).__name__)
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "raised" in p.stdout, (
        f"exit status {p.returncode}; stdout {p.stdout!r}; stderr {p.stderr[-500:]!r}"
    )


async def test_openai_thread_messages_are_not_taken_for_anthropic_messages() -> None:
    """PY-4 ("an existing AsyncOpenAI client gains it by one constructor
    argument"): the route takes any `POST .../messages` for Anthropic's
    Messages API, so OpenAI's `POST /v1/threads/{id}/messages`
    (`client.beta.threads.messages.create`, still in the pinned SDK) is
    parsed as an Anthropic request and answered 400 `invalid_body`
    ("missing field `model`") without ever reaching the provider."""
    seen: list[str] = []

    def provider(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.path)
        return httpx2.Response(
            200,
            json={
                "id": "msg_1",
                "object": "thread.message",
                "created_at": 0,
                "thread_id": "thread_1",
                "role": "user",
                "content": [],
                "attachments": [],
                "metadata": {},
                "status": "completed",
                "assistant_id": None,
                "run_id": None,
                "completed_at": None,
                "incomplete_at": None,
                "incomplete_details": None,
            },
        )

    limiter = tollgate.Limiter(scopes={"openai": {"rpm": 10, "tpm": 10_000}})
    http = httpx2.AsyncClient(
        transport=tollgate.AsyncTransport(limiter, "openai", transport=httpx2.MockTransport(provider))
    )
    client = openai.AsyncOpenAI(api_key="x", base_url="http://provider/v1", http_client=http, max_retries=0)
    with pytest.warns(DeprecationWarning):
        try:
            message = await client.beta.threads.messages.create("thread_1", role="user", content="hello")
        except openai.BadRequestError as e:
            pytest.fail(f"the transport refused it: {e}")
    assert message.id == "msg_1" and seen == ["/v1/threads/thread_1/messages"]
    await client.close()


def test_released_lease_that_was_never_settled_does_not_say_settled() -> None:
    """Lease.settled's docstring ("Whether it was settled (`settle` or
    `refused`)"): after `release()` without any settlement, `settled` is
    True (`is_none_or` on the released lease), while the estimate stays
    charged as unknown usage (Q-5): a caller checking `lease.settled` to
    decide whether to settle is told it already did."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 5, "tpm": 1_000}})
    lease = limiter.acquire_blocking("s", tokens=100)
    lease.release()
    available = limiter.snapshot()["scopes"]["s"]["limits"][1]["available"]
    assert available == 900  # the estimate is still charged: unsettled
    assert lease.settled is False


def test_out_of_range_numbers_raise_value_error() -> None:
    """docs/python.md ("Wrong argument types raise `TypeError`,
    out-of-range numbers `ValueError`"; a bad setting is a `ConfigError`,
    itself a ValueError): `concurrency=-1` and `default_max_tokens=-1`
    raise OverflowError (pyo3's u64 conversion), and an int limit beyond
    i64 raises TypeError."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 5}})
    cases = {
        "concurrency=-1": lambda: tollgate.Limiter(scopes={"s": {"rpm": 1}}, concurrency=-1),
        "default_max_tokens=-1": lambda: tollgate.AsyncTransport(limiter, "s", default_max_tokens=-1),
        "rpm=2**63": lambda: tollgate.Limiter(scopes={"s": {"rpm": 2**63}}),
    }
    wrong = {}
    for name, make in cases.items():
        try:
            make()
            wrong[name] = "accepted"
        except ValueError:
            pass
        except Exception as e:  # noqa: BLE001
            wrong[name] = type(e).__name__
    assert not wrong, wrong


def test_simulator_takes_its_rates_and_durations_as_numbers() -> None:
    """docs/python.md ("Settings are `tollgate sim`'s flags as keyword
    arguments ...; durations in seconds, a `timedelta` or the flag's
    text") and tollgate.testing's docstring (which lists `error_rate`,
    `disconnect_rate`, `slow_headers_rate`, `ingress_delay`):
    `_flag_value` formats every float as microseconds, so the fault
    rates, which are plain fractions (`--error-rate 0.1`), become
    `100000us` and the simulator refuses to start; and `ingress_delay`
    is missing from `_DURATIONS`, so `ingress_delay=1` (seconds) is sent
    as `1` and refused."""
    from tollgate.testing import simulator

    refused = {}
    for settings in (
        {"error_rate": 0.1},
        {"disconnect_rate": 0.05},
        {"slow_headers_rate": 0.2},
        {"ingress_delay": 1},
    ):
        try:
            with simulator(**settings):
                pass
        except ValueError as e:
            refused[str(settings)] = str(e).splitlines()[0]
    assert not refused, refused


async def test_deadline_cancels_the_attempt_before_the_error_and_the_permit_are_returned() -> None:
    """DL-6 ("provider work is cancelled before the error is returned (no
    detached work)"), ADM-7 (the concurrency limit bounds active calls):
    when a supervised call's deadline expires during an attempt, the
    engine drops the attempt, whose Python task is only *asked* to cancel
    (`call_soon_threadsafe(task.cancel)`, pyawait.rs), and returns
    `DeadlineExceeded` and the permit at once. The caller's next call on
    a `concurrency=1` limiter starts its provider work while the first
    attempt is still running: two in flight."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 100}}, concurrency=1)
    running = 0
    most = 0

    async def provider(seconds: float) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await asyncio.sleep(seconds)
        finally:
            running -= 1
        return "ok"

    with pytest.raises(tollgate.DeadlineExceeded):
        await limiter.call(provider, 10, timeout=0.1)
    still_running = running
    assert await limiter.call(provider, 0.05) == "ok"
    assert still_running == 0, "DeadlineExceeded returned while the attempt still ran"
    assert most == 1, f"{most} provider calls in flight under concurrency=1"
