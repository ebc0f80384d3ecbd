#!/usr/bin/env bash
# A profile-guided build of `tollgate` (the `dist` profile plus LLVM's
# PGO): an instrumented build serves a training load through the
# gateway (chat, Responses and Messages, one-shot and streamed, and
# embeddings, against the simulator; without tracing, then with every
# span exported), its profile is merged, and the binary is built again
# with it. See BENCHMARKS.md, "A profile-guided build", and
# docs/operations.md.
#
#   benches/gateway/pgo.sh            # writes target/pgo/tollgate
#
# Needs: the `llvm-tools` rustup component (llvm-profdata of rustc's own
# LLVM: rustup component add llvm-tools), python3. Uses the ports of run.sh
# (18181 simulator, 18182 gateway, 18186 OTLP receiver). Two builds of
# the dist profile in target directories of their own: about 15 minutes
# on 2 cores the first time.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/benches/gateway
cd "$ROOT"

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET/pgo
GEN_TARGET=$OUT/gen-target
USE_TARGET=$OUT/use-target
DATA=$OUT/data
TRAIN=${TRAIN:-6s}

PROFDATA=$(find "$(rustc --print sysroot)" -name llvm-profdata -type f | head -n 1)
[[ -x $PROFDATA ]] || { echo "llvm-profdata not found: rustup component add llvm-tools" >&2; exit 1; }

# shellcheck source=../lib.sh
source "$ROOT/benches/lib.sh"
SIM_PORT=18181
GW_PORT=18182
SINK_PORT=18186
require_free_ports $SIM_PORT $GW_PORT $SINK_PORT
trap stop_pids EXIT

# 1. The instrumented build (its own target directory: other flags).
rm -rf "$DATA"
mkdir -p "$DATA"
CARGO_TARGET_DIR=$GEN_TARGET RUSTFLAGS="-Cprofile-generate=$DATA" \
  cargo build --profile dist -p tollgate-cli -p tollgate-loadgen
CARGO_TARGET_DIR=$GEN_TARGET RUSTFLAGS="-Cprofile-generate=$DATA" \
  cargo build --profile dist -p tollgate-telemetry --example otlp_sink
GEN=$GEN_TARGET/dist/tollgate
LOADGEN=$GEN_TARGET/dist/tollgate-loadgen
SINK=$GEN_TARGET/dist/examples/otlp_sink

# 2. Training: the simulator and the gateway as run.sh starts them
# (two connection threads), under each kind of load the gateway serves,
# first without telemetry, then (a shorter load) exporting every span to
# a local OTLP receiver. Only the gateway's profiles are kept: the
# simulator, the receiver and the load generator write theirs nowhere.
LLVM_PROFILE_FILE=/dev/null "$GEN" sim --listen 127.0.0.1:$SIM_PORT >/dev/null 2>&1 &
PIDS+=($!)
LLVM_PROFILE_FILE=/dev/null "$SINK" 127.0.0.1:$SINK_PORT >/dev/null 2>&1 &
PIDS+=($!)
wait_port $SIM_PORT
wait_port $SINK_PORT
# The bench configuration plus a Messages model (an `anthropic`
# provider on the simulator) and an embeddings model.
{
  sed 's/^\[server\]$/[server]\nconnection_threads = 2/' "$HERE/gateway.toml"
  cat <<EOF

[providers.sim-anthropic]
flavor = "anthropic"
base_url = "http://127.0.0.1:$SIM_PORT/v1"

[models.sim-claude]
provider = "sim-anthropic"
upstream_model = "sim-chat"
scope = "bench"

[models.sim-embed]
provider = "sim"
scope = "bench"
kind = "embeddings"
EOF
} >"$OUT/gateway.toml"
{ cat "$OUT/gateway.toml"; telemetry_section $SINK_PORT pgo; } >"$OUT/gateway-otel.toml"

export TOLLGATE_LOADGEN_API_KEY=sk-bench-gateway
GW=http://127.0.0.1:$GW_PORT
# load DURATION ARGS...: one training load; stops the script unless
# every response was a 200 (a profile of error paths would mislead).
load() {
  LLVM_PROFILE_FILE=/dev/null "$LOADGEN" --duration "$1" "${@:2}" >"$OUT/load.json"
  python3 - "$OUT/load.json" "${@:2}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if r["ok"] == 0 or r["non_2xx"] or r["errors"]:
    sys.exit(f"training load {sys.argv[2:]}: {r['ok']} ok, non-2xx {r['non_2xx']}, errors {r['errors']}")
PY
}
# train CONFIG DURATION: one gateway with CONFIG under every load for
# DURATION each; its profile is written when it exits on its own
# (SIGTERM: graceful shutdown).
train() {
  LLVM_PROFILE_FILE="$DATA/gateway-%p-%m.profraw" \
    "$GEN" serve --config "$1" >/dev/null 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  wait_port $GW_PORT
  load "$2" --url "$GW/v1/chat/completions" --concurrency 64
  load "$2" --url "$GW/v1/chat/completions" --rate 2000 --concurrency 64
  load "$2" --url "$GW/v1/chat/completions" --stream --concurrency 64
  load "$2" --url "$GW/v1/chat/completions" --stream --rate 1000 --concurrency 64
  load "$2" --url "$GW/v1/chat/completions" --model sim-chat-3 --concurrency 16
  load "$2" --url "$GW/v1/responses" --concurrency 16 \
    --body '{"model":"sim-chat","input":"Say hello.","max_output_tokens":16}'
  load "$2" --url "$GW/v1/responses" --concurrency 16 --stream \
    --body '{"model":"sim-chat","input":"Say hello.","max_output_tokens":16,"stream":true}'
  load "$2" --url "$GW/v1/messages" --concurrency 16 \
    --body '{"model":"sim-claude","max_tokens":16,"messages":[{"role":"user","content":"Say hello."}]}'
  load "$2" --url "$GW/v1/messages" --concurrency 16 --stream \
    --body '{"model":"sim-claude","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Say hello."}]}'
  load "$2" --url "$GW/v1/embeddings" --concurrency 16 \
    --body '{"model":"sim-embed","input":"Say hello."}'
  kill -TERM "$pid"
  wait "$pid"
  wait_free $GW_PORT
}
train "$OUT/gateway.toml" "$TRAIN"
train "$OUT/gateway-otel.toml" 2s
ls "$DATA"/gateway-*.profraw >/dev/null
# Named by its content: cargo rebuilds when RUSTFLAGS changes, not when
# the file it names does.
"$PROFDATA" merge -o "$OUT/merged.profdata" "$DATA"/gateway-*.profraw
PROFILE_FILE=$OUT/gateway-$(sha256sum "$OUT/merged.profdata" | cut -c1-12).profdata
rm -f "$OUT"/gateway-*.profdata
mv "$OUT/merged.profdata" "$PROFILE_FILE"

# 3. The build that uses it.
CARGO_TARGET_DIR=$USE_TARGET \
  RUSTFLAGS="-Cprofile-use=$PROFILE_FILE" \
  cargo build --profile dist -p tollgate-cli
cp "$USE_TARGET/dist/tollgate" "$OUT/tollgate"
echo "profile-guided build: $OUT/tollgate"
