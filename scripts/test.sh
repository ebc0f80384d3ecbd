#!/usr/bin/env bash
# The whole test suite, Rust and Python: the README's test command and
# what CI runs after fmt and clippy.
#
#   1. cargo test --workspace
#   2. a virtual environment under target/py-venv (reused when present),
#      with the pinned test requirements and the Python package built from
#      crates/tollgate-py by `pip install` (maturin, release profile)
#   3. pytest on crates/tollgate-py/tests
#
# PYTHON picks the interpreter (CPython 3.11 or newer; default python3).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace"
cargo test --workspace

python="${PYTHON:-python3}"
venv=target/py-venv
if [[ ! -x "$venv/bin/python" ]]; then
  echo "== creating $venv"
  "$python" -m venv "$venv"
fi
# maturin (a pinned test requirement) builds the package in place.
export PATH="$PWD/$venv/bin:$PATH"
echo "== pip install (pinned test requirements, then the package)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -r crates/tollgate-py/requirements-test.txt
start=$(date +%s)
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --force-reinstall --no-deps --no-build-isolation ./crates/tollgate-py
echo "(package built and installed in $(( $(date +%s) - start )) s)"

echo "== pytest crates/tollgate-py/tests"
cd crates/tollgate-py
start=$(date +%s)
"../../$venv/bin/python" -m pytest -q -p no:cacheprovider tests
echo "(pytest took $(( $(date +%s) - start )) s)"
