#!/usr/bin/env bash
# The hook for `cargo xtask bench`: run the Python peers' bench (bench_load.py), or with --restarts
# the restarts bench (bench_restarts.py), on a fixture when a Python with torch, the peers and
# tensora is available, else say why it is skipped.
#   tensora-py/bench/run_python_peers.sh FIXTURE OUT.json [bench_load.py options...]
#   tensora-py/bench/run_python_peers.sh FIXTURE OUT.json --restarts [bench_restarts.py options...]
# Python: $TENSORA_PY_VENV/bin/python, else $CARGO_TARGET_DIR/py-venv or target/py-venv (what
# `cargo xtask provision --python` fills, with tensora installed by maturin), else $PYTHON.
# Exit 0: ran, OUT.json written (schema 2: temps.{warm,cold}.results.SUBJECT.{gbps_median,
# gbps_min, gbps_max, seconds, x_roofline} or .error; acceptance; markdown). Exit 3: skipped, one
# line "python peers skipped: WHY" on stdout. Anything else: the bench failed.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 FIXTURE OUT.json [bench_load.py options...]" >&2
    exit 2
fi
fixture="$1"
out="$2"
shift 2
bench_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$bench_dir/../.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
python="${TENSORA_PY_VENV:-$target_dir/py-venv}/bin/python"
[ -x "$python" ] || python="${PYTHON:-python3}"

if ! why="$("$python" -c 'import torch, tensora, safetensors, runai_model_streamer, fastsafetensors' 2>&1)"; then
    echo "python peers skipped: $python cannot import the peers (run \`cargo xtask provision --python\` once): ${why##*$'\n'}"
    exit 3
fi
script="bench_load.py"
if [ "${1:-}" = "--restarts" ]; then
    script="bench_restarts.py"
    shift
fi
exec "$python" "$bench_dir/$script" "$fixture" --json "$out" "$@"
