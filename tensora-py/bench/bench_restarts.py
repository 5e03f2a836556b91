"""Situation (c), restarts: what a cold start leaves for the next process on the node.

    python tensora-py/bench/bench_restarts.py CHECKPOINT [--cli PATH] [--sequences N]
        [--restarts N] [--subjects a,b,...] [--together N] [--no-limited] [--scratch DIR]
        [--timeout S] [--json OUT.json]

Sequences: the checkpoint's pages are dropped from the page cache once (`POSIX_FADV_DONTNEED` on
each file: the interpreter's and torch's libraries stay cached, as on a node that ran a job
before), then the subject loads the whole checkpoint in a
fresh process `1 + restarts` times in a row (a cold start, then restarts: a server that restarts,
a notebook run again). Every step is a process of its own, timed as `bench_load.py` times its
children (imports untimed; the load and a touch of every page timed). The ideal sequence is the
cold roofline once (O_DIRECT into fresh memory, bench_load's `roofline` cold) and then the warm
roofline (two threads of `preadv` from the page cache into fresh memory) for each restart.
Sequences are interleaved: each round runs every subject's sequence once, in a shuffled order.

Subjects: bench_load.py's (`auto`, `owned`, `hf_torch`, `hf_numpy`, `runai`, `fastsafetensors`,
`stream`) and `cli`: the `tensora load CHECKPOINT --json` binary given by `--cli`, timed by its
own report's `seconds`.

Together: the checkpoint's pages dropped, `--together` processes of one subject start at once on the same
checkpoint (the tensor-parallel workers' pattern without `tensora.distributed`): the wall time
until the last one ends, and the bytes read from the checkpoint's block device in that time
(`/proc/diskstats`), against the wall of one process alone started the same way.

Limited: a load in a memory cgroup whose limit leaves less room than the checkpoint, the page cache
holding another file (a 512 MiB "neighbour" read just before): what `auto` chose (its report's
reason) and how much of the neighbour is still cached afterwards (`fincore`). Needs root and a
writable memory cgroup; otherwise the section says why it was skipped.

Prints one table per part and the acceptance ratios of issue 40; `--json` writes every step.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_load  # noqa: E402  (the children, the cache drop and the round order live there)

# The neighbour file of the limited case, and the cgroup's limit above the checkpoint's size: an
# owned copy and a Python child with torch imported fit under it, the checkpoint's pages beside
# them (plus auto's margin, at least 1 GiB) do not.
NEIGHBOUR_BYTES = 512 << 20
LIMITED_SPARE_BYTES = 1 << 30
LIMITED_CGROUP = "tensora-bench-limited"
STEP_TIMEOUT_DEFAULT_S = 600


def measure_step(subject, path, cli, temp, timeout_s):
    """One fresh process of `subject`; its `{"seconds", "report"...}` or `{"error"}`."""
    if subject != "cli":
        return bench_load.measure(subject, path, temp, timeout_s)
    try:
        r = subprocess.run([cli, "load", path, "--json"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s} s"}
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {r.stderr.strip()[-300:]}"}
    report = json.loads(r.stdout)
    return {"seconds": report["seconds"], "bytes": report["bytes_selected"], "report": report}


def reason_of(step):
    report = step.get("report") or {}
    return report.get("reason", "")


def sequence(subject, path, cli, restarts, timeout_s):
    """Drop the cache once, then `1 + restarts` fresh processes; the steps."""
    bench_load.evict(bench_load.files_of(path))
    steps = []
    for i in range(1 + restarts):
        if subject == "ideal":
            step = bench_load.measure("roofline", path, "cold" if i == 0 else "warm", timeout_s)
        else:
            step = measure_step(subject, path, cli, "warm", timeout_s)
        steps.append(step)
        if "error" in step:
            break
    return steps


def summarize(values):
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_sequences(args, subjects, path):
    results = {s: [] for s in subjects}
    for r in range(args.sequences):
        for subject in bench_load.round_order(subjects, r):
            steps = sequence(subject, path, args.cli, args.restarts, args.timeout)
            results[subject].append(steps)
            ok = all("error" not in s for s in steps)
            total = sum(s["seconds"] for s in steps) if ok else None
            shown = f"{total:.2f} s" if ok else steps[-1]["error"]
            print(f"  sequence {r + 1}/{args.sequences} {subject:16} {shown}", flush=True)
    table = {}
    for subject, seqs in results.items():
        good = [s for s in seqs if all("error" not in step for step in s)]
        errors = [s[-1]["error"] for s in seqs if s and "error" in s[-1]]
        table[subject] = {
            "total_s": summarize([sum(step["seconds"] for step in s) for s in good]),
            "steps_s": [summarize([s[i]["seconds"] for s in good]) for i in range(1 + args.restarts)] if good else [],
            "reasons": sorted({reason_of(step) for s in good for step in s if reason_of(step)}),
            "errors": errors,
            "sequences": seqs,
        }
    return table


def fmt(summary):
    if not summary:
        return "n/a"
    return f"{summary['median']:.2f} ({summary['min']:.2f}..{summary['max']:.2f})"


def sequence_lines(table, restarts):
    """The sequences' Markdown table, one line per subject."""
    head = "| subject | total s | cold s | " + " | ".join(f"restart {i} s" for i in range(1, restarts + 1)) + " |"
    lines = [head, "|" + "---|" * (3 + restarts)]
    for subject, row in table.items():
        if row["errors"] and not row["total_s"]:
            lines.append(f"| {subject} | error: {row['errors'][0]} |")
            continue
        steps = " | ".join(fmt(s) for s in row["steps_s"])
        lines.append(f"| {subject} | {fmt(row['total_s'])} | {steps} |")
    return lines


def device_of(path):
    """`(major, minor)` of the block device holding `path`."""
    dev = os.stat(path).st_dev
    return os.major(dev), os.minor(dev)


def sectors_read(device):
    """Sectors read so far from `device` (512 bytes each, as /proc/diskstats counts them)."""
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == device:
                return int(fields[5])
    raise RuntimeError(f"device {device} not in /proc/diskstats")


def together(subject, path, cli, count, timeout_s):
    """`count` processes of `subject` started at once on the cold checkpoint."""
    files = bench_load.files_of(path)
    device = device_of(files[0])
    bench_load.evict(files)
    before = sectors_read(device)
    t = time.perf_counter()
    if subject == "cli":
        argv = [cli, "load", path, "--json"]
    else:
        argv = [sys.executable, os.path.abspath(bench_load.__file__), "--child", subject, path]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(count)]
    errors = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            errors.append(f"timed out after {timeout_s} s")
            continue
        if p.returncode != 0:
            errors.append(f"exit {p.returncode}: {err.strip()[-300:]}")
    wall = time.perf_counter() - t
    device_bytes = (sectors_read(device) - before) * 512
    return {"wall_s": wall, "device_bytes": device_bytes, "errors": errors}


def cgroup_dir():
    """A writable memory cgroup directory for the limited case (v2 or v1), and its limit file."""
    with open("/proc/self/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            return os.path.join("/sys/fs/cgroup/memory", rel.lstrip("/"), LIMITED_CGROUP), "memory.limit_in_bytes"
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    if rel is None:
        raise RuntimeError("no cgroup found in /proc/self/cgroup")
    return os.path.join("/sys/fs/cgroup", rel.lstrip("/"), LIMITED_CGROUP), "memory.max"


def cached_fraction(path):
    """Fraction of `path`'s pages in the page cache (`fincore --bytes`)."""
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"fincore: {r.stderr.strip()}")
    res, size = (int(x) for x in r.stdout.split()[:2])
    return res / size if size else 1.0


def limited(subjects, path, cli, total_bytes, timeout_s, scratch):
    """Each subject's load inside a memory cgroup too small to cache the checkpoint; the neighbour
    file is written under `scratch` (default: beside the checkpoint, on the same device)."""
    try:
        cg, limit_file = cgroup_dir()
        os.makedirs(cg, exist_ok=True)
        # Room for an owned copy and the interpreter, not for the page cache beside it.
        limit_bytes = total_bytes + LIMITED_SPARE_BYTES
        with open(os.path.join(cg, limit_file), "w") as f:
            f.write(str(limit_bytes))
    except (OSError, RuntimeError) as e:
        return {"skipped": f"no writable memory cgroup here ({e}); run as root on a cgroup v1 or v2 machine"}
    rows = {}
    scratch = scratch or os.path.dirname(os.path.abspath(bench_load.files_of(path)[0]))
    with tempfile.NamedTemporaryFile(dir=scratch) as neighbour:
        neighbour.write(os.urandom(1 << 20) * (NEIGHBOUR_BYTES >> 20))
        neighbour.flush()
        os.fsync(neighbour.fileno())
        for subject in subjects:
            bench_load.evict(bench_load.files_of(path))
            with open(neighbour.name, "rb") as f:
                while f.read(8 << 20):
                    pass
            before = cached_fraction(neighbour.name)
            step = in_cgroup(cg, lambda: measure_step(subject, path, cli, "warm", timeout_s))
            rows[subject] = {
                "limit_bytes": limit_bytes,
                "neighbour_cached_before": before,
                "neighbour_cached_after": cached_fraction(neighbour.name),
                "seconds": step.get("seconds"),
                "reason": reason_of(step),
                "error": step.get("error"),
            }
    try:
        os.rmdir(cg)
    except OSError:
        pass
    return rows


def in_cgroup(cg, fn):
    """Run `fn` (which starts child processes) with this process moved into `cg`, then back."""
    procs = os.path.join(cg, "cgroup.procs")
    parent_procs = os.path.join(os.path.dirname(cg), "cgroup.procs")
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
    try:
        return fn()
    finally:
        with open(parent_procs, "w") as f:
            f.write(str(os.getpid()))


def acceptance(table, together_rows, one_cold):
    def total(s):
        row = table.get(s) or {}
        return (row.get("total_s") or {}).get("median")

    out = []

    def check(name, num, den, goal, higher_is_better=False):
        if num is None or den is None:
            out.append({"check": name, "value": None, "goal": goal, "pass": None, "higher_is_better": higher_is_better})
            return
        value = num / den
        ok = value >= goal if higher_is_better else value <= goal
        out.append({"check": name, "value": value, "goal": goal, "pass": ok, "higher_is_better": higher_is_better})

    check("auto total / HF torch total", total("auto"), total("hf_torch"), 0.8)
    check("auto total / ideal", total("auto"), total("ideal"), 1.15)
    check("cli total / ideal", total("cli"), total("ideal"), 1.15)
    for subject, row in together_rows.items():
        one = one_cold.get(subject)
        check(f"{subject}: {row['count']} together, device bytes / checkpoint", row["device_bytes"], row["checkpoint_bytes"], 1.1)
        check(f"{subject}: {row['count']} together, wall / one process alone", row["wall_s"], one, 2.0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--cli", help="the tensora binary (for the `cli` subject)")
    ap.add_argument("--sequences", type=int, default=3)
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--subjects", default="auto,owned,hf_torch,hf_numpy,runai,fastsafetensors,cli")
    ap.add_argument("--together", type=int, default=4, help="processes started at once (0: skip)")
    ap.add_argument("--no-limited", action="store_true", help="skip the memory-limited case")
    ap.add_argument("--scratch", help="directory for the limited case's neighbour file (default: the checkpoint's)")
    ap.add_argument("--timeout", type=int, default=STEP_TIMEOUT_DEFAULT_S)
    ap.add_argument("--json")
    args = ap.parse_args()
    subjects = [s for s in args.subjects.split(",") if s]
    if "cli" in subjects and not args.cli:
        ap.error("the cli subject needs --cli PATH")
    path = args.path
    total_bytes = sum(os.path.getsize(f) for f in bench_load.files_of(path))
    print(f"restarts: {path}, {total_bytes / 1e9:.2f} GB, {args.sequences} sequences of 1 cold + {args.restarts} restarts")
    table = run_sequences(args, subjects + ["ideal"], path)
    table_lines = sequence_lines(table, args.restarts)
    print("\n".join(table_lines))
    lines = []  # every other result, one line each
    together_rows, one_cold = {}, {}
    if args.together > 0:
        for subject in [s for s in ("auto", "cli") if s in subjects]:
            # The anchor: one process alone, started and timed the same way (its interpreter's
            # start and imports included, as in the wall of N together).
            one_cold[subject] = together(subject, path, args.cli, 1, args.timeout)["wall_s"]
            row = together(subject, path, args.cli, args.together, args.timeout)
            row.update(count=args.together, checkpoint_bytes=total_bytes, one_wall_s=one_cold[subject])
            together_rows[subject] = row
            lines.append(
                f"together: {args.together} x {subject}: wall {row['wall_s']:.2f} s (one alone {row['one_wall_s']:.2f} s), "
                f"{row['device_bytes'] / 1e9:.2f} GB from the device ({row['device_bytes'] / total_bytes:.2f}x the checkpoint)"
                + (f", errors: {row['errors']}" if row["errors"] else "")
            )
            print(lines[-1], flush=True)
    limited_rows = {} if args.no_limited else limited(
        [s for s in ("auto", "cli") if s in subjects], path, args.cli, total_bytes, args.timeout, args.scratch
    )
    for subject, row in limited_rows.items():
        if subject == "skipped":
            lines.append(f"limited: skipped: {row}")
        else:
            lines.append(
                f"limited: {subject} under a {row['limit_bytes'] / 1e9:.2f} GB cgroup: {row['seconds'] or row['error']} s; "
                f"neighbour cached {row['neighbour_cached_before']:.0%} -> {row['neighbour_cached_after']:.0%}; reason: {row['reason']}"
            )
        print(lines[-1])
    checks = acceptance(table, together_rows, one_cold)
    for c in checks:
        value = "n/a" if c["value"] is None else f"{c['value']:.2f}"
        verdict = {True: "pass", False: "FAIL", None: "no data"}[c["pass"]]
        lines.append(f"check: {c['check']}: {value} (goal {'>=' if c.get('higher_is_better') else '<='} {c['goal']}) {verdict}")
        print(lines[-1])
    for subject, row in table.items():
        for reason in row["reasons"]:
            lines.append(f"reason: {subject}: {reason}")
            print(lines[-1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "sequences": table,
                    "together": together_rows,
                    "limited": limited_rows,
                    "checks": checks,
                    "markdown": "\n".join(table_lines) + "\n\n" + "\n".join(f"- {line}" for line in lines),
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        bench_load.child(sys.argv[2], sys.argv[3])
    else:
        main()
