"""Tensor-parallel acceptance cells (issue 44): what each rank reads, and how fast, cold.

    python tensora-py/bench/bench_tp.py CHECKPOINT_DIR [--runs N] [--slice-dir DIR] [--json OUT]

Cells, every measurement a fresh process with the page cache dropped first (as bench_load.py):

- tp4: each of 4 ranks loads its share with the Llama rules (`tensora.load_file(framework="pt",
  tp=(rank, 4))`); per rank the report's bytes_read and the process's read_bytes (/proc/self/io:
  what the disk delivered), and the sum over ranks against the checkpoint plus 4 x the
  replicated tensors. Once, untimed: every rank's tensors bit-equal to HF
  `safetensors.torch.load_file` + `torch.chunk(4, dim)[rank]`.
- tp4together: the 4 ranks' processes loading at once, cold (one drop before them; each loads
  once all have imported torch and tensora): each report's bytes_read, their sum against the
  checkpoint, and what the device delivered meanwhile (/proc/diskstats of the fixture's block
  device, which other processes on it add to: the page cache serves a page one rank read to the
  others).
- get_slice: 1/8 of a 512 MiB F32 tensor [8192, 16384] along dimension 0 and along dimension 1
  (`safe_open(...).get_slice("w")[...]`), bytes read per the report and /proc/self/io.
- tp2: rank 0 of 2, cold, GB/s of the bytes it needs (`bytes_selected / seconds`) against the
  cold read roofline (bench_load.py's roofline child: 8 MiB O_DIRECT preadv by 8 threads), and
  against the share's own roofline: the device alone delivering the share (share_plans.py) as
  covering ranges and as exactly its rows, the faster of the two, whose needed bytes per second
  over the whole files' (read the same way) bound the first ratio for any loader. A row-parallel slice's rows are
  shorter than a page, or a few pages with gaps shorter than a page, so a device answers either
  with the gaps too (covering) or with one request per row: where a request costs more than its
  gap takes to transfer, the share's roofline lies below the roofline of the bytes it needs, for
  any loader. All alternated in every round.

Medians with min..max; the machine may be shared (say so with the numbers).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_load import drop_caches  # noqa: E402  (one eviction helper)

SPLIT_DIMS = {"column": 0, "row": 1}


def read_bytes(field="read_bytes"):
    """This process's `field` of /proc/self/io: `read_bytes` (what the disk delivered to it),
    `syscr` (read system calls)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith(field + ":")).split()[1])


def child_tp(path, rank, world, wait=False):
    import torch  # noqa: F401  (imported untimed, as bench_load.py's children: its libraries are cold too)

    import tensora

    if wait:  # started together: say so once imported, and load when told
        print("ready", flush=True)
        sys.stdin.readline()
    before, calls, device = read_bytes(), read_bytes("syscr"), device_read_bytes(path)
    t = time.perf_counter()
    weights, report = tensora.load_file_with_report(path, framework="pt", tp=(rank, world), rules="llama")
    seconds = time.perf_counter() - t
    disk = read_bytes() - before
    print(json.dumps({"seconds": seconds, "disk_bytes": disk, "bytes_read": report["bytes_read"],
                      "bytes_selected": report["bytes_selected"], "slices": report["slices"],
                      "io_mode": report["io_mode"], "backend": report.get("backend"), "tensors": len(weights),
                      "read_calls": read_bytes("syscr") - calls, "device_bytes": device_read_bytes(path) - device}))


def device_read_bytes(path):
    """Bytes read so far from the block device holding `path` (/proc/diskstats, 512-byte sectors)."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if int(fields[0]) == major and int(fields[1]) == minor:
                return int(fields[5]) * 512
    raise SystemExit(f"{path}: device {major}:{minor} is not in /proc/diskstats")


def together(path, files, world):
    """`world` rank processes, each told to load once all of them imported torch and tensora, after
    one drop: their results, the device bytes from the go to the last result (torch's libraries
    read in by the imports not counted; other processes' reads on the device are), and that wall."""
    drop_caches(files)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), path, "--child", "tp", str(rank), str(world),
                               "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise SystemExit(f"together: a rank did not start: {p.stderr.read()[-500:]}")
    before = device_read_bytes(path)
    t = time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"together rank {rank}: exit {p.returncode}: {err.strip()[-500:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results, device_read_bytes(path) - before, time.perf_counter() - t


def child_slice(path, dim):
    import torch  # noqa: F401  (untimed, see child_tp)

    import tensora

    with tensora.safe_open(path, framework="pt") as f:
        rows, cols = f.get_slice("w").get_shape()
        start, length = (rows // 8, rows // 8) if dim == 0 else (cols // 8, cols // 8)
        before = read_bytes()
        t = time.perf_counter()
        data, report = f._m().slice("w", dim, start, length)
        seconds = time.perf_counter() - t
        disk = read_bytes() - before
    report = json.loads(report)
    print(json.dumps({"seconds": seconds, "disk_bytes": disk, "bytes_read": report["bytes_read"],
                      "bytes_selected": report["bytes_selected"], "slices": report["slices"],
                      "io_mode": report["io_mode"], "tensor_bytes": rows * cols * 4}))


def child_verify(path, world):
    """Every rank's share bit-equal to HF load_file + torch.chunk; prints the replicated bytes."""
    import glob

    import torch
    from safetensors.torch import load_file as hf_load_file

    import tensora

    whole = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        whole.update(hf_load_file(f))
    replicated = 0
    for rank in range(world):
        share = tensora.load_file(path, framework="pt", tp=(rank, world), rules="llama")
        assert set(share) == set(whole)
        for name, t in whole.items():
            dim = split_dim(name)
            if dim is None:
                want = t
                replicated += t.numel() * t.element_size() if rank == 0 else 0
            else:
                chunks = t.chunk(world, dim)
                want = chunks[rank] if rank < len(chunks) else t.narrow(dim, 0, 0)
            # Bit-equal: the bytes, not the values (random fixtures hold NaNs, never equal to themselves).
            if share[name].shape != want.shape or not torch.equal(bits(share[name]), bits(want)):
                raise SystemExit(f"rank {rank}: {name} differs from HF load_file + chunk")
        del share
    total = sum(t.numel() * t.element_size() for t in whole.values())
    print(json.dumps({"equal": True, "replicated_bytes": replicated, "total_bytes": total}))


def bits(t):
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8)


def split_dim(name):
    """The Llama preset's split of `name` (the same patterns as tensora_format::TpRules::preset)."""
    import fnmatch

    rules = [("*.q_proj.weight", 0), ("*.k_proj.weight", 0), ("*.v_proj.weight", 0), ("*.o_proj.weight", 1),
             ("*.gate_proj.weight", 0), ("*.up_proj.weight", 0), ("*.down_proj.weight", 1),
             ("*embed_tokens.weight", 0), ("lm_head.weight", 0)]
    return next((d for p, d in rules if fnmatch.fnmatchcase(name, p)), None)


def roofline(path, files):
    drop_caches(files)
    env = dict(os.environ, TENSORA_BENCH_DIRECT="1")
    r = subprocess.run([sys.executable, os.path.join(HERE, "bench_load.py"), "--child", "roofline", path],
                       capture_output=True, text=True, timeout=900, env=env)
    if r.returncode != 0:
        raise SystemExit(f"roofline: {r.stderr.strip()[-500:]}")
    m = json.loads(r.stdout.strip().splitlines()[-1])
    return m["bytes"] / m["seconds"] / 1e9


def med(xs):
    xs = sorted(xs)
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1]}


def fmt(m, scale=1.0, digits=3):
    return f"{m['median'] / scale:.{digits}f} ({m['min'] / scale:.{digits}f}..{m['max'] / scale:.{digits}f})"


def write_slice_fixture(directory):
    import numpy as np

    from tensora.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "slice512.safetensors")
    if not os.path.exists(path):
        w = np.arange(8192 * 16384, dtype=np.float32).reshape(8192, 16384)
        save_file({"w": w}, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--slice-dir", default=os.path.join(HERE, "..", "..", "target", "bench-tp"))
    ap.add_argument("--cells", default="verify,tp4,tp4together,get_slice,tp2")
    ap.add_argument("--json")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.child:
        kind, *params = args.child + rest
        if kind == "tp":
            return child_tp(args.path, int(params[0]), int(params[1]), params[2:] == ["wait"])
        if kind == "slice":
            return child_slice(args.path, int(params[0]))
        if kind == "verify":
            return child_verify(args.path, int(params[0]))
        raise SystemExit(f"unknown child {kind}")
    import tensora

    info = tensora.inspect(args.path)
    files = [f["path"] for f in info["files"]]
    total = sum(t["nbytes"] for t in info["tensors"])
    cells = args.cells.split(",")
    doc = {"path": args.path, "bytes": total, "runs": args.runs, "loadavg_before": os.getloadavg()}
    print(f"{args.path}: {total} bytes, {len(files)} files, load average {os.getloadavg()[0]:.1f}")
    if "verify" in cells:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), args.path, "--child", "verify", "4"],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(f"verify: {r.stderr.strip()[-800:]}")
        v = json.loads(r.stdout.strip().splitlines()[-1])
        doc["verify"] = v
        print(f"verify: every rank of 4 bit-equal to HF load_file + chunk; replicated {v['replicated_bytes']} bytes")
    if "tp4" in cells:
        per_rank = {rank: [] for rank in range(4)}
        for _ in range(args.runs):
            for rank in range(4):
                drop_caches(files)
                per_rank[rank].append(child_args(args.path, ["tp", rank, 4]))
        doc["tp4"] = per_rank
        sums = []
        for rank, samples in per_rank.items():
            s = samples[0]
            print(f"tp4 rank {rank}: selected {s['bytes_selected']}, read {s['bytes_read']} (report), "
                  f"disk {fmt(med([x['disk_bytes'] for x in samples]), 1, 0)}, "
                  f"{fmt(med([x['seconds'] for x in samples]))} s, {s['io_mode']}, slices {s['slices']}")
        for i in range(args.runs):
            sums.append(sum(per_rank[r][i]["bytes_read"] for r in range(4)))
        doc["tp4_sum_bytes_read"] = sums
        rep = doc.get("verify", {}).get("replicated_bytes")
        bound = f", bound 1.05 x {total} + 4 x {rep} = {1.05 * total + 4 * rep:.0f}" if rep is not None else ""
        print(f"tp4 sum of bytes read over ranks: {sums[0]} = {sums[0] / total:.3f} x checkpoint{bound}")
    if "tp4together" in cells:
        rounds = [together(args.path, files, 4) for _ in range(args.runs)]
        doc["tp4together"] = [{"ranks": r, "device_bytes": d, "wall_seconds": w} for r, d, w in rounds]
        sums = [sum(x["bytes_read"] for x in r) for r, _, _ in rounds]
        device = [d for _, d, _ in rounds]
        walls = [w for _, _, w in rounds]
        last = rounds[-1][0]
        print(f"tp4together: bytes_read by rank {[x['bytes_read'] for x in last]} ({[x['io_mode'] for x in last]}, "
              f"slices {last[0]['slices']}); sum {fmt(med(sums), total, 3)} x checkpoint; device "
              f"{fmt(med(device), total, 3)} x checkpoint; wall {fmt(med(walls), 1, 2)} s")
    if "get_slice" in cells:
        spath = write_slice_fixture(args.slice_dir)
        out = {0: [], 1: []}
        for _ in range(args.runs):
            for dim in (0, 1):
                drop_caches([spath])
                out[dim].append(child_args(spath, ["slice", dim]))
        doc["get_slice"] = out
        for dim, samples in out.items():
            s = samples[0]
            disk = med([x["disk_bytes"] for x in samples])
            print(f"get_slice 1/8 dim {dim}: selected {s['bytes_selected']} = {s['bytes_selected'] / s['tensor_bytes']:.4f} "
                  f"of the tensor; read {s['bytes_read']} (report, {s['bytes_read'] / s['tensor_bytes']:.4f}), "
                  f"disk {fmt(disk, 1, 0)} ({disk['median'] / s['tensor_bytes']:.4f}), {s['io_mode']}, {s['slices']}")
        os.remove(spath)
    if "tp2" in cells:
        tp2(args.path, files, args.runs, doc)
    doc["loadavg_after"] = os.getloadavg()
    print(f"load average {doc['loadavg_before'][0]:.1f} before, {doc['loadavg_after'][0]:.1f} after (shared machine)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)


def share_plan(path, kind):
    """The device alone reading rank 0 of 2's share (or the whole files) by `kind` (share_plans.py)."""
    r = subprocess.run([sys.executable, os.path.join(HERE, "share_plans.py"), path, "0", "2", kind],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"share plan {kind}: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def tp2(path, files, runs, doc):
    """Rank 0 of 2, cold, against the read roofline of the bytes it needs, and against the share's
    own roofline (share_plans.py: the device alone delivering the share, by covering ranges or by
    exactly its rows, and the whole files the same way), all alternated in every round."""
    tp, read, roof, plans, loads = [], [], [], {"whole": [], "covering": [], "rows": []}, []
    for _ in range(runs):
        drop_caches(files)
        s = child_args(path, ["tp", 0, 2])
        loads.append(s)
        tp.append(s["bytes_selected"] / s["seconds"] / 1e9)
        read.append(s["bytes_read"] / s["seconds"] / 1e9)
        roof.append(roofline(path, files))
        for kind in plans:
            drop_caches(files)
            plans[kind].append(share_plan(path, kind))
    doc["tp2"] = {"gbps": tp, "read_gbps": read, "roofline_gbps": roof, "plans": plans, "loads": loads}
    print(f"tp2 rank 0: {s['io_mode']} via {s['backend']}, slices {s['slices']}, {s['read_calls']} read calls, "
          f"disk {s['disk_bytes']} bytes to the process, device {s['device_bytes']} bytes (all readers), "
          f"{s['seconds']:.2f} s (last run)")
    ratios = [a / b for a, b in zip(tp, roof)]
    read_ratios = [a / b for a, b in zip(read, roof)]
    needed = s["bytes_selected"]
    print(f"tp2 rank 0 cold: {fmt(med(tp), 1, 2)} GB/s of the {needed} bytes it needs, "
          f"{fmt(med(read), 1, 2)} GB/s of the {s['bytes_read']} it reads; roofline {fmt(med(roof), 1, 2)} GB/s; "
          f"x roofline {fmt(med(ratios), 1, 2)} (needed), {fmt(med(read_ratios), 1, 2)} (read)")
    for kind, xs in plans.items():
        x = xs[-1]
        print(f"tp2 {kind} read alone (share_plans.py, O_DIRECT, the device alone): {x['bytes']} bytes in "
              f"{x['requests']} requests ({x['block_bytes']} B blocks), {fmt(med([y['seconds'] for y in xs]), 1, 3)} s")
    best = [min(c["seconds"], r["seconds"]) for c, r in zip(plans["covering"], plans["rows"])]
    whole_gbps = [w["bytes"] / w["seconds"] / 1e9 for w in plans["whole"]]
    bound = [needed / b / 1e9 / w for b, w in zip(best, whole_gbps)]
    of_device = [needed / x["seconds"] / 1e9 / w for x, w in zip(loads, whole_gbps)]
    of_share = [b / x["seconds"] for b, x in zip(best, loads)]
    doc["tp2"].update({"share_roofline_seconds": best, "bound": bound, "of_share_roofline": of_share})
    print(f"tp2 share roofline (the faster plan each round): {fmt(med(best), 1, 3)} s; at it the bytes the share "
          f"needs arrive at {fmt(med(bound), 1, 2)} x the rate of the whole files read the same way (the device "
          f"alone): no loader's share arrives faster, against any roofline of the files' bytes; the load "
          f"{fmt(med(of_device), 1, 2)} x that rate, {fmt(med(of_share), 1, 2)} of the share roofline's speed")


def child_args(path, params):
    r = subprocess.run([sys.executable, os.path.abspath(__file__), path, "--child", *map(str, params)],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"{params}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
