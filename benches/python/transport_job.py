"""A job of five windows through the OpenAI SDK against the strict
simulator: tollgate's httpx transport next to aiolimiter + tenacity
(SPEC PY-4; BENCHMARKS.md, "Python package: an SDK job").

    target/py-venv/bin/python benches/python/transport_job.py          # W = 10 s, about 2 minutes
    W=30 target/py-venv/bin/python benches/python/transport_job.py     # about 5 minutes

The simulator (tollgate.testing.simulator, in this process) enforces
REQUESTS and TOKENS per window W on strict sliding windows, charging each
request its prompt and the completion it generates at arrival, and
answers 429 with `retry-after` past either limit. Every item is the same
chat completion (a 400-character prompt, max_tokens 32; the simulator
generates 16 tokens): 122 tokens charged, so the token limit binds. The job
is sized to 4.9 windows of the token budget; it cannot finish before
4 x W (the last part of its budget becomes available then): utilisation =
4 x W / elapsed (first send to last answer).

Both clients run 64 workers taking items off one queue, one AsyncOpenAI
client each side, the SDK's own retries off (max_retries=0):

* tollgate: `tollgate.httpx_client(limiter, "openai")` with the simulator's
  limits as the scope's limits; the engine's retries (default [retry]).
* aiolimiter + tenacity, as commonly written: `AsyncLimiter(REQUESTS, W)`
  around each call (requests only: aiolimiter has no tokens), and
  tenacity retrying `openai.RateLimitError` up to 20 times, waiting the
  server's `retry-after` (or exponential backoff with jitter without one).
"""

from __future__ import annotations

import asyncio
import math
import os
import time

import openai
from aiolimiter import AsyncLimiter
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

import tollgate
from tollgate.testing import simulator

W = float(os.environ.get("W", "10"))
REQUESTS = 100
TOKENS = 10_000
PROMPT = "x" * 400
MAX_TOKENS = 32
CHARGED = 3 + (3 + len(PROMPT) // 4) + 16  # the simulator's count: 122
WINDOWS = 4.9
ITEMS = int(WINDOWS * TOKENS / CHARGED)
WORKERS = 64
MESSAGES = [{"role": "user", "content": PROMPT}]


async def run_job(call) -> tuple[float, int]:
    """Runs ITEMS calls on WORKERS workers: elapsed seconds, lost items."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(ITEMS):
        queue.put_nowait(i)
    lost = 0

    async def worker() -> None:
        nonlocal lost
        while not queue.empty():
            queue.get_nowait()
            try:
                await call()
            except Exception as e:  # noqa: BLE001 - counted
                lost += 1
                print("lost:", type(e).__name__, e)

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    return time.monotonic() - start, lost


def sim_settings() -> dict:
    return {"rpm": REQUESTS, "tpm": TOKENS, "window": W, "completion_tokens": 16}


async def with_tollgate() -> dict:
    with simulator(**sim_settings()) as sim:
        limiter = tollgate.Limiter(
            scopes={"openai": {"limits": [
                {"requests": REQUESTS, "per": f"{int(W * 1000)}ms"},
                {"tokens": TOKENS, "per": f"{int(W * 1000)}ms"},
            ]}},
            admission={"default_timeout": "10m", "max_timeout": "10m"},
        )
        client = openai.AsyncOpenAI(
            base_url=sim.openai_base_url,
            api_key="bench",
            max_retries=0,
            http_client=tollgate.httpx_client(limiter, "openai"),
        )

        async def call() -> None:
            await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=MAX_TOKENS)

        elapsed, lost = await run_job(call)
        await client.close()
        return {"elapsed": elapsed, "lost": lost, "stats": sim.stats(),
                "client_429s": limiter.snapshot()["scopes"]["openai"]["counters"]["cooldowns"]}


def retry_after(state) -> float:
    """The server's retry-after, else exponential backoff with jitter."""
    exc = state.outcome.exception() if state.outcome else None
    response = getattr(exc, "response", None)
    if response is not None:
        for header in ("retry-after-ms", "retry-after"):
            value = response.headers.get(header)
            if value:
                try:
                    seconds = float(value) / (1000 if header.endswith("ms") else 1)
                    return seconds
                except ValueError:
                    pass
    return wait_exponential_jitter(initial=0.5, max=20)(state)


async def with_aiolimiter() -> dict:
    with simulator(**sim_settings()) as sim:
        limiter = AsyncLimiter(REQUESTS, W)
        client = openai.AsyncOpenAI(base_url=sim.openai_base_url, api_key="bench", max_retries=0)
        seen = 0

        async def call() -> None:
            nonlocal seen
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(openai.RateLimitError),
                wait=retry_after,
                stop=stop_after_attempt(20),
                reraise=True,
            ):
                with attempt:
                    async with limiter:
                        try:
                            await client.chat.completions.create(
                                model="gpt-4o-mini", messages=MESSAGES, max_tokens=MAX_TOKENS
                            )
                        except openai.RateLimitError:
                            seen += 1
                            raise

        elapsed, lost = await run_job(call)
        await client.close()
        return {"elapsed": elapsed, "lost": lost, "stats": sim.stats(), "client_429s": seen}


def row(name: str, result: dict) -> str:
    stats = result["stats"]
    bound = (math.ceil(WINDOWS) - 1) * W
    rejected = stats["rejected_429"]
    return (
        f"| {name} | {ITEMS} | {result['lost']} | {sum(rejected.values())} "
        f"(requests {rejected['rpm']}, tokens {rejected['tpm']}) | {result['client_429s']} | "
        f"{result['elapsed']:.1f} s | {bound:.0f} s | {bound / result['elapsed']:.3f} | "
        f"{stats['max_requests_in_window']} / {stats['max_tokens_in_window']} |"
    )


async def main() -> None:
    print(f"W = {W:g} s, {REQUESTS} requests and {TOKENS} tokens per window, {ITEMS} items "
          f"of {CHARGED} tokens ({WINDOWS} windows of the token budget), {WORKERS} workers")
    print("| client | items | lost | provider 429s | 429s the client saw | elapsed | bound | utilisation "
          "| most requests / tokens in one window |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(row("tollgate transport", await with_tollgate()), flush=True)
    print(row("aiolimiter + tenacity", await with_aiolimiter()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
