"""PY-7: the overhead of acquire + settle from Python, next to aiolimiter in
the same run.

    target/py-venv/bin/python benches/python/overhead.py

Both limiters get limits far above the load, so nothing ever waits: what is
measured is the cost of admitting and settling one call. tollgate does
`async with limiter.acquire(scope, tokens=...) as lease: lease.settle(...)`
(a request limit and a token limit, settled with the reported usage);
aiolimiter does `async with limiter:` (one request limit, no tokens, no
settlement). Each operation is timed on its own (perf_counter_ns around
it) and the median, p99 and throughput are printed.

`uncontended`: one task, back to back. `1000 tasks`: 1,000 tasks on one
loop, each running its operations with a `sleep(0)` between them, so the
limiter always has 1,000 callers in flight.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import tollgate
from aiolimiter import AsyncLimiter

OPS = 200_000
TASKS = 1_000


def summary(name: str, samples: list[int], wall: float) -> str:
    samples.sort()
    median = statistics.median(samples) / 1000
    p99 = samples[int(len(samples) * 0.99)] / 1000
    rate = len(samples) / wall
    return f"{name:<36} median {median:6.2f} µs   p99 {p99:7.2f} µs   {rate:>10,.0f} ops/s"


async def tollgate_op(limiter: tollgate.Limiter) -> int:
    t0 = time.perf_counter_ns()
    async with limiter.acquire("openai", tokens=1_200) as lease:
        lease.settle(input_tokens=1_000, output_tokens=150)
    return time.perf_counter_ns() - t0


async def aiolimiter_op(limiter: AsyncLimiter) -> int:
    t0 = time.perf_counter_ns()
    async with limiter:
        pass
    return time.perf_counter_ns() - t0


async def uncontended(op, limiter) -> tuple[list[int], float]:
    for _ in range(2_000):  # warm up
        await op(limiter)
    samples = []
    start = time.perf_counter()
    for _ in range(OPS):
        samples.append(await op(limiter))
    return samples, time.perf_counter() - start


async def contended(op, limiter) -> tuple[list[int], float]:
    samples: list[int] = []
    per_task = OPS // TASKS

    async def task() -> None:
        for _ in range(per_task):
            samples.append(await op(limiter))
            await asyncio.sleep(0)

    start = time.perf_counter()
    await asyncio.gather(*(task() for _ in range(TASKS)))
    return samples, time.perf_counter() - start


def limiters():
    big = 10**12
    t = tollgate.Limiter(scopes={"openai": {"rpm": big, "tpm": big}})
    a = AsyncLimiter(max_rate=big, time_period=60)
    return t, a


async def main() -> None:
    print(f"python {sys.version.split()[0]}, tollgate {tollgate.__version__}, {OPS:,} operations each")
    for label, run in [("uncontended", uncontended), (f"{TASKS} tasks", contended)]:
        t, a = limiters()
        samples, wall = await run(tollgate_op, t)
        print(summary(f"tollgate acquire+settle, {label}", samples, wall))
        samples, wall = await run(aiolimiter_op, a)
        print(summary(f"aiolimiter acquire, {label}", samples, wall))
        assert t.snapshot()["idle"]


if __name__ == "__main__":
    asyncio.run(main())
