"""One worker process of the Redis test (test_redis.py): admissions on a
limiter kept in Redis, recorded as JSON lines on stdout.

Usage: python redis_worker.py URL SECONDS SEED
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import tollgate

REQUESTS = 20
TOKENS = 2_000
LIMITS = {
    "shared": {
        "limits": [
            {"requests": REQUESTS, "per": "1s"},
            {"tokens": TOKENS, "per": "1s"},
        ]
    }
}


async def main(url: str, seconds: float, seed: int) -> None:
    # A generous operation timeout: the test is about exactness, not outages,
    # and a loaded machine can take longer than the default 50 ms.
    limiter = tollgate.Limiter(
        scopes=LIMITS, quota_store={"backend": "redis", "url": url, "timeout": "2s"}
    )
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    records: list[tuple[float, float, int]] = []

    async def worker() -> None:
        while time.monotonic() < end:
            estimate = rng.randint(10, 300)
            asked = time.monotonic()
            try:
                async with limiter.acquire("shared", tokens=estimate, timeout=1) as lease:
                    admitted = time.monotonic()
                    charge = estimate
                    if rng.random() < 0.6:
                        charge = rng.randint(0, estimate)
                        lease.settle(total_tokens=charge)
                    await asyncio.sleep(rng.random() * 0.01)
                    records.append((asked, admitted, charge))
            except tollgate.DeadlineExceeded:
                pass

    await asyncio.gather(*(worker() for _ in range(8)))
    snap = limiter.snapshot()
    print(json.dumps({"records": records, "store": snap["scopes"]["shared"]["store"], "idle": snap["idle"]}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3])))
