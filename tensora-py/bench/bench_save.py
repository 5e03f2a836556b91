"""Python save bench: ``tensora.save_file`` against HF's ``safetensors.torch.save_file`` and
``safetensors.numpy.save_file`` on the same tensors, in the same run, alternately.

The tensors are loaded once (numpy arrays; the torch tensors are ``torch.from_numpy`` views of
them, so both frameworks save the very same memory). Every run writes a new file and is timed to
durability: HF's ``save_file`` is followed by an ``fsync`` of the file and of its directory (what
``tensora.save_file`` does inside, before and after naming the file), so both sides stop the clock
when the bytes are on the disk. HF without the ``fsync`` (the bytes only in the page cache) is
reported beside them. The file is removed after each run and the removal synced, untimed.

    python tensora-py/bench/bench_save.py target/tensora-bench/fixtures/full/tinyllama --runs 5 \\
        --json target/tensora-bench/python/save.json

``cargo xtask bench`` runs it (``tensora_bench::save``) in the venv it provisions
(``target/py-venv``, or ``$TENSORA_PY_VENV``) and puts its pairs in the report.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import safetensors.numpy
import safetensors.torch
import torch

import tensora
import tensora.torch


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable(save):
    """HF's save, then the file and its directory synced: what tensora.save_file includes."""

    def run(tensors, path):
        save(tensors, path)
        fsync_path(path)
        fsync_path(os.path.dirname(path) or ".")

    return run


def timed(fn, tensors, path):
    t = time.perf_counter()
    fn(tensors, path)
    seconds = time.perf_counter() - t
    size = os.path.getsize(path)
    os.remove(path)
    # Untimed: make the removal durable, so the next run's fsync does not wait for its discards.
    fsync_path(os.path.dirname(path) or ".")
    return size / seconds / 1e9


def tensora_save(report_sink):
    def run(tensors, path):
        report_sink.append(tensora.save_file_with_report(tensors, path))

    return run


def pairs(subject, anchor, tensors, path, runs, warmups):
    """``warmups`` untimed pairs, then ``runs`` pairs, the order alternating: GB/s of each side."""
    s_gbps, a_gbps = [], []
    for i in range(warmups + runs):
        if i % 2 == 0:
            a = timed(anchor, tensors, path)
            s = timed(subject, tensors, path)
        else:
            s = timed(subject, tensors, path)
            a = timed(anchor, tensors, path)
        if i >= warmups:
            s_gbps.append(s)
            a_gbps.append(a)
    return s_gbps, a_gbps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="a checkpoint tensora.load_file reads")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmups", type=int, default=1, help="untimed pairs before the timed ones")
    ap.add_argument("--out", help="directory to write into (default: beside --json, or the cwd)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cases", choices=["all", "durable", "dropin"], default="all",
                    help="durable: only the pairs where HF's save is followed by an fsync (what "
                         "tensora.save_file includes); all: also HF without the fsync; dropin: "
                         "tensora.torch.save_file (HF's semantics: renamed, not synced) against HF "
                         "save_file, and its durability=\"synced\" form against HF + fsync")
    args = ap.parse_args()
    out_dir = args.out or (os.path.dirname(os.path.abspath(args.json)) if args.json else os.getcwd())
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "bench-save.safetensors")

    if args.cases == "dropin":  # torch only: bf16 has no numpy dtype
        np_tensors = {}
        pt_tensors = tensora.load_file(args.path, framework="pt", residence="owned")
    else:
        np_tensors = tensora.load_file(args.path)  # an owned snapshot
        pt_tensors = {k: torch.from_numpy(v) for k, v in np_tensors.items()}
    nbytes = sum(t.numel() * t.element_size() for t in pt_tensors.values())
    reports = []
    cases = [
        ("tensora.save_file (torch)", "HF safetensors.torch.save_file + fsync",
         tensora_save(reports), durable(safetensors.torch.save_file), pt_tensors),
        ("tensora.save_file (numpy)", "HF safetensors.numpy.save_file + fsync",
         tensora_save(reports), durable(safetensors.numpy.save_file), np_tensors),
        ("tensora.save_file (torch)", "HF safetensors.torch.save_file, no fsync (page cache only)",
         tensora_save(reports), safetensors.torch.save_file, pt_tensors),
    ]
    if args.cases == "durable":
        cases = [c for c in cases if c[1].endswith("+ fsync")]
    if args.cases == "dropin":

        def synced(tensors, path):
            tensora.torch.save_file(tensors, path, durability="synced")

        cases = [
            ("tensora.torch.save_file", "HF safetensors.torch.save_file (neither syncs)",
             tensora.torch.save_file, safetensors.torch.save_file, pt_tensors),
            ("tensora.torch.save_file(durability=\"synced\")", "HF safetensors.torch.save_file + fsync",
             synced, durable(safetensors.torch.save_file), pt_tensors),
        ]
    doc = {"path": args.path, "bytes": nbytes, "runs": args.runs, "pairs": []}
    doc["load_average_before"] = os.getloadavg()
    for subject, anchor, s_fn, a_fn, tensors in cases:
        s, a = pairs(s_fn, a_fn, tensors, path, args.runs, args.warmups)
        ratios = sorted(x / y for x, y in zip(s, a))
        print(f"{subject} {np.median(s):.2f} GB/s vs {anchor} {np.median(a):.2f} GB/s: "
              f"x{np.median(ratios):.2f} ({ratios[0]:.2f}..{ratios[-1]:.2f})", file=sys.stderr)
        # HF without the fsync writes only to the page cache: context for the synced pairs, no goal.
        doc["pairs"].append({"subject": subject, "anchor": anchor, "subject_gbps": s, "anchor_gbps": a,
                             "context": anchor.endswith("(page cache only)")})
    doc["load_average_after"] = os.getloadavg()
    doc["tensora_report"] = reports[-1] if reports else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
