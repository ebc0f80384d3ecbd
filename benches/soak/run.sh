#!/usr/bin/env bash
# Soak of `tollgate serve` (SPEC GW-6, GW-16, GW-17, OBS-1; issue 10): a
# fixed number of requests, one-shot and streaming, from well-behaved
# clients and from clients that cancel at random points or stop reading
# their stream, against two fault-injecting simulators; then the checks of
# `tollgate-soak` (see crates/tollgate-loadgen/src/soak/main.rs) and a
# bounded SIGTERM shutdown. Not run in CI; see BENCHMARKS.md, "Soak".
#
#   benches/soak/run.sh                          # 200,000 requests, ~5 min
#   REQUESTS=20000 benches/soak/run.sh           # a quick one (~1.5 min)
#   SEED=7 RATE=800 SKIP_BUILD=1 benches/soak/run.sh
#
# Everything listens on 127.0.0.1 only, on the fixed ports 18281 (slow
# simulator), 18283 (bulk simulator) and 18282 (gateway, see
# gateway.toml); they must be free. The run stops by itself: after
# REQUESTS requests, or at MAX_DURATION. Exit status 0 only when every
# check held. Needs: cargo, curl, python3, Linux (/proc).
# Results (report.json, logs, /stats, /metrics) stay in the printed work
# directory.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/benches/soak
cd "$ROOT"

REQUESTS=${REQUESTS:-200000}
RATE=${RATE:-1000}               # requests scheduled per second
CONCURRENCY=${CONCURRENCY:-256}  # most requests in flight
SEED=${SEED:-1}
MAX_DURATION=${MAX_DURATION:-30m}
SKIP_BUILD=${SKIP_BUILD:-0}
TOLLGATE=${TOLLGATE:-$ROOT/target/release/tollgate}
SOAK=${SOAK:-$ROOT/target/release/tollgate-soak}

SLOW_PORT=18281
GW_PORT=18282
BULK_PORT=18283
export TOLLGATE_SOAK_API_KEY=sk-soak          # gateway.toml holds its hash
export TOLLGATE_SOAK_ADMIN_KEY=soak-admin-key

# Simulator faults, the same on both: 5 % 5xx (500 or 503), 2 % of streams
# cut mid-way, 2 % of responses with headers held back 300 ms.
FAULTS=(--error-rate 0.05 --disconnect-rate 0.02 --slow-headers-rate 0.02 --slow-headers-delay 300ms)

WORK=$(mktemp -d /tmp/tollgate-soak.XXXXXX)
# shellcheck source=../lib.sh
source "$ROOT/benches/lib.sh"
trap 'stop_pids; echo "results: $WORK" >&2' EXIT
trap 'exit 130' INT TERM

require_free_ports "$SLOW_PORT" "$GW_PORT" "$BULK_PORT"

if [[ $SKIP_BUILD != 1 ]]; then
  cargo build --release -p tollgate-cli -p tollgate-loadgen
fi

# --- servers -------------------------------------------------------------
# slow: 2 ms to the first token, then 1 ms per token (a stalled stream of
# n tokens cannot end before n ms; the soak's --per-token says so).
"$TOLLGATE" sim --listen 127.0.0.1:$SLOW_PORT --seed "$SEED" "${FAULTS[@]}" \
  --ttft 2ms --per-token 1ms --completion-tokens 4000 >"$WORK/sim-slow.log" 2>&1 &
SLOW_PID=$!
PIDS+=("$SLOW_PID")
# bulk: 20 ms to the first token (longer than any impatient client's
# deadline), then as fast as it can, up to 30,000 tokens (the large
# stalled streams, megabytes: more than the sockets and the gateway buffer).
"$TOLLGATE" sim --listen 127.0.0.1:$BULK_PORT --seed "$((SEED + 1))" "${FAULTS[@]}" \
  --ttft 20ms --per-token 0s --completion-tokens 30000 >"$WORK/sim-bulk.log" 2>&1 &
BULK_PID=$!
PIDS+=("$BULK_PID")
wait_port $SLOW_PORT
wait_port $BULK_PORT

"$TOLLGATE" serve --config "$HERE/gateway.toml" >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
wait_port $GW_PORT
sleep 1

# Each process's CPU ticks so far (cpu_ticks, benches/lib.sh).
CPU0=("$(cpu_ticks "$GW_PID")" "$(cpu_ticks "$SLOW_PID")" "$(cpu_ticks "$BULK_PID")")

echo "== soak: $REQUESTS requests at $RATE/s, seed $SEED (gateway pid $GW_PID, work $WORK)"
echo "   $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
STATUS=0
"$SOAK" --url "http://127.0.0.1:$GW_PORT" --gateway-pid "$GW_PID" \
  --requests "$REQUESTS" --rate "$RATE" --concurrency "$CONCURRENCY" --seed "$SEED" \
  --max-duration "$MAX_DURATION" --per-token 1ms --bulk-stall-tokens 25000 \
  --report "$WORK/report.json" >/dev/null || STATUS=$?

echo "{\"gateway_cpu_seconds\": $(( $(cpu_ticks "$GW_PID") - CPU0[0] ))e-2, \
\"sim_slow_cpu_seconds\": $(( $(cpu_ticks "$SLOW_PID") - CPU0[1] ))e-2, \
\"sim_bulk_cpu_seconds\": $(( $(cpu_ticks "$BULK_PID") - CPU0[2] ))e-2}" >"$WORK/cpu.json"
curl -fsS "http://127.0.0.1:$SLOW_PORT/stats" >"$WORK/sim-slow.stats.json" || true
curl -fsS "http://127.0.0.1:$BULK_PORT/stats" >"$WORK/sim-bulk.stats.json" || true
curl -fsS "http://127.0.0.1:$GW_PORT/metrics" >"$WORK/gateway-metrics.txt" || true
grep -E '^Vm(RSS|HWM)' "/proc/$GW_PID/status" >"$WORK/gateway-rss-end.txt" || true

# --- bounded shutdown: SIGTERM while clients hold streams they do not
# read (two large ones on sim-bulk, whose writes block, and two long ones
# on sim-chat, all with a 60 s deadline) must end the gateway within its
# grace (5 s) plus 5 s.
python3 - "$GW_PORT" >"$WORK/holders.log" 2>&1 <<'PY' &
import json, socket, sys, time
socks = []
for model, tokens in (("sim-bulk", 25000), ("sim-bulk", 25000), ("sim-chat", 4000), ("sim-chat", 4000)):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    s.connect(("127.0.0.1", int(sys.argv[1])))
    body = json.dumps({"model": model, "max_tokens": tokens, "stream": True,
                       "messages": [{"role": "user", "content": "hold"}]})
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer sk-soak\r\nContent-Type: application/json\r\n"
               f"x-request-timeout: 60\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    socks.append(s)
print("holding", len(socks), "unread streams", flush=True)
time.sleep(60)
PY
HOLDERS=$!
PIDS+=("$HOLDERS")
sleep 1.5
curl -fsS -H "Authorization: Bearer $TOLLGATE_SOAK_ADMIN_KEY" \
  "http://127.0.0.1:$GW_PORT/admin/snapshot" >"$WORK/snapshot-before-sigterm.json" || true
ACTIVE=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['tenants']['active'])" \
  "$WORK/snapshot-before-sigterm.json" 2>/dev/null || echo "?")
T0=$(date +%s.%N)
kill -TERM "$GW_PID"
SHUTDOWN_OK=0
for _ in $(seq 100); do
  if ! kill -0 "$GW_PID" 2>/dev/null; then SHUTDOWN_OK=1; break; fi
  sleep 0.1
done
SHUTDOWN_S=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$T0" "$(date +%s.%N)")
kill "$HOLDERS" 2>/dev/null || true
if [[ $SHUTDOWN_OK == 1 ]]; then
  wait "$GW_PID" 2>/dev/null || true
  echo "shutdown: with $ACTIVE calls active (unread streams), the gateway exited ${SHUTDOWN_S} s after SIGTERM (bound: 10 s)"
else
  echo "shutdown: FAILED, with $ACTIVE calls active (unread streams), the gateway still runs ${SHUTDOWN_S} s after SIGTERM (bound: 10 s)" >&2
  [[ $STATUS != 0 ]] || STATUS=1
fi
echo "{\"active_at_sigterm\": \"$ACTIVE\", \"exited\": $SHUTDOWN_OK, \"seconds\": $SHUTDOWN_S}" >"$WORK/shutdown.json"

if [[ -s $WORK/report.json ]]; then
  python3 "$HERE/summarize.py" "$WORK"
fi
exit "$STATUS"
