"""Where a warm `residence="auto"` load spends its time next to HF's lazy torch mapping.

    python tensora-py/bench/auto_breakdown.py CHECKPOINT [--runs N] [--json OUT.json]

In one process, warm (one untimed pass first), `--runs` times each, medians (min-max) in ms:

- HF torch: `safetensors.torch.load_file` per file (maps, makes tensors), then the touch (one byte
  per 4 KiB page: here each first touch of a page is a minor fault);
- tensora auto: `_native.load` (the native load: open, mincore sample, plan, map, populate, close
  and stat, then the per-tensor export), the DLPack export to torch (`torch.from_dlpack` per
  tensor), then the same touch; the load report's phases; the mappings of the files left in
  `/proc/self/maps`;
- population strategies on a raw private mapping of every file (`mmap` + strategy + touch +
  `munmap`): lazy (faults at the touch, as HF), `MADV_POPULATE_READ` on one thread and on two
  (tensora's `populate` uses the load's threads), and `MAP_POPULATE`.
"""

import argparse
import ctypes
import json
import mmap
import os
import statistics
import threading
import time

import numpy as np
import torch

import tensora
from bench_load import files_of, touch  # the bench's own touch: one byte per 4 KiB page
from tensora import _native

PAGE = 4096
MADV_POPULATE_READ = 22
MAP_POPULATE = 0x8000
MAP_NORESERVE = 0x4000

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def hf_torch(path):
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    out = {}
    for f in files_of(path):
        out.update(load_file(f))
    t1 = time.perf_counter()
    touch(out.values())
    t2 = time.perf_counter()
    return {"load": t1 - t0, "touch": t2 - t1, "total": t2 - t0}


def maps_of(files):
    real = {os.path.realpath(f) for f in files}
    with open("/proc/self/maps") as m:
        return sum(1 for line in m if line.rstrip("\n").split(" ")[-1] in real)


def tensora_auto(path, files):
    t0 = time.perf_counter()
    datas, report = _native.load(os.fspath(path), None, "auto", None, "auto", None)
    t1 = time.perf_counter()
    tensors = {k: torch.from_dlpack(d) for k, d in datas.items()}
    t2 = time.perf_counter()
    touch(tensors.values())
    t3 = time.perf_counter()
    rep = json.loads(report)
    mappings = maps_of(files)
    out = {
        "native_load": t1 - t0,
        "dlpack_export": t2 - t1,
        "touch": t3 - t2,
        "total": t3 - t0,
        "report_seconds": rep["seconds"],
        "binding_overhead": (t1 - t0) - rep["seconds"],
        "mappings": mappings,
        "io_mode": rep["io_mode"],
        "minor_faults": rep["minor_faults"],
    }
    for k, v in rep["phases"].items():
        out[f"phase_{k}"] = v
    del tensors, datas
    return out


def raw_strategy(files, strategy):
    """Map every file privately, read its pages in by `strategy`, touch, unmap."""
    t0 = time.perf_counter()
    maps = []
    for f in files:
        size = os.path.getsize(f)
        fd = os.open(f, os.O_RDONLY)
        flags = mmap.MAP_PRIVATE | MAP_NORESERVE | (MAP_POPULATE if strategy == "map_populate" else 0)
        addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
        os.close(fd)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        maps.append((addr, size))
    if strategy.startswith("populate"):
        n = 2 if strategy == "populate_2_threads" else 1
        spans = []
        for addr, size in maps:
            half = (size // n // PAGE) * PAGE
            spans += [(addr + i * half, half if i < n - 1 else size - i * half) for i in range(n)]

        def pop(span_list):
            for a, s in span_list:
                if libc.madvise(a, s, MADV_POPULATE_READ) != 0:
                    raise OSError(ctypes.get_errno(), "MADV_POPULATE_READ")

        if n == 1:
            pop(spans)
        else:
            ts = [threading.Thread(target=pop, args=(spans[i::n],)) for i in range(n)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
    t1 = time.perf_counter()
    for addr, size in maps:
        arr = np.frombuffer((ctypes.c_uint8 * size).from_address(addr), dtype=np.uint8)
        int(arr[::PAGE].sum())
    t2 = time.perf_counter()
    for addr, size in maps:
        libc.munmap(addr, size)
    t3 = time.perf_counter()
    return {"populate": t1 - t0, "touch": t2 - t1, "unmap": t3 - t2, "total": t2 - t0}


def med(samples, key):
    v = sorted(s[key] for s in samples)
    return statistics.median(v), v[0], v[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    files = files_of(args.path)
    total = sum(t["nbytes"] for t in tensora.inspect(args.path)["tensors"])
    subjects = {
        "hf_torch": lambda: hf_torch(args.path),
        "tensora_auto": lambda: tensora_auto(args.path, files),
        "raw_lazy": lambda: raw_strategy(files, "lazy"),
        "raw_populate_1_thread": lambda: raw_strategy(files, "populate_1_thread"),
        "raw_populate_2_threads": lambda: raw_strategy(files, "populate_2_threads"),
        "raw_map_populate": lambda: raw_strategy(files, "map_populate"),
    }
    samples = {k: [] for k in subjects}
    for fn in subjects.values():
        fn()  # warm
    for r in range(args.runs):
        keys = list(subjects)
        keys = keys[r % len(keys):] + keys[: r % len(keys)]
        for k in keys:
            samples[k].append(subjects[k]())
    la = os.getloadavg()[0]
    print(f"{args.path}: {total / 1e9:.2f} GB, {len(files)} file(s), {args.runs} runs, load average {la:.2f}")
    doc = {"path": args.path, "bytes": total, "loadavg": la, "results": {}}
    for k, ss in samples.items():
        doc["results"][k] = ss
        parts = []
        for key in ss[0]:
            if isinstance(ss[0][key], str):
                parts.append(f"{key}={ss[0][key]}")
                continue
            m, lo, hi = med(ss, key)
            if key in ("mappings", "minor_faults"):
                parts.append(f"{key}={m:.0f}")
            else:
                parts.append(f"{key} {m * 1e3:.1f} ({lo * 1e3:.1f}-{hi * 1e3:.1f}) ms")
        m, _, _ = med(ss, "total")
        print(f"  {k:24s} {total / m / 1e9:7.1f} GB/s | " + "; ".join(parts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
