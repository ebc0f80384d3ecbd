#!/usr/bin/env bash
# Batch runner benchmark: `tollgate batch` against the strict simulator on
# a workload that needs several windows of token budget, compared on the
# same workload with a naive client (fixed concurrency, retry on 429 after
# retry-after); then the peak RSS of a run with 100,000 items queued.
# Not run in CI; see BENCHMARKS.md, "Batch runner".
#
#   benches/batch/run.sh                  # W = 60 s, about 28 minutes
#   WINDOW=10 benches/batch/run.sh        # time-scaled: 10 s windows, same limits per window, ~8 minutes
#
# Needs: cargo, curl, python3, /usr/bin/time. Uses the ports 18191 and
# 18192 (simulators); they must be free. Everything (inputs, outputs,
# summaries, /stats, the SVG plot, logs) stays in the printed directory.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/benches/batch
cd "$ROOT"

WINDOW=${WINDOW:-60}                 # seconds, for both the simulator and the clients
ITEMS=${ITEMS:-600}
RPM=${RPM:-500}                      # requests per window
TPM=${TPM:-60000}                    # tokens per window
TTFT=${TTFT:-50ms}                   # simulator latency before each answer
CONCURRENCY=${CONCURRENCY:-64}       # tollgate batch --concurrency
NAIVE_CONCURRENCY=${NAIVE_CONCURRENCY:-32}
RSS_ITEMS=${RSS_ITEMS:-100000}
REFUSALS=${REFUSALS:-"none all"}      # the simulator's --charge-refusals, one pair of runs each
NAIVE_TIMEOUT=${NAIVE_TIMEOUT:-$((WINDOW * 40))}  # the naive client may never finish
SKIP_BUILD=${SKIP_BUILD:-0}
PORT_A=18191
PORT_B=18192

WORK=$(mktemp -d /tmp/tollgate-batch-bench.XXXXXX)
# shellcheck source=../lib.sh
source "$ROOT/benches/lib.sh"
trap 'stop_pids; echo "results: $WORK" >&2' EXIT
trap 'exit 130' INT TERM

require_free_ports "$PORT_A" "$PORT_B"

if [[ $SKIP_BUILD != 1 ]]; then
  cargo build --release -p tollgate-cli
fi
TOLLGATE=$ROOT/target/release/tollgate

# A strict simulator: sliding windows of $WINDOW s, charging at arrival by
# its own count (prompt + the completion it generates; it generates up to
# max_tokens, so the output allowance is what it charges).
start_sim() { # PORT CHARGE_REFUSALS
  "$TOLLGATE" sim --listen "127.0.0.1:$1" --rpm "$RPM" --tpm "$TPM" --window "${WINDOW}s" \
    --completion-tokens 4096 --ttft "$TTFT" --charge-refusals "$2" >"$WORK/sim-$1-$2.log" 2>&1 &
  SIM_PID=$!
  PIDS+=($SIM_PID)
  wait_port "$1"
}
stop_sim() {
  kill "$SIM_PID" 2>/dev/null || true
  wait "$SIM_PID" 2>/dev/null || true
}

python3 "$HERE/workload.py" "$ITEMS" "$WORK/in.jsonl"
"$TOLLGATE" batch --dry-run "$WORK/in.jsonl" --rpm "$RPM" --tpm "$TPM" --window "${WINDOW}s" \
  | tee "$WORK/dry-run.txt"

# Refusals free (the simulator's default) and refusals charged in full
# (OpenAI documents that failed requests count toward the limits).
for charge in $REFUSALS; do
  echo "== tollgate batch, refusals charged: $charge" >&2
  start_sim $PORT_A "$charge"
  "$TOLLGATE" batch "$WORK/in.jsonl" -o "$WORK/tollgate-$charge.jsonl" \
    --base-url "http://127.0.0.1:$PORT_A/v1" --rpm "$RPM" --tpm "$TPM" --window "${WINDOW}s" \
    --concurrency "$CONCURRENCY" --progress plain --progress-interval 30s \
    --summary-json "$WORK/tollgate-$charge-summary.json" --plot "$WORK/tollgate-$charge.svg" \
    >"$WORK/tollgate-$charge-summary.txt" 2>"$WORK/tollgate-$charge.log"
  cat "$WORK/tollgate-$charge-summary.txt"
  curl -s "http://127.0.0.1:$PORT_A/stats" >"$WORK/sim-tollgate-$charge.json"
  stop_sim

  echo "== naive client, refusals charged: $charge" >&2
  start_sim $PORT_B "$charge"
  timeout "$NAIVE_TIMEOUT" python3 "$HERE/naive.py" "http://127.0.0.1:$PORT_B/v1" "$WORK/in.jsonl" \
    "$WORK/naive-$charge.jsonl" "$NAIVE_CONCURRENCY" | tee "$WORK/naive-$charge.json" \
    || echo '{"wall_time_s": null}' >"$WORK/naive-$charge.json"
  curl -s "http://127.0.0.1:$PORT_B/stats" >"$WORK/sim-naive-$charge.json"
  stop_sim
done

echo "== peak RSS with $RSS_ITEMS items queued" >&2
python3 "$HERE/workload.py" "$RSS_ITEMS" "$WORK/big.jsonl"
python3 "$HERE/workload.py" 1000 "$WORK/small.jsonl"
for f in small big; do
  # A tight limit keeps nearly every item queued; the deadline ends the run.
  /usr/bin/time -v "$TOLLGATE" batch --sim "$WORK/$f.jsonl" -o "$WORK/$f-out.jsonl" \
    --rpm 200 --tpm 10000000 --window 1s --deadline 5s --progress off \
    >"$WORK/rss-$f.txt" 2>"$WORK/rss-$f.log" || true
done

REFUSALS="$REFUSALS" python3 - "$WORK" "$WINDOW" "$RPM" "$TPM" "$ITEMS" "$RSS_ITEMS" <<'PY'
import json, math, os, re, sys
work, window, rpm, tpm, items, rss_items = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]

def bound(stats):
    # The physical lower bound from the simulator's own charge of the
    # admitted requests (a refusal's charge is the client's own waste).
    reqs = stats["requests_charged"]
    toks = stats["tokens_charged"]
    return max((math.ceil(reqs / rpm) - 1) * window, (math.ceil(toks / tpm) - 1) * window, 0)

def rss(name):
    text = open(os.path.join(work, f"rss-{name}.log")).read()
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return int(m.group(1)) / 1024 if m else float("nan")

rows = []
for charge in os.environ.get("REFUSALS", "none all").split():
    tg = json.load(open(os.path.join(work, f"tollgate-{charge}-summary.json")))
    naive = json.load(open(os.path.join(work, f"naive-{charge}.json")))
    for name, wall, stats_file in [("tollgate batch", tg["wall_time_s"], f"sim-tollgate-{charge}.json"),
                                   ("naive client", naive.get("wall_time_s"), f"sim-naive-{charge}.json")]:
        s = json.load(open(os.path.join(work, stats_file)))
        rows.append((name, charge, wall, bound(s), s))
print()
print(f"workload: {items} chat items, limits {rpm} requests and {tpm} tokens per {window:g} s window (strict sliding window)")
print("| client | refusals charged | wall time | lower bound (simulator's charge of answered requests) | wall / bound | requests sent | 429s | tokens charged | max tokens in a window |")
print("|---|---|---|---|---|---|---|---|---|")
for name, charge, wall, lb, s in rows:
    r429 = sum(v for v in s["rejected_429"].values() if isinstance(v, int))
    if wall is None:
        print(f"| {name} | {charge} | did not finish | {lb:.0f} s | | {s['requests_total']} | {r429} | {s['tokens_charged']} | {s['max_tokens_in_window']} |")
        continue
    ratio = wall / lb if lb else float("nan")
    print(f"| {name} | {charge} | {wall:.1f} s | {lb:.0f} s | {ratio:.3f} | {s['requests_total']} | {r429} | {s['tokens_charged']} | {s['max_tokens_in_window']} |")
size_big = os.path.getsize(os.path.join(work, "big.jsonl")) / 2**20
size_small = os.path.getsize(os.path.join(work, "small.jsonl")) / 2**20
print()
print(f"peak RSS: 1,000 items ({size_small:.1f} MiB input) {rss('small'):.1f} MiB; {int(rss_items):,} items ({size_big:.1f} MiB input) {rss('big'):.1f} MiB")
PY
