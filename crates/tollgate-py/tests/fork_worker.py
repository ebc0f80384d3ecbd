"""A process that uses tollgate, then forks (test_fork.py). Prints one JSON
object on stdout; the parent exits 0 only if every check passed.

Usage:
    python fork_worker.py waits        # a child waits and is woken
    python fork_worker.py pool         # a multiprocessing "fork" pool
    python fork_worker.py redis URL    # parent and child settle on one store
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import sys
import time

import tollgate

# One request per 50 ms: a second and third acquisition must wait for the
# window, so their wake comes from the runtime's timer.
PACED = {"s": {"limits": [{"requests": 1, "per": "50ms"}]}}


def use(limiter: tollgate.Limiter) -> None:
    """Starts everything the package runs in this process: the runtime
    (a timed wait) and the notifier thread (an asyncio wake from it)."""
    for _ in range(2):
        with limiter.acquire_blocking("s", timeout=5):
            pass

    async def waits() -> None:
        async def one() -> None:
            async with limiter.acquire("s", timeout=5):
                pass

        await asyncio.gather(*(one() for _ in range(3)))

    asyncio.run(waits())


def paced_in_this_process() -> int:
    """A new limiter here: three blocking and three async acquisitions,
    all but the first waiting for the window. Returns how many were
    admitted."""
    limiter = tollgate.Limiter(scopes=PACED)
    admitted = 0
    for _ in range(3):
        with limiter.acquire_blocking("s", timeout=5):
            admitted += 1

    async def waits() -> int:
        async def one() -> int:
            async with limiter.acquire("s", timeout=5):
                return 1

        return sum(await asyncio.gather(*(one() for _ in range(3))))

    admitted += asyncio.run(waits())
    assert limiter.snapshot()["idle"]
    return admitted


def refusals(
    before_fork: tollgate.Limiter,
    transport: tollgate.Transport,
    awaitable: object,
    lease: tollgate.Lease,
) -> list[str]:
    """What a limiter, a transport, an acquisition not yet awaited and a
    lease made before the fork say when used in the child: each attempt's
    RuntimeError, or "not refused"."""
    import httpx

    async def wait_for_it() -> None:
        await awaitable  # type: ignore[misc]

    def send() -> None:
        with httpx.Client(transport=transport) as client:
            client.post("http://127.0.0.1:9/v1/chat/completions", json={"model": "m", "messages": []})

    messages = []
    for attempt in (
        lambda: before_fork.acquire_blocking("s", timeout=1),
        lambda: before_fork.acquire("s", timeout=1),
        lambda: before_fork.snapshot(),
        lambda: tollgate.Transport(before_fork),
        send,
        lambda: asyncio.run(wait_for_it()),
        lambda: lease.settle(total_tokens=1),
    ):
        try:
            attempt()
            messages.append("not refused")
        except RuntimeError as e:
            messages.append(str(e))
    return messages


def wait_child(pid: int, seconds: float) -> int:
    """The child's exit status; kills it and returns -1 after `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return -1


def child_report(read: int, write: int, body) -> int:
    """Forks; the child runs `body()` and writes its JSON result to the
    pipe, then exits normally (atexit handlers and finalization run).
    Returns the child's pid."""
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = {"ok": True, "result": body()}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(result))
        sys.exit(0)
    os.close(write)
    return pid


def waits() -> dict:
    before_fork = tollgate.Limiter(scopes=PACED)
    transport = tollgate.Transport(before_fork)
    use(before_fork)
    lease = before_fork.acquire_blocking("s", timeout=5)
    awaitable = before_fork.acquire("s", timeout=5)
    read, write = os.pipe()

    def body() -> dict:
        return {
            "admitted": paced_in_this_process(),
            "refusals": refusals(before_fork, transport, awaitable, lease),
        }

    pid = child_report(read, write, body)
    lease.release()
    with os.fdopen(read) as src:
        report = src.read()
    code = wait_child(pid, 30)
    # The parent's limiter still works after the fork.
    use(before_fork)
    return {"child_exit": code, "child": json.loads(report) if report else None}


def pooled(_: int) -> int:
    return paced_in_this_process()


def pool() -> dict:
    use(tollgate.Limiter(scopes=PACED))
    with multiprocessing.get_context("fork").Pool(2) as p:
        result = p.map_async(pooled, range(4))
        admitted = result.get(timeout=30)
    return {"admitted": admitted}


def redis(url: str) -> dict:
    """The parent and its child each settle `rounds` reservations of 100
    tokens at 0 on one scope kept in Redis; every settlement must count,
    so afterwards the whole minute's budget is free again."""
    budget, rounds = 4_000, 20
    scopes = {"s": {"limits": [{"tokens": budget, "per": "1m"}]}}
    store = {"backend": "redis", "url": url, "timeout": "2s"}

    def settle_rounds(limiter: tollgate.Limiter) -> None:
        for _ in range(rounds):
            with limiter.acquire_blocking("s", tokens=100, timeout=5) as lease:
                lease.settle(total_tokens=0)

    parent = tollgate.Limiter(scopes=scopes, quota_store=store)
    settle_rounds(parent)
    go_read, go_write = os.pipe()
    read, write = os.pipe()

    def body() -> dict:
        os.read(go_read, 1)  # the parent's rounds are done
        child = tollgate.Limiter(scopes=scopes, quota_store=store)
        settle_rounds(child)
        # Everything was given back: the whole budget is free.
        with child.acquire_blocking("s", tokens=budget, timeout=1):
            pass
        return {"rounds": rounds}

    pid = child_report(read, write, body)
    settle_rounds(parent)
    # The parent's settlements have landed in the store (each is a round
    # trip of its own after the lease; closing waits for them) before the
    # child looks: the store's answers wake waiters of their own process
    # only.
    async def close() -> None:
        await parent.close()

    asyncio.run(close())
    os.write(go_write, b"1")
    with os.fdopen(read) as src:
        report = src.read()
    return {"child_exit": wait_child(pid, 30), "child": json.loads(report) if report else None}


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "waits":
        print(json.dumps(waits()))
    elif mode == "pool":
        print(json.dumps(pool()))
    elif mode == "redis":
        print(json.dumps(redis(sys.argv[2])))
    else:
        sys.exit(f"unknown mode {mode!r}")
