#!/usr/bin/env bash
# Two gateway builds against each other in many short alternating runs:
# for a difference of a few percent, smaller than what this shared VM's
# speed drifts by over the minutes of run.sh's rounds. Both gateways run
# side by side (benches/gateway/gateway.toml on two connection threads,
# build A on port 18182, build B on 18184) in front of one simulator
# (18181); each round runs `tollgate-loadgen` against A then B, or B then
# A, and reads each gateway's CPU ticks from /proc around its run. Prints
# every run, then B / A of responses/s and of CPU µs per response: the
# mean of the rounds' ratios with its standard error, and their median.
# Not run in CI; see BENCHMARKS.md.
#
#   benches/gateway/ab.sh <build A> <build B> [rounds] [loadgen arguments]
#   benches/gateway/ab.sh old/tollgate target/dist/tollgate 30 --concurrency 64 --duration 3s
#   benches/gateway/ab.sh old/tollgate target/dist/tollgate 24 --stream --concurrency 64 --duration 3s
#
# Needs: python3, and `cargo build --profile dist -p tollgate-loadgen`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/benches/gateway
# shellcheck source=../lib.sh
source "$ROOT/benches/lib.sh"
A=${1:?build A}
B=${2:?build B}
ROUNDS=${3:-30}
[[ $ROUNDS =~ ^[0-9]+$ ]] && (( ROUNDS >= 2 )) ||
  { echo "rounds: a number of at least 2, not '$ROUNDS'" >&2; exit 1; }
shift $(( $# < 3 ? $# : 3 ))
ARGS=("$@")
(( ${#ARGS[@]} )) || ARGS=(--concurrency 64 --duration 3s)
LOADGEN=${LOADGEN:-${CARGO_TARGET_DIR:-$ROOT/target}/dist/tollgate-loadgen}
WORK=$(mktemp -d /tmp/tollgate-ab.XXXXXX)
export TOLLGATE_LOADGEN_API_KEY=sk-bench-gateway

require_free_ports 18181 18182 18184
sed "s/^\[server\]\$/[server]\nconnection_threads = 2/" "$HERE/gateway.toml" >"$WORK/a.toml"
sed 's/127.0.0.1:18182/127.0.0.1:18184/' "$WORK/a.toml" >"$WORK/b.toml"

trap 'stop_pids; echo "results: $WORK" >&2' EXIT
# The gateways' access lines (stdout) go to /dev/null: the gateway
# still formats and writes them (a file's page-cache copy is left out),
# and no log file grows by hundreds of MB a run. Stderr stays in $WORK.
"$A" sim --listen 127.0.0.1:18181 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
"$A" serve --config "$WORK/a.toml" >/dev/null 2>"$WORK/a.log" &
GA=$!
PIDS+=($GA)
"$B" serve --config "$WORK/b.toml" >/dev/null 2>"$WORK/b.log" &
GB=$!
PIDS+=($GB)
for port in 18181 18182 18184; do
  wait_port "$port"
done

# CPU ticks of gateway $1, which must still run.
ticks() {
  kill -0 "$1" 2>/dev/null || { echo "gateway $1 exited (see $WORK/*.log)" >&2; exit 1; }
  cpu_ticks "$1"
}

# One run: label, gateway pid, port.
run() {
  local before after
  before=$(ticks "$2")
  "$LOADGEN" --url "http://127.0.0.1:$3/v1/chat/completions" --model sim-chat \
    "${ARGS[@]}" >"$WORK/run.json"
  after=$(ticks "$2")
  python3 - "$1" $((after - before)) "$(getconf CLK_TCK)" "$WORK/run.json" <<'PY'
import json, sys
label, ticks, hz, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
d = json.load(open(path))
failed = sum(d["non_2xx"].values()) + d["errors"]
print(label, round(d["ok_rate"]), round(ticks * 1e6 / hz / max(d["ok"], 1), 1), failed, flush=True)
PY
}

run warm-A $GA 18182 >/dev/null
run warm-B $GB 18184 >/dev/null
for r in $(seq "$ROUNDS"); do
  if (( r % 2 )); then
    run A $GA 18182
    run B $GB 18184
  else
    run B $GB 18184
    run A $GA 18182
  fi
done | tee "$WORK/runs.txt"

python3 - "$WORK/runs.txt" <<'PY'
import math, statistics as st, sys
rows = [line.split() for line in open(sys.argv[1])]
a = [r for r in rows if r[0] == "A"]
b = [r for r in rows if r[0] == "B"]
print(f"failed responses: A {sum(int(r[3]) for r in a)}, B {sum(int(r[3]) for r in b)}")
for i, name in ((1, "responses/s"), (2, "CPU us per response")):
    x = [float(r[i]) for r in a]
    y = [float(r[i]) for r in b]
    ratios = [q / p for p, q in zip(x, y)]
    se = st.stdev(ratios) / math.sqrt(len(ratios))
    print(f"{name}: A {st.median(x):.1f}, B {st.median(y):.1f} (medians); "
          f"B / A {st.mean(ratios):.3f} (se {se:.3f}), median {st.median(ratios):.3f}, "
          f"{len(ratios)} rounds")
PY
