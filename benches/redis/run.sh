#!/usr/bin/env bash
# Shared quota store benchmark (SPEC DQ-1; BENCHMARKS.md, "Shared quota
# store (Redis)"): admissions per second against a local redis-server from
# one replica and from three (separate processes, each its own backend and
# connection), the latency of one admission against the in-process store in
# the same run, and Redis round trips per admitted call, counted by the
# server (INFO commandstats: EVALSHA, EVAL, SCRIPT calls, rejected ones
# included; commands run inside the scripts are not round trips). Not run
# in CI.
#
#   benches/redis/run.sh                      # 5 s per load phase
#   SECS=10 CONCURRENCY=32 benches/redis/run.sh
#
# Needs: cargo, redis-server, redis-cli. Loopback only; port 18270 must be
# free (REDIS_PORT to change it). Outputs stay in the printed directory.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# shellcheck source=../lib.sh
source benches/lib.sh

PORT=${REDIS_PORT:-18270}
SECS=${SECS:-5}
CONCURRENCY=${CONCURRENCY:-16}
WORK=$(mktemp -d -t tollgate-redis-bench.XXXXXX)
trap stop_pids EXIT
require_free_ports "$PORT"

cargo build -q --release -p tollgate-redis --example redis_bench
BIN=$ROOT/target/release/examples/redis_bench
URL=redis://127.0.0.1:$PORT

redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
  >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$PORT"

# Client round trips so far: the scripts' EVALSHA/EVAL and SCRIPT LOAD.
trips() {
  redis-cli -p "$PORT" INFO commandstats | tr -d '\r' | awk -F'[:=,]' '
    /^cmdstat_(evalsha|eval|script)/ {
      for (i = 2; i < NF; i += 2) if ($i == "calls" || $i == "rejected_calls") s += $(i + 1)
    }
    END { print s + 0 }'
}
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$2"; }
# Warm-up admissions per process (see the binary): counted in round trips.
WARM=100

echo "== in-process store (LocalQuota), sequential"
LOCAL=$("$BIN" local | tee "$WORK/local.txt")
echo "$LOCAL"

# One phase from one process: its line, and round trips per admitted call.
phase() {
  local title=$1 out=$2
  shift 2
  echo "== $title"
  local before after line n
  before=$(trips)
  line=$("$BIN" "$@" | tee "$WORK/$out.txt")
  after=$(trips)
  echo "$line"
  n=$(field admitted "$line")
  echo "round trips per admitted call: $(awk -v t=$((after - before)) -v n=$((n + WARM)) 'BEGIN { printf "%.3f", t / n }')"
}

phase "redis, one connection, one call at a time" latency latency "$URL"
phase "redis, one replica, $CONCURRENCY concurrent calls, ${SECS} s" one load "$URL" "$SECS" "$CONCURRENCY"
phase "through the engine: one replica's AdmissionController, $CONCURRENCY concurrent calls, ${SECS} s" \
  engine engine "$URL" "$SECS" "$CONCURRENCY"

echo "== redis, three replicas (processes), $CONCURRENCY concurrent calls each, ${SECS} s"
before=$(trips)
LOADS=()
for r in 1 2 3; do
  "$BIN" load "$URL" "$SECS" "$CONCURRENCY" >"$WORK/three-$r.txt" &
  LOADS+=($!)
done
wait "${LOADS[@]}"
after=$(trips)
total=0
for r in 1 2 3; do
  line=$(cat "$WORK/three-$r.txt")
  echo "replica $r: $line"
  total=$((total + $(field admitted "$line")))
done
echo "three replicas: $(awk -v n=$total -v s="$SECS" 'BEGIN { printf "%.0f", n / s }') admissions/s in all"
echo "round trips per admitted call: $(awk -v t=$((after - before)) -v n=$((total + 3 * WARM)) 'BEGIN { printf "%.3f", t / n }')"
echo "server time per script call (all phases): $(redis-cli -p "$PORT" INFO commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([^,]*\).*/\1/p') µs"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "outputs in $WORK"
