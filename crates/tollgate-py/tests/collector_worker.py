"""A process for test_cancellation.py: the garbage collector frees a task
a cut attempt's lease is parked on (its loop was closed) while a wake-up
runs directly on another loop's thread, and a call waits for that
permit. Prints `python ran inside the release` if Python code ran while
the lease was released (the engine holds its locks then), `released` once
the waiting call got the permit."""

import asyncio
import gc
import sys

import tollgate

limiter = tollgate.Limiter(scopes={"s": {"rpm": 1000}}, concurrency=1)
other = tollgate.Limiter(scopes={"t": {"rpm": 1000}}, concurrency=5)
gc.disable()

# A cut attempt whose task never ends, its loop closed under it: the
# task is garbage in a cycle, and the lease stays parked on it.
old = asyncio.new_event_loop()
started: list[int] = []


async def stubborn() -> None:
    started.append(1)
    try:
        await asyncio.sleep(30)
    finally:
        await asyncio.sleep(30)


async def cut() -> None:
    call = asyncio.ensure_future(limiter.call(stubborn, timeout=0.1))
    while not started:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.3)
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)


old.run_until_complete(cut())
old.close()
del old, cut, stubborn
assert not limiter.snapshot()["idle"], "the permit should be parked on the task"

state = {"armed": False, "collecting": False}


class Loop(asyncio.SelectorEventLoop):
    def call_soon(self, callback, *args, context=None):  # type: ignore[override]
        if state["collecting"] and type(callback).__name__ != "Done":
            print("python ran inside the release", flush=True)
        elif state["armed"] and type(callback).__name__ != "Done":
            # Inside the direct wake of a done callback: collect now.
            state["armed"] = False
            state["collecting"] = True
            gc.collect()
            state["collecting"] = False
        return super().call_soon(callback, *args, context=context)


async def main() -> None:
    async def quick() -> str:
        return "w"

    waiting = asyncio.ensure_future(limiter.call(quick, scope="s", timeout=5))
    await asyncio.sleep(0.05)  # it waits for the parked permit

    async def arm() -> str:
        state["armed"] = True
        return "a"

    await other.call(arm, scope="t")
    await waiting
    print("released", flush=True)


Loop().run_until_complete(main())
