#!/usr/bin/env python3
"""Reproduces a defect the soak found: a stream whose deadline runs out just
after the gateway forwarded `data: [DONE]` gets one more event, a
`deadline_exceeded` error, and an aborted body.

    target/release/tollgate sim --listen 127.0.0.1:18281 --ttft 2ms --per-token 1ms &
    TOLLGATE_SOAK_ADMIN_KEY=x target/release/tollgate serve --config benches/soak/gateway.toml &
    python3 benches/soak/done_then_error.py 1500

Sends N streaming requests of 16 tokens (about 20 ms) one after another,
with `x-request-timeout` from 15 to 44 ms, so that deadlines fall on every
point of the stream, and counts the endings. Without the defect the
`error after [DONE]` count is 0.
"""

import http.client
import json
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
counts = {}
shown = 0
for i in range(n):
    timeout = 0.015 + (i % 30) * 0.001
    conn = http.client.HTTPConnection("127.0.0.1", 18282, timeout=10)
    body = json.dumps({"model": "sim-chat", "max_tokens": 16, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]})
    conn.request("POST", "/v1/chat/completions", body,
                 {"Authorization": "Bearer sk-soak", "Content-Type": "application/json",
                  "x-request-timeout": f"{timeout:.3f}"})
    response = conn.getresponse()
    data, aborted = b"", False
    try:
        while chunk := response.read1(65536):
            data += chunk
    except http.client.IncompleteRead:
        aborted = True
    text = data.decode(errors="replace")
    done, error = text.find("data: [DONE]"), text.find('data: {"error"')
    if done >= 0 and error > done:
        kind = "error after [DONE]"
        if shown < 2:
            shown += 1
            print(f"x-request-timeout {timeout:.3f}: ...{text[-300:]!r} (aborted: {aborted})")
    elif done >= 0:
        kind = "complete"
    elif error >= 0:
        kind = f"{response.status} error" + (" (aborted)" if aborted else "")
    else:
        kind = f"{response.status} other"
    counts[kind] = counts.get(kind, 0) + 1
    conn.close()
for kind, count in sorted(counts.items()):
    print(f"{count:>6}  {kind}")
sys.exit(1 if counts.get("error after [DONE]") else 0)
