"""Load time inside vLLM: the load formats `auto`, `runai_streamer`, `fastsafetensors` and
`tensora`, warm and cold, in one interleaved run (in the vLLM venv, target/vllm-venv).

    python tensora-py/bench/bench_vllm.py CHECKPOINT [--runs N] [--temps warm,cold,restart]
        [--formats a,b,...] [--evict all|checkpoint] [--timeout S] [--json OUT.json]

CHECKPOINT is a Llama-shaped safetensors checkpoint (the bench's 2.2 GB TinyLlama-shaped fixture
under `cargo xtask bench --full`); `llama_dir.py` writes the config off its shapes beside links
to its files, so every format reads the very same files. Each sample is a fresh process
(`vllm_engine.py`: `vllm.LLM` on the CPU build, eager, in-process engine) and gives three times:
vLLM's own "Loading weights took" figure (its `DefaultModelLoader`; Run:ai's loader logs none),
`load_weights` (the loader's `load_weights`, timed the same way for every format) and the whole
`LLM()` start. Rounds are interleaved in an order shuffled per round (bench_load.round_order).
Warm: one untimed start of each format first. Cold: the page cache dropped before every sample
(bench_load.drop_caches; with `--evict checkpoint` only the checkpoint's pages, with
`POSIX_FADV_DONTNEED`, so a shared machine's other work keeps its cache), and each round also times `device`: the checkpoint's bytes read with
`O_DIRECT` into memory faulted in beforehand (bench_load's `device` subject), the roofline the
acceptance compares cold loads with. Restart (a restart after a cold start): the page cache
dropped, one untimed start of the same format (its cold start), then the timed start in a fresh
process, the way a server restarts on a node. A format that fails gets a cell saying why. The
JSON keeps every sample (`values`, in the order taken) beside the median, min and max.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_load  # noqa: E402  (one home for the cache drop, the round order and the device read)
from llama_dir import model_dir  # noqa: E402

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_engine.py")
FORMATS = ("auto", "runai_streamer", "fastsafetensors", "tensora")
TIMES = ("loading_weights_seconds", "load_weights_seconds", "start_seconds")
# One engine start of a 2.2 GB model on a loaded 2-core machine, import included.
TIMEOUT_DEFAULT_S = 900


def engine(model: str, load_format: str, timeout_s: float) -> dict:
    """One engine start in a fresh process; its result, or {"error": ...}."""
    with tempfile.TemporaryDirectory(prefix="tensora-bench-vllm-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, ENGINE, model, "--load-format", load_format, "--out", out]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s} s"}
        if not os.path.exists(out):
            last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            return {"error": f"exit {r.returncode}: {last[-300:]}"}
        with open(out) as f:
            result = json.load(f)
    if not result["ok"]:
        return {"error": f"{result['error_type']}: {result['error'][-300:]}"}
    return result


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def evict(args, files):
    """Empty the page cache of the checkpoint before a cold sample, as `--evict` says."""
    if args.evict == "checkpoint":
        return bench_load.evict_checkpoint(files)
    return bench_load.drop_caches(files)


def run_temperature(args, temp, model, files):
    samples = {f: [] for f in args.formats}
    errors = {}
    device = []
    if temp == "warm":
        for f in args.formats:  # fills the page cache, untimed
            first = engine(model, f, args.timeout)
            if "error" in first:
                errors[f] = first["error"]
    subjects = list(args.formats) + (["device"] if temp == "cold" else [])
    for r in range(args.runs):
        for s in bench_load.round_order(subjects, r):
            if s in errors:
                continue
            if temp in ("cold", "restart"):
                evict(args, files)
            if temp == "restart":
                first = engine(model, s, args.timeout)  # the cold start, untimed
                if "error" in first:
                    errors[s] = first["error"]
                    continue
            if s == "device":
                m = bench_load.measure("device", args.checkpoint, "cold", args.timeout)
                if "error" in m:
                    errors[s] = m["error"]
                else:
                    device.append(m["seconds"])
                continue
            m = engine(model, s, args.timeout)
            if "error" in m:
                errors[s] = m["error"]
            else:
                samples[s].append(m)
    results = {}
    for f in args.formats:
        if f in errors or not samples[f]:
            results[f] = {"error": errors.get(f, "no sample")}
        else:
            results[f] = {t: stats([m.get(t) for m in samples[f]]) for t in TIMES}
    if temp == "cold":
        results["device"] = {"error": errors["device"]} if "device" in errors else {"seconds": stats(device)}
    return results


def acceptance(doc):
    """Issue 43's goals on the medians of `load_weights` (the same span for every format)."""
    out = {}

    def med(temp, f, key="load_weights_seconds"):
        r = doc["temps"].get(temp, {}).get(f, {})
        return (r.get(key) or {}).get("median")

    t = med("cold", "tensora")
    dev = med("cold", "device", "seconds")
    if t and dev:
        out["cold tensora / device roofline (goal <= 1.10)"] = t / dev
    for temp in ("cold", "warm", "restart"):
        for other in FORMATS[:-1]:
            o = med(temp, other)
            if t and o and med(temp, "tensora"):
                out[f"{temp} {other} / tensora (goal >= 1.0)"] = o / med(temp, "tensora")
    return out


def cell(r, key):
    if "error" in r:
        return f"failed: {r['error']}"
    s = r.get(key)
    return "-" if s is None else f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def markdown(doc):
    lines = []
    for temp, results in doc["temps"].items():
        lines += [f"{temp}: seconds, median (min-max) of {doc['runs']}", "",
                  "| load format | Loading weights took (vLLM) | load_weights | LLM() start |",
                  "|---|---|---|---|"]
        for f in doc["formats"]:
            lines.append(f"| {f} | " + " | ".join(cell(results[f], k) for k in TIMES) + " |")
        if "device" in results:
            lines.append(f"| device (O_DIRECT roofline) | - | {cell(results['device'], 'seconds')} | - |")
        lines.append("")
    for k, v in doc["acceptance"].items():
        lines.append(f"- {k}: {v:.2f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--temps", default="warm,cold")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--evict", choices=("all", "checkpoint"), default="all",
                    help="cold samples: drop the whole page cache (all) or only the checkpoint's pages")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_DEFAULT_S)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(args.formats) - set(FORMATS))
    bad_temps = [t for t in args.temps.split(",") if t and t not in ("warm", "cold", "restart")]
    if unknown or bad_temps or args.runs < 1:
        ap.error(f"--formats takes {FORMATS}, --temps warm, cold, restart, --runs at least 1 "
                 f"(got {unknown}, {bad_temps}, {args.runs})")
    model, dtype = model_dir(args.checkpoint)
    files = bench_load.files_of(args.checkpoint)
    doc = {
        "checkpoint": os.path.abspath(args.checkpoint),
        "bytes": sum(os.path.getsize(f) for f in files),
        "dtype": dtype,
        "formats": args.formats,
        "runs": args.runs,
        "evict": args.evict,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_before": os.getloadavg()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "temps": {},
    }
    for temp in [t for t in args.temps.split(",") if t]:
        doc["temps"][temp] = run_temperature(args, temp, model, files)
        doc["machine"]["load_after"] = os.getloadavg()
        doc["acceptance"] = acceptance(doc)
        if args.json:  # after each temperature: a long run interrupted keeps what it measured
            with open(args.json + ".tmp", "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(args.json + ".tmp", args.json)
    print(markdown(doc))
    failed = [f for t in doc["temps"].values() for f, r in t.items() if "error" in r]
    return 1 if failed and set(failed) >= set(args.formats) else 0


if __name__ == "__main__":
    sys.exit(main())
