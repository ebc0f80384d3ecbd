"""Edges of supervised calls and streams found in review (SPEC LC-5,
DL-6, ADM-7): closing a stream another task iterates, and a deadline
that cuts an attempt."""

from __future__ import annotations

import asyncio
import gc
import threading

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
    """LC-5, PY-3: a consumer task iterates a supervised stream and another
    task calls `aclose()` on it: the iteration ends (at most the item in
    flight arrives) and the permit is returned. Found in review: the
    `__anext__` in flight put the stream back when its item arrived, so
    the consumer went on receiving and the permit stayed held."""
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


class CutUpstream:
    """An async iterator to cut: its first item comes at once (unless
    `first_at_once` is false) and no later one ever does; a read cut while
    it waits takes `unwind` seconds to unwind (an `await` in its cleanup,
    as when an httpx connection is closed), or never ends when `unwind` is
    None (it awaits a future nobody resolves)."""

    def __init__(self, first_at_once: bool = True, unwind: float | None = 0.1) -> None:
        self.first_at_once = first_at_once
        self.unwind = unwind
        self.reads = 0
        self.cut = False
        self.unwound = False

    def __aiter__(self) -> "CutUpstream":
        return self

    async def __anext__(self) -> dict:
        self.reads += 1
        if self.reads == 1 and self.first_at_once:
            return {"i": 1}
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cut = True
            if self.unwind is None:
                await asyncio.get_running_loop().create_future()
            await asyncio.sleep(self.unwind or 0)
            self.unwound = True
            raise
        return {"i": self.reads}


@pytest.mark.parametrize("leave", ["aclose", "async with"])
async def test_closing_a_stream_returns_once_the_read_it_cut_unwound(leave: str) -> None:
    # proves: LC-5 (leaving a stream early cancels its upstream and
    # returns its permit) / POOL-1 (the permit goes back when the attempt
    # has ended) / DL-6 (no provider work runs on after the caller moved on)
    """A consumer task waits in the stream's second item; another task
    leaves the stream (`aclose()`, or the end of `async with`). When that
    returns, the cut read has unwound and the limiter is idle. Found in
    review: `aclose()` returned at once, the read still unwinding and the
    permit held, so a caller's next step could find the limiter busy."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 100}}, concurrency=1)
    upstream = CutUpstream()
    stream = limiter.stream(lambda: upstream, scope="s", timeout=10)
    got: list[int] = []

    async def consume() -> None:
        async for item in stream:
            got.append(item["i"])

    task = asyncio.create_task(consume())
    try:
        await until(lambda: upstream.reads == 2)
        if leave == "aclose":
            await stream.aclose()
        else:
            await stream.__aexit__(None, None, None)
        assert upstream.unwound, "the close returned while the cut read still ran"
        assert idle(limiter), "the close returned, yet the stream still holds its permit"
        assert got == [1]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class Gate:
    """An async iterator whose first item comes at once and each later
    one when `go` is set."""

    def __init__(self) -> None:
        self.reads = 0
        self.go = asyncio.Event()

    def __aiter__(self) -> "Gate":
        return self

    async def __anext__(self) -> dict:
        self.reads += 1
        if self.reads >= 2:
            await self.go.wait()
        return {"i": self.reads}


async def test_a_stream_closed_from_another_threads_loop_returns_once_the_read_unwound() -> None:
    # proves: LC-5 / POOL-1 (the close reaches a read in flight on another
    # thread's loop and returns once it unwound, the permit back)
    """Threads and a real clock: the consumer iterates on this loop, the
    close runs on a loop of another thread while the consumer waits in
    its second read."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 100}}, concurrency=1)
    upstream = CutUpstream()
    stream = limiter.stream(lambda: upstream, scope="s", timeout=30)

    async def consume() -> None:
        async for _ in stream:
            pass

    task = asyncio.create_task(consume())
    seen: dict[str, object] = {}

    def close_there() -> None:
        async def close() -> None:
            await asyncio.wait_for(stream.aclose(), 20)
            seen["unwound"] = upstream.unwound
            seen["idle"] = idle(limiter)

        try:
            asyncio.run(close())
        except BaseException as e:  # reported by the assertion below
            seen["error"] = repr(e)

    try:
        await until(lambda: upstream.reads == 2)
        closer = threading.Thread(target=close_there)
        closer.start()
        while closer.is_alive():
            await asyncio.sleep(0.01)
        assert seen == {"unwound": True, "idle": True}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("turns", range(4))
async def test_closing_a_stream_returns_once_the_consumer_let_go_of_it(turns: int) -> None:
    # proves: LC-5 (leaving a stream early returns its permit) / POOL-1
    """The upstream read a consumer waits in completes, and the stream is
    closed `turns` loop turns later, before or after the consumer's
    `__anext__` has run again: either way, when `aclose()` returns the
    permit is back. Found in review: with the read complete but the
    consumer not yet run, nothing was cut, so `aclose()` returned while
    the consumer still held the stream and its permit."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 100}}, concurrency=1)
    upstream = Gate()
    stream = limiter.stream(lambda: upstream, scope="s", timeout=10)

    async def consume() -> None:
        async for _ in stream:
            pass

    task = asyncio.create_task(consume())
    try:
        await until(lambda: upstream.reads == 2)
        upstream.go.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        await stream.aclose()
        assert idle(limiter), "aclose() returned, yet the stream still holds its permit"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_closing_a_stream_while_it_opens_cuts_the_opening() -> None:
    # proves: LC-5 / POOL-1 / DL-6 (a stream closed while its first item
    # is awaited: the opening attempt is cancelled, and the close returns
    # once it unwound, the permit back)
    """Found in review: the opening (admission and the attempts up to the
    first item) did not watch for a close, so `aclose()` waited for the
    whole first read, up to the stream's deadline."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 100}}, concurrency=1)
    upstream = CutUpstream(first_at_once=False)
    stream = limiter.stream(lambda: upstream, scope="s", timeout=60)
    got: list[dict] = []

    async def consume() -> None:
        async for item in stream:
            got.append(item)

    task = asyncio.create_task(consume())
    try:
        await until(lambda: upstream.reads == 1)
        await asyncio.wait_for(stream.aclose(), 10)
        assert upstream.unwound, "the close returned while the opening attempt still ran"
        assert idle(limiter), "the close returned, yet the stream still holds its permit"
        await asyncio.wait_for(task, 10)
        assert got == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_stream_closed_while_it_waits_for_a_permit_never_calls_upstream() -> None:
    # proves: LC-5 / ADM-7 (a stream closed while its opening waits for the
    # only permit: it never starts, and the permit goes to nobody for it)
    """Found in review: the close returned at once, but the opening went
    on waiting and called the upstream once the permit came free."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 100}}, concurrency=1)
    release = asyncio.Event()

    async def hold() -> str:
        await release.wait()
        return "held"

    holder = asyncio.create_task(limiter.call(hold, scope="s", timeout=60))
    await until(lambda: not idle(limiter))
    called: list[int] = []

    def open_upstream() -> Gate:
        called.append(1)
        return Gate()

    stream = limiter.stream(open_upstream, scope="s", timeout=60)
    task = asyncio.create_task(stream.__anext__())
    await asyncio.sleep(0.05)  # its opening waits for the permit
    await stream.aclose()
    release.set()
    assert await holder == "held"
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(task, 10)
    await asyncio.wait_for(until(lambda: idle(limiter)), 10)
    assert called == [], "the upstream was called for a stream closed before it opened"


@pytest.mark.parametrize("cut", ["read", "opening"])
async def test_leaving_async_with_after_a_timeout_returns_once_the_cut_read_unwound(cut: str) -> None:
    # proves: LC-5 / POOL-1 / DL-6 (a timeout around `async with` cancels
    # the `__anext__` in flight; the exit returns once what it cut has
    # unwound, the permit back)
    """The common shape `async with asyncio.timeout(...)` around `async
    with limiter.stream(...)`: the timeout cancels the consumer's
    `__anext__` (in a later read, or in the opening), then `__aexit__`
    runs. Found in review: with the `__anext__` already gone, the exit no
    longer found the call's tasks and returned while the cut read still
    unwound, its permit held."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 100}}, concurrency=1)
    upstream = CutUpstream() if cut == "read" else CutUpstream(first_at_once=False)
    # The read the timeout cuts: the second, or the first (the opening).
    waiting_in = 2 if cut == "read" else 1
    at_exit: dict[str, bool] = {}
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(None) as deadline:

            async def expire_once_it_waits() -> None:
                await until(lambda: upstream.reads == waiting_in)
                deadline.reschedule(asyncio.get_running_loop().time())

            expiry = asyncio.create_task(expire_once_it_waits())
            stream = limiter.stream(lambda: upstream, scope="s", timeout=60)
            try:
                async with stream:
                    async for _ in stream:
                        pass
            finally:
                at_exit["unwound"] = upstream.unwound
                at_exit["idle"] = idle(limiter)
    await expiry
    assert at_exit == {"unwound": True, "idle": True}


def test_a_permit_held_by_a_task_its_loop_destroyed_goes_back_while_the_stream_object_lives() -> None:
    # proves: POOL-1 (a cut read's permit waits for its task; a task
    # destroyed without ending, its loop closed, gives it back)
    """Found in review: the stream object kept the call's tasks alive, and
    with them the permit parked on a task its closed loop had destroyed,
    for as long as the object lived."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 100}}, concurrency=1)
    upstream = CutUpstream(unwind=None)
    loop = asyncio.new_event_loop()

    async def run() -> tollgate.SupervisedStream:
        stream = limiter.stream(lambda: upstream, scope="s", timeout=60)

        async def consume() -> None:
            async for _ in stream:
                pass

        task = asyncio.create_task(consume())
        await until(lambda: upstream.reads == 2)
        with pytest.raises(asyncio.TimeoutError):
            # The cut read never ends, so neither does the close.
            await asyncio.wait_for(stream.aclose(), 0.2)
        await until(lambda: upstream.cut)
        assert not idle(limiter), "the permit went back before the cut read ended"
        del task
        return stream

    stream = loop.run_until_complete(run())
    loop.close()
    gc.collect()
    assert idle(limiter), "the stream object kept the permit of a task its closed loop destroyed"
    del stream


async def test_a_call_cut_by_its_deadline_answers_after_its_attempt_unwound() -> None:
    """DL-6 (provider work is cancelled before the error is returned: no
    detached work), ADM-7 (the concurrency limit bounds active calls):
    when a call's deadline cuts its attempt, the call answers once the
    attempt's task has unwound, so the caller's next call never overlaps
    it on a `concurrency=1` limiter. Found in review: the task was only
    asked to cancel and `DeadlineExceeded` came back at once, two provider
    calls then running at the same time."""
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


async def until(condition) -> None:
    """Yields to the loop until `condition()` holds (an ordering, not a
    timing: nothing is asserted about how long it takes)."""
    while not condition():
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("cut", ["deadline", "cancelled"])
async def test_a_waiting_call_starts_only_once_the_cut_attempt_unwound(cut: str) -> None:
    # proves: POOL-1 (an attempt's permit is released when the attempt
    # ends, cancellation included) / ADM-7 (the concurrency limit bounds
    # active calls) / DL-6 (provider work is cancelled, not detached)
    """A call's attempt is cut (its deadline, or its caller cancels it)
    and its task takes a while to unwind (an `await` in its `finally`, as
    when an httpx connection is closed). Another call already waits for
    the only permit of a `concurrency=1` limiter: it starts only once the
    cut attempt's `finally` has ended. Found in review: the permit went
    back as soon as the attempt was cut, and the waiting call's attempt
    ran while the cut one was still unwinding."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 1000}}, concurrency=1)
    events: list[str] = []

    async def cut_slowly() -> str:
        events.append("first started")
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.3)  # still unwinding
            events.append("first unwound")
        return "late"

    async def second() -> str:
        events.append("second started")
        return "ok"

    first = asyncio.create_task(limiter.call(cut_slowly, timeout=0.1 if cut == "deadline" else 30))
    await until(lambda: "first started" in events)
    waiting = asyncio.create_task(limiter.call(second, timeout=30))
    if cut == "cancelled":
        await asyncio.sleep(0.05)  # the second call waits for the permit
        first.cancel()
    outcome = (await asyncio.gather(first, return_exceptions=True))[0]
    if cut == "deadline":
        assert isinstance(outcome, tollgate.DeadlineExceeded), outcome
    else:
        assert isinstance(outcome, asyncio.CancelledError), outcome
    assert await waiting == "ok"
    assert events == ["first started", "first unwound", "second started"], events
    await until(lambda: idle(limiter))


async def test_a_stream_whose_opening_is_cut_raises_once_the_attempt_unwound() -> None:
    # proves: DL-6 (provider work is cancelled before the error is
    # returned: no detached work) / POOL-1 / PY-3 (streams)
    """The deadline cuts the attempt that opens a `Limiter.stream` while
    its task takes a while to unwind (an `await` in its `finally`): the
    first `__anext__` raises `DeadlineExceeded` only once the attempt has
    unwound, as `Limiter.call` does. Found in review: the stream raised at
    once, the cut attempt still running behind it."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 1000}}, concurrency=1)
    events: list[str] = []

    async def opens_slowly() -> Slow:
        events.append("opening")
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.3)  # still unwinding
            events.append("unwound")
        return Slow(1)

    with pytest.raises(tollgate.DeadlineExceeded):
        async for _ in limiter.stream(opens_slowly, scope="s", timeout=0.1):
            pass
    events.append("raised")
    assert events == ["opening", "unwound", "raised"], events
    await until(lambda: idle(limiter))


class SecondItemUnwindsSlowly:
    """An async iterator whose first item comes at once and whose second
    waits until cancelled, then takes a while to unwind."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.i = 0

    def __aiter__(self) -> "SecondItemUnwindsSlowly":
        return self

    async def __anext__(self) -> dict:
        self.i += 1
        if self.i == 1:
            return {"i": 1}
        self.events.append("reading")
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.3)  # still unwinding
            self.events.append("unwound")
        raise StopAsyncIteration


@pytest.mark.parametrize("cut", ["deadline", "cancelled"])
async def test_a_stream_cut_mid_way_keeps_its_permit_until_its_item_read_unwound(cut: str) -> None:
    # proves: POOL-1 (an attempt's permit is released when the attempt
    # ends, cancellation included) / LC-5 (a consumer that leaves early:
    # upstream aborted, permits released) / ADM-7 / DL-6 (the deadline's
    # error once the upstream work has ended)
    """A `Limiter.stream` is cut while its upstream `__anext__` runs (its
    deadline, or its consumer's task cancelled), and that read takes a
    while to unwind. A call already waiting for the only permit of a
    `concurrency=1` limiter starts only once the read has unwound; the
    deadline's error is raised only then. Found in review: the stream's
    permit went back when the stream was cut, so the waiting call ran
    beside the unwinding read, and `DeadlineExceeded` came before it
    ended."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 1000}}, concurrency=1)
    events: list[str] = []

    async def consume() -> None:
        timeout = 0.3 if cut == "deadline" else 30
        async for _ in limiter.stream(lambda: SecondItemUnwindsSlowly(events), scope="s", timeout=timeout):
            pass

    async def second() -> str:
        events.append("second started")
        return "ok"

    consumer = asyncio.create_task(consume())
    await until(lambda: "reading" in events)
    waiting = asyncio.create_task(limiter.call(second, timeout=30))
    if cut == "cancelled":
        await asyncio.sleep(0.05)  # the second call waits for the permit
        consumer.cancel()
    outcome = (await asyncio.gather(consumer, return_exceptions=True))[0]
    events.append("consumer ended")
    if cut == "deadline":
        assert isinstance(outcome, tollgate.DeadlineExceeded), outcome
    else:
        assert isinstance(outcome, asyncio.CancelledError), outcome
    assert await waiting == "ok"
    await until(lambda: "unwound" in events)
    assert events.index("unwound") < events.index("second started"), events
    if cut == "deadline":
        assert events.index("unwound") < events.index("consumer ended"), events
    await until(lambda: idle(limiter))


def test_a_loop_closed_with_a_cut_attempt_pending_gives_its_permit_back() -> None:
    # proves: POOL-1 (an attempt's permit is released when the attempt
    # ends: a task destroyed without ending ends it) / Q-9
    """A call's deadline cuts an attempt whose task never finishes
    unwinding; the caller gives up on the call and its loop is closed
    with the task still pending. Once the task is collected, the permit
    is back for the limiter's other loops."""
    limiter = tollgate.Limiter(scopes={"s": {"rpm": 1000}}, concurrency=1)
    loop = asyncio.new_event_loop()
    started: list[int] = []

    async def stubborn() -> str:
        started.append(1)
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(30)
        return "late"

    async def caller() -> None:
        call = asyncio.ensure_future(limiter.call(stubborn, timeout=0.1))
        while not started:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)  # cut; the call waits for the straggler
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)

    loop.run_until_complete(caller())
    assert not idle(limiter), "the cut attempt still runs: its permit is held"
    loop.close()
    del loop
    gc.collect()
    assert idle(limiter), limiter.snapshot()
