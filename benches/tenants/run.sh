#!/usr/bin/env bash
# The two-tenant scenario of SPEC §15 (issue 22) on the strict simulator:
# one model on one scope of LIMIT requests per WINDOW, two tenants with no
# limits of their own. Three runs: the interactive tenant alone (one
# request a second), the bulk tenant alone (BULK requests at once), then
# both (the burst, and from 2 s later one interactive request a second
# until the bulk answers are all in). Prints each run's JSON summary
# (`tollgate-tenants`, crates/tollgate-loadgen/src/tenants.rs). Not run in
# CI; see BENCHMARKS.md, "Fair share between tenants".
#
#   benches/tenants/run.sh                       # W = 10 s, 100 per window
#   WINDOW=60s LIMIT=600 benches/tenants/run.sh  # the minute window
#   PACE=100ms benches/tenants/run.sh            # + a pacing limit on the scope
#
# PACE (off by default) adds a second, shorter sliding-window limit of
# PACE_REQUESTS (default 1) requests per PACE to the shared scope, next to
# LIMIT per WINDOW (SPEC Q-1): e.g. PACE=1s PACE_REQUESTS=10. The
# simulator keeps enforcing LIMIT per WINDOW only. CHAT_PRIORITY sets the
# interactive tenant's `priority` (default: none, so `standard` like
# bulk); RUNS picks runs (default "interactive-alone bulk-alone both").
#
# Listens on 127.0.0.1:18381 (simulator) and 18382 (gateway); SIM_PORT and
# GW_PORT change them (to run two variants side by side).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

WINDOW=${WINDOW:-10s}
LIMIT=${LIMIT:-100}
BULK=${BULK:-1000}
QUEUE=${QUEUE:-1100}
CHATS_ALONE=${CHATS_ALONE:-20}
PACE=${PACE:-}
PACE_REQUESTS=${PACE_REQUESTS:-1}
CHAT_PRIORITY=${CHAT_PRIORITY:-}
RUNS=${RUNS:-interactive-alone bulk-alone both}
SKIP_BUILD=${SKIP_BUILD:-0}
TOLLGATE=${TOLLGATE:-$ROOT/target/release/tollgate}
TENANTS=${TENANTS:-$ROOT/target/release/tollgate-tenants}
SIM_PORT=${SIM_PORT:-18381}
GW_PORT=${GW_PORT:-18382}
BULK_KEY=sk-bench-bulk
CHAT_KEY=sk-bench-interactive

WORK=$(mktemp -d /tmp/tollgate-tenants.XXXXXX)
# shellcheck source=../lib.sh
source "$ROOT/benches/lib.sh"
trap 'stop_pids; echo "results: $WORK" >&2' EXIT
trap 'exit 130' INT TERM
require_free_ports "$SIM_PORT" "$GW_PORT"

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
max_connections = 4096
access_log = false

[admission]
queue_capacity = $QUEUE
max_timeout = "1h"

[providers.sim]
base_url = "http://127.0.0.1:$SIM_PORT/v1"

[scopes.shared]
limits = [$LIMITS]

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "shared"

[tenants.bulk]
keys_sha256 = ["$("$TOLLGATE" hash-key "$BULK_KEY")"]

[tenants.interactive]
keys_sha256 = ["$("$TOLLGATE" hash-key "$CHAT_KEY")"]
${CHAT_PRIORITY:+priority = \"$CHAT_PRIORITY\"}
TOML

# A fresh simulator and gateway per run: every run starts with a full
# window.
run() {
  local name=$1
  shift
  "$TOLLGATE" sim --listen 127.0.0.1:$SIM_PORT --rpm "$LIMIT" --window "$WINDOW" \
    >"$WORK/sim-$name.log" 2>&1 &
  PIDS+=("$!")
  wait_port $SIM_PORT
  "$TOLLGATE" serve --config "$WORK/gateway.toml" >"$WORK/gateway-$name.log" 2>&1 &
  PIDS+=("$!")
  wait_port $GW_PORT
  "$TENANTS" --url "http://127.0.0.1:$GW_PORT" "$@" >"$WORK/$name.json"
  curl -fsS "http://127.0.0.1:$SIM_PORT/stats" >"$WORK/sim-$name.stats.json"
  echo "== $name"
  cat "$WORK/$name.json"
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("provider 429s:", s["rejected_429"])' \
    "$WORK/sim-$name.stats.json"
  stop_pids
  wait_free $SIM_PORT
  wait_free $GW_PORT
}

echo "== window $WINDOW, $LIMIT requests per window, bulk $BULK, queue $QUEUE${PACE:+, pacing $PACE_REQUESTS per $PACE}${CHAT_PRIORITY:+, interactive tenant priority $CHAT_PRIORITY}"
echo "   $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $RUNS; do
  case $r in
    interactive-alone) run "$r" --chat-key "$CHAT_KEY" --chats "$CHATS_ALONE" --chat-after 0s ;;
    bulk-alone) run "$r" --bulk-key "$BULK_KEY" --bulk "$BULK" ;;
    both) run "$r" --bulk-key "$BULK_KEY" --bulk "$BULK" --chat-key "$CHAT_KEY" --chats 100000 ;;
    *) echo "unknown run $r" >&2; exit 2 ;;
  esac
done
