#!/usr/bin/env bash
# Hunts flaky tests: runs test binaries many times, two at once, under
# load, and prints per test how often it ran and failed.
#
#   scripts/flake-hunt.sh                       # scripts/flake-hunt.plan
#   scripts/flake-hunt.sh my.plan               # another plan
#   RUNS=30 scripts/flake-hunt.sh               # every line 30 times
#   OUT=/tmp/hunt scripts/flake-hunt.sh          # where logs and results go
#
# A plan has one line per test binary: `runs package target [filter...]`
# (`target` as cargo names it: the test file's name, or the crate's name
# for its unit tests; filters as libtest takes them, e.g. `--exact NAME`).
# The binaries are built once (`cargo test --workspace --no-run`, so with
# the features `cargo test --workspace` uses); then every run of every
# line is a job, the jobs are shuffled so that different binaries meet,
# and two run at a time at `nice -n 10` (the machine is shared: the load
# is the point, starving others is not). Each run starts in its crate's
# directory, as `cargo test` does. A failing run's log is kept in
# $OUT/fail/. The binaries run from links in $OUT/bin/, so building
# meanwhile changes nothing. Not run in CI.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"

# One job (called by xargs): `--one runs package target [filter...]`.
if [ "${1:-}" = "--one" ]; then
    shift
    out="$1" exe="$2" pkg="$3" target="$4"
    shift 4
    log="$(mktemp "${out}/run.XXXXXX")"
    rc=0
    (cd "${root}/crates/${pkg}" &&
        CARGO_MANIFEST_DIR="${PWD}" CARGO_PKG_NAME="${pkg}" \
            timeout 900 nice -n 10 "${exe}" "$@") >"${log}" 2>&1 || rc=$?
    # One line per test: package, target, test, ok|FAILED, message.
    awk -v pkg="${pkg}" -v target="${target}" -v rc="${rc}" '
        /^test .* \.\.\. (ok|FAILED)$/ {
            name = $2; status[name] = $NF; order[++n] = name
        }
        /^---- .* stdout ----$/ { current = $2 }
        /panicked at/ && current != "" && !(current in msg) { want = current; next }
        want != "" { msg[want] = $0; want = "" }
        END {
            for (i = 1; i <= n; i++) {
                t = order[i]
                printf "%s\t%s\t%s\t%s\t%s\n", pkg, target, t, status[t], msg[t]
            }
            if (n == 0 || rc == 124) {
                printf "%s\t%s\t%s\tFAILED\t%s\n", pkg, target, "(binary)",
                    (rc == 124 ? "timed out after 900 s" : "exit " rc ", no test ran")
            }
        }' "${log}" >>"${out}/results.tsv"
    if [ "${rc}" -ne 0 ]; then
        mkdir -p "${out}/fail"
        mv "${log}" "${out}/fail/${pkg}-${target}-$(basename "${log}").log"
    else
        rm -f "${log}"
    fi
    exit 0
fi

plan="${1:-${root}/scripts/flake-hunt.plan}"
out="${OUT:-${root}/target/flake-hunt}"
mkdir -p "${out}"
rm -f "${out}/results.tsv"

cd "${root}"
echo "building the test binaries..." >&2
nice -n 5 cargo test --workspace --no-run --message-format=json 2>/dev/null |
    jq -r 'select(.reason == "compiler-artifact" and .executable != null
                  and .profile.test == true)
           | [(.manifest_path | split("/") | .[-2]), .target.name, .executable]
           | @tsv' >"${out}/binaries.tsv"

jobs="${out}/jobs"
: >"${jobs}"
while read -r runs pkg target filters; do
    case "${runs}" in '' | '#'*) continue ;; esac
    runs="${RUNS:-${runs}}"
    exe="$(awk -F'\t' -v p="${pkg}" -v t="${target}" \
        '$1 == p && $2 == t { print $3; exit }' "${out}/binaries.tsv")"
    if [ -z "${exe}" ]; then
        echo "no test binary ${pkg}/${target}" >&2
        exit 2
    fi
    # A hard link (a copy on another file system): a build during the
    # hunt writes a new file and does not change what the hunt runs.
    mkdir -p "${out}/bin"
    ln -f "${exe}" "${out}/bin/" 2>/dev/null || cp -p "${exe}" "${out}/bin/"
    exe="${out}/bin/$(basename "${exe}")"
    for _ in $(seq "${runs}"); do
        # One job a line, no trailing blank (xargs -L would join the
        # next line to it).
        echo "${out} ${exe} ${pkg} ${target}${filters:+ ${filters}}" >>"${jobs}"
    done
done <"${plan}"

total="$(wc -l <"${jobs}")"
echo "${total} runs, two at a time..." >&2
started="$(date +%s)"
shuf "${jobs}" | xargs -P 2 -L 1 "${root}/scripts/flake-hunt.sh" --one
echo "done in $(($(date +%s) - started)) s; logs of failed runs in ${out}/fail" >&2

# The table: per test, runs and failures, and the first failure's message.
awk -F'\t' '
    { key = $1 "/" $2 " " $3; runs[key]++ }
    $4 == "FAILED" { fails[key]++; if (!(key in msg)) msg[key] = $5 }
    END {
        for (k in runs) {
            printf "%-90s %5d %5d  %s\n", k, runs[k], fails[k] + 0, substr(msg[k], 1, 120)
        }
    }' "${out}/results.tsv" | sort >"${out}/table.txt"
printf "%-90s %5s %5s  %s\n" "test" "runs" "fails" "first failure"
cat "${out}/table.txt"
