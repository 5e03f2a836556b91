"""One rank of a collective-load test, started by tests/test_distributed.py (bench/ranks.py) with torchrun's
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), but without torchrun's agent, which would
kill the surviving ranks when one dies and so hide what they do.

For each `--path` in turn, writes `<out>/<index>-rank<N>.json`: each tensor's sha256 and shape, and
the rank's report, or the error it raised. `--mode` picks what the rank does: `load` (tensora.distributed.load_file), `stream`
(weights_iterator, with `--dtype` if given), `missing` (rank 1 asks for a path that does not exist), `die` (rank 1 exits at
once, before loading), `other` (rank 1 loads `--other` instead of the path), `select` (every rank
loads `--select`, rank 1 `--select1`), `tp` (td.load_tp_with_report, Llama rules; `--tp` makes `missing` and `die` call it too,
`--exchange-bytes` and `--replicated-own-bytes` set its bounds, `--count-opens` reports as `opens` how often each native
call that opens the checkpoint and reads its headers ran), `die-mid` (td.load_tp_with_report; rank 1 exits as
it starts exchanging its second window of the group split), `files` (one `weights_iterator` over every `--path` as a
file list, written as the first path's result; rank 1 gets the list reversed).
"""

import argparse
import hashlib
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import tensora
import tensora.distributed as td

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from procstat import rss_kib  # noqa: E402  (tests/procstat.py)


def digest(t) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


# The native calls that open a checkpoint and read its headers, as `--count-opens` counts them.
OPENING_CALLS = ("load", "tp_reads", "TpSource")


def count_opens(opens: dict) -> None:
    """Wraps each of OPENING_CALLS that tensora._native has so that every call adds 1 to opens[name]."""
    for name in OPENING_CALLS:
        real = getattr(tensora._native, name, None)
        if real is None:
            continue

        def counted(*args, _name=name, _real=real, **kwargs):
            opens[_name] = opens.get(_name, 0) + 1
            return _real(*args, **kwargs)

        setattr(tensora._native, name, counted)


def run(a, rank: int, path: str) -> dict:
    out = {"rank": rank}
    try:
        if a.mode == "die" and rank == 1:
            os._exit(3)
        path = path + ".missing" if a.mode == "missing" and rank == 1 else path
        path = a.other if a.mode == "other" and rank == 1 else path
        if a.mode == "files":
            files = list(reversed(path)) if rank == 1 else path
            out["tensors"] = {name: [digest(t), list(t.shape)] for name, t in td.weights_iterator(files, budget=a.budget)}
            return out
        if a.mode == "stream":
            # Keeps no tensor past the next step, like a caller copying each into its model: the
            # last one stays bound to `t` while the iterator fetches the next window.
            rss_before = rss_kib("VmRSS")
            got = {}
            for name, t in td.weights_iterator(path, budget=a.budget, dtype=a.dtype):
                got[name] = [digest(t), list(t.shape)]
            out["rss_before_kib"] = rss_before
            out["rss_peak_kib"] = rss_kib("VmHWM")
            out["tensors"] = got
            return out
        if a.mode == "die-mid" and rank == 1:
            exchange, calls = td._exchange_split, []

            def dying(*args, **kwargs):
                calls.append(args[1])
                if len(calls) == 2:
                    os._exit(3)
                return exchange(*args, **kwargs)

            td._exchange_split = dying
        if a.mode in ("tp", "die-mid") or a.tp:
            if a.exchange_bytes is not None:
                td.EXCHANGE_BYTES_MAX = a.exchange_bytes
            if a.replicated_own_bytes is not None:
                td.REPLICATED_OWN_BYTES_MAX = a.replicated_own_bytes
            if a.count_opens:
                count_opens(out.setdefault("opens", {}))
            got, report = td.load_tp_with_report(path)
            out["report"] = report
        else:
            select = (a.select1 if rank == 1 else a.select) if a.mode == "select" else None
            got, report = td.load_file_with_report(path, select=select)
            out["report"] = report
        out["tensors"] = {k: [digest(v), list(v.shape)] for k, v in got.items()}
    except tensora.TensoraError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", required=True, action="append")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="load")
    ap.add_argument("--budget", type=int, default=64 << 10)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--other")
    ap.add_argument("--tp", action="store_true")
    ap.add_argument("--dtype")
    ap.add_argument("--exchange-bytes", type=int)
    ap.add_argument("--replicated-own-bytes", type=int)
    ap.add_argument("--count-opens", action="store_true")
    ap.add_argument("--select", action="append")
    ap.add_argument("--select1", action="append")
    a = ap.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=a.timeout))
    rank = dist.get_rank()
    for index, path in enumerate([a.path] if a.mode == "files" else a.path):
        out = run(a, rank, path)
        with open(os.path.join(a.out, f"{index}-rank{rank}.json"), "w") as f:
            json.dump(out, f)
    try:
        dist.destroy_process_group()
    except Exception:  # the group may be broken after a failure
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
