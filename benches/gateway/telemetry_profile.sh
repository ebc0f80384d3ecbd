#!/usr/bin/env bash
# Where telemetry's CPU goes, by function: `perf record` of a gateway with
# telemetry off and of one exporting every span to otlp_sink, each under
# the same closed loop in turn, and the samples per response of every
# function, on minus off (issue 25; BENCHMARKS.md, "Telemetry's CPU by
# function"). Not run in CI.
#
#   cargo build --profile dist -p tollgate-cli -p tollgate-loadgen
#   cargo build --profile dist -p tollgate-telemetry --example otlp_sink
#   ROUNDS=3 RUN=8s benches/gateway/telemetry_profile.sh
#
# Needs: perf, python3. Ports 18181, 18182, 18185 and 18186 must be free.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/benches/gateway
PROFILE=${PROFILE:-dist}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE
TOLLGATE=${TOLLGATE:-$TARGET/tollgate}
ROUNDS=${ROUNDS:-3}
RUN=${RUN:-8s}
WORK=$(mktemp -d /tmp/tollgate-telemetry-profile.XXXXXX)
export TOLLGATE_LOADGEN_API_KEY=sk-bench-gateway
# shellcheck source=../lib.sh
source "$ROOT/benches/lib.sh"
trap 'stop_pids; echo "results: $WORK" >&2' EXIT
trap 'exit 130' INT TERM
require_free_ports 18181 18182 18185 18186

"$TOLLGATE" sim --listen 127.0.0.1:18181 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
"$TARGET/examples/otlp_sink" 127.0.0.1:18186 >"$WORK/sink.log" 2>&1 &
PIDS+=($!)
declare -A PORT=([off]=18182 [on]=18185) PID=()
for name in off on; do
  { sed "s/^listen = \"127.0.0.1:18182\"/listen = \"127.0.0.1:${PORT[$name]}\"/" "$HERE/gateway.toml"
    if [[ $name == on ]]; then telemetry_section 18186 bench-on; fi
  } >"$WORK/$name.toml"
  "$TOLLGATE" serve --config "$WORK/$name.toml" >/dev/null 2>&1 &
  PIDS+=($!)
  PID[$name]=$!
done
for port in 18181 18182 18185 18186; do wait_port $port; done

load() { # NAME DURATION OUT
  "$TARGET/tollgate-loadgen" --url "http://127.0.0.1:${PORT[$1]}/v1/chat/completions" \
    --model sim-chat --concurrency 64 --duration "$2" >"$3"
}
for name in off on; do load "$name" 2s /dev/null; done
for r in $(seq "$ROUNDS"); do
  for name in off on; do
    perf record -F 1999 -p "${PID[$name]}" -o "$WORK/$name-$r.data" >/dev/null 2>&1 &
    rec=$!
    sleep 0.3
    load "$name" "$RUN" "$WORK/$name-$r.json"
    kill -INT $rec
    wait $rec || true
  done
done

python3 - "$WORK" "$ROUNDS" <<'PY'
import collections, json, subprocess, sys
work, rounds = sys.argv[1], int(sys.argv[2])
samples, ok = {}, {}
for name in ("off", "on"):
    c, n = collections.Counter(), 0
    for r in range(1, rounds + 1):
        n += json.load(open(f"{work}/{name}-{r}.json"))["ok"]
        out = subprocess.run(
            ["perf", "report", "-i", f"{work}/{name}-{r}.data", "--no-children",
             "--sort", "sym", "-F", "sample,sym", "-q"],
            capture_output=True, text=True).stdout
        for line in out.splitlines():
            p = line.strip().split(None, 1)
            if len(p) == 2 and p[0].isdigit():
                c[p[1]] += int(p[0])
    samples[name], ok[name] = c, n
# One sample is 1/1999 s of CPU: µs per response = samples / responses * 500.25.
us = lambda name, k: samples[name].get(k, 0) / ok[name] * 1e6 / 1999
for name in samples:
    total = sum(samples[name].values()) / ok[name] * 1e6 / 1999
    print(f"{name}: {ok[name]} responses, {total:.1f} µs of sampled CPU per response")
print("µs per response: on - off, off, on, function")
keys = set(samples["off"]) | set(samples["on"])
for k in sorted(keys, key=lambda k: us("off", k) - us("on", k))[:40]:
    print(f"{us('on', k) - us('off', k):7.3f} {us('off', k):7.3f} {us('on', k):7.3f}  {k[:100]}")
PY
