#!/usr/bin/env bash
# Build the tensora Python package into a venv and run its pytest suite.
# Called by `cargo xtask test` (and so by CI); works on a fresh machine with network access to PyPI.
#   target/py-venv (or $TENSORA_PY_VENV) is reused when present; PYTHON picks the interpreter.
#   Dependencies: requirements-test.txt (torch and transformers included: no test is skipped for
#   a missing one), installed with uv, whose cache (its default in the home directory, or
#   $UV_CACHE_DIR) outlives the checkout, so a fresh venv links the wheels instead of downloading.
#   Any skipped test fails the run (tests/conftest.py); -rs prints why a test was skipped.
set -euo pipefail

crate_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$crate_dir/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
venv="${TENSORA_PY_VENV:-$target_dir/py-venv}"
python="${PYTHON:-python3}"
requirements="$crate_dir/requirements-test.txt"

if [ ! -x "$venv/bin/python" ]; then
    echo "tensora-py: creating venv at $venv"
    "$python" -m venv "$venv"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"

# Installed once per requirements file: the stamp holds the file's digest.
stamp="$venv/.tensora-requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    start=$(date +%s)
    python -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
    uv pip install --quiet --python "$venv/bin/python" -r "$requirements"
    echo "$want" >"$stamp"
    echo "tensora-py: installed requirements-test.txt in $(($(date +%s) - start)) s"
fi

echo "tensora-py: building and installing (maturin develop --release)"
maturin develop --release --quiet -m "$crate_dir/Cargo.toml"

cd "$crate_dir"
# The tests' files go under target/ (on the checkout's disk, emptied by pytest when a run starts,
# so at most one run's files are ever left), not into the machine's /tmp.
python -m pytest -q -rs -p no:cacheprovider --basetemp "$target_dir/pytest-tmp" tests "$@"
