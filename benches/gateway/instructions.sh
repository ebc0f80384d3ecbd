#!/usr/bin/env bash
# User-space instructions per request of the gateway, counted by valgrind's
# callgrind: a figure that, unlike CPU time on a shared VM, hardly moves
# from run to run, for comparing two builds of the hot path. Not run in CI;
# see BENCHMARKS.md, "Instructions per request".
#
#   benches/gateway/instructions.sh                     # one-shot, target/dist/tollgate
#   MODE=stream benches/gateway/instructions.sh
#   TOLLGATE=/path/to/other/tollgate benches/gateway/instructions.sh
#   TELEMETRY=1 benches/gateway/instructions.sh         # [telemetry] on, every
#       span exported to tollgate-telemetry's example otlp_sink (port 18196)
#   callgrind_annotate --inclusive=yes <work dir>/callgrind.out.*   # where they go
#
# The simulator runs natively on port 18191, the gateway under callgrind on
# port 18192 (benches/gateway/gateway.toml, two connection threads). After a
# warm-up outside the count, `tollgate-loadgen` sends a closed loop of 4
# connections for DURATION; the figure is the instructions counted over
# that time divided by the responses. What the kernel does is not counted
# (system calls are about as many as nginx's, see BENCHMARKS.md), and a
# `rep movsb` copy counts each byte, so large moves of futures weigh more
# here than in time. Needs: valgrind (Debian: apt-get install -y valgrind),
# curl, python3, and `cargo build --profile dist -p tollgate-cli -p
# tollgate-loadgen` (and `-p tollgate-telemetry --example otlp_sink`).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOLLGATE=${TOLLGATE:-$ROOT/target/dist/tollgate}
LOADGEN=${LOADGEN:-$ROOT/target/dist/tollgate-loadgen}
MODE=${MODE:-oneshot}
TELEMETRY=${TELEMETRY:-0}
SINK=${SINK:-$ROOT/target/dist/examples/otlp_sink}
DURATION=${DURATION:-20s}
SIM_PORT=18191
PORT=18192
WORK=$(mktemp -d /tmp/tollgate-instructions.XXXXXX)

"$TOLLGATE" sim --listen 127.0.0.1:$SIM_PORT >"$WORK/sim.log" 2>&1 &
SIM=$!
GW=
SINK_PID=
cleanup() {
  [[ -n $GW ]] && kill "$GW" 2>/dev/null || true
  [[ -n $SINK_PID ]] && kill "$SINK_PID" 2>/dev/null || true
  kill "$SIM" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

sed -e "s/^\[server\]\$/[server]\nconnection_threads = 2/" \
  -e "s/127.0.0.1:18182/127.0.0.1:$PORT/" -e "s/127.0.0.1:18181/127.0.0.1:$SIM_PORT/" \
  "$ROOT/benches/gateway/gateway.toml" >"$WORK/gateway.toml"
if [[ $TELEMETRY == 1 ]]; then
  "$SINK" 127.0.0.1:18196 >"$WORK/sink.log" 2>&1 &
  SINK_PID=$!
  printf '\n[telemetry]\nendpoint = "http://127.0.0.1:18196"\nservice_name = "bench"\n' \
    >>"$WORK/gateway.toml"
fi
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/callgrind.out" \
  "$TOLLGATE" serve --config "$WORK/gateway.toml" >/dev/null 2>"$WORK/valgrind.log" &
GW=$!
for _ in $(seq 120); do
  curl -sf -o /dev/null "http://127.0.0.1:$PORT/healthz" && break
  sleep 1
done

export TOLLGATE_LOADGEN_API_KEY=sk-bench-gateway
FLAGS=(--concurrency 4)
[[ $MODE == stream ]] && FLAGS+=(--stream)
load() {
  "$LOADGEN" --url "http://127.0.0.1:$PORT/v1/chat/completions" --model sim-chat \
    "${FLAGS[@]}" --duration "$1"
}
load 5s >/dev/null
callgrind_control -i on "$GW" >/dev/null 2>&1
load "$DURATION" >"$WORK/loadgen.json"
callgrind_control -i off "$GW" >/dev/null 2>&1
callgrind_control -d "$GW" >/dev/null 2>&1
sleep 1
kill -INT "$GW"
wait "$GW" 2>/dev/null || true
GW=

python3 - "$WORK" <<'EOF'
import glob, json, sys
work = sys.argv[1]
ok = json.load(open(f"{work}/loadgen.json"))["ok"]
total = 0
for path in glob.glob(f"{work}/callgrind.out*"):
    for line in open(path, errors="replace"):
        if line.startswith("totals:"):
            total += int(line.split()[1])
print(f"responses {ok}  instructions {total}  per response {total // max(ok, 1)}")
print(f"work directory: {work}")
EOF
