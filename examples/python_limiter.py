"""tollgate from Python: a limiter shared by many tasks, each call admitted
with its token estimate and settled with what it used.

    pip install crates/tollgate-py && python examples/python_limiter.py
"""

import asyncio
import random

import tollgate

limiter = tollgate.Limiter(
    scopes={"openai": {"limits": [{"requests": 20, "per": "1s"}, {"tokens": 4000, "per": "1s"}]}},
    concurrency=8,
)


async def one_call(i: int) -> None:
    estimate = random.randint(50, 400)
    try:
        async with limiter.acquire("openai", tokens=estimate, timeout=5) as lease:
            await asyncio.sleep(0.05)  # the provider call
            lease.settle(input_tokens=estimate // 2, output_tokens=10)
    except tollgate.DeadlineExceeded as e:
        print(f"call {i}: {e.code}, retry after {e.retry_after:.2f}s")


async def main() -> None:
    await asyncio.gather(*(one_call(i) for i in range(60)))
    snapshot = limiter.snapshot()
    print("idle:", snapshot["idle"], "admitted:", snapshot["scopes"]["openai"]["counters"]["admitted"])


asyncio.run(main())
