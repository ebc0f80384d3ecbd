#!/usr/bin/env bash
# Small requests' latency while other clients send large prompts (GW-17):
# four clients of tenant `bench` post a 1 MB prompt (one run of letters,
# the tokenizer's slowest input, for model `gpt-4o`) back to back, while
# tollgate-loadgen sends small chat requests in an open loop of 50/s for
# 10 s, and one client of a second tenant, `other`, posts the same large
# prompt back to back. Prints the load generator's latency figures and
# the second tenant's large-prompt latencies (ms). See BENCHMARKS.md,
# "Large prompts beside small requests" and "Large prompts from two
# tenants".
#
#   cargo build --profile dist -p tollgate-cli -p tollgate-loadgen
#   benches/gateway/large_prompts.sh                       # target/dist/tollgate
#   TOLLGATE=/path/to/other/tollgate benches/gateway/large_prompts.sh
#   THREADS=2 benches/gateway/large_prompts.sh             # server.connection_threads = 2
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOLLGATE=${TOLLGATE:-$ROOT/target/dist/tollgate}
LOADGEN=${LOADGEN:-$ROOT/target/dist/tollgate-loadgen}
THREADS=${THREADS:-}
source "$ROOT/benches/lib.sh"
WORK=$(mktemp -d /tmp/tollgate-large-prompts.XXXXXX)
trap 'stop_pids' EXIT
require_free_ports 18181 18182

python3 - "$WORK/big.json" <<'PY'
import json, sys
run = "".join(chr(ord("a") + (k * 7) % 26) for k in range(1_000_000))
body = {"model": "gpt-4o", "messages": [{"role": "user", "content": run}], "max_tokens": 16}
json.dump(body, open(sys.argv[1], "w"))
PY
{
  if [[ -n $THREADS ]]; then
    sed "s/^\[server\]\$/[server]\nconnection_threads = $THREADS/" "$ROOT/benches/gateway/gateway.toml"
  else
    cat "$ROOT/benches/gateway/gateway.toml"
  fi
  printf '\n[models.gpt-4o]\nprovider = "sim"\nscope = "bench"\n'
  # SHA-256 of "sk-bench-other".
  printf '\n[tenants.other]\nkeys_sha256 = ["%s"]\n' \
    6bd1d507399c0c2af69a9aeed0d618daa94d94d068cb203f58e43b3d1e1da5a7
} >"$WORK/gateway.toml"

"$TOLLGATE" sim --listen 127.0.0.1:18181 >"$WORK/sim.log" 2>&1 & PIDS+=($!)
"$TOLLGATE" serve --config "$WORK/gateway.toml" >/dev/null 2>"$WORK/gateway.log" & PIDS+=($!)
wait_port 18181
wait_port 18182

export TOLLGATE_LOADGEN_API_KEY=sk-bench-gateway
big() { # [KEY]: prints the status and the seconds taken
  curl -s -o /dev/null -w '%{http_code} %{time_total}\n' \
    -H "authorization: Bearer ${1:-$TOLLGATE_LOADGEN_API_KEY}" \
    -H 'content-type: application/json' --data-binary @"$WORK/big.json" \
    http://127.0.0.1:18182/v1/chat/completions
}
[[ $(big) == "200 "* ]] || { echo "a large prompt was not answered 200" >&2; exit 1; }
for _ in 1 2 3 4; do
  (while true; do big >>"$WORK/big.codes"; done) & PIDS+=($!)
done
sleep 1
(while true; do big sk-bench-other >>"$WORK/other.codes"; done) & OTHER=$!
PIDS+=($OTHER)
"$LOADGEN" --url http://127.0.0.1:18182/v1/chat/completions --model sim-chat \
  --rate 50 --concurrency 8 --duration 10s >"$WORK/small.json"
kill "$OTHER" 2>/dev/null || true
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
small = json.load(open(f"{work}/small.json"))
def answers(name):
    return [line.split() for line in open(f"{work}/{name}.codes") if len(line.split()) == 2]
codes = [c for c, _ in answers("big")]
lat = small["latency_ms"]
print(f"small: {small['ok']} ok, {small['errors']} errors; latency ms p50 {lat['p50']}, "
      f"p90 {lat['p90']}, p99 {lat['p99']}, max {lat['max']}")
print(f"large prompts answered: {len(codes)} ({codes.count('200')} with 200)")
other = answers("other")
ms = sorted(1000 * float(t) for _, t in other)
if ms:
    print(f"other tenant's large prompts: {len(ms)} ({sum(c == '200' for c, _ in other)} with 200); "
          f"latency ms p50 {ms[len(ms) // 2]:.0f}, max {ms[-1]:.0f}")
print(f"work directory: {work}")
PY
