"""A process that exits right after its event loop stops while a limiter's
wakes are still on their way (test_exit.py): 256 tasks wait on a scope that
refills every millisecond, and all are cancelled at once, then the process
exits."""

import asyncio
import sys

import tollgate


async def main(seconds: float) -> None:
    limiter = tollgate.Limiter(scopes={"s": {"limits": [{"requests": 1, "per": "1ms"}]}})

    async def one() -> None:
        while True:
            async with limiter.acquire("s", tokens=1):
                pass

    tasks = [asyncio.create_task(one()) for _ in range(256)]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


asyncio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 0.1))
