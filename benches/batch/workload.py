#!/usr/bin/env python3
"""Writes a batch workload: OpenAI Batch JSONL chat requests with prompts of
varied length and varied max_tokens (seeded, reproducible).

    workload.py N OUT.jsonl [SEED]
"""
import json
import random
import sys

WORDS = ("quota window token request admission deadline retry cooldown "
         "provider stream lease refund estimate simulator batch resume").split()


def main():
    n = int(sys.argv[1])
    out = sys.argv[2]
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 7)
    with open(out, "w") as f:
        for i in range(n):
            words = rng.randint(5, 400)
            prompt = " ".join(rng.choice(WORDS) for _ in range(words))
            line = {
                "custom_id": f"item-{i:06d}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "sim-chat",
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": rng.choice([16, 32, 64, 128, 256, 512]),
                },
            }
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
