"""Warm-cache throughput of tensora.load_file / weights_iterator vs HF safetensors.numpy.load_file.

    python tensora-py/bench/bench_load.py CHECKPOINT_DIR_OR_FILE [--runs N] [--cli target/release/tensora]

GB = 1e9 bytes of tensor data delivered. One warm-up run per subject (fills the page cache),
then N timed runs; the median is reported. Each result is dropped inside the timed region
(freeing is part of a load's cost for a process that swaps models).
"""

import argparse
import glob
import gc
import os
import json
import statistics
import subprocess
import time

import tensora


def files_of(path):
    if os.path.isdir(path):
        return sorted(glob.glob(os.path.join(path, "*.safetensors")))
    return [path]


def hf_load(path):
    from safetensors.numpy import load_file

    out = {}
    for f in files_of(path):
        out.update(load_file(f))
    return out


def subjects(path):
    return {
        "hf safetensors.numpy.load_file": lambda: hf_load(path),
        "tensora.load_file (np)": lambda: tensora.load_file(path),
        "tensora.weights_iterator (np, 256 MiB budget)": lambda: sum(
            a.nbytes for _, a in tensora.weights_iterator(path, framework="np")
        ),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cli", help="path to the tensora CLI: also report its own `load --json` gbps")
    args = ap.parse_args()
    total = sum(t["len_bytes"] for t in tensora.inspect(args.path)["tensors"])
    print(f"{args.path}: {total / 1e9:.3f} GB of tensor data, warm, median of {args.runs}")
    for name, fn in subjects(args.path).items():
        fn()  # warm-up
        gc.collect()
        secs = []
        for _ in range(args.runs):
            t = time.perf_counter()
            r = fn()
            del r
            secs.append(time.perf_counter() - t)
            gc.collect()
        med = statistics.median(secs)
        print(f"{name:48s} {total / med / 1e9:6.2f} GB/s  (median {med:.3f} s, min {min(secs):.3f} s)")
    if args.cli:
        gbps = []
        for _ in range(args.runs + 1):
            out = subprocess.run([args.cli, "load", args.path, "--json"], check=True, capture_output=True)
            gbps.append(json.loads(out.stdout)["gbps"])
        gbps = gbps[1:]  # the first run is the warm-up
        print(f"{'tensora CLI load (its own report, excl. drop)':48s} {statistics.median(gbps):6.2f} GB/s  (max {max(gbps):.2f})")


if __name__ == "__main__":
    main()
