"""Warm-cache throughput of tensora.load_file (its default, residence="owned", and the opt-in
residence="auto": mapped views when warm) / weights_iterator vs HF safetensors.numpy.load_file,
and the tensora CLI doing the same kinds of load.

    python tensora-py/bench/bench_load.py CHECKPOINT [--runs N] [--cli target/release/tensora]
        [--json OUT.json]

Fairness: GB = 1e9 bytes of tensor data delivered. Every Python subject's timed region is the
load, then reading one byte of every 4 KiB page of every tensor (so lazy paths are not
flattered and every page is really there), then dropping the result (freeing is part of a
load's cost for a process that swaps models). Each subject gets one warm-up run (which also
fills the page cache), then N timed runs back to back; the median, min and max are reported.

The CLI (`tensora load --json`, owned, and `--mapped`) is timed twice: its own report (the
load only, in-process, what the 10 % goal compares against for the owned load) and the wall
time of the whole process (start, load, drop, exit). `--mapped` in the CLI maps the files and
touches no page, so its figure is the cost of an open, not of delivering bytes.

Prints a table, then one markdown row (for the README); `--json` also writes every sample,
every subject's last load report, and the machine's load average before and after.
"""

import argparse
import gc
import glob
import json
import os
import platform
import resource
import statistics
import subprocess
import time

import numpy as np

import tensora

PAGE_BYTES = 4096


def files_of(path):
    if os.path.isdir(path):
        return sorted(glob.glob(os.path.join(path, "*.safetensors")))
    return [path]


def touch(arrays) -> int:
    """Read one byte of every 4 KiB page of every array (they are contiguous)."""
    s = 0
    for a in arrays:
        if a.size:
            s += int(a.reshape(-1).view(np.uint8)[::PAGE_BYTES].sum())
    return s


def hf_load(path):
    from safetensors.numpy import load_file

    out = {}
    for f in files_of(path):
        out.update(load_file(f))
    touch(out.values())
    return None


def tensora_load(path, residence, reports):
    """`residence=None` is the default (owned), called as a user would, with no argument."""
    kwargs = {} if residence is None else {"residence": residence}
    d, report = tensora.load_file_with_report(path, **kwargs)
    touch(d.values())
    reports.setdefault(residence or "owned", []).append(report)


def stream(path):
    for _, a in tensora.weights_iterator(path, framework="np"):
        touch((a,))


def summary(total_bytes, secs):
    gbps = sorted(total_bytes / s / 1e9 for s in secs)
    return {
        "gbps_median": statistics.median(gbps),
        "gbps_min": gbps[0],
        "gbps_max": gbps[-1],
        "seconds": secs,
    }


def time_python(fn, runs):
    fn()  # warm-up
    gc.collect()
    secs = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        gc.collect()  # frees what `fn` dropped (arrays are freed when their last reference goes)
        secs.append(time.perf_counter() - t)
    return secs


def cpu_seconds(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def cli_once(cli, path, extra):
    """One `tensora load --json` process: (its report, the process's wall seconds, its CPU
    seconds)."""
    c = cpu_seconds(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run([cli, "load", path, "--json", *extra], check=True, capture_output=True)
    wall = time.perf_counter() - t
    return json.loads(out.stdout), wall, cpu_seconds(resource.RUSAGE_CHILDREN) - c


def time_cli(cli, path, extra, runs, between=None):
    """`runs` timed CLI loads after one warm-up; `between()` runs (timed by the caller) before
    each, so two subjects alternate and share the machine's noise."""
    own, wall, cpu, last = [], [], [], None
    cli_once(cli, path, extra)
    for _ in range(runs):
        if between is not None:
            between()
        last, elapsed, c = cli_once(cli, path, extra)
        own.append(last["seconds"])
        wall.append(elapsed)
        cpu.append(c)
    return own, wall, cpu, last


def fmt(s):
    return f"{s['gbps_median']:.2f} ({s['gbps_min']:.2f}-{s['gbps_max']:.2f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cli", help="the tensora CLI binary: also time `tensora load` (owned and --mapped)")
    ap.add_argument("--json", help="write every sample and the load reports here")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    total = sum(t["len_bytes"] for t in tensora.inspect(args.path)["tensors"])
    load_before = os.getloadavg()
    print(f"{args.path}: {total / 1e9:.3f} GB of tensor data, warm, {args.runs} runs, load average {load_before[0]:.2f}")
    reports = {}
    subjects = {
        "hf": ("HF safetensors.numpy.load_file", lambda: hf_load(args.path)),
        "owned": ("tensora.load_file (default: owned)", lambda: tensora_load(args.path, None, reports)),
        "auto": ("tensora.load_file (residence=auto)", lambda: tensora_load(args.path, "auto", reports)),
        "stream": ("tensora.weights_iterator (256 MiB, owned)", lambda: stream(args.path)),
    }
    results = {}
    owned_secs, owned_cpu = [], []

    def owned_run():
        c = cpu_seconds(resource.RUSAGE_SELF)
        t = time.perf_counter()
        subjects["owned"][1]()
        gc.collect()
        owned_secs.append(time.perf_counter() - t)
        owned_cpu.append(cpu_seconds(resource.RUSAGE_SELF) - c)

    for key, (label, fn) in subjects.items():
        if key == "owned" and args.cli:
            # Alternate with the CLI's owned load (below) so both see the same machine noise.
            continue
        results[key] = {"label": label, **summary(total, time_python(fn, args.runs))}
    if args.cli:
        subjects["owned"][1]()  # warm-up
        reports.pop("owned", None)
        own, wall, cpu, last = time_cli(args.cli, args.path, [], args.runs, between=owned_run)
        results["owned"] = {"label": subjects["owned"][0], **summary(total, owned_secs), "cpu_seconds": owned_cpu}
        results["cli_owned"] = {
            "label": "tensora load (owned), alternating with the row above",
            "own_report": summary(total, own),
            "process_wall": summary(total, wall),
            "cpu_seconds": cpu,
            "report": last,
        }
        own, wall, _, last = time_cli(args.cli, args.path, ["--mapped"], args.runs)
        results["cli_mapped"] = {
            "label": "tensora load --mapped (maps, touches no page)",
            "own_report": summary(total, own),
            "process_wall": summary(total, wall),
            "report": last,
        }
    for key in ("auto", "owned"):
        rs = reports[key]
        results[key]["report"] = rs[-1]
        # The load report's own figure (load only: no touch, no drop), as the CLI's.
        results[key]["own_report"] = summary(total, [r["seconds"] for r in rs[-args.runs :]])
    for key, r in results.items():
        if "gbps_median" in r:
            extra = f"; its load report {fmt(r['own_report'])}" if "own_report" in r else ""
            print(f"{r['label']:44s} {r['gbps_median']:7.2f} GB/s median (min {r['gbps_min']:.2f}, max {r['gbps_max']:.2f}){extra}")
        else:
            o, w = r["own_report"], r["process_wall"]
            print(f"{r['label']:44s} {o['gbps_median']:7.2f} GB/s own report (min {o['gbps_min']:.2f}, max {o['gbps_max']:.2f}); whole process {fmt(w)}")
    for key in ("auto", "owned"):
        print(f"  {key}: {results[key]['report']['io_mode']}: {results[key]['report']['reason']}")
    if args.cli:
        py_cpu = statistics.median(results["owned"]["cpu_seconds"])
        cli_cpu = statistics.median(results["cli_owned"]["cpu_seconds"])
        results["owned"]["cpu_vs_cli_owned"] = cli_cpu / py_cpu
        print(
            f"  owned CPU seconds per load (user+sys, median; less sensitive to other load on the machine): "
            f"Python {py_cpu:.2f} s, CLI process {cli_cpu:.2f} s"
        )
    hf = results["hf"]["gbps_median"]
    for key in ("owned", "auto", "stream"):
        results[key]["x_hf"] = results[key]["gbps_median"] / hf
    if "cli_owned" in results:
        cli = results["cli_owned"]["own_report"]["gbps_median"]
        results["owned"]["vs_cli_owned"] = results["owned"]["own_report"]["gbps_median"] / cli
    load_after = os.getloadavg()
    header = (
        "| warm, GB/s median (min-max) | HF load_file | load_file (default: owned) | x HF "
        "| load_file residence=auto | x HF | weights_iterator (owned) | CLI load, owned | Python owned / CLI owned |"
    )
    cli_cells = "| - | - |"
    if "cli_owned" in results:
        cli_cells = (
            f"| {fmt(results['cli_owned']['own_report'])} | {results['owned']['vs_cli_owned'] * 100:.0f}% "
            f"(load reports: {fmt(results['owned']['own_report'])}; CPU s per load "
            f"{statistics.median(results['owned']['cpu_seconds']):.2f} vs "
            f"{statistics.median(results['cli_owned']['cpu_seconds']):.2f}) |"
        )
    row = (
        f"| {os.path.basename(os.path.normpath(args.path))}, {total / 1e9:.1f} GB | {fmt(results['hf'])} "
        f"| {fmt(results['owned'])} | {results['owned']['x_hf']:.1f} "
        f"| {fmt(results['auto'])} ({results['auto']['report']['io_mode']}) | {results['auto']['x_hf']:.1f} "
        f"| {fmt(results['stream'])} {cli_cells}"
    )
    print()
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    print(row)
    if args.json:
        doc = {
            "schema": 1,
            "path": args.path,
            "bytes": total,
            "runs": args.runs,
            "machine": {
                "cpus": os.cpu_count(),
                "kernel": platform.release(),
                "python": platform.python_version(),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
            },
            "results": results,
            "markdown_header": header,
            "markdown_row": row,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
