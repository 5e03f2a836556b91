#!/usr/bin/env bash
# Build the tensora Python package into a venv and run its pytest suite.
# Called by `cargo xtask test`; works on a fresh machine with network access to PyPI.
#   target/py-venv (or $TENSORA_PY_VENV) is reused when present; PYTHON picks the interpreter.
set -euo pipefail

crate_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$crate_dir/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
venv="${TENSORA_PY_VENV:-$target_dir/py-venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "tensora-py: creating venv at $venv"
    "$python" -m venv "$venv"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"

# Quiet, and skipped when already satisfied.
if ! python -c "import maturin, numpy, pytest, safetensors" 2>/dev/null; then
    python -m pip install --quiet --disable-pip-version-check "maturin>=1.9,<2" numpy pytest safetensors
fi

echo "tensora-py: building and installing (maturin develop --release)"
maturin develop --release --quiet -m "$crate_dir/Cargo.toml"

cd "$crate_dir"
python -m pytest -q -p no:cacheprovider tests "$@"
