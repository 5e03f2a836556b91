"""Collective loading on ``torch.distributed``: each rank of a process group reads one share of the
checkpoint from storage, then the ranks exchange their shares with the group's collectives, straight
into each rank's arena. Storage is read once in all instead of once per rank, and every rank ends with
the same tensors as a single-process :func:`tensora.load_file`.

::

    import torch.distributed as dist, tensora.distributed as td
    dist.init_process_group("gloo")                       # torchrun sets the rendezvous
    weights = td.load_file("model/")                      # every rank: the whole model
    for name, t in td.weights_iterator(files, budget=512 << 20):
        model.load_weight(name, t)                        # one window at a time

The shares are a pure function of the checkpoint, the selection and the options, so every rank must
call with the same arguments (checked: a rank that plans differently fails every rank). A failure on
any rank (a missing file, a read error, a rank that dies) raises :class:`tensora.LoadError` on every
rank, naming the failing rank; no rank is left waiting past the process group's timeout.

With gloo (CPU) the shares are exchanged in host memory. With NCCL each rank copies its share to its
current CUDA device, the shares are broadcast on the device, and the tensors come back on the device
(views of one device buffer). The device path is written against the documented NCCL semantics and
tested only where a GPU exists.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from . import RemoteOptions, _native, _convert, _check_framework, _remote_dict
from ._native import LoadError

__all__ = ["load_file", "load_file_with_report", "weights_iterator"]

PathLike = Union[str, "os.PathLike[str]"]

# Bytes of one window of `weights_iterator` (and of the queue behind it) by default.
BUDGET_DEFAULT_BYTES = 256 << 20


def _group_facts(group):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise LoadError("tensora.distributed needs an initialised torch.distributed process group")
    group = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    global_ranks = dist.get_process_group_ranks(group)
    return group, rank, world, global_ranks, dist.get_backend(group)


# Side groups on gloo for the status exchange of groups whose backend is not gloo (NCCL), by ranks.
_STATUS_GROUPS: Dict[Tuple[int, ...], Any] = {}


def _status_group(group, global_ranks, backend):
    """The group the statuses travel on: `group` itself on gloo; otherwise a gloo group of the same
    ranks, made once (a collective call: every rank reaches it at its first collective load)."""
    import torch.distributed as dist

    if backend == "gloo":
        return group
    key = tuple(global_ranks)
    if key not in _STATUS_GROUPS:
        _STATUS_GROUPS[key] = dist.new_group(ranks=global_ranks, backend="gloo")
    return _STATUS_GROUPS[key]


def _swap(group, peer, payload):
    """Sends `payload` (bytes) to global rank `peer` and receives the peer's: length, then bytes.
    Raises what the transport raises when the peer is gone."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor([len(payload)], dtype=torch.int64)
    theirs = torch.zeros(1, dtype=torch.int64)
    works = [dist.isend(mine, peer, group=group), dist.irecv(theirs, peer, group=group)]
    for w in works:
        w.wait()
    n = int(theirs.item())
    if not 0 <= n <= _STATUS_BYTES_MAX:
        raise LoadError(f"collective load: rank sent a status of {n} bytes (at most {_STATUS_BYTES_MAX})")
    out = torch.zeros(n, dtype=torch.uint8)
    works = [dist.isend(torch.frombuffer(bytearray(payload), dtype=torch.uint8), peer, group=group)] if payload else []
    if n:
        works.append(dist.irecv(out, peer, group=group))
    for w in works:
        w.wait()
    return bytes(out.numpy())


# The largest status a rank accepts from another (an error message and the share regions).
_STATUS_BYTES_MAX = 1 << 20


def _agree(group, rank, world, global_ranks, backend, status):
    """Every rank swaps statuses with every other one, pair by pair, so a rank that failed is named
    by its own report and a rank that left is named by the pair that broke. Returns the statuses by
    rank, or raises the same kind of error on every surviving rank. Each wait is bounded by the
    process group's timeout."""
    sgroup = _status_group(group, global_ranks, backend)
    payload = json.dumps(status).encode()
    statuses: List[Any] = [None] * world
    statuses[rank] = status
    gone = []
    for r in range(world):
        if r == rank:
            continue
        try:
            statuses[r] = json.loads(_swap(sgroup, global_ranks[r], payload))
        except LoadError:
            raise
        except Exception as e:  # a dead or unreachable rank: gloo raises RuntimeError on its pair
            gone.append((r, e))
    if gone:
        r, e = gone[0]
        raise LoadError(f"collective load failed: rank {r} left the group or did not answer ({type(e).__name__}: {e})")
    failed = [(r, s["error"]) for r, s in enumerate(statuses) if s["error"] is not None]
    if failed:
        r, msg = failed[0]
        raise LoadError(f"collective load failed on rank {r}: {msg}")
    plans = {json.dumps(s["regions"]) for s in statuses}
    if len(plans) != 1:
        raise LoadError("collective load: the ranks planned different shares (call with the same arguments on every rank)")
    return statuses


def _exchange(shared, group, rank, world, global_ranks, backend):
    """Fills every other rank's region of ``shared`` from that rank; returns ``(bytes received,
    device buffer or None)``."""
    import torch
    import torch.distributed as dist

    regions = shared.regions()
    received = 0
    device_buffer = None
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        end = max((o + n for o, n in regions), default=0)
        device_buffer = torch.empty(end, dtype=torch.uint8, device=device)
        off, n = regions[rank]
        if n:
            host = torch.frombuffer(shared.region(rank), dtype=torch.uint8)
            device_buffer[off:off + n].copy_(host)
    for r, (off, n) in enumerate(regions):
        if n == 0:
            continue
        if device_buffer is not None:
            buf = device_buffer[off:off + n]
        else:
            buf = torch.frombuffer(shared.region(r), dtype=torch.uint8)
        try:
            dist.broadcast(buf, src=global_ranks[r], group=group)
        except Exception as e:
            raise LoadError(f"collective load: rank {r} did not send its share ({n} bytes): {e}") from e
        if r != rank:
            received += n
    return received, device_buffer


def _device_tensors(shared, datas, device_buffer):
    """The tensors as views of the device buffer (NCCL): each at its arena offset, with its dtype,
    shape and strides; a tensor whose offset is not a multiple of its element size is copied to an
    aligned tensor (a device view must be aligned)."""
    import torch

    offsets = shared.offsets()
    out = {}
    for name, d in datas.items():
        host = _convert(d, "pt")
        if d.nbytes == 0:
            out[name] = host.to(device_buffer.device)
            continue
        off = offsets[name]
        raw = device_buffer[off:off + d.nbytes]
        if off % host.element_size() == 0:
            flat = raw.view(host.dtype)
        else:
            flat = raw.clone().view(host.dtype)
        out[name] = torch.as_strided(flat, host.shape, host.stride())
    return out


def _report(shared, group, rank, world, global_ranks, read_s, exchange_s, received):
    import torch.distributed as dist

    mine = json.loads(shared.report())
    figures = {
        "rank": rank,
        "bytes_read": mine["bytes_read"],
        "bytes_received": received,
        "read_seconds": read_s,
        "exchange_seconds": exchange_s,
    }
    everyone: List[Any] = [None] * world
    dist.all_gather_object(everyone, figures, group=group)
    slowest = max(everyone, key=lambda f: f["read_seconds"] + f["exchange_seconds"])
    return {**mine, **figures, "ranks": everyone, "slowest": slowest}


def _collective(shared_or_error, group, rank, world, global_ranks, backend, fw, read_s):
    shared, error = shared_or_error
    status = {"error": error, "regions": shared.regions() if shared is not None else None}
    _agree(group, rank, world, global_ranks, backend, status)
    t = time.perf_counter()
    received, device_buffer = _exchange(shared, group, rank, world, global_ranks, backend)
    exchange_s = time.perf_counter() - t
    datas = shared.tensors()
    report = _report(shared, group, rank, world, global_ranks, read_s, exchange_s, received)
    if device_buffer is not None:
        if fw != "pt":
            raise LoadError("tensora.distributed: NCCL tensors live on the GPU; use framework='pt'")
        return _device_tensors(shared, datas, device_buffer), report
    return {name: _convert(d, fw) for name, d in datas.items()}, report


def _check_residence(residence: str) -> None:
    if residence != "owned":
        raise ValueError(
            f"tensora.distributed: residence={residence!r} is not supported: a collective load fills "
            "owned memory (the other ranks' shares arrive over the process group); use 'owned'")


def _read(load):
    t = time.perf_counter()
    try:
        shared = load()
        return (shared, None), time.perf_counter() - t
    except Exception as e:  # reported to every rank by `_agree`, then raised there
        return (None, f"{type(e).__name__}: {e}"), time.perf_counter() - t


def load_file_with_report(
    path: PathLike,
    group=None,
    framework: str = "pt",
    select: Union[None, str, List[str]] = None,
    backend: str = "auto",
    residence: str = "owned",
    remote: Optional[RemoteOptions] = None,
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """:func:`load_file`, plus this rank's report: its own load report's fields, ``rank``,
    ``bytes_read`` (from storage), ``bytes_received`` (from the other ranks), ``read_seconds``,
    ``exchange_seconds``, ``ranks`` (every rank's figures) and ``slowest`` (the rank whose read plus
    exchange took longest, so a straggler is visible)."""
    fw = _check_framework(framework)
    _check_residence(residence)
    group, rank, world, global_ranks, pg_backend = _group_facts(group)
    r = _remote_dict(remote, None)
    outcome, read_s = _read(lambda: _native.load_share(os.fspath(path), rank, world, select, backend, r))
    return _collective(outcome, group, rank, world, global_ranks, pg_backend, fw, read_s)


def load_file(
    path: PathLike,
    group=None,
    framework: str = "pt",
    select: Union[None, str, List[str]] = None,
    backend: str = "auto",
    residence: str = "owned",
    remote: Optional[RemoteOptions] = None,
) -> Dict[str, Any]:
    """Every selected tensor of ``path`` on every rank of ``group`` (default: the world), each rank
    reading only its share from storage. ``path`` (local or a URL), ``select``, ``backend`` and
    ``remote`` as in :func:`tensora.load_file` and the same on every rank (a URL is read without a
    cache: the ranks would wait on each other's locks). ``residence`` is ``"owned"``: the tensors
    are a snapshot in memory each rank owns (the other shares arrive by the exchange, so views of
    local files cannot hold them)."""
    return load_file_with_report(path, group, framework, select, backend, residence, remote)[0]


def weights_iterator(
    path_or_files: Union[PathLike, Iterable[PathLike]],
    group=None,
    framework: str = "pt",
    budget: Optional[int] = None,
    select: Union[None, str, List[str]] = None,
    backend: str = "auto",
) -> Iterator[Tuple[str, Any]]:
    """Yield ``(name, tensor)`` on every rank, one window of at most ``budget`` bytes (default
    256 MiB) at a time: each rank reads its share of the window, the ranks exchange, the window's
    tensors are yielded. One more window is read while the consumer works, so a rank holds at most
    about ``2 × budget`` besides what the caller keeps."""
    fw = _check_framework(framework)
    group, rank, world, global_ranks, pg_backend = _group_facts(group)
    if isinstance(path_or_files, (str, os.PathLike)):
        paths = [os.fspath(path_or_files)]
    else:
        paths = [os.fspath(p) for p in path_or_files]
    budget = BUDGET_DEFAULT_BYTES if budget is None else budget
    stream = _native.open_share_stream(paths, rank, world, budget, select, backend)
    try:
        while True:
            outcome, read_s = _read(lambda: next(stream, None))
            done = outcome == (None, None)
            # Every rank has the same windows: agree on the end too, so none waits alone.
            _agree(group, rank, world, global_ranks, pg_backend, {"error": outcome[1], "regions": ["end" if done else "window"]})
            if done:
                return
            tensors, _ = _collective(outcome, group, rank, world, global_ranks, pg_backend, fw, read_s)
            yield from tensors.items()
    finally:
        stream.close()
