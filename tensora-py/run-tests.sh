#!/usr/bin/env bash
# Build the tensora Python package into a venv and run its pytest suite.
# Called by `cargo xtask test` (and so by CI); works on a fresh machine with network access to PyPI.
#   The venv, target/py-venv (or $TENSORA_PY_VENV), comes from `cargo xtask provision --python`:
#   requirements-test.txt (torch and transformers included: no test is skipped for a missing one)
#   installed with uv once per version of the file, and tensora built from this checkout
#   (maturin develop --release). uv's cache (its default in the home directory, or
#   $UV_CACHE_DIR) outlives the checkout, so a fresh venv links the wheels instead of downloading.
#   Any skipped test fails the run (tests/conftest.py); -rs prints why a test was skipped.
set -euo pipefail

crate_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$crate_dir/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
venv="${TENSORA_PY_VENV:-$target_dir/py-venv}"

(cd "$repo_root" && "${CARGO:-cargo}" xtask provision --python)
# shellcheck disable=SC1091
source "$venv/bin/activate"

cd "$crate_dir"
# The tests' files go under target/ (on the checkout's disk, emptied by pytest when a run starts,
# so at most one run's files are ever left), not into the machine's /tmp.
python -m pytest -q -rs -p no:cacheprovider --basetemp "$target_dir/pytest-tmp" tests "$@"
