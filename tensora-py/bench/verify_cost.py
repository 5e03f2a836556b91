"""Warm throughput of verified loads (`manifest=`, crc32c) against the same loads without, in one
process, alternating, medians (min-max) of `--runs` pairs; each load's tensors are touched (one
byte per 4 KiB page) and dropped inside the timed region.

    python tensora-py/bench/verify_cost.py CHECKPOINT [--runs N] [--manifest M.json]
"""

import argparse
import gc
import os
import statistics
import tempfile
import time

import tensora
from bench_load import touch  # the bench's own touch: one byte per 4 KiB page


def timed(fn):
    t = time.perf_counter()
    out = fn()
    touch(out.values() if isinstance(out, dict) else [v for _, v in out])
    del out
    gc.collect()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--manifest")
    args = ap.parse_args()
    manifest = args.manifest or os.path.join(tempfile.mkdtemp(), "manifest.json")
    if not args.manifest:
        tensora.hash(args.path, write_manifest=manifest)
    total = sum(t["nbytes"] for t in tensora.inspect(args.path)["tensors"])
    cases = {
        "owned": lambda m: tensora.load_file(args.path, framework="pt", residence="owned", manifest=m),
        "auto": lambda m: tensora.load_file(args.path, framework="pt", residence="auto", manifest=m),
        "weights_iterator": lambda m: list(tensora.weights_iterator(args.path, residence="owned", manifest=m)),
    }
    print(f"{args.path}: {total / 1e9:.2f} GB, warm, {args.runs} pairs, load average {os.getloadavg()[0]:.2f}")
    for name, fn in cases.items():
        fn(None), fn(manifest)  # warm-up
        plain, verified = [], []
        for r in range(args.runs):
            order = [(plain, None), (verified, manifest)]
            for bucket, m in order if r % 2 == 0 else order[::-1]:
                bucket.append(timed(lambda: fn(m)))
        ratio = statistics.median(p / v for p, v in zip(plain, verified))
        gb = lambda xs: f"{total / statistics.median(xs) / 1e9:.2f} ({total / max(xs) / 1e9:.2f}-{total / min(xs) / 1e9:.2f})"
        print(f"  {name:18s} plain {gb(plain)} GB/s; verified {gb(verified)} GB/s; verified/plain {ratio:.2f} (goal >= 0.85)")
    print(f"(load average {os.getloadavg()[0]:.2f} after)")


if __name__ == "__main__":
    main()
