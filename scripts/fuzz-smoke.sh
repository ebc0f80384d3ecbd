#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ briefly: a smoke test, not a campaign.
#
#   scripts/fuzz-smoke.sh            # each target for 30 s
#   FUZZ_SECONDS=300 scripts/fuzz-smoke.sh sse_decoder
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). Only a stable
# toolchain is available here, so the nightly-only flags cargo-fuzz passes
# are unlocked with RUSTC_BOOTSTRAP=1, and sanitizers are off (`-s none`):
# tollgate-openai forbids unsafe code, so libFuzzer's coverage guidance and
# Rust's own panics/overflow checks (debug assertions are on) are what
# matter. Not run in CI (the test suite replays the checks on fuzz/seeds/
# instead: crates/tollgate-cli/tests/fuzz_seeds.rs).
set -euo pipefail

# Run from fuzz/ so that everything libFuzzer writes (corpus, artifacts,
# the fuzz-N.log files of parallel jobs) stays there (ignored by git).
cd "$(dirname "$0")/../fuzz"

seconds="${FUZZ_SECONDS:-30}"
jobs="${FUZZ_JOBS:-1}"

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "cargo-fuzz not found: cargo install cargo-fuzz --locked" >&2
    exit 2
fi

export RUSTC_BOOTSTRAP=1
fuzz_args=(--fuzz-dir . -s none --debug-assertions)

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list --fuzz-dir .)
fi

cargo fuzz build "${fuzz_args[@]}"

parallel=()
if [ "${jobs}" -gt 1 ]; then
    parallel=(-jobs="${jobs}" -workers="${jobs}")
fi

failed=()
for target in "${targets[@]}"; do
    echo "=== ${target}: ${seconds}s"
    mkdir -p "corpus/${target}"
    # Checked-in seeds start the corpus; a dictionary steers mutations.
    if [ -d "seeds/${target}" ]; then
        cp -n "seeds/${target}/"* "corpus/${target}/" 2>/dev/null || true
    fi
    dict=()
    if [ -f "dicts/${target}.dict" ]; then
        dict=(-dict="dicts/${target}.dict")
    fi
    if ! cargo fuzz run "${fuzz_args[@]}" "${target}" "corpus/${target}" -- \
        -max_total_time="${seconds}" "${parallel[@]}" "${dict[@]}" \
        -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1; then
        failed+=("${target}")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]} (see fuzz/artifacts/)" >&2
    exit 1
fi
echo "all fuzz targets ran ${seconds}s without a finding: ${targets[*]}"
