"""Collective loading when storage is the bottleneck: N ranks each loading a checkpoint alone from
one HTTP server, against the same N ranks loading it collectively (`tensora.distributed`), in one
interleaved run.

    sudo python tensora-py/bench/bench_collective.py CHECKPOINT_DIR [--ranks 4] [--cap-mbytes 200]
        [--runs 3] [--port 18080] [--timeout 900] [--json OUT.json]

The server is nginx (bench/servers.py, serving CHECKPOINT_DIR's parent on 127.0.0.1:PORT). Its total
bandwidth is capped at `--cap-mbytes` MB/s (1e6 bytes) with a token bucket on the loopback device
(`tc` htb: one class for packets from PORT, everything else, the ranks' exchange included,
unlimited), so the cap holds however many connections the loaders open: that needs root and
`tc`; the script says so and stops otherwise, and removes the qdisc on exit.

Subjects (each a fresh set of N processes with gloo; the timed region runs from a barrier before
the load to a barrier after it, so it is the slowest rank's time):

- alone: every rank `tensora.load_file(url)`: N x the bytes from the server;
- collective: every rank `tensora.distributed.load_file(url)`: each reads its share, then the
  ranks exchange; the bytes from the server are the checkpoint's once.

Rounds alternate the order. Prints medians (min-max) of seconds and of GB/s of checkpoint bytes
per rank, the ratio alone / collective of the medians, the bytes each rank read from the server,
the load average; `--json` keeps every sample.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import ranks  # noqa: E402
from servers import Nginx  # noqa: E402

SUBJECTS = ("alone", "collective")


def worker(a) -> None:
    """One rank: barrier, load, barrier; rank 0 writes the time, every rank its figures."""
    from datetime import timedelta

    import torch.distributed as dist

    import tensora
    import tensora.distributed as td

    dist.init_process_group("gloo", timeout=timedelta(seconds=a.timeout))
    rank = dist.get_rank()
    dist.barrier()
    t0 = time.perf_counter()
    if a.subject == "alone":
        weights, report = tensora.load_file_with_report(a.url, framework="pt")
    else:
        weights, report = td.load_file_with_report(a.url, framework="pt")
    dist.barrier()
    seconds = time.perf_counter() - t0
    figures = {"rank": rank, "seconds": seconds, "bytes_read": report["bytes_read"],
               "bytes_received": report.get("bytes_received", 0),
               "read_seconds": report.get("read_seconds"), "exchange_seconds": report.get("exchange_seconds"),
               "tensors": len(weights),
               "bytes": sum(t.numel() * t.element_size() for t in weights.values())}
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(figures, f)
    dist.destroy_process_group()


def tc(*args: str) -> None:
    r = subprocess.run(["tc", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"tc {' '.join(args)} failed (needs root and the htb qdisc): {r.stderr.strip()}")


def cap_port(port: int, cap_mbytes: float) -> None:
    rate = f"{int(cap_mbytes * 8)}mbit"
    tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "20", "r2q", "1000")
    tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", rate, "ceil", rate,
       "burst", "256k")
    tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate", "100gbit")
    tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
       "sport", str(port), "0xffff", "flowid", "1:10")


def uncap() -> None:
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)


def run_subject(a, subject: str, url: str, work: Path) -> dict:
    out = Path(tempfile.mkdtemp(dir=work))
    argv = [__file__, "--worker", "--subject", subject, "--url", url, "--out", str(out),
            "--timeout", str(a.timeout)]
    codes, errs = ranks.launch(a.ranks, argv, a.timeout + 60)
    if codes != [0] * a.ranks:
        raise SystemExit(f"{subject}: ranks exited {codes}:\n{errs}")
    figures = [json.loads((out / f"rank{r}.json").read_text()) for r in range(a.ranks)]
    shutil.rmtree(out)
    return {"seconds": max(f["seconds"] for f in figures), "ranks": figures}


def summary(xs):
    return statistics.median(xs), min(xs), max(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--cap-mbytes", type=float, default=200.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--subject")
    ap.add_argument("--url")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if not a.checkpoint:
        ap.error("CHECKPOINT_DIR is required")
    ckpt = Path(a.checkpoint).resolve()
    if not ckpt.is_dir():
        raise SystemExit(f"{ckpt}: not a directory")
    ckpt_bytes = sum(f.stat().st_size for f in ckpt.iterdir() if f.is_file())
    work = Path(tempfile.mkdtemp(prefix="tensora-collective-"))
    load_before = os.getloadavg()
    samples = {s: [] for s in SUBJECTS}
    with Nginx(ckpt.parent, a.port) as nginx:
        try:
            cap_port(nginx.port, a.cap_mbytes)
            url = nginx.url(f"{ckpt.name}/")
            for run in range(a.runs):
                order = SUBJECTS if run % 2 == 0 else tuple(reversed(SUBJECTS))
                for s in order:
                    r = run_subject(a, s, url, work)
                    samples[s].append(r)
                    read = [f["bytes_read"] for f in r["ranks"]]
                    print(f"run {run + 1}/{a.runs} {s:>10}: {r['seconds']:7.2f} s, bytes read by rank {read}",
                          flush=True)
        finally:
            uncap()
            shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    med = {s: summary([x["seconds"] for x in samples[s]]) for s in SUBJECTS}
    print(f"\n{a.ranks} ranks, {ckpt_bytes / 1e9:.2f} GB checkpoint, server capped at {a.cap_mbytes:.0f} MB/s "
          f"(alone reads {a.ranks} x the checkpoint, collective reads it once)")
    for s in SUBJECTS:
        m, lo, hi = med[s]
        print(f"  {s:>10}: {m:7.2f} s ({lo:.2f}-{hi:.2f}), {ckpt_bytes / m / 1e9:.3f} GB/s per rank")
    ratio = med["alone"][0] / med["collective"][0]
    print(f"  collective is {ratio:.2f}x faster than alone (medians); load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "ranks": a.ranks, "checkpoint_bytes": ckpt_bytes, "cap_mbytes": a.cap_mbytes, "samples": samples,
            "median_seconds": {s: med[s][0] for s in SUBJECTS}, "ratio_alone_over_collective": ratio,
            "loadavg_before": load_before, "loadavg_after": load_after}, indent=1))


if __name__ == "__main__":
    main()
