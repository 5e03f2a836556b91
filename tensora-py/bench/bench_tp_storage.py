"""The storage-bound tensor-parallel cell (issue 44): 4 `torchrun` ranks on gloo load their TP=4
shares of a checkpoint from nginx capped at a total rate (200 MB/s for all connections together),
three ways, alternated in every round:

- whole: each rank loads every tensor (`tensora.load_file(url, framework="pt")`) and narrows it to
  its share (`torch.chunk(4, dim)[rank]`, Llama rules), as a loader without slices does;
- collective: today's `tensora.distributed.load_file(url)` (each byte read once across the group,
  whole tensors exchanged) and the same narrowing;
- group: `tensora.distributed.load_tp(url)`, the group split (each byte read once across the group,
  only slices exchanged).

    python tensora-py/bench/bench_tp_storage.py CHECKPOINT_DIR [--runs 3] [--rate 200e6] [--json OUT]

The cap: nginx runs in a network namespace of its own, reached over a veth pair whose namespace
side sends at most `--rate` bytes per second in all (`tc` token bucket). Loopback, which gloo's
exchange uses, is not shaped. (nginx's own `limit_rate` is per connection: a loader that opens more
connections would get more.) Needs root (`ip netns`, `tc`).

Seconds per load are rank 0's, from a barrier before the load to a barrier after it (so the slowest
rank counts); torch and tensora are imported before the first barrier. Each round checks that
every rank's `group` tensors are bit-equal to its `whole` ones (digests). Also printed: the bytes
nginx sent per load against the checkpoint, and the rate they came at. Goal: group >= 3.5x faster
than whole, and faster than collective. The machine may be shared: say so with the numbers.
"""

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from servers import Nginx  # noqa: E402

MODES = ("whole", "collective", "group")
# The namespace nginx serves from, its veth pair and their addresses.
NETNS = "tensora-tp-bench"
VETH_HOST, VETH_NS = "tptb-h", "tptb-n"
HOST_ADDR, NS_ADDR = "10.231.0.1", "10.231.0.2"
# The token bucket's burst: well above the rate over the kernel's tick (200 KB at 1000 Hz) and a
# segmentation offload's 64 KiB.
TBF_BURST_BYTES = 4 << 20
WORLD = 4
# The most seconds one torchrun of one mode may take (a 2.2 GB checkpoint read 4 times at 200 MB/s
# is 44 s).
LAUNCH_TIMEOUT_S = 900


def digest(t) -> str:
    import torch

    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def narrowed(weights, dims, rank):
    """Each tensor narrowed to `rank`'s share (`torch.chunk`), copied as a weight loader would."""
    out = {}
    for name, t in weights.items():
        dim = dims[name]
        if dim is None:
            out[name] = t
            continue
        parts = t.chunk(WORLD, dim)
        out[name] = parts[rank].contiguous() if rank < len(parts) else t.narrow(dim, 0, 0)
    return out


def child(mode, url, out_dir):
    """One rank under torchrun: load `url` the `mode` way, write seconds, bytes and digests."""
    import torch  # noqa: F401  (imported before the clock)
    import torch.distributed as dist

    import tensora
    import tensora.distributed as td

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    _, reads = tensora._native.TpSource(url).reads(rank, WORLD)
    dims = {name: dim for name, _, _, dim, *_ in reads}
    dist.barrier()
    t = time.perf_counter()
    if mode == "whole":
        weights, report = tensora.load_file_with_report(url, framework="pt")
        got = narrowed(weights, dims, rank)
    elif mode == "collective":
        weights, report = td.load_file_with_report(url)
        got = narrowed(weights, dims, rank)
    else:
        got, report = td.load_tp_with_report(url)
    dist.barrier()
    seconds = time.perf_counter() - t
    res = {"rank": rank, "seconds": seconds, "bytes_read": report["bytes_read"],
           "exchange_seconds": report.get("group_split", {}).get("exchange_seconds", report.get("exchange_seconds")),
           "bytes_received": report.get("bytes_received", 0),
           "digests": {name: digest(v) for name, v in got.items()}}
    with open(os.path.join(out_dir, f"{mode}-rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def launch(mode, url):
    """One torchrun of `mode`; returns every rank's result by rank."""
    with tempfile.TemporaryDirectory(prefix="tensora-tp-") as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               os.path.abspath(__file__), "--child", mode, url, out]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
        if r.returncode != 0:
            raise SystemExit(f"{mode}: torchrun exited {r.returncode}: {r.stderr.strip()[-1500:]}")
        results = {}
        for rank in range(WORLD):
            with open(os.path.join(out, f"{mode}-rank{rank}.json")) as f:
                results[rank] = json.load(f)
        return results


@contextlib.contextmanager
def capped_link(rate_bytes):
    """A network namespace reached from here over a veth pair whose namespace side sends at most
    `rate_bytes` per second in all; yields the command prefix that runs in it and its address.
    Removed on exit (and a leftover of a killed run first)."""
    def run(*cmd):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)}: {r.stderr.strip()}")

    ns = ["ip", "netns", "exec", NETNS]
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    run("ip", "netns", "add", NETNS)
    try:
        run("ip", "link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_NS)
        run("ip", "link", "set", VETH_NS, "netns", NETNS)
        run("ip", "addr", "add", f"{HOST_ADDR}/30", "dev", VETH_HOST)
        run("ip", "link", "set", VETH_HOST, "up")
        run(*ns, "ip", "addr", "add", f"{NS_ADDR}/30", "dev", VETH_NS)
        run(*ns, "ip", "link", "set", VETH_NS, "up")
        run(*ns, "ip", "link", "set", "lo", "up")
        run(*ns, "tc", "qdisc", "add", "dev", VETH_NS, "root", "tbf", "rate", f"{int(rate_bytes) * 8}bit",
            "burst", str(TBF_BURST_BYTES), "latency", "100ms")
        yield ns, NS_ADDR
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
        subprocess.run(["ip", "link", "del", VETH_HOST], capture_output=True)


def med(xs):
    xs = sorted(xs)
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1]}


def fmt(m, digits=2):
    return f"{m['median']:.{digits}f} ({m['min']:.{digits}f}..{m['max']:.{digits}f})"


def nginx_sent_bytes(pid):
    """Bytes nginx's processes (the master and its workers) wrote to sockets and files so far."""
    total = 0
    for p in [pid] + [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]:
        with open(f"/proc/{p}/io") as f:
            total += int(next(line for line in f if line.startswith("wchar:")).split()[1])
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", nargs="?")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200e6, help="nginx's total rate, bytes per second")
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "URL", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    import tensora

    path = os.path.abspath(args.path)
    total = sum(t["nbytes"] for t in tensora.inspect(path)["tensors"])
    doc = {"path": path, "bytes": total, "runs": args.runs, "rate": args.rate, "world": WORLD,
           "loadavg_before": os.getloadavg(), "seconds": {m: [] for m in MODES},
           "served_bytes": {m: [] for m in MODES}, "bytes_read": {m: [] for m in MODES}}
    print(f"{path}: {total} bytes; nginx capped at {args.rate / 1e6:.0f} MB/s in all (tc tbf on its veth); {WORLD} torchrun ranks "
          f"on gloo; load average {os.getloadavg()[0]:.1f}")
    with capped_link(args.rate) as (launcher, addr), Nginx(os.path.dirname(path), host=addr, launcher=launcher) as n:
        url = n.url(os.path.basename(path) + "/")
        for run in range(args.runs):
            digests = {}
            for mode in MODES:
                before = nginx_sent_bytes(n._proc.pid)
                res = launch(mode, url)
                served = nginx_sent_bytes(n._proc.pid) - before
                doc["seconds"][mode].append(res[0]["seconds"])
                doc["served_bytes"][mode].append(served)
                doc["bytes_read"][mode].append(sum(r["bytes_read"] for r in res.values()))
                digests[mode] = {r: res[r]["digests"] for r in res}
                print(f"run {run + 1} {mode}: {res[0]['seconds']:.2f} s (rank 0 exchanging "
                      f"{res[0]['exchange_seconds'] or 0:.2f} s), nginx sent {served / total:.3f}x the "
                      f"checkpoint ({served / res[0]['seconds'] / 1e6:.0f} MB/s), bytes_read by rank "
                      f"{[res[r]['bytes_read'] for r in range(WORLD)]}", flush=True)
            for mode in ("collective", "group"):
                if digests[mode] != digests["whole"]:
                    raise SystemExit(f"run {run + 1}: {mode}'s tensors differ from whole + narrow")
    s = {m: med(doc["seconds"][m]) for m in MODES}
    speedup = [w / g for w, g in zip(doc["seconds"]["whole"], doc["seconds"]["group"])]
    versus = [c / g for c, g in zip(doc["seconds"]["collective"], doc["seconds"]["group"])]
    doc["loadavg_after"] = os.getloadavg()
    print(f"medians of {args.runs} (min..max), seconds: whole + narrow {fmt(s['whole'])}, collective + narrow "
          f"{fmt(s['collective'])}, group split {fmt(s['group'])}")
    print(f"group split x faster than whole: {fmt(med(speedup))} (goal >= 3.5); than collective: "
          f"{fmt(med(versus))} (goal > 1); every rank bit-equal to whole + narrow")
    print(f"load average {doc['loadavg_before'][0]:.1f} before, {doc['loadavg_after'][0]:.1f} after (shared machine)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
