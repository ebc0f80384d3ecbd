"""The httpx transports under the pinned OpenAI and Anthropic SDKs,
against the strict simulator over loopback (SPEC PY-4)."""

from __future__ import annotations

import asyncio
import json
import time

import anthropic
import httpx
import httpx2
import openai
import pytest

import tollgate
from tollgate.testing import simulator

WINDOW = 1.0
RPM = 12
TPM = 1_200
# max_tokens above the simulator's completion length (16) covers its
# message framing, which OpenAI's character rule leaves out.
MAX_TOKENS = 32


def openai_limits() -> dict:
    return {"openai": {"limits": [{"requests": RPM, "per": "1s"}, {"tokens": TPM, "per": "1s"}]}}


def counters(limiter: tollgate.Limiter, scope: str) -> dict:
    return limiter.snapshot()["scopes"][scope]["counters"]


def no_429(stats: dict) -> bool:
    return all(v == 0 for v in stats["rejected_429"].values())


async def test_openai_sdk_job_of_several_windows_draws_no_provider_429() -> None:
    """PY-4, Q-2, Q-5, GW-5: AsyncOpenAI over the transport runs a job of
    several windows (one-shot and streaming calls, httpx2 and httpx
    clients) against a simulator enforcing the same limits: no 429, every
    call's usage settled (tollgate's reported tokens are exactly what the
    simulator charged), the usage chunk the SDK did not ask for stripped,
    nothing held at the end."""
    with simulator(rpm=RPM, tpm=TPM, window=WINDOW) as sim:
        limiter = tollgate.Limiter(scopes=openai_limits())
        clients = [
            openai.AsyncOpenAI(
                base_url=sim.openai_base_url,
                api_key="test",
                http_client=tollgate.httpx_client(limiter, "openai", module=module),
            )
            for module in (httpx2, httpx)
        ]

        async def one(i: int) -> int:
            client = clients[i % 2]
            messages = [{"role": "user", "content": f"question {i}: " + "word " * (i % 7)}]
            if i % 3 == 0:
                chunks = await client.chat.completions.create(
                    model="gpt-4o-mini", messages=messages, max_tokens=MAX_TOKENS, stream=True
                )
                seen = [c async for c in chunks]
                assert all(c.usage is None for c in seen), "the usage chunk is not forwarded"
                return len(seen)
            reply = await client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, max_tokens=MAX_TOKENS
            )
            assert reply.usage is not None and reply.usage.completion_tokens == 16
            return 1

        calls = 3 * RPM + 4  # four windows' worth
        results = await asyncio.gather(*(one(i) for i in range(calls)))
        assert all(r > 0 for r in results)
        stats = sim.stats()
        assert no_429(stats), stats["rejected_429"]
        assert stats["ok"] == calls
        c = counters(limiter, "openai")
        assert c["admitted"] == calls == stats["requests_charged"]
        assert c["tokens_reported"] == stats["tokens_charged"]
        assert c["unknown_usage"] == 0
        assert limiter.snapshot()["idle"]
        for client in clients:
            await client.close()


async def test_anthropic_sdk_one_shot_and_streams_settle_input_and_output() -> None:
    """PY-4, Q-12, WIRE-3: AsyncAnthropic over the transport (Anthropic's
    profile: input and output tokens apart) against the simulator's
    request, ITPM and OTPM buckets with the same limits: no 429 over
    several windows of one-shot and streamed messages, usage settled from
    the final events."""
    with simulator(anthropic_rpm=10, itpm=400, otpm=400, window=WINDOW) as sim:
        limiter = tollgate.Limiter(
            scopes={
                "anthropic": {
                    "limits": [
                        {"requests": 10, "per": "1s"},
                        {"input_tokens": 400, "per": "1s"},
                        {"output_tokens": 400, "per": "1s"},
                    ]
                }
            }
        )
        client = anthropic.AsyncAnthropic(
            base_url=sim.base_url, api_key="test", http_client=tollgate.httpx_client(limiter)
        )

        async def one(i: int) -> int:
            messages = [{"role": "user", "content": f"hello {i} " + "x" * (i % 11)}]
            if i % 2:
                async with client.messages.stream(
                    model="claude-haiku-4-5", max_tokens=MAX_TOKENS, messages=messages
                ) as stream:
                    final = await stream.get_final_message()
            else:
                final = await client.messages.create(
                    model="claude-haiku-4-5", max_tokens=MAX_TOKENS, messages=messages
                )
            return final.usage.input_tokens + final.usage.output_tokens

        calls = 30
        reported = sum(await asyncio.gather(*(one(i) for i in range(calls))))
        stats = sim.stats()
        assert no_429(stats), stats["rejected_429"]
        assert stats["messages_charged"] == calls
        c = counters(limiter, "anthropic")
        assert c["admitted"] == calls and c["unknown_usage"] == 0
        assert c["tokens_reported"] == reported
        assert reported == stats["input_tokens_charged"] + stats["output_tokens_charged"]
        assert limiter.snapshot()["idle"]
        await client.close()


def test_sync_clients_stream_and_early_close() -> None:
    """PY-4, LC-5: the synchronous transport under openai.OpenAI and
    anthropic.Anthropic: one-shot and streamed calls are settled from
    their usage; a stream the caller leaves early is closed and settled
    by its estimate, and nothing stays held."""
    with simulator(rpm=RPM, tpm=TPM, anthropic_rpm=10, itpm=1_000, otpm=1_000, window=WINDOW) as sim:
        limiter = tollgate.Limiter(
            scopes={**openai_limits(), "anthropic": {"limits": [{"requests": 10, "per": "1s"}]}}
        )
        client = openai.OpenAI(
            base_url=sim.openai_base_url,
            api_key="test",
            http_client=tollgate.httpx_client(limiter, "openai", sync=True),
        )
        messages = [{"role": "user", "content": "hello"}]
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=MAX_TOKENS)
        streamed = list(
            client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, max_tokens=MAX_TOKENS, stream=True
            )
        )
        assert len(streamed) == 18 and reply.usage.completion_tokens == 16
        c = counters(limiter, "openai")
        assert c["tokens_reported"] == 2 * reply.usage.total_tokens
        reserved = c["tokens_reserved"]
        left = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, max_tokens=MAX_TOKENS, stream=True
        )
        for i, _ in enumerate(left):
            if i == 2:
                break
        left.close()
        c = counters(limiter, "openai")
        estimate = c["tokens_reserved"] - reserved
        assert c["tokens_reported"] == 2 * reply.usage.total_tokens
        assert limiter.snapshot()["idle"]
        # The stream left early (no usage seen) keeps its whole estimate
        # counted in the window.
        limits = limiter.snapshot()["scopes"]["openai"]["limits"]
        tokens = next(l for l in limits if l["dimension"] == "tokens")
        assert tokens["available"] <= TPM - 2 * reply.usage.total_tokens - estimate

        aclient = anthropic.Anthropic(
            base_url=sim.base_url,
            api_key="test",
            http_client=tollgate.httpx_client(limiter, "anthropic", sync=True),
        )
        with aclient.messages.stream(model="claude-haiku-4-5", max_tokens=MAX_TOKENS, messages=messages) as s:
            final = s.get_final_message()
        assert final.usage.output_tokens == 16
        assert counters(limiter, "anthropic")["unknown_usage"] == 0
        assert limiter.snapshot()["idle"]
        client.close()
        aclient.close()


async def test_provider_retry_after_cools_the_scope() -> None:
    """PY-4, CD-1, RT-3: another client (plain httpx) has spent the
    simulator's window, so tollgate's call draws a 429 with `retry-after`:
    the transport cools the whole scope for it, a call made meanwhile waits
    instead of reaching the provider, and the engine's retry (not the
    SDK's) succeeds once the cooldown is over."""
    with simulator(rpm=2, window=WINDOW) as sim:
        messages = [{"role": "user", "content": "hi"}]
        body = {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS}
        async with httpx2.AsyncClient() as other:
            for _ in range(2):
                r = await other.post(sim.openai_base_url + "/chat/completions", json=body)
                assert r.status_code == 200
        limiter = tollgate.Limiter(
            scopes={"openai": {"rpm": 100}},
            retry={"max_attempts": 5, "base_delay": "10ms", "jitter": 0.0},
        )
        client = openai.AsyncOpenAI(
            base_url=sim.openai_base_url,
            api_key="test",
            http_client=tollgate.httpx_client(limiter, "openai"),
        )
        first = asyncio.ensure_future(
            client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS)
        )

        async def refused() -> None:
            while counters(limiter, "openai")["cooldowns"] == 0:
                await asyncio.sleep(0.002)

        await asyncio.wait_for(refused(), 10)
        cooldown = limiter.snapshot()["scopes"]["openai"]["cooldown_remaining"]
        cooling_until = time.monotonic() + cooldown
        assert 0 < cooldown <= WINDOW
        assert sim.stats()["requests_total"] == 3
        # A call made during the cooldown waits for it: nothing reaches the
        # provider until the cooldown is over.
        second = asyncio.ensure_future(
            client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS)
        )
        while not (first.done() and second.done()):
            seen = sim.stats()["requests_total"]
            if time.monotonic() < cooling_until - 0.05:
                assert seen == 3, "a request reached the provider during the cooldown"
            await asyncio.sleep(0.005)
        # The engine's retries (never the SDK's) answered both.
        assert (await first).usage is not None and (await second).usage is not None
        stats = sim.stats()
        assert stats["ok"] == 4 and stats["rejected_429"]["rpm"] >= 1
        assert limiter.snapshot()["idle"]
        await client.close()


async def test_rate_limit_headers_feed_the_scope() -> None:
    """PY-4, Q-14: a client tollgate cannot see spends the same account;
    the simulator's `x-ratelimit-remaining-*` headers tell it, and the
    transport hands them to the engine, which takes the gap out of the
    scope's window."""
    with simulator(rpm=20, tpm=10_000, window=2.0, background_rpm=10) as sim:
        limiter = tollgate.Limiter(
            scopes={"openai": {"limits": [{"requests": 20, "per": "2s"}, {"tokens": 10_000, "per": "2s"}]}}
        )
        client = openai.AsyncOpenAI(
            base_url=sim.openai_base_url, api_key="test", http_client=tollgate.httpx_client(limiter, "openai")
        )
        await asyncio.sleep(0.3)  # the background consumer spends first
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=MAX_TOKENS
        )
        c = counters(limiter, "openai")
        assert c["gap_requests"] > 0 or c["gap_tokens"] > 0, c
        await client.close()


async def test_final_answers_tell_the_sdk_not_to_retry() -> None:
    """PY-4, RT-1, RT-4, GW-4: when the engine gives up, the SDK gets the
    provider's last answer (or the gateway's error) with
    `x-should-retry: false`, so its own max_retries never multiplies the
    engine's attempts."""
    with simulator(rpm=1, window=30) as sim:
        messages = [{"role": "user", "content": "hi"}]
        body = {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS}
        async with httpx2.AsyncClient() as other:
            assert (await other.post(sim.openai_base_url + "/chat/completions", json=body)).status_code == 200
        limiter = tollgate.Limiter(
            scopes={"openai": {"rpm": 100}},
            retry={"max_attempts": 3, "base_delay": "10ms", "max_wait": "100ms"},
        )
        client = openai.AsyncOpenAI(
            base_url=sim.openai_base_url,
            api_key="test",
            max_retries=5,
            http_client=tollgate.httpx_client(limiter, "openai", timeout=5),
        )
        with pytest.raises(openai.RateLimitError) as e:
            await client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS)
        assert e.value.response.headers["x-should-retry"] == "false"
        assert float(e.value.response.headers["retry-after"]) > 20
        # The provider's own answer; one attempt: its hint is beyond
        # max_wait, so the engine gave up at once, and the SDK did not retry.
        assert e.value.code == "rate_limit_exceeded"
        assert sim.stats()["rejected_429"]["rpm"] == 1
        # Refused by tollgate (the scope cools down): the gateway's error.
        with pytest.raises(openai.RateLimitError) as e:
            await client.chat.completions.create(
                model="m", messages=messages, max_tokens=MAX_TOKENS, extra_headers={"x-request-timeout": "0.2"}
            )
        assert e.value.code == "admission_wait_deadline_exceeded"
        assert e.value.response.headers["x-should-retry"] == "false"
        assert sim.stats()["requests_total"] == 2
        assert limiter.snapshot()["idle"]
        await client.close()


async def test_bad_input_to_the_transport() -> None:
    """PY-4, PY-6, Q-3, GW-4: wrong arguments raise at once; a body that is
    not a valid request is the gateway's 400 `invalid_body`; an estimate
    over the whole limit is 400 `estimate_exceeds_limit` (Anthropic's error
    format on /messages); requests that are not model calls pass through
    unadmitted; nothing is held afterwards."""
    limiter = tollgate.Limiter(scopes={"openai": {"rpm": 5, "tpm": 100}}, providers={})
    with pytest.raises(tollgate.UnknownScope):
        tollgate.AsyncTransport(limiter, "nope")
    with pytest.raises(ValueError, match="flavor"):
        tollgate.AsyncTransport(limiter, flavor="bedrock")
    with pytest.raises(tollgate.ConfigError, match="providers"):
        tollgate.AsyncTransport(limiter, provider="missing")
    with pytest.raises(ValueError, match="timeout"):
        tollgate.AsyncTransport(limiter, timeout=-1)
    with pytest.raises(TypeError):
        tollgate.AsyncTransport(object(), "openai")  # type: ignore[arg-type]
    with simulator() as sim:
        async with tollgate.httpx_client(limiter) as http:
            r = await http.post(sim.openai_base_url + "/chat/completions", content=b"{not json")
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_body"
            assert r.headers["x-should-retry"] == "false"
            r = await http.post(
                sim.openai_base_url + "/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x" * 1000}]},
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "estimate_exceeds_limit"
            r = await http.post(
                sim.base_url + "/v1/messages",
                json={"model": "claude", "max_tokens": 500, "messages": [{"role": "user", "content": "x"}]},
            )
            assert r.status_code == 400 and r.json()["type"] == "error"
            assert r.json()["error"]["type"] == "invalid_request_error"
            r = await http.get(sim.openai_base_url + "/models")
            assert r.status_code == 200
        assert sim.stats()["requests_total"] == 0 and sim.stats()["routes"]["models"] == 1
    snap = limiter.snapshot()
    assert snap["idle"] and snap["scopes"]["openai"]["counters"]["admitted"] == 0


async def test_openai_thread_messages_are_not_taken_for_anthropic_messages() -> None:
    """PY-4: only Anthropic's `/v1/messages` is routed as the Messages API,
    so an AsyncOpenAI client keeps working by one constructor argument:
    OpenAI's `POST /v1/threads/{id}/messages`
    (`client.beta.threads.messages.create`) is not a model call and passes
    through to the provider unadmitted, as other routes do."""
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
    assert counters(limiter, "openai")["admitted"] == 0
    await client.close()


def chat_answer() -> httpx2.Response:
    """A one-shot chat completion of 5 + 2 tokens."""
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    return httpx2.Response(
        200,
        json={
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": usage,
        },
    )


class UnwindsSlowly(httpx2.AsyncBaseTransport):
    """A provider transport whose request marked `x-test: first` waits
    until cancelled, then takes a while to unwind (an `await` in its
    `finally`, as closing a connection does); any other is answered at
    once."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        name = request.headers.get("x-test", "other")
        self.events.append(f"{name} started")
        if name == "first":
            try:
                await asyncio.sleep(30)
            finally:
                await asyncio.sleep(0.3)  # still unwinding
                self.events.append("first unwound")
        return chat_answer()


async def test_transport_answers_a_cut_attempt_once_it_unwound_and_holds_its_permit() -> None:
    # proves: DL-6 (provider work is cancelled before the error is
    # returned: no detached work) / POOL-1 (an attempt's permit is released
    # when the attempt ends) / ADM-7 (the concurrency limit bounds active
    # calls) / PY-4 (the transports)
    """The transport's deadline cuts an attempt whose inner transport
    takes a while to unwind: the SDK gets the deadline's answer only once
    the attempt has unwound, and a request already waiting for the only
    permit of a `concurrency=1` limiter is sent only then. Found in review:
    the transport answered at once (unlike `Limiter.call`), and the
    waiting request overlapped the cut one at the provider."""
    events: list[str] = []
    limiter = tollgate.Limiter(scopes={"openai": {"rpm": 100, "tpm": 100_000}}, concurrency=1)
    transport = tollgate.AsyncTransport(limiter, "openai", transport=UnwindsSlowly(events), timeout=30)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS}
    async with httpx2.AsyncClient(transport=transport, base_url="http://provider/v1") as http:

        async def first() -> httpx2.Response:
            headers = {"x-test": "first", "x-request-timeout": "0.1"}
            r = await http.post("/chat/completions", json=body, headers=headers)
            events.append("first answered")
            return r

        cut = asyncio.create_task(first())
        while "first started" not in events:
            await asyncio.sleep(0.005)
        waiting = asyncio.create_task(http.post("/chat/completions", json=body, headers={"x-test": "second"}))
        r1, r2 = await asyncio.gather(cut, waiting)
    assert r1.status_code == 504 and r1.headers["x-should-retry"] == "false", (r1.status_code, r1.text)
    assert r2.status_code == 200, r2.text
    unwound = events.index("first unwound")
    assert unwound < events.index("first answered"), events
    assert unwound < events.index("second started"), events
    while not limiter.snapshot()["idle"]:
        await asyncio.sleep(0.005)


class SecondEventUnwindsSlowly(httpx2.AsyncByteStream):
    """A streamed chat completion's body: its first event comes at once;
    reading the next waits until cancelled, then takes a while to unwind
    (an `await` in its `finally`, as closing a connection does)."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def __aiter__(self):
        chunk = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}],
        }
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        self.events.append("first reading")
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.3)  # still unwinding
            self.events.append("first read unwound")
        yield b"data: [DONE]\n\n"


class StreamUnwindsSlowly(httpx2.AsyncBaseTransport):
    """A provider transport streaming the request marked `x-test: first`
    with `SecondEventUnwindsSlowly`; any other is answered at once."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        name = request.headers.get("x-test", "other")
        self.events.append(f"{name} started")
        if name == "first":
            headers = {"content-type": "text/event-stream"}
            return httpx2.Response(200, headers=headers, stream=SecondEventUnwindsSlowly(self.events))
        return chat_answer()


@pytest.mark.parametrize("cut", ["deadline", "closed"])
async def test_transport_stream_cut_mid_way_holds_its_permit_until_its_body_read_unwound(cut: str) -> None:
    # proves: POOL-1 (an attempt's permit is released when the attempt
    # ends, cancellation included) / LC-5 (a consumer that leaves early:
    # upstream aborted, permits released) / ADM-7 (the concurrency limit
    # bounds active calls) / DL-6 (the deadline's error once the upstream
    # read has ended) / PY-4 (the transports)
    """An SDK stream through the transport is cut mid-way (its deadline,
    or its consumer's task cancelled, which closes the stream) while the
    transport reads its body, and that read takes a while to unwind. A
    request already waiting for the only permit of a `concurrency=1`
    limiter is sent only once the read has unwound; the deadline's error
    is raised, and the stream's `aclose()` returns, only then. Found in
    review: the transport gave the stream's permit back when the stream
    was cut, so the waiting request was sent beside the unwinding read;
    later, `aclose()` returned while the read still unwound."""
    events: list[str] = []
    limiter = tollgate.Limiter(scopes={"openai": {"rpm": 100, "tpm": 100_000}}, concurrency=1)
    transport = tollgate.AsyncTransport(limiter, "openai", transport=StreamUnwindsSlowly(events), timeout=30)
    client = openai.AsyncOpenAI(
        base_url="http://provider/v1",
        api_key="test",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=transport),
    )
    messages = [{"role": "user", "content": "hi"}]

    async def consume() -> None:
        headers = {"x-test": "first"}
        if cut == "deadline":
            headers["x-request-timeout"] = "0.3"
        stream = await client.chat.completions.create(
            model="m", messages=messages, max_tokens=MAX_TOKENS, stream=True, extra_headers=headers
        )
        async with stream:
            async for _ in stream:
                events.append("first chunk")

    consumer = asyncio.create_task(consume())
    while "first reading" not in events:
        await asyncio.sleep(0.005)
    waiting = asyncio.create_task(
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=MAX_TOKENS, extra_headers={"x-test": "second"}
        )
    )
    if cut == "closed":
        while "first chunk" not in events:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # the second request waits for the permit
        consumer.cancel()
    outcome = (await asyncio.gather(consumer, return_exceptions=True))[0]
    events.append("consumer ended")
    if cut == "deadline":
        assert isinstance(outcome, tollgate.DeadlineExceeded), repr(outcome)
    else:
        assert isinstance(outcome, asyncio.CancelledError), repr(outcome)
    reply = await waiting
    assert reply.choices[0].message.content == "hi"
    while "first read unwound" not in events:
        await asyncio.sleep(0.005)
    unwound = events.index("first read unwound")
    assert unwound < events.index("second started"), events
    # The deadline's error, and the stream's close (`aclose()` by the
    # SDK's `async with`), each return only once the read has unwound.
    assert unwound < events.index("consumer ended"), events
    while not limiter.snapshot()["idle"]:
        await asyncio.sleep(0.005)
    await client.close()
