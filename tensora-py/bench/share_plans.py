"""What the device alone takes to deliver one tensor-parallel rank's share, read two ways, and the
whole files read the same way (bench_tp.py's tp2 cell: the share's own roofline, measured in the
same run as the load):

- whole: every byte of every file, in 8 MiB `O_DIRECT` `preadv`s by 16 threads (the roofline
  child's 8, deeper), into memory faulted in before the timer (bench_load.py's `device` child);
- covering: every tensor's slice as one range (a row-parallel slice from its first row's start to
  its last row's end, the other ranks' columns between), widened to 4 KiB, read as `whole`;
- rows: the same, except that each row of a row-parallel slice is its own read, widened only to
  the device's logical block (512 B here): exactly the rows, in as many requests. 64 processes
  issue them (Python's lock caps one process's threads near half the device's request rate; 64
  processes reached what 64 C threads reach, measured here).

The faster of covering and rows is the share's roofline: no loader reads the share from this
device faster, whatever it does with the bytes (a mix does no better where, as here, a device's
time is its requests' fixed costs plus its bytes: each row-parallel tensor is faster one way or
the other). Its needed bytes per second over `whole`'s bytes per second bound what any loader's
"x roofline (needed)" can reach. The Llama rules and torch.chunk's split, as bench_tp.py's
`split_dim`.

    python share_plans.py CHECKPOINT_DIR RANK WORLD whole|covering|rows   (prints one JSON line)
"""

import json
import mmap
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_load import read_jobs  # noqa: E402  (one O_DIRECT reader for the benches)

PAGE_BYTES = 4096
PIECE_BYTES = 8 << 20
COVERING_THREADS = 16
ROWS_PROCESSES = 64


def share(path, rank, world, split_dim):
    """Per file of the checkpoint (`tensora.inspect`'s layout): (whole ranges, row-parallel
    slices), where a whole range is (offset, length) read as one, and a row-parallel slice is
    (offset of its first row, rows, width, stride) in bytes; and the bytes the share needs."""
    import tensora

    info = tensora.inspect(path)
    out = {f["path"]: ([], []) for f in info["files"]}
    needed = 0
    for t in info["tensors"]:
        whole, strided = out[info["files"][t["file"]]["path"]]
        start, length, shape = t["offset_bytes"], t["len_bytes"], t["shape"]
        dim = split_dim(t["name"]) if shape else None
        if dim is None or length == 0:
            whole.append((start, length))
            needed += length
            continue
        rows = shape[0]
        inner = length // rows
        if dim == 0:
            size = -(-rows // world)
            first, n = rank * size, max(0, min(size, rows - rank * size))
            whole.append((start + first * inner, n * inner))
            needed += n * inner
        else:
            cols = shape[1]
            per_col = inner // cols
            size = -(-cols // world)
            first, n = rank * size, max(0, min(size, cols - rank * size))
            strided.append((start + first * per_col, rows, n * per_col, inner))
            needed += rows * n * per_col
    return out, needed


def widen(off, length, block):
    lo = off // block * block
    return lo, -(-(off + length) // block) * block - lo


def requests(plan, kind, block):
    """(file, offset, length) reads of one plan, aligned for O_DIRECT, in file order (as a load's
    plan orders its reads: a device behind a host's file cache reads ahead sequentially)."""
    reqs = []
    for f, (whole, strided) in plan.items():
        if kind == "whole":
            size = os.path.getsize(f)
            reqs += [(f, at, -(-min(PIECE_BYTES, size - at) // PAGE_BYTES) * PAGE_BYTES)
                     for at in range(0, size, PIECE_BYTES)]
            continue
        ranges = list(whole)
        if kind == "covering":
            ranges += [(o, (rows - 1) * stride + width) for o, rows, width, stride in strided if rows and width]
        for off, length in ranges:
            lo, n = widen(off, length, PAGE_BYTES)
            reqs += [(f, at, min(PIECE_BYTES, lo + n - at)) for at in range(lo, lo + n, PIECE_BYTES)]
        if kind == "rows":
            for o, rows, width, stride in strided:
                reqs += [(f, *widen(o + r * stride, width, block)) for r in range(rows) if width]
    return sorted(reqs)


def logical_block(path):
    st = os.stat(path)
    try:
        with open(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/queue/logical_block_size") as f:
            return int(f.read())
    except OSError:  # a partition: its disk's queue
        try:
            with open(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/../queue/logical_block_size") as f:
                return int(f.read())
        except OSError:
            return PAGE_BYTES


def faulted(reqs):
    """One anonymous buffer for `reqs`, every page faulted in before the timer (the device alone,
    as bench_load.py's `device` child: this VM's cost of first touching fresh memory varies more
    than the device), and where each request lands in it (each on a 4 KiB boundary, as O_DIRECT
    wants its memory)."""
    at, dest = 0, []
    for _, _, n in reqs:
        dest.append(at)
        at += -(-n // PAGE_BYTES) * PAGE_BYTES
    buf = mmap.mmap(-1, max(at, PAGE_BYTES))
    view = memoryview(buf)
    for page in range(0, len(buf), PAGE_BYTES):
        view[page] = 1
    view.release()
    return buf, dest


def jobs_of(reqs, dest):
    """`read_jobs`' jobs for `reqs` landing at `dest`, in file order (it takes the last first); a
    widened last read asks only for the bytes up to the end of its file."""
    sizes = {f: os.path.getsize(f) for f in {f for f, _, _ in reqs}}
    return [(f, off, at, min(n, sizes[f] - off)) for (f, off, n), at in reversed(list(zip(reqs, dest)))]


def covering(reqs):
    """`COVERING_THREADS` threads (the `whole` and `covering` plans) into one faulted buffer; the
    seconds from the first read to the last."""
    buf, dest = faulted(reqs)
    jobs = jobs_of(reqs, dest)
    view = memoryview(buf)
    t = time.perf_counter()
    read_jobs(jobs, view, COVERING_THREADS, direct=True)
    seconds = time.perf_counter() - t
    view.release()
    return seconds


def rows(reqs, block):
    """`ROWS_PROCESSES` processes, each with every `ROWS_PROCESSES`-th request and its own faulted
    buffer, told to start together once all are ready; the seconds from the go to the last exit."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pids = []
    for k in range(ROWS_PROCESSES):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(ready_r)
                os.close(go_w)
                mine = reqs[k::ROWS_PROCESSES]
                buf, dest = faulted(mine)
                jobs = jobs_of(mine, dest)
                os.write(ready_w, b"r")
                if os.read(go_r, 1) != b"g":
                    os._exit(1)
                read_jobs(jobs, memoryview(buf), 1, direct=True, block=block)
            except BaseException:  # noqa: BLE001  (the exit status says it)
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(ready_w)
    os.close(go_r)
    got = 0
    while got < ROWS_PROCESSES:
        b = os.read(ready_r, ROWS_PROCESSES)
        if not b:  # every writer gone: a reader failed before it was ready
            break
        got += len(b)
    t = time.perf_counter()
    os.write(go_w, b"g" * ROWS_PROCESSES)
    failed = sum(os.waitpid(p, 0)[1] != 0 for p in pids)
    seconds = time.perf_counter() - t
    if failed or got < ROWS_PROCESSES:
        raise SystemExit(f"rows: {failed} of {ROWS_PROCESSES} readers failed")
    return seconds


def main():
    from bench_tp import split_dim

    path, rank, world, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    plan, needed = share(path, rank, world, split_dim)
    block = logical_block(next(iter(plan)))
    reqs = requests(plan, kind, block)
    if kind not in ("whole", "covering", "rows"):
        raise SystemExit(f"unknown plan {kind!r}: whole, covering or rows")
    seconds = rows(reqs, block) if kind == "rows" else covering(reqs)
    print(json.dumps({"plan": kind, "seconds": seconds, "bytes": sum(n for _, _, n in reqs),
                      "requests": len(reqs), "needed_bytes": needed, "block_bytes": block}))


if __name__ == "__main__":
    main()
