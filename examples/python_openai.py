"""tollgate under the OpenAI SDK: every call of an AsyncOpenAI client
admitted, estimated, retried and settled by the engine, against the strict
simulator started in this process (no network, no key).

    pip install crates/tollgate-py openai && python examples/python_openai.py
"""

import asyncio

import openai

import tollgate
from tollgate.testing import simulator


async def main() -> None:
    # The simulated account: 20 requests and 2,000 tokens per 2 s window.
    with simulator(rpm=20, tpm=2_000, window=2) as sim:
        limiter = tollgate.Limiter(
            scopes={"openai": {"limits": [{"requests": 20, "per": "2s"}, {"tokens": 2_000, "per": "2s"}]}}
        )
        client = openai.AsyncOpenAI(
            base_url=sim.openai_base_url,
            api_key="not-needed",
            max_retries=0,  # the engine retries (within the call's deadline)
            http_client=tollgate.httpx_client(limiter, "openai", timeout=30),
        )

        async def ask(i: int) -> str:
            reply = await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"Question {i}"}], max_tokens=32
            )
            return reply.choices[0].message.content

        answers = await asyncio.gather(*(ask(i) for i in range(50)))  # 2.5 windows' worth
        stats = sim.stats()
        print(f"{len(answers)} answers, {sum(stats['rejected_429'].values())} provider 429s")
        counters = limiter.snapshot()["scopes"]["openai"]["counters"]
        print(f"tokens charged by the provider {stats['tokens_charged']}, settled by tollgate {counters['tokens_reported']}")
        await client.close()


asyncio.run(main())
