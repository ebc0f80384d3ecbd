#!/usr/bin/env python3
"""The naive batch client the benchmark compares against: a fixed number of
worker threads, each takes the next line and POSTs it; on a 429 it sleeps
for the server's retry-after (retry-after-ms when given) and tries again,
with no limit of its own and no progress file. This is the pattern of the
widely copied parallel-processor scripts, minus their fixed 15 s pause.

    naive.py BASE_URL INPUT.jsonl OUTPUT.jsonl CONCURRENCY

Prints one JSON object: wall time, requests sent, 429s seen.
"""
import json
import sys
import threading
import time
import urllib.error
import urllib.request


def main():
    base, inp, out, conc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with open(inp) as f:
        items = [json.loads(l) for l in f if l.strip()]
    lock = threading.Lock()
    state = {"next": 0, "sent": 0, "r429": 0, "failed": 0}
    results = []

    def worker():
        while True:
            with lock:
                i = state["next"]
                state["next"] += 1
            if i >= len(items):
                return
            item = items[i]
            body = json.dumps(item["body"]).encode()
            while True:
                req = urllib.request.Request(
                    base + item["url"].removeprefix("/v1"), data=body,
                    headers={"Content-Type": "application/json"})
                with lock:
                    state["sent"] += 1
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        payload = json.loads(r.read())
                    with lock:
                        results.append({"custom_id": item["custom_id"],
                                        "response": {"status_code": 200, "body": payload}})
                    break
                except urllib.error.HTTPError as e:
                    if e.code == 429:
                        with lock:
                            state["r429"] += 1
                        ms = e.headers.get("retry-after-ms")
                        s = e.headers.get("retry-after")
                        delay = float(ms) / 1000 if ms else float(s or 1)
                        time.sleep(delay)
                        continue
                    with lock:
                        state["failed"] += 1
                    break

    start = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    with open(out, "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print(json.dumps({"wall_time_s": wall, "requests_sent": state["sent"],
                      "client_429s": state["r429"], "failed": state["failed"],
                      "succeeded": len(results)}))


if __name__ == "__main__":
    main()
