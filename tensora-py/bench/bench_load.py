"""The loaders a torch user picks between, in one interleaved run, warm and cold.

    python tensora-py/bench/bench_load.py CHECKPOINT [--runs N] [--temps warm,cold,restart]
        [--subjects a,b,...] [--warmups N] [--timeout S] [--json OUT.json]

Subjects (each ends with every tensor of the checkpoint as a torch tensor, kept, with one byte of
every 4 KiB page read inside the timed region, so lazy paths are not flattered):

- hf_numpy: `safetensors.numpy.load_file` per file, then `torch.from_numpy` (zero copy);
- hf_torch: `safetensors.torch.load_file` per file (tensors on a private mapping of the file);
- runai: Run:ai's `SafetensorsStreamer().stream_files(files)` (owned tensors, its default);
- fastsafetensors: `fastsafe_open(files, device="cpu", nogds=True)`, `get_tensor` of each;
- owned: `tensora.load_file(framework="pt")` (the default residence, an owned snapshot);
- auto: `tensora.load_file(framework="pt", residence="auto")` (mapped views when warm);
- stream: `tensora.weights_iterator(framework="pt")` (256 MiB runs, owned), every tensor kept;
- roofline: 8 MiB `preadv`s into one fresh anonymous buffer of the checkpoint's size, by two
  threads through the page cache (warm), or by eight threads with `O_DIRECT` (cold): what
  reading every byte into fresh memory costs here. Ratios "x roofline" divide a subject's median
  GB/s by it;
- from_pretrained, from_pretrained_tensora (`--with-models`, Llama-shaped checkpoints): transformers'
  `AutoModelForCausalLM.from_pretrained` over the checkpoint's files (`llama_dir.py` writes the
  config), without and with `tensora.patch()`, every weight touched; the model's code (which
  transformers imports at first use) is imported before the timer;
- device: the same reads into a buffer faulted in before the timer starts: what the page cache
  (warm) or the disk (cold) gives with no memory to fault in. On a VM that hands freed memory back
  to its host, first touches of fresh memory can cost more than the reads (the roofline then reads
  well below this line, and a loader that faults its memory in beside its reads beats it).

Every measurement is a fresh process (`--child`), as a server's start is: it imports torch and the
subject's package first, untimed, then times the load and the touch. Rounds are interleaved: each
round runs every subject once, in an order shuffled per round (seeded by the round number), so the
machine's drift, and what the subject run just before leaves behind, spread over all of them.
Warm: one untimed run of each subject first (which also fills the page cache).
Cold: the page cache is dropped before every run (`echo 3 > /proc/sys/vm/drop_caches`, as root;
otherwise `POSIX_FADV_DONTNEED` on each file, said in the output; `--evict checkpoint` drops
only the checkpoint's pages, so the modules a subject imports inside its timed region, such as
transformers' model code, stay cached and cold differs from warm by the weights alone).
Restart (a restart after a cold start): the page cache dropped, one untimed run of the same
subject (its cold start, in a process of its own), then the timed run in a fresh process: what
the subject's cold start left in the page cache for the next process. GB = 1e9 bytes of tensor
data.
A subject that fails or is not installed gets a cell saying why; it is never dropped silently.

Prints a table per temperature, the acceptance ratios of issue 18 (medians of seconds), then the
markdown rows for the README; `--json` writes every sample, each tensora load report, the machine
and the load average before and after.
"""

import argparse
import gc
import glob
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time

PAGE_BYTES = 4096
# Threads (reads in flight) of the cold roofline: direct reads need depth to reach the device's
# rate (2 threads reached 1.3-1.4 GB/s here, 8 and 16 1.6-1.7).
DIRECT_THREADS = 8
SUBJECTS = {
    "hf_numpy": "HF safetensors.numpy.load_file + torch.from_numpy",
    "hf_torch": "HF safetensors.torch.load_file",
    "runai": "Run:ai SafetensorsStreamer",
    "fastsafetensors": "fastsafetensors (cpu, nogds)",
    "owned": "tensora.load_file (owned)",
    "auto": "tensora.load_file (residence=auto)",
    "stream": "tensora.weights_iterator (owned)",
    "roofline": "roofline: preadv into fresh memory (2 threads; cold 8, O_DIRECT)",
    "device": "device: the same reads into memory faulted in before the timer",
    "from_pretrained": "transformers AutoModelForCausalLM.from_pretrained (HF safetensors)",
    "from_pretrained_tensora": "the same after tensora.patch()",
}
# Subjects that build a model (`--with-models`): they need a Llama-shaped checkpoint
# (`llama_dir.py` writes its config.json), so they are not among the defaults.
MODELS = ("from_pretrained", "from_pretrained_tensora")
# Subjects that read raw bytes (one uint8 tensor per file), not the checkpoint's tensors.
RAW = ("roofline", "device")
OURS = ("owned", "auto", "stream")
# warm: the page cache filled first; cold: dropped before each run; restart: dropped, then one
# untimed cold start of the subject, then the timed run (see the module docs).
TEMPS = ("warm", "cold", "restart")


def files_of(path):
    if os.path.isdir(path):
        return sorted(glob.glob(os.path.join(path, "*.safetensors")))
    return [path]


# ---------------------------------------------------------------- child: one measurement


def touch(tensors) -> int:
    """Read one byte of every 4 KiB page of every tensor (and its last byte)."""
    s = 0
    for t in tensors:
        if t.numel():
            flat = t.reshape(-1).view(__import__("torch").uint8)
            s += int(flat[::PAGE_BYTES].sum()) + int(flat[-1])
    return s


def prepare(subject, path):
    """Import what the subject needs and set up what it reads into (untimed, for the checkpoint at
    `path`), and return its load function: path -> (dict of torch tensors, tensora report or
    None)."""
    import torch

    if subject == "hf_numpy":
        from safetensors.numpy import load_file

        def run(path):
            out = {}
            for f in files_of(path):
                out.update({k: torch.from_numpy(v) for k, v in load_file(f).items()})
            return out, None

    elif subject == "hf_torch":
        from safetensors.torch import load_file

        def run(path):
            out = {}
            for f in files_of(path):
                out.update(load_file(f))
            return out, None

    elif subject == "runai":
        from runai_model_streamer import SafetensorsStreamer

        def run(path):
            out = {}
            with SafetensorsStreamer() as streamer:
                streamer.stream_files(files_of(path))
                for name, t in streamer.get_tensors():
                    out[name] = t
            return out, None

    elif subject == "fastsafetensors":
        from fastsafetensors import fastsafe_open

        def run(path):
            with fastsafe_open(files_of(path), framework="pt", device="cpu", nogds=True) as f:
                return {k: f.get_tensor(k) for k in f.keys()}, None

    elif subject in ("owned", "auto"):
        import tensora

        def run(path):
            return tensora.load_file_with_report(path, framework="pt", residence=subject)

    elif subject == "stream":
        import tensora

        def run(path):
            return dict(tensora.weights_iterator(path, framework="pt", residence="owned")), None

    elif subject in MODELS:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import llama_dir
        from transformers import AutoModelForCausalLM

        if subject == "from_pretrained_tensora":
            import tensora

            tensora.patch()
        model_path, dtype = llama_dir.model_dir(path)
        # transformers imports a model's code (and torch._dynamo with it) at its first use, 3.4 of
        # the 4.2 s of a warm from_pretrained here: imported now, untimed, as every subject's
        # package is, so the cell times the load (the same for both subjects either way).
        import transformers

        with open(os.path.join(model_path, "config.json")) as f:
            for arch in json.load(f)["architectures"]:
                getattr(transformers, arch)

        def run(path):
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
            return dict(model.state_dict()), None

    elif subject == "roofline":

        def run(path):
            return read_into(path, fresh_buffer(path))

    elif subject == "device":
        buf = fresh_buffer(path)
        view = memoryview(buf)
        for at in range(0, len(buf), PAGE_BYTES):  # every page faulted in, untimed
            view[at] = 0

        def run(path):
            return read_into(path, buf)

    else:
        raise SystemExit(f"unknown subject {subject!r}")
    return run


def fresh_buffer(path):
    """One fresh anonymous buffer (huge pages advised) that holds every file of `path`, each
    starting on a page."""
    import mmap

    total = sum(-(-os.path.getsize(f) // PAGE_BYTES) * PAGE_BYTES for f in files_of(path))
    buf = mmap.mmap(-1, max(total, PAGE_BYTES))
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


def read_jobs(jobs, view, threads, direct, block=PAGE_BYTES):
    """`threads` threads `preadv` the jobs, `(file, offset, at, n)`: `n` bytes of `file` at
    `offset` into `view[at:]`, the last job first; with `O_DIRECT` each read is widened to whole
    `block`s (`view` must have room, 4 KiB-aligned), and a read that ends at the end of its file
    may come back short. Raises the first error after every thread stopped."""
    lock = threading.Lock()
    errors = []

    def worker():
        fds = {}
        try:
            while True:
                with lock:
                    if not jobs:
                        return
                    f, off, at, n = jobs.pop()
                fd = fds.get(f)
                if fd is None:
                    fd = fds[f] = os.open(f, os.O_RDONLY | (os.O_DIRECT if direct else 0))
                want = -(-n // block) * block if direct else n
                got = os.preadv(fd, [view[at : at + want]], off)
                if got < n:
                    raise OSError(f"{f}: short read at {off}")
        except Exception as e:  # reported by the caller as the cell's error
            errors.append(repr(e))
        finally:
            for fd in fds.values():
                os.close(fd)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise RuntimeError(errors[0])


def read_into(path, buf):
    """Read every byte of every file of `path` into `buf` (see `fresh_buffer`) with 8 MiB
    `preadv`s: two threads through the page cache, or (the cache cold: `TENSORA_BENCH_DIRECT=1`)
    `DIRECT_THREADS` threads with `O_DIRECT`; then expose it as one uint8 tensor per file."""
    import torch

    direct = os.environ.get("TENSORA_BENCH_DIRECT") == "1"
    chunk = 8 << 20
    files = files_of(path)
    sizes = [os.path.getsize(f) for f in files]
    jobs, base = [], 0
    for f, size in zip(files, sizes):
        for off in range(0, size, chunk):
            jobs.append((f, off, base + off, min(chunk, size - off)))
        base += -(-size // PAGE_BYTES) * PAGE_BYTES
    read_jobs(jobs, memoryview(buf), DIRECT_THREADS if direct else 2, direct)
    out, base = {}, 0
    for f, size in zip(files, sizes):
        out[f] = torch.frombuffer(buf, dtype=torch.uint8, count=size, offset=base) if size else torch.empty(0)
        base += -(-size // PAGE_BYTES) * PAGE_BYTES
    return out, None


def child(subject, path):
    run = prepare(subject, path)
    gc.collect()
    read_before = device_read_bytes()
    t = time.perf_counter()
    tensors, report = run(path)
    touch(tensors.values())
    seconds = time.perf_counter() - t
    read_after = device_read_bytes()
    read_bytes = None if read_before is None or read_after is None else read_after - read_before
    n_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    t = time.perf_counter()
    count = len(tensors)
    del tensors
    gc.collect()
    drop_seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "drop_seconds": drop_seconds, "bytes": n_bytes, "tensors": count,
                      "read_bytes": read_bytes, "report": report}))


def device_read_bytes():
    """Bytes this process had read from the device so far (`read_bytes` of /proc/self/io: its
    reads, page faults and read-ahead; the child reports those of its timed region), or None
    where the kernel does not count them."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration, ValueError):
        return None


# ---------------------------------------------------------------- parent: the interleaved run


def evict(files):
    """Drop the pages of `files` from the page cache (`POSIX_FADV_DONTNEED`), and nothing else."""
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drop_caches(files):
    """Empty the page cache of `files`; how it was done."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        evict(files)
        return "fadvise"


def evict_checkpoint(files):
    """Drop only the checkpoint's pages (`--evict checkpoint`): a subject's own code (torch's and
    transformers' modules, imported lazily inside the timed region) stays cached, so a cold run
    differs from a warm one by the weights alone."""
    os.sync()
    evict(files)
    return "fadvise, checkpoint only"


def measure(subject, path, temp, timeout_s):
    env = dict(os.environ)
    if subject in RAW and temp == "cold":
        env["TENSORA_BENCH_DIRECT"] = "1"
    try:
        r = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", subject, path],
            capture_output=True, text=True, timeout=timeout_s, env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s} s"}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return {"error": f"exit {r.returncode}: {last[-300:]}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def summary(total, samples):
    secs = [s["seconds"] for s in samples]
    gbps = sorted(total / s / 1e9 for s in secs)
    return {
        "seconds": secs,
        "seconds_median": statistics.median(secs),
        "gbps_median": statistics.median(gbps),
        "gbps_min": gbps[0],
        "gbps_max": gbps[-1],
    }


def round_order(subjects, r):
    """Round `r`'s order: the subjects shuffled, seeded by `r` (the same orders every run), so
    neither a place in the round nor the subject run just before is always the same one: in a
    rotation, where each subject always followed the same one, a cold cell moved by up to 1.3x with
    what that one left behind (freed memory, a busy disk)."""
    order = list(subjects)
    random.Random(r).shuffle(order)
    return order


def run_temperature(args, temp, subjects, total, tensors, files):
    samples = {s: [] for s in subjects}
    errors = {}
    how = None
    if temp == "warm":
        for s in subjects * args.warmups:  # warm-up: fills the page cache, untimed
            first = measure(s, args.path, temp, args.timeout)
            if "error" in first:
                errors[s] = first["error"]
    for r in range(args.runs):
        order = round_order(subjects, r)
        for s in order:
            if s in errors:
                continue
            if temp in ("cold", "restart"):
                how = drop_caches(files) if args.evict == "all" else evict_checkpoint(files)
            if temp == "restart":
                first = measure(s, args.path, temp, args.timeout)  # the cold start, untimed
                if "error" in first:
                    errors[s] = first["error"]
                    continue
            m = measure(s, args.path, temp, args.timeout)
            if "error" in m:
                errors[s] = m["error"]
            elif s not in RAW and (m["bytes"] != total or m["tensors"] != tensors):
                errors[s] = f"delivered {m['tensors']} tensors, {m['bytes']} bytes; expected {tensors}, {total}"
            else:
                samples[s].append(m)
    results = {}
    for s in subjects:
        if s in errors or not samples[s]:
            results[s] = {"label": SUBJECTS[s], "error": errors.get(s, "no sample")}
            continue
        results[s] = {"label": SUBJECTS[s], **summary(total, samples[s])}
        reports = [m["report"] for m in samples[s] if m.get("report")]
        if reports:
            results[s]["report"] = reports[-1]
            results[s]["io_modes"] = sorted({rep["io_mode"] for rep in reports})
        results[s]["drop_seconds_median"] = statistics.median(m["drop_seconds"] for m in samples[s])
    roof = results.get("roofline", {}).get("gbps_median")
    for s, r in results.items():
        if roof and "gbps_median" in r:
            r["x_roofline"] = r["gbps_median"] / roof
    return {"cache_drop": how, "results": results}


def ratio(results, num, den):
    """Median seconds of `den` over median seconds of `num`: how many times faster `num` is."""
    a, b = results.get(num, {}), results.get(den, {})
    if "seconds_median" not in a or "seconds_median" not in b:
        return None
    return b["seconds_median"] / a["seconds_median"]


def acceptance(doc):
    warm = doc["temps"].get("warm", {}).get("results", {})
    cold = doc["temps"].get("cold", {}).get("results", {})
    out = {
        "warm auto / hf_torch (goal >= 1.0)": ratio(warm, "auto", "hf_torch"),
        "warm owned / runai (goal >= 2.0)": ratio(warm, "owned", "runai"),
    }
    best = [s for s in OURS if "seconds_median" in cold.get(s, {})]
    if best:
        b = min(best, key=lambda s: cold[s]["seconds_median"])
        out[f"cold best ({b}) / hf_torch (goal >= 1.3)"] = ratio(cold, b, "hf_torch")
        out[f"cold best ({b}) / runai (goal >= 2.0)"] = ratio(cold, b, "runai")
    # Issue 42: from_pretrained patched against unpatched, each temperature; cold over warm
    # against the device time of the same bytes.
    for temp, results in doc["temps"].items():
        r = ratio(results["results"], "from_pretrained_tensora", "from_pretrained")
        if r is not None:
            out[f"{temp} patched from_pretrained speed-up over unpatched (goal >= 1.0)"] = r
    device = cold.get("device", {}).get("seconds_median")
    for s in MODELS:
        c, w = cold.get(s, {}).get("seconds_median"), warm.get(s, {}).get("seconds_median")
        if device and c and w:
            out[f"{s}: (cold - warm) / device (goal <= 1.1)"] = (c - w) / device
    return out


def cell(r):
    if "error" in r:
        return f"failed: {r['error']}"
    return f"{r['gbps_median']:.2f} ({r['gbps_min']:.2f}-{r['gbps_max']:.2f})"


def markdown(doc):
    temps = list(doc["temps"])
    header = "| subject | " + " | ".join(f"{t} GB/s median (min-max) | x roofline" for t in temps) + " |"
    lines = [header, "|" + "---|" * (1 + 2 * len(temps))]
    for s in doc["subjects"]:
        row = [SUBJECTS[s]]
        for t in temps:
            r = doc["temps"][t]["results"][s]
            row += [cell(r), f"{r['x_roofline']:.2f}" if "x_roofline" in r else "-"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def chosen_subjects(names: str, with_models: bool):
    """The subjects to run, in the order named, each once: `--subjects a,b` then, with
    `--with-models`, the model subjects not already named (naming one in both ran it twice a round
    and printed its row twice)."""
    named = [s for s in names.split(",") if s] + (list(MODELS) if with_models else [])
    return list(dict.fromkeys(named))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--temps", default="warm,cold", help="warm, cold, restart (comma-separated)")
    ap.add_argument(
        "--subjects",
        default=",".join(s for s in SUBJECTS if s not in MODELS),
        help="comma-separated, from: " + ", ".join(SUBJECTS),
    )
    ap.add_argument("--with-models", action="store_true", help="add " + ", ".join(MODELS) + " (Llama-shaped checkpoints)")
    ap.add_argument("--warmups", type=int, default=1, help="untimed warm runs of each subject first")
    ap.add_argument("--evict", choices=("all", "checkpoint"), default="all",
                    help="cold and restart: drop the whole page cache (all) or the checkpoint's pages only")
    ap.add_argument("--timeout", type=int, default=600, help="seconds one measurement may take")
    ap.add_argument("--json", help="write every sample and the load reports here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.path)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    subjects = chosen_subjects(args.subjects, args.with_models)
    unknown = [s for s in subjects if s not in SUBJECTS]
    temps = [t for t in args.temps.split(",") if t]
    if unknown or not subjects or any(t not in TEMPS for t in temps):
        ap.error(f"unknown subject or temperature: {unknown or temps}")
    import tensora

    info = tensora.inspect(args.path)
    total = sum(t["nbytes"] for t in info["tensors"])
    files = [f["path"] for f in info["files"]]
    load_before = os.getloadavg()
    print(f"{args.path}: {total / 1e9:.3f} GB in {len(info['tensors'])} tensors, {len(files)} file(s); "
          f"{args.runs} rounds, load average {load_before[0]:.2f}")
    doc = {"schema": 2, "path": args.path, "bytes": total, "runs": args.runs, "subjects": subjects, "temps": {}}
    for temp in temps:
        doc["temps"][temp] = run_temperature(args, temp, subjects, total, len(info["tensors"]), files)
        dropped = f" (cache dropped by {doc['temps'][temp]['cache_drop']})" if temp != "warm" else ""
        print(f"\n{temp}{dropped}")
        for s in subjects:
            r = doc["temps"][temp]["results"][s]
            extra = f"  x roofline {r['x_roofline']:.2f}" if "x_roofline" in r else ""
            modes = f"  [{', '.join(r['io_modes'])}]" if "io_modes" in r else ""
            print(f"  {r['label']:52s} {cell(r)}{extra}{modes}")
    doc["acceptance"] = acceptance(doc)
    print("\nratios (medians of seconds)")
    for k, v in doc["acceptance"].items():
        print(f"  {k}: {'n/a' if v is None else f'{v:.2f}'}")
    doc["markdown"] = markdown(doc)
    load_after = os.getloadavg()
    doc["machine"] = {
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }
    print()
    print(doc["markdown"])
    print(f"\n(load average {load_before[0]:.2f} before, {load_after[0]:.2f} after)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
