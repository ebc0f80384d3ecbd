#!/usr/bin/env bash
# Gateway overhead benchmark: the same load against the simulator directly,
# through `tollgate serve` (admission on) and through nginx as a plain
# reverse proxy. Not run in CI; see BENCHMARKS.md, "Gateway overhead".
#
#   benches/gateway/run.sh                 # 5 rounds, about 14 minutes
#   ROUNDS=3 RATE=2000 benches/gateway/run.sh
#   # another gateway binary and configuration, e.g. a build from before
#   # deployments existed (without the three-deployment path):
#   TOLLGATE=/path/to/old/tollgate GATEWAY_CONFIG=old.toml \
#     GATEWAY_PATHS="direct gateway nginx" benches/gateway/run.sh
#   # only the streams, with a second gateway binary ("baseline", same
#   # configuration, its own port) in the same rounds as the first:
#   SECTIONS=stream BASELINE=/path/to/old/tollgate \
#     GATEWAY_PATHS="direct gateway baseline nginx" benches/gateway/run.sh
#   # the same binary on two serving modes (GATEWAY_THREADS: connection
#   # threads for the gateway; BASELINE_CONFIG for another configuration):
#   BASELINE=target/release/tollgate GATEWAY_THREADS=2 \
#     GATEWAY_PATHS="gateway baseline nginx" benches/gateway/run.sh
#   # telemetry on against off: path gateway-otel is a second gateway, same
#   # configuration plus [telemetry] exporting every span to a local
#   # OTLP/HTTP receiver that discards them (tollgate-telemetry's example
#   # otlp_sink, port 18186), on port 18185:
#   GATEWAY_PATHS="gateway gateway-otel nginx" benches/gateway/run.sh
#   # (for telemetry's cost at saturation alone, benches/gateway/telemetry.sh
#   # alternates much shorter runs: less of the machine's drift)
#
# Needs: cargo, nginx (Debian: apt-get install -y nginx; the service need
# not run), curl, python3. Uses the fixed ports 18181 (simulator), 18182
# (gateway, see gateway.toml) and 18183 (nginx, see nginx.conf); they must
# be free. Results (every loadgen JSON, /stats, /metrics, RSS samples) stay
# in the printed work directory.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/benches/gateway
cd "$ROOT"

ROUNDS=${ROUNDS:-5}
RATE=${RATE:-2000}                       # one-shot open loop, requests/s
DURATION=${DURATION:-15s}
STREAM_RATE=${STREAM_RATE:-1000}         # streaming open loop, streams/s
STREAM_DURATION=${STREAM_DURATION:-15s}
MAX_CONCURRENCY=${MAX_CONCURRENCY:-64}   # closed loop, connections
MAX_DURATION=${MAX_DURATION:-10s}
SKIP_BUILD=${SKIP_BUILD:-0}
# The cargo profile built and run: `dist` (release plus LTO, the build to
# deploy; see Cargo.toml), or `release`.
PROFILE=${PROFILE:-dist}
# Which loads to run: fixed (one-shot open loop), stream (streams, open
# loop), max (one-shot, closed loop), maxstream (streams, closed loop).
SECTIONS=${SECTIONS:-fixed stream max maxstream}
# Another gateway binary run beside the first as path "baseline".
BASELINE=${BASELINE:-}
# Seconds to wait idle after the last run before reading the gateways'
# resident sets once more (whether memory comes back after load).
IDLE_AFTER=${IDLE_AFTER:-0}

SIM_PORT=18181
GW_PORT=18182
NGINX_PORT=18183
BASE_PORT=18184
OTEL_PORT=18185
SINK_PORT=18186
SIM=http://127.0.0.1:$SIM_PORT
declare -A URL=(
  [direct]=$SIM/v1/chat/completions
  [gateway]=http://127.0.0.1:$GW_PORT/v1/chat/completions
  [gateway3]=http://127.0.0.1:$GW_PORT/v1/chat/completions
  [nginx]=http://127.0.0.1:$NGINX_PORT/v1/chat/completions
  [baseline]=http://127.0.0.1:$BASE_PORT/v1/chat/completions
  [gateway-otel]=http://127.0.0.1:$OTEL_PORT/v1/chat/completions
)
# gateway3: the same gateway, model sim-chat-3 of three deployments.
declare -A MODEL=([direct]=sim-chat [gateway]=sim-chat [gateway3]=sim-chat-3 [nginx]=sim-chat
  [baseline]=sim-chat [gateway-otel]=sim-chat)
read -r -a PATHS <<<"${GATEWAY_PATHS:-direct gateway gateway3 nginx}"
OTEL=0
[[ " ${PATHS[*]} " == *" gateway-otel "* ]] && OTEL=1
GATEWAY_CONFIG=${GATEWAY_CONFIG:-$HERE/gateway.toml}
# The baseline's configuration (its listen address is rewritten to its own
# port): the gateway's unless given.
BASELINE_CONFIG=${BASELINE_CONFIG:-$GATEWAY_CONFIG}
# When set, `server.connection_threads` for the gateway and the baseline
# (added to a copy of their configuration), e.g. to compare serving modes.
GATEWAY_THREADS=${GATEWAY_THREADS:-}
BASELINE_THREADS=${BASELINE_THREADS:-}
# The gateway's tenant key (gateway.toml holds its hash). Sent on every
# path so that the three see the same request bytes; the simulator
# ignores it.
export TOLLGATE_LOADGEN_API_KEY=sk-bench-gateway

WORK=$(mktemp -d /tmp/tollgate-gateway-bench.XXXXXX)
# shellcheck source=../lib.sh
source "$ROOT/benches/lib.sh"
trap 'stop_pids; echo "results: $WORK" >&2' EXIT
trap 'exit 130' INT TERM

require_free_ports "$SIM_PORT" "$GW_PORT" "$NGINX_PORT" "$BASE_PORT" "$OTEL_PORT" "$SINK_PORT"
command -v nginx >/dev/null || { echo "nginx not found (apt-get install -y nginx)" >&2; exit 1; }

if [[ $SKIP_BUILD != 1 ]]; then
  cargo build --profile "$PROFILE" -p tollgate-cli -p tollgate-loadgen
  if (( OTEL )); then
    cargo build --profile "$PROFILE" -p tollgate-telemetry --example otlp_sink
  fi
fi
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
TOLLGATE=${TOLLGATE:-$TARGET/$PROFILE/tollgate}  # another gateway binary to compare
LOADGEN=$TARGET/$PROFILE/tollgate-loadgen
SINK=$TARGET/$PROFILE/examples/otlp_sink

# --- servers -------------------------------------------------------------
"$TOLLGATE" sim --listen 127.0.0.1:$SIM_PORT >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_port $SIM_PORT

# A copy of configuration $1 with `connection_threads = $2` under [server]
# when $2 is set.
with_threads() {
  if [[ -n $2 ]]; then
    sed "s/^\[server\]\$/[server]\nconnection_threads = $2/" "$1"
  else
    cat "$1"
  fi
}
with_threads "$GATEWAY_CONFIG" "$GATEWAY_THREADS" >"$WORK/gateway.toml"
# The gateways' access lines (stdout) go to /dev/null: the gateway
# still formats and writes them (a file's page-cache copy is left out),
# and no log file grows by hundreds of MB a run. Stderr stays in $WORK.
"$TOLLGATE" serve --config "$WORK/gateway.toml" >/dev/null 2>"$WORK/gateway.log" &
GW_PID=$!
PIDS+=("$GW_PID")
wait_port $GW_PORT

BASE_PID=
if [[ -n $BASELINE ]]; then
  with_threads "$BASELINE_CONFIG" "$BASELINE_THREADS" |
    sed "s/^listen = \"127.0.0.1:$GW_PORT\"/listen = \"127.0.0.1:$BASE_PORT\"/" \
      >"$WORK/baseline.toml"
  "$BASELINE" serve --config "$WORK/baseline.toml" >/dev/null 2>"$WORK/baseline.log" &
  BASE_PID=$!
  PIDS+=("$BASE_PID")
  wait_port $BASE_PORT
fi

OTEL_PID=
if (( OTEL )); then
  "$SINK" 127.0.0.1:$SINK_PORT >"$WORK/sink.log" 2>&1 &
  PIDS+=($!)
  wait_port $SINK_PORT
  # The gateway's configuration (its serving mode included) plus [telemetry].
  { sed "s/^listen = \"127.0.0.1:$GW_PORT\"/listen = \"127.0.0.1:$OTEL_PORT\"/" "$WORK/gateway.toml"
    telemetry_section "$SINK_PORT" bench-gateway-otel
  } >"$WORK/gateway-otel.toml"
  "$TOLLGATE" serve --config "$WORK/gateway-otel.toml" >/dev/null 2>"$WORK/gateway-otel.log" &
  OTEL_PID=$!
  PIDS+=("$OTEL_PID")
  wait_port $OTEL_PORT
fi

mkdir -p "$WORK/nginx"
nginx -p "$WORK/nginx" -c "$HERE/nginx.conf" >"$WORK/nginx.log" 2>&1 &
NGINX_PID=$!   # the master (daemon off); it stops its workers on TERM
PIDS+=("$NGINX_PID")
wait_port $NGINX_PORT

sleep 1
grep -E '^Vm(RSS|HWM)' /proc/$GW_PID/status >"$WORK/gateway-rss-idle.txt"
if [[ -n $BASE_PID ]]; then
  grep -E '^Vm(RSS|HWM)' /proc/$BASE_PID/status >"$WORK/baseline-rss-idle.txt"
fi

SIM_PID=${PIDS[0]}
declare -A PROC=([direct]=$SIM_PID [gateway]=$GW_PID [gateway3]=$GW_PID [nginx]=$NGINX_PID
  [baseline]=${BASE_PID:-$GW_PID} [gateway-otel]=${OTEL_PID:-$GW_PID})

# One loadgen run: NAME PATH [loadgen flags...]. Writes NAME.json plus the
# simulator's /stats and the proxies' and simulator's CPU ticks.
run() {
  local name=$1 path=$2
  shift 2
  curl -fsS -XPOST "$SIM/reset" >/dev/null
  local s0 p0
  s0=$(cpu_ticks "$SIM_PID")
  p0=$(cpu_ticks "${PROC[$path]}")
  "$LOADGEN" --url "${URL[$path]}" --model "${MODEL[$path]}" "$@" >"$WORK/$name.json"
  echo "{\"sim_cpu_ticks\": $(($(cpu_ticks "$SIM_PID") - s0)), \"proxy_cpu_ticks\": $(($(cpu_ticks "${PROC[$path]}") - p0))}" \
    >"$WORK/$name.cpu.json"
  curl -fsS "$SIM/stats" >"$WORK/$name.stats.json"
  python3 - "$WORK/$name.json" "$name" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
l = d["latency_ms"]
t = d["ttft_ms"] or {}
ttft = f" ttft p50 {t['p50']} p99 {t['p99']}" if t else ""
print(f"{sys.argv[2]:<20} {d['ok_rate']:>9.1f}/s p50 {l['p50']} p99 {l['p99']}{ttft}"
      f" non_2xx {d['non_2xx']} errors {d['errors']}")
PY
}

# Rotate the order of the paths from round to round.
order() {
  local r=$1 i n=${#PATHS[@]}
  for i in $(seq 0 $((n - 1))); do echo "${PATHS[$(((i + r) % n))]}"; done
}

echo "== warm-up (discarded)"
for path in "${PATHS[@]}"; do
  run "warmup-$path" "$path" --rate "$RATE" --duration 3s
done

section() { [[ " $SECTIONS " == *" $1 "* ]]; }

if section fixed; then
echo "== one-shot, open loop, $RATE/s for $DURATION"
for r in $(seq "$ROUNDS"); do
  for path in $(order "$r"); do
    run "fixed-$path-$r" "$path" --rate "$RATE" --duration "$DURATION"
  done
done
fi

if section stream; then
echo "== streaming, open loop, $STREAM_RATE/s for $STREAM_DURATION"
for r in $(seq "$ROUNDS"); do
  for path in $(order "$r"); do
    run "stream-$path-$r" "$path" --rate "$STREAM_RATE" --duration "$STREAM_DURATION" --stream
  done
done
fi

if section max; then
echo "== one-shot, closed loop, $MAX_CONCURRENCY connections for $MAX_DURATION"
for r in $(seq "$ROUNDS"); do
  for path in $(order "$r"); do
    if [[ $path == gateway || $path == gateway3 ]]; then
      # Sample the gateway's resident set every 100 ms during the run.
      (while kill -0 "$GW_PID" 2>/dev/null; do
         awk '/^VmRSS/ {print $2}' /proc/$GW_PID/status
         sleep 0.1
       done) >"$WORK/max-$path-$r.rss.txt" &
      SAMPLER=$!
      run "max-$path-$r" "$path" --concurrency "$MAX_CONCURRENCY" --duration "$MAX_DURATION"
      kill "$SAMPLER"
      wait "$SAMPLER" 2>/dev/null || true
    else
      run "max-$path-$r" "$path" --concurrency "$MAX_CONCURRENCY" --duration "$MAX_DURATION"
    fi
  done
done
fi

if section maxstream; then
echo "== streams, closed loop, $MAX_CONCURRENCY connections for $MAX_DURATION"
for r in $(seq "$ROUNDS"); do
  for path in $(order "$r"); do
    run "maxstream-$path-$r" "$path" --stream --concurrency "$MAX_CONCURRENCY" --duration "$MAX_DURATION"
  done
done
fi

sleep 2
grep -E '^Vm(RSS|HWM)' /proc/$GW_PID/status >"$WORK/gateway-rss-after.txt"
if [[ -n $BASE_PID ]]; then
  grep -E '^Vm(RSS|HWM)' /proc/$BASE_PID/status >"$WORK/baseline-rss-after.txt"
fi
if (( IDLE_AFTER > 0 )); then
  sleep "$IDLE_AFTER"
  grep -E '^Vm(RSS|HWM)' /proc/$GW_PID/status >"$WORK/gateway-rss-idle-after.txt"
  if [[ -n $BASE_PID ]]; then
    grep -E '^Vm(RSS|HWM)' /proc/$BASE_PID/status >"$WORK/baseline-rss-idle-after.txt"
  fi
fi
curl -fsS "http://127.0.0.1:$GW_PORT/metrics" >"$WORK/gateway-metrics.txt"
if (( OTEL )); then
  curl -fsS "http://127.0.0.1:$OTEL_PORT/metrics" >"$WORK/gateway-otel-metrics.txt"
  curl -fsS "http://127.0.0.1:$SINK_PORT/stats" >"$WORK/sink-stats.json"
  echo "otlp_sink received: $(cat "$WORK/sink-stats.json")"
  echo "gateway-otel spans dropped: $(grep '^tollgate_telemetry_spans_dropped_total' \
    "$WORK/gateway-otel-metrics.txt" || echo '0 (none counted)')"
fi

SECTIONS="$SECTIONS" python3 "$HERE/summarize.py" "$WORK" "$ROUNDS" "${PATHS[@]}"
