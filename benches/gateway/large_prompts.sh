#!/usr/bin/env bash
# Small requests' latency while other clients send large prompts (GW-17):
# four clients post a 1 MB prompt (one run of letters, the tokenizer's
# slowest input, for model `gpt-4o`) back to back, while tollgate-loadgen
# sends small chat requests in an open loop of 50/s for 10 s. Prints the
# load generator's latency figures (ms). See BENCHMARKS.md, "Large
# prompts beside small requests".
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
} >"$WORK/gateway.toml"

"$TOLLGATE" sim --listen 127.0.0.1:18181 >"$WORK/sim.log" 2>&1 & PIDS+=($!)
"$TOLLGATE" serve --config "$WORK/gateway.toml" >"$WORK/gateway.log" 2>&1 & PIDS+=($!)
wait_port 18181
wait_port 18182

export TOLLGATE_LOADGEN_API_KEY=sk-bench-gateway
big() {
  curl -s -o /dev/null -w '%{http_code}\n' -H "authorization: Bearer $TOLLGATE_LOADGEN_API_KEY" \
    -H 'content-type: application/json' --data-binary @"$WORK/big.json" \
    http://127.0.0.1:18182/v1/chat/completions
}
[[ $(big) == 200 ]] || { echo "a large prompt was not answered 200" >&2; exit 1; }
for _ in 1 2 3 4; do
  (while true; do big >>"$WORK/big.codes"; done) & PIDS+=($!)
done
sleep 1
"$LOADGEN" --url http://127.0.0.1:18182/v1/chat/completions --model sim-chat \
  --rate 50 --concurrency 8 --duration 10s >"$WORK/small.json"
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
small = json.load(open(f"{work}/small.json"))
codes = open(f"{work}/big.codes").read().split()
lat = small["latency_ms"]
print(f"small: {small['ok']} ok, {small['errors']} errors; latency ms p50 {lat['p50']}, "
      f"p90 {lat['p90']}, p99 {lat['p99']}, max {lat['max']}")
print(f"large prompts answered: {len(codes)} ({codes.count('200')} with 200)")
print(f"work directory: {work}")
PY
