#!/usr/bin/env python3
"""A plain concurrent client for a job of N chat completions (see run.sh).

`--concurrency` threads, one keep-alive HTTP/1.1 connection each, take the
next item as soon as their previous one is answered. A 429 is retried after
the server's `retry-after-ms` / `retry-after` (1 s without one), never
sooner than 50 ms, plus up to 25 % random jitter, at most `--max-retries`
times (an SDK client with a generous retry budget); any other failure loses
the item. Prints one JSON object: items ok and lost, 429s seen, and the time
from the first send to the last answer. Loopback only (127.0.0.1).
"""

import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="http://127.0.0.1:PORT/v1/chat/completions")
    p.add_argument("--key", default=None)
    p.add_argument("--items", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--model", default="gpt-4o-mini")
    p.add_argument("--prompt-chars", type=int, default=792)
    p.add_argument("--max-tokens", type=int, default=50)
    p.add_argument("--max-retries", type=int, default=100)
    p.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    args = p.parse_args()

    url = urllib.parse.urlsplit(args.url)
    if url.scheme != "http" or url.hostname not in ("127.0.0.1", "localhost"):
        raise SystemExit("loopback http URLs only")
    prompt = ("Please summarize the following customer feedback about our delivery "
              "service and recommend improvements. " * 20)[: args.prompt_chars]
    body = json.dumps({
        "model": args.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.max_tokens,
    }).encode()
    headers = {"content-type": "application/json"}
    if args.key:
        headers["authorization"] = f"Bearer {args.key}"

    lock = threading.Lock()
    state = {"next": 0, "ok": 0, "lost": 0, "seen_429": 0, "reconnects": 0, "errors": [],
             "last_end": 0.0}
    start = time.monotonic()

    def take() -> bool:
        with lock:
            if state["next"] >= args.items:
                return False
            state["next"] += 1
            return True

    def worker() -> None:
        conn = None
        while take():
            attempts = 0
            reconnected = 0
            while True:
                attempts += 1
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=args.timeout)
                    conn.request("POST", url.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    status = resp.status
                    retry_ms = resp.getheader("retry-after-ms")
                    retry_s = resp.getheader("retry-after")
                except Exception as e:
                    # A keep-alive connection the server closed: reconnect
                    # and send again (twice at most); else the item is lost.
                    conn = None
                    if reconnected < 2 and isinstance(e, (ConnectionError, http.client.RemoteDisconnected)):
                        reconnected += 1
                        attempts -= 1
                        with lock:
                            state["reconnects"] += 1
                        continue
                    with lock:
                        state["lost"] += 1
                        if len(state["errors"]) < 5:
                            state["errors"].append(repr(e))
                    break
                if status == 200:
                    with lock:
                        state["ok"] += 1
                        state["last_end"] = max(state["last_end"], time.monotonic())
                    break
                if status == 429 and attempts <= args.max_retries:
                    with lock:
                        state["seen_429"] += 1
                    if retry_ms is not None:
                        delay = float(retry_ms) / 1000.0
                    elif retry_s is not None:
                        delay = float(retry_s)
                    else:
                        delay = 1.0
                    time.sleep(max(delay, 0.05) * random.uniform(1.0, 1.25))
                    continue
                with lock:
                    if status == 429:
                        state["seen_429"] += 1
                    state["lost"] += 1
                    if len(state["errors"]) < 5:
                        state["errors"].append(f"{status}: {data[:200]!r}")
                break

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = (state["last_end"] or time.monotonic()) - start
    print(json.dumps({
        "items": args.items,
        "ok": state["ok"],
        "lost": state["lost"],
        "client_429": state["seen_429"],
        "reconnects": state["reconnects"],
        "elapsed_s": round(elapsed, 3),
        "errors": state["errors"],
    }))


if __name__ == "__main__":
    main()
