#!/usr/bin/env bash
# What tracing costs the gateway at saturation (issue 25's goal: with
# telemetry on, exporting every span to a local receiver, throughput at
# most 5 % lower than off). Not run in CI; see BENCHMARKS.md, "Telemetry
# on against off, in short alternating runs".
#
# One `tollgate serve` with telemetry off (port 18182) and one with the
# same configuration plus [telemetry] exporting every span to
# tollgate-telemetry's example otlp_sink (port 18186), served from port
# 18185, both up for the whole run. Each round sends a short closed loop
# to each in turn (order alternating from round to round). On this shared
# VM the machine's speed drifts by up to a third over tens of seconds;
# rounds of a second or two see both paths under the same drift, so the
# ratio of the two paths' responses settles within a few rounds' worth of
# noise instead of a few minutes'.
#
#   benches/gateway/telemetry.sh                 # 60 rounds, about 4 minutes
#   ROUNDS=100 RUN=2s benches/gateway/telemetry.sh
#   # another build's telemetry-on path beside this one's (port 18187):
#   CANDIDATE=/path/to/other/tollgate benches/gateway/telemetry.sh
#   # this build with other [telemetry] settings beside the defaults:
#   CANDIDATE_SETTINGS='batch_size = 64' benches/gateway/telemetry.sh
#
# Needs: cargo, curl, python3. Ports 18181 (simulator), 18182, 18185,
# 18186 and 18187 must be free. Results stay in the printed directory
# (the servers' logs cut to their first and last lines).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/benches/gateway
cd "$ROOT"

ROUNDS=${ROUNDS:-60}
RUN=${RUN:-1.5s}                        # each path's closed loop per round
CONCURRENCY=${CONCURRENCY:-64}
SKIP_BUILD=${SKIP_BUILD:-0}
PROFILE=${PROFILE:-dist}
CANDIDATE=${CANDIDATE:-}
CANDIDATE_SETTINGS=${CANDIDATE_SETTINGS:-}   # lines added to the candidate's [telemetry]

SIM_PORT=18181
OFF_PORT=18182
ON_PORT=18185
SINK_PORT=18186
CANDIDATE_PORT=18187
export TOLLGATE_LOADGEN_API_KEY=sk-bench-gateway

WORK=$(mktemp -d /tmp/tollgate-telemetry-bench.XXXXXX)
# shellcheck source=../lib.sh
source "$ROOT/benches/lib.sh"
# The gateways' access lines (stdout) go to /dev/null, their stderr to
# $WORK (see ab.sh).
trap 'stop_pids; echo "results: $WORK" >&2' EXIT
trap 'exit 130' INT TERM
require_free_ports $SIM_PORT $OFF_PORT $ON_PORT $SINK_PORT $CANDIDATE_PORT

if [[ $SKIP_BUILD != 1 ]]; then
  cargo build --profile "$PROFILE" -p tollgate-cli -p tollgate-loadgen
  cargo build --profile "$PROFILE" -p tollgate-telemetry --example otlp_sink
fi
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
TOLLGATE=${TOLLGATE:-$TARGET/$PROFILE/tollgate}
LOADGEN=$TARGET/$PROFILE/tollgate-loadgen

"$TOLLGATE" sim --listen 127.0.0.1:$SIM_PORT >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
SIM_PID=$!
"$TARGET/$PROFILE/examples/otlp_sink" 127.0.0.1:$SINK_PORT >"$WORK/sink.log" 2>&1 &
PIDS+=($!)
SINK_PID=$!
wait_port $SIM_PORT
wait_port $SINK_PORT

# serve NAME PORT BINARY TELEMETRY(0|1): a gateway on PORT, gateway.toml's
# configuration, plus [telemetry] when asked.
declare -A PORT=() PID=()
serve() {
  { sed "s/^listen = \"127.0.0.1:18182\"/listen = \"127.0.0.1:$2\"/" "$HERE/gateway.toml"
    if [[ $4 == 1 ]]; then
      telemetry_section $SINK_PORT "bench-$1"
      if [[ $1 == candidate && -n $CANDIDATE_SETTINGS ]]; then
        printf '%s\n' "$CANDIDATE_SETTINGS"
      fi
    fi
  } >"$WORK/$1.toml"
  "$3" serve --config "$WORK/$1.toml" >/dev/null 2>"$WORK/$1.log" &
  PIDS+=($!)
  PID[$1]=$!
  PORT[$1]=$2
  wait_port "$2"
}
serve off $OFF_PORT "$TOLLGATE" 0
serve on $ON_PORT "$TOLLGATE" 1
NAMES=(off on)
if [[ -n $CANDIDATE || -n $CANDIDATE_SETTINGS ]]; then
  serve candidate $CANDIDATE_PORT "${CANDIDATE:-$TOLLGATE}" 1
  NAMES+=(candidate)
fi

load() { # NAME DURATION OUT
  "$LOADGEN" --url "http://127.0.0.1:${PORT[$1]}/v1/chat/completions" --model sim-chat \
    --concurrency "$CONCURRENCY" --duration "$2" >"$3"
}

for name in "${NAMES[@]}"; do
  load "$name" 2s /dev/null   # warm-up: connections, buffers, caches
done
n=${#NAMES[@]}
for r in $(seq "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    name=${NAMES[$(((r + k) % n))]}
    t0=$(cpu_ticks "${PID[$name]}")
    s0=$(cpu_ticks $SINK_PID)
    u0=$(cpu_ticks $SIM_PID)
    load "$name" "$RUN" "$WORK/$name-$r.json"
    echo "$(($(cpu_ticks "${PID[$name]}") - t0))" >"$WORK/$name-$r.ticks"
    echo "$(($(cpu_ticks $SINK_PID) - s0))" >"$WORK/$name-$r.sink"
    echo "$(($(cpu_ticks $SIM_PID) - u0))" >"$WORK/$name-$r.sim"
  done
done

for name in "${NAMES[@]:1}"; do
  curl -fsS "http://127.0.0.1:${PORT[$name]}/metrics" >"$WORK/$name-metrics.txt"
  echo "$name: $(grep '^tollgate_telemetry_spans_dropped_total' "$WORK/$name-metrics.txt" \
    || echo 'tollgate_telemetry_spans_dropped_total 0 (none counted)')"
done
echo "otlp_sink received: $(curl -fsS "http://127.0.0.1:$SINK_PORT/stats")"

python3 - "$WORK" "$ROUNDS" "${NAMES[@]}" <<'PY'
import json, statistics, sys
work, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(name, r):
    d = json.load(open(f"{work}/{name}-{r}.json"))
    ticks = lambda kind: int(open(f"{work}/{name}-{r}.{kind}").read())
    return d["ok"], d["elapsed_s"], ticks("ticks"), ticks("sink"), ticks("sim")
runs = {n: [load(n, r) for r in range(1, rounds + 1)] for n in names}
rate = {n: [run[0] / run[1] for run in runs[n]] for n in names}
print(f"{rounds} rounds; responses/s, mean (min-max); CPU µs per response: "
      "the gateway, the receiver, the simulator")
for n in names:
    ok, _, ticks, sink, sim = (sum(col) for col in zip(*runs[n]))
    print(f"  {n:9} {statistics.mean(rate[n]):8.0f} ({min(rate[n]):.0f}-{max(rate[n]):.0f})"
          f"  {ticks * 1e4 / ok:5.1f} µs  {sink * 1e4 / ok:4.1f} µs  {sim * 1e4 / ok:5.1f} µs")
def compare(a, b):
    ratios = [y / x - 1 for x, y in zip(rate[a], rate[b])]
    se = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
    total = sum(rate[b]) / sum(rate[a]) - 1
    print(f"  {b} vs {a}: all responses {100 * total:+.1f} %, per round median "
          f"{100 * statistics.median(ratios):+.1f} %, mean {100 * statistics.mean(ratios):+.1f} % "
          f"(standard error {100 * se:.1f} points)")
for n in names[1:]:
    compare("off", n)
if "candidate" in names:
    compare("on", "candidate")
PY
