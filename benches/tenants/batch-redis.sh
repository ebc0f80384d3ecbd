#!/usr/bin/env bash
# The two-tenant scenario of SPEC §15 (issue 22) across processes: the
# bulk tenant is a `tollgate batch` run and the interactive tenant goes
# through `tollgate serve`, both spending one scope of LIMIT requests per
# WINDOW kept in Redis (docs/redis.md), in front of the strict simulator
# enforcing the same limit. Each process schedules its own waiters
# (FAIR-9): the interactive calls compete with the batch runner at the
# store. Three runs, each with a fresh redis-server, simulator and
# gateway: the interactive tenant alone (one request a second), the batch
# alone (BULK items), then both (the batch, and from 2 s later one
# interactive request a second until the batch ends). Prints each run's
# summaries and the provider's 429s. Not run in CI; see BENCHMARKS.md,
# "Fair share between tenants".
#
#   benches/tenants/batch-redis.sh                        # W = 10 s, 100 per window
#   WINDOW=60s LIMIT=600 benches/tenants/batch-redis.sh   # the minute window
#   BATCH_RPM=80 benches/tenants/batch-redis.sh           # the batch leaves 20 % headroom
#   BATCH_ARGS="--limit requests=9/1s" benches/tenants/batch-redis.sh  # the batch paces itself
#
# BATCH_RPM (default LIMIT) is the batch's `--rpm` on the shared scope:
# Redis keeps one count and each process applies its own amount, so a
# lower one leaves the rest to the gateway. BATCH_ARGS are added to the
# batch's command line (a limit with another window is a key of its own
# in the store, counting the batch only). PACE/PACE_REQUESTS add a pacing
# limit to the gateway's scope as in run.sh. RUNS picks runs (default
# "interactive-alone batch-alone both"). REDIS_TIMEOUT (default 500ms) is
# both processes' bound on one Redis operation: the default 50 ms stopped
# a batch run ("quota store unavailable") on this shared 2-core machine
# under a load average of 19.
#
# Listens on 127.0.0.1:18391 (simulator), 18392 (gateway), 18393 (Redis);
# SIM_PORT, GW_PORT and REDIS_PORT change them.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

WINDOW=${WINDOW:-10s}
LIMIT=${LIMIT:-100}
BULK=${BULK:-1000}
BATCH_RPM=${BATCH_RPM:-$LIMIT}
BATCH_ARGS=${BATCH_ARGS:-}
CHATS_ALONE=${CHATS_ALONE:-20}
PACE=${PACE:-}
PACE_REQUESTS=${PACE_REQUESTS:-1}
RUNS=${RUNS:-interactive-alone batch-alone both}
SKIP_BUILD=${SKIP_BUILD:-0}
TOLLGATE=${TOLLGATE:-$ROOT/target/release/tollgate}
TENANTS=${TENANTS:-$ROOT/target/release/tollgate-tenants}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
REDIS_TIMEOUT=${REDIS_TIMEOUT:-500ms}
SIM_PORT=${SIM_PORT:-18391}
GW_PORT=${GW_PORT:-18392}
REDIS_PORT=${REDIS_PORT:-18393}
CHAT_KEY=sk-bench-interactive

WORK=$(mktemp -d /tmp/tollgate-batch-redis.XXXXXX)
# shellcheck source=../lib.sh
source "$ROOT/benches/lib.sh"
trap 'stop_pids; echo "results: $WORK" >&2' EXIT
trap 'exit 130' INT TERM
require_free_ports "$SIM_PORT" "$GW_PORT" "$REDIS_PORT"

if [[ $SKIP_BUILD != 1 ]]; then
  cargo build --release -p tollgate-cli -p tollgate-loadgen
fi

LIMITS="{ requests = $LIMIT, per = \"$WINDOW\" }"
if [[ -n $PACE ]]; then
  LIMITS="{ requests = $PACE_REQUESTS, per = \"$PACE\" }, $LIMITS"
fi

cat >"$WORK/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$GW_PORT"
access_log = false

[admission]
max_timeout = "1h"

[quota_store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT"
timeout = "$REDIS_TIMEOUT"

[providers.sim]
base_url = "http://127.0.0.1:$SIM_PORT/v1"

[scopes.shared]
limits = [$LIMITS]

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "shared"

[tenants.interactive]
keys_sha256 = ["$("$TOLLGATE" hash-key "$CHAT_KEY")"]
TOML

python3 - "$BULK" >"$WORK/in.jsonl" <<'PY'
import json, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"custom_id": f"bulk-{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "sim-chat", "max_tokens": 16,
                               "messages": [{"role": "user", "content": "Say something."}]}}))
PY

# The batch on the shared scope; its summary in $WORK/batch-NAME.json.
batch() {
  local name=$1
  # shellcheck disable=SC2086 # BATCH_ARGS is a list of arguments
  OPENAI_API_KEY=sk-bench-batch "$TOLLGATE" batch "$WORK/in.jsonl" -o "$WORK/batch-$name.jsonl" \
    --base-url "http://127.0.0.1:$SIM_PORT/v1" --rpm "$BATCH_RPM" --window "$WINDOW" \
    --redis "redis://127.0.0.1:$REDIS_PORT" --scope shared \
    --redis-timeout "$REDIS_TIMEOUT" $BATCH_ARGS \
    --item-timeout 1h --progress off --summary-json "$WORK/batch-$name.json" \
    >"$WORK/batch-$name.txt" 2>"$WORK/batch-$name.log"
}

# Fresh Redis, simulator and gateway per run: every run starts with a
# full window.
run() {
  local name=$1
  echo "== $name ($(uptime | sed 's/.*load/load/'))"
  "$REDIS_SERVER" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    >"$WORK/redis-$name.log" 2>&1 &
  PIDS+=("$!")
  wait_port "$REDIS_PORT"
  "$TOLLGATE" sim --listen "127.0.0.1:$SIM_PORT" --rpm "$LIMIT" --window "$WINDOW" \
    >"$WORK/sim-$name.log" 2>&1 &
  PIDS+=("$!")
  wait_port "$SIM_PORT"
  "$TOLLGATE" serve --config "$WORK/gateway.toml" >"$WORK/gateway-$name.log" 2>&1 &
  PIDS+=("$!")
  wait_port "$GW_PORT"
  case $name in
    interactive-alone)
      "$TENANTS" --url "http://127.0.0.1:$GW_PORT" --chat-key "$CHAT_KEY" \
        --chats "$CHATS_ALONE" --chat-after 0s >"$WORK/$name.json"
      cat "$WORK/$name.json"
      ;;
    batch-alone)
      batch "$name"
      cat "$WORK/batch-$name.txt"
      ;;
    both)
      (batch "$name"; touch "$WORK/batch-done") &
      local batch_pid=$!
      "$TENANTS" --url "http://127.0.0.1:$GW_PORT" --chat-key "$CHAT_KEY" --chats 100000 \
        --chat-after 2s --stop-file "$WORK/batch-done" >"$WORK/$name.json"
      wait "$batch_pid"
      cat "$WORK/$name.json" "$WORK/batch-$name.txt"
      ;;
    *) echo "unknown run $name" >&2; exit 2 ;;
  esac
  curl -fsS "http://127.0.0.1:$SIM_PORT/stats" >"$WORK/sim-$name.stats.json"
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("provider 429s:", s["rejected_429"])' \
    "$WORK/sim-$name.stats.json"
  stop_pids
  wait_free "$SIM_PORT"
  wait_free "$GW_PORT"
  wait_free "$REDIS_PORT"
}

echo "== window $WINDOW, $LIMIT requests per window, batch of $BULK (--rpm $BATCH_RPM${BATCH_ARGS:+ $BATCH_ARGS})${PACE:+, gateway pacing $PACE_REQUESTS per $PACE}"
echo "   $(nproc) cores"
for r in $RUNS; do
  run "$r"
done
