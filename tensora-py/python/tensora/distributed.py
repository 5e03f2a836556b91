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
call with the same arguments and see the same files (a file's identity includes its inode and
mtime, so copies on each node's own disk count as different files; checked before any byte is
exchanged: the ranks
agree on a digest of each window's plan, every tensor's name, dtype, shape and arena offset and every
file's size, mtime and inode, or an object's size and ETag; a rank that differs fails every rank,
naming it and the first file or tensor that differs). A failure on
any rank (a missing file, a read error, a rank that dies) raises :class:`tensora.LoadError` on every
rank, naming the failing rank; no rank is left waiting past the process group's timeout.

With gloo (CPU) the shares are exchanged in host memory. With NCCL each rank copies its share to its
current CUDA device, the shares are broadcast on the device, and the tensors come back on the device
(views of one device buffer). The device path is written against the documented NCCL semantics and
tested only where a GPU exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from . import RemoteOptions, _native, _convert, _check_framework, _dtype_name, _remote_dict
from ._native import LoadError

__all__ = ["load_file", "load_file_with_report", "load_tp", "load_tp_with_report", "weights_iterator",
           "EXCHANGE_BYTES_MAX", "REPLICATED_OWN_BYTES_MAX"]

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


def _swap(group, peer, payload, bytes_max):
    """Sends `payload` (bytes) to global rank `peer` and receives the peer's (at most `bytes_max`):
    length, then bytes. Raises what the transport raises when the peer is gone."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor([len(payload)], dtype=torch.int64)
    theirs = torch.zeros(1, dtype=torch.int64)
    works = [dist.isend(mine, peer, group=group), dist.irecv(theirs, peer, group=group)]
    for w in works:
        w.wait()
    n = int(theirs.item())
    if not 0 <= n <= bytes_max:
        raise LoadError(f"collective load: rank sent a status of {n} bytes (at most {bytes_max})")
    out = torch.zeros(n, dtype=torch.uint8)
    works = [dist.isend(torch.frombuffer(bytearray(payload), dtype=torch.uint8), peer, group=group)] if payload else []
    if n:
        works.append(dist.irecv(out, peer, group=group))
    for w in works:
        w.wait()
    return bytes(out.numpy())


# The largest status a rank accepts from another (an error message, the share regions and the
# plan's digest).
_STATUS_BYTES_MAX = 1 << 20
# The largest plan a rank sends or accepts when the plans' digests differ (the error path only):
# its files and tensors as `[kind, what, key]`, cut to this size by the sender.
_PLAN_BYTES_MAX = 64 << 20


def _gather(g, payload, bytes_max):
    """Every rank swaps `payload` (JSON) with every other one, pair by pair, so a rank that left is
    named by the pair that broke; returns the payloads by rank (this rank's own at its place), or
    raises on every surviving rank. Each wait is bounded by the process group's timeout."""
    sgroup = _status_group(g.group, g.global_ranks, g.backend)
    data = json.dumps(payload).encode()
    out: List[Any] = [None] * g.world
    out[g.rank] = payload
    gone = []
    for r in range(g.world):
        if r == g.rank:
            continue
        try:
            out[r] = json.loads(_swap(sgroup, g.global_ranks[r], data, bytes_max))
        except LoadError:
            raise
        except Exception as e:  # a dead or unreachable rank: gloo raises RuntimeError on its pair
            gone.append((r, e))
    if gone:
        r, e = gone[0]
        raise LoadError(f"collective load failed: rank {r} left the group or did not answer ({type(e).__name__}: {e})")
    return out


def _plan_digest(plan) -> Optional[str]:
    """The digest of a window's plan (`Shared.plan()`): each file's identity and each tensor's
    name, dtype, shape, file and arena offset, in order (what an item is called is left out)."""
    if plan is None:
        return None
    # Length-prefixed, so no two plans spell the same text; one join (20,000 tensors: ~20 ms).
    text = "".join(f"{kind}{len(key)}:{key}" for kind, _, key in plan)
    return hashlib.sha256(text.encode()).hexdigest()


def _plan_payload(plan) -> Dict[str, Any]:
    """`plan` as sent when the digests differ: its items, up to `_PLAN_BYTES_MAX` bytes of them."""
    items: List[List[str]] = []
    size = 64  # the payload's own keys
    for item in plan or []:
        size += len(json.dumps(list(item))) + 2
        if size > _PLAN_BYTES_MAX:
            break
        items.append(list(item))
    return {"items": items, "complete": len(items) == len(plan or [])}


def _plan_difference(first, other, r: int) -> str:
    """What differs between rank 0's plan payload and rank `r`'s: the first file or tensor."""
    head = (f"collective load: rank {r} planned another load than rank 0 (every rank must call with "
            "the same arguments and see the same files)")
    a, b = first["items"], other["items"]
    for x, y in zip(a, b):
        if (x[0], x[2]) != (y[0], y[2]):
            return f"{head}: rank 0 has {x[0]} {x[1]!r} ({x[2]}), rank {r} has {y[0]} {y[1]!r} ({y[2]})"
    if len(a) != len(b) and first["complete"] and other["complete"]:
        extra, who = (a[len(b)], 0) if len(a) > len(b) else (b[len(a)], r)
        return f"{head}: only rank {who} has {extra[0]} {extra[1]!r} ({extra[2]})"
    return f"{head}: the first {min(len(a), len(b))} files and tensors agree, a later one differs"


def _agree(g, status, plan=None):
    """Every rank swaps statuses with every other one (`_gather`), so a rank that failed is named
    by its own report. Then the ranks compare the digests of their plans (`plan`: this window's
    `Shared.plan()`, or None); where one differs from rank 0's, every rank swaps its whole plan and
    raises naming the first such rank and the first file or tensor that differs. Returns the
    statuses by rank, or raises the same kind of error on every surviving rank."""
    statuses = _gather(g, {**status, "plan": _plan_digest(plan)}, _STATUS_BYTES_MAX)
    failed = [(r, s["error"]) for r, s in enumerate(statuses) if s["error"] is not None]
    if failed:
        r, msg = failed[0]
        raise LoadError(f"collective load failed on rank {r}: {msg}")
    # Every rank holds the same digests, so every rank takes the same branch.
    differs = next((r for r, s in enumerate(statuses) if s["plan"] != statuses[0]["plan"]), None)
    if differs is not None:
        plans = _gather(g, _plan_payload(plan), _PLAN_BYTES_MAX)
        raise LoadError(_plan_difference(plans[0], plans[differs], differs))
    regions = {json.dumps(s["regions"]) for s in statuses}
    if len(regions) != 1:
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


class _Group:
    """The process group of one collective call and the facts every step needs."""

    def __init__(self, group):
        self.group, self.rank, self.world, self.global_ranks, self.backend = _group_facts(group)

    def agree(self, status, plan=None):
        return _agree(self, status, plan)


def _window(g: _Group, outcome, fw, dtype=None):
    """One window: every rank says how its read went (raising on every rank if one failed), the
    shares are exchanged, and the window's tensors come back with this rank's figures."""
    shared, error = outcome
    # Before any byte is exchanged: the same regions, and the same files and tensors in them.
    g.agree({"error": error, "regions": shared.regions() if shared is not None else None},
            shared.plan() if shared is not None else None)
    t = time.perf_counter()
    received, device_buffer = _exchange(shared, g.group, g.rank, g.world, g.global_ranks, g.backend)
    exchange_s = time.perf_counter() - t
    if device_buffer is not None and dtype is not None:
        raise LoadError("tensora.distributed: dtype= casts in host memory; with NCCL the tensors live on the "
                        "GPU: convert them there (tensor.to(dtype))")
    datas = shared.tensors(dtype)
    if device_buffer is not None:
        if fw != "pt":
            raise LoadError("tensora.distributed: NCCL tensors live on the GPU; use framework='pt'")
        tensors = _device_tensors(shared, datas, device_buffer)
    else:
        tensors = {name: _convert(d, fw) for name, d in datas.items()}
    return tensors, json.loads(shared.report()), received, exchange_s


def _windows(paths, g: _Group, fw, window_bytes, select, backend, remote, dtype=None):
    """Every window of `paths` on every rank, as ``(tensors, report, bytes received, read
    seconds, exchange seconds)``. A thread reads this rank's share of the next window while this
    one is exchanged and consumed, and starts on the one after only when this one's successor is
    taken: two windows of ``window_bytes`` at most, besides what the caller keeps. Nothing here
    holds a window once the caller has moved past it."""
    stream = _native.open_share_stream(paths, g.rank, g.world, window_bytes, select, backend, remote)
    try:
        while True:
            t = time.perf_counter()
            try:
                outcome = (next(stream, None), None)
            except Exception as e:  # reported to every rank by `agree`, then raised there
                outcome = (None, f"{type(e).__name__}: {e}")
            read_s = time.perf_counter() - t
            done = outcome == (None, None)
            # Every rank has the same windows: agree on the end too, so none waits alone.
            g.agree({"error": outcome[1], "regions": ["end" if done else "window"]})
            if done:
                return
            tensors, report, received, exchange_s = _window(g, outcome, fw, dtype)
            outcome = None  # the share: its memory is the window's
            yield tensors, report, received, read_s, exchange_s
            del tensors
    finally:
        stream.close()


def _paths(path_or_files) -> List[str]:
    if isinstance(path_or_files, (str, os.PathLike)):
        return [os.fspath(path_or_files)]
    return [os.fspath(p) for p in path_or_files]


def _check_residence(residence: str) -> None:
    if residence != "owned":
        raise ValueError(
            f"tensora.distributed: residence={residence!r} is not supported: a collective load fills "
            "owned memory (the other ranks' shares arrive over the process group); use 'owned'")


def load_file_with_report(
    path: PathLike,
    group=None,
    framework: str = "pt",
    select: Union[None, str, List[str]] = None,
    backend: str = "auto",
    residence: str = "owned",
    remote: Optional[RemoteOptions] = None,
    budget: Optional[int] = None,
    dtype: Any = None,
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """:func:`load_file`, plus this rank's report: ``rank``, ``bytes_read`` (from storage),
    ``bytes_received`` (from the other ranks), ``bytes_selected``, ``windows``, ``read_seconds``
    (waiting for this rank's reads beyond what the exchange hid), ``exchange_seconds``,
    ``seconds`` (the whole call), ``backend`` and ``reason`` (of the first window's read),
    ``ranks`` (every rank's figures) and ``slowest`` (the rank whose read plus exchange took
    longest, so a straggler is visible)."""
    fw = _check_framework(framework)
    _check_residence(residence)
    g = _Group(group)
    budget = BUDGET_DEFAULT_BYTES if budget is None else budget
    started = time.perf_counter()
    tensors: Dict[str, Any] = {}
    figures = {"rank": g.rank, "bytes_read": 0, "bytes_received": 0, "bytes_selected": 0, "windows": 0,
               "read_seconds": 0.0, "exchange_seconds": 0.0}
    first = None
    for window, report, received, read_s, exchange_s in _windows(
            _paths(path), g, fw, budget, select, backend, _remote_dict(remote, None), _dtype_name(dtype)):
        tensors.update(window)
        first = first or report
        figures["bytes_read"] += report["bytes_read"]
        figures["bytes_selected"] += report["bytes_selected"]
        figures["bytes_received"] += received
        figures["windows"] += 1
        figures["read_seconds"] += read_s
        figures["exchange_seconds"] += exchange_s
    figures["seconds"] = time.perf_counter() - started
    import torch.distributed as dist

    everyone: List[Any] = [None] * g.world
    dist.all_gather_object(everyone, figures, group=g.group)
    slowest = max(everyone, key=lambda f: f["read_seconds"] + f["exchange_seconds"])
    origin = {k: first[k] for k in ("backend", "reason", "io_mode") if first and k in first}
    return tensors, {**origin, **figures, "ranks": everyone, "slowest": slowest}


def load_file(
    path: PathLike,
    group=None,
    framework: str = "pt",
    select: Union[None, str, List[str]] = None,
    backend: str = "auto",
    residence: str = "owned",
    remote: Optional[RemoteOptions] = None,
    budget: Optional[int] = None,
    dtype: Any = None,
) -> Dict[str, Any]:
    """Every selected tensor of ``path`` on every rank of ``group`` (default: the world), each rank
    reading only its share from storage. ``path`` (local or a URL), ``select``, ``backend`` and
    ``remote`` as in :func:`tensora.load_file` and the same on every rank (a URL is read without a
    cache: the ranks would wait on each other's locks). ``residence`` is ``"owned"``: the tensors
    are a snapshot in memory each rank owns (the other shares arrive by the exchange, so views of
    local files cannot hold them). The load runs in windows of ``budget`` bytes (256 MiB by
    default): the ranks exchange one window while they read the next. ``dtype`` is as in
    :func:`tensora.load_file`: after each window's exchange its floating-point tensors are
    converted (bit-exact with torch's ``.to()``) into a buffer of the window's own at the target
    dtype (host memory: refused with NCCL)."""
    return load_file_with_report(path, group, framework, select, backend, residence, remote, budget, dtype)[0]


def load_tp(path: PathLike, group=None, **options: Any) -> Dict[str, Any]:
    """This rank's tensor-parallel share, the group being the tensor-parallel group: rank ``r`` of
    ``group`` (default: the world) of size ``world`` gets what ``tensora.load_file(path, tp=(r,
    world), rules=rules)`` gives, and the group reads each byte once in all (the group split):

    - a split tensor its rank reads exactly or as runs of rows (a column-parallel block, or a
      row-parallel one read strided): each rank reads its own slice;
    - a split tensor the planner would read as a covering range on some rank (a row-parallel
      weight whose rows are too narrow to skip between, on this source): rank ``r`` reads rows
      ``torch.chunk(world)[r]`` of the whole tensor, one contiguous range, and sends every other
      rank exactly that rank's columns of those rows (never a whole tensor);
    - replicated tensors: read once across the group and exchanged, as :func:`load_file`.

    ``path`` is local or a URL (``remote`` as in :func:`load_file`: no cache); every rank calls
    with the same arguments and sees the same files (checked before any byte is exchanged). A
    failure on any rank raises :class:`tensora.LoadError` on every rank, naming the rank (and the
    tensor, in the exchange). ``options``: those of :func:`load_tp_with_report`. See
    docs/tensor-parallel.md."""
    return load_tp_with_report(path, group, **options)[0]


# Bytes of the group split a rank holds in flight at once: the rows it has read and not yet
# exchanged, and the pieces it stages to send. The rows of the group-split tensors are read in
# windows (runs of consecutive tensors, in the order the ranks agreed on), each sent to the ranks
# that need it as soon as it has landed while the next window is read; a window's rows, and the
# pieces staged in one step of its exchange, are at most `_window_bytes()` (a third of this), so
# the window being read, the window being exchanged and its staged step fit in this bound. A tensor
# whose rows alone exceed a third is a window of its own (its read is one sharded load), and its
# exchange still stages at most a third per step. What arrives lands in place.
EXCHANGE_BYTES_MAX = 64 << 20
# Windows of rows a rank holds at once: the one being exchanged and the one being read.
WINDOWS_IN_FLIGHT_MAX = 2
# The longest a rank waits for its reader thread to finish reading one window (torch's default
# process-group timeout): past it, the rank reports the window as failed to every rank.
WINDOW_READ_WAIT_S_MAX = 1800.0


def _window_bytes() -> int:
    """The bytes of one window of rows, and of one step's staged pieces (see EXCHANGE_BYTES_MAX)."""
    return max(1, EXCHANGE_BYTES_MAX // (WINDOWS_IN_FLIGHT_MAX + 1))


def _glob_exact(name: str) -> str:
    """A glob of the rules that matches exactly `name` (its metacharacters escaped)."""
    return "".join("\\" + c if c in "*?[]{},\\" else c for c in name)


def _chunks(size: int, world: int) -> List[Tuple[int, int]]:
    """``(start, length)`` of each rank's part of ``size`` indexes, as ``torch.chunk`` splits them
    (a rank past the last chunk gets an empty part)."""
    import torch

    parts = [c.shape[0] for c in torch.empty(size, device="meta").chunk(world)] if size else []
    out, start = [], 0
    for r in range(world):
        n = parts[r] if r < len(parts) else 0
        out.append((start, n))
        start += n
    return out


def _as_bytes(t):
    import torch

    return t.reshape(-1).view(torch.uint8)


def _exchange_split(g: _Group, name: str, own, shape: List[int], dim: int, flight=None):
    """Rank ``g.rank``'s columns (``torch.chunk`` of ``dim``) of tensor ``name`` of ``shape``,
    assembled from ``own`` (this rank's rows, ``torch.chunk`` of dimension 0, every column) and
    the other ranks' rows of those columns, one step of at most ``_window_bytes()`` staged at a
    time (counted in ``flight``, a :class:`_Flight`, while staged). Returns ``(tensor, bytes
    sent, bytes received)``."""
    import torch
    import torch.distributed as dist

    rows = _chunks(shape[0], g.world)
    cols = _chunks(shape[dim], g.world)
    (row0, nrows), (col0, ncols) = rows[g.rank], cols[g.rank]
    out = torch.empty([ncols if d == dim else n for d, n in enumerate(shape)], dtype=own.dtype)
    out[row0:row0 + nrows] = own.narrow(dim, col0, ncols)
    row_bytes = own.element_size() * int(torch.Size(shape[1:]).numel())
    if row_bytes == 0 or (ncols == 0 and nrows == 0):
        return out, 0, 0
    block = max(1, _window_bytes() // row_bytes)
    steps = max(-(-n // block) for _, n in rows)
    sent = received = 0
    for k in range(steps):
        lo = k * block
        works = []
        for r, (start, n) in enumerate(rows):
            if r != g.rank and lo < n and ncols:
                buf = out[start + lo:start + min(n, lo + block)]
                works.append((r, "send", dist.irecv(_as_bytes(buf), g.global_ranks[r], group=g.group)))
                received += buf.nbytes
        staged = []  # alive until every send of the step completed
        if lo < nrows:
            mine = own[lo:min(nrows, lo + block)]
            for q, (c0, n) in enumerate(cols):
                if q != g.rank and n:
                    staged.append(mine.narrow(dim, c0, n).contiguous())
                    if flight is not None:
                        flight.add(0, staged[-1].nbytes)
                    works.append((q, "receive", dist.isend(_as_bytes(staged[-1]), g.global_ranks[q], group=g.group)))
                    sent += staged[-1].nbytes
        for peer, what, w in works:
            try:
                w.wait()
            except Exception as e:  # a rank that left or failed: gloo raises on the pair
                raise LoadError(
                    f"tensor-parallel load: tensor {name!r}: rank {peer} did not {what} its slice of rows "
                    f"{lo}.. ({type(e).__name__}: {e})") from e
        if flight is not None:
            flight.add(0, -sum(t.nbytes for t in staged))
    return out, sent, received


class _Flight:
    """What the group split holds in flight on this rank: windows read or being read and not yet
    exchanged, and bytes (their rows, and the pieces staged to send), with the most of each seen
    (the report's ``windows_in_flight_max`` and ``bytes_in_flight_max``). Shared by the reader
    thread and the exchanging one."""

    def __init__(self):
        import threading

        self._lock = threading.Lock()
        self.windows = self.bytes = self.windows_max = self.bytes_max = 0

    def add(self, windows: int, nbytes: int) -> None:
        with self._lock:
            self.windows += windows
            self.bytes += nbytes
            self.windows_max = max(self.windows_max, self.windows)
            self.bytes_max = max(self.bytes_max, self.bytes)


def _split_windows(reads, grouped, world: int) -> List[Tuple[List[str], int]]:
    """The group-split tensors (``grouped``, in the agreed order) cut into windows: runs of
    consecutive tensors whose rows at the rank with the most (``torch.chunk``'s first) total at most
    ``_window_bytes()``; a tensor larger alone is a window of its own. The same on every rank (a
    function of the agreed shapes). Returns each window's names and its rows' bytes (the most
    any rank reads of it)."""
    nbytes = {n: (shape, size) for n, _, shape, _, _, size in reads}
    bound = _window_bytes()
    windows: List[Tuple[List[str], int]] = []
    for n in grouped:
        shape, size = nbytes[n]
        rows = int(shape[0]) if shape else 1
        most = -(-rows // world) * (size // rows) if rows else 0
        if windows and windows[-1][1] + most <= bound:
            windows[-1][0].append(n)
            windows[-1] = (windows[-1][0], windows[-1][1] + most)
        else:
            windows.append(([n], most))
    return windows


def _read_windows(windows, read, flight: _Flight, ready, slots, stop) -> None:
    """The reader thread: reads each window's rows (``read(names)`` gives ``(tensors, report)``) in
    order, once a slot is free (``slots``: a semaphore of ``WINDOWS_IN_FLIGHT_MAX``, released by the
    exchanging thread when it has exchanged a window), and puts ``(tensors, report)`` or the
    error's text on ``ready``. Stops at ``stop`` (the exchanging thread gave up)."""
    for names, most in windows:
        while not slots.acquire(timeout=1.0):
            if stop.is_set():
                return
        if stop.is_set():
            return
        flight.add(1, most)
        try:
            got = read(names)
        except Exception as e:  # reported to every rank by `agree`, then raised there
            got = f"{type(e).__name__}: {e}"
        ready.put(got)
        if isinstance(got, str):
            return


def _exchange_windows(g: _Group, reads, grouped, read) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The group split's pipeline: a thread reads this rank's rows window by window
    (:func:`_split_windows`) while this thread exchanges each landed window with the ranks that need
    its columns, at most ``WINDOWS_IN_FLIGHT_MAX`` windows held at once. Before a window's bytes
    move the ranks agree that every rank read it (else every rank raises naming the first that
    failed). Returns the tensors and the ``group_split`` report."""
    import queue
    import threading

    windows = _split_windows(reads, grouped, g.world)
    flight = _Flight()
    ready: "queue.Queue[Any]" = queue.Queue(maxsize=WINDOWS_IN_FLIGHT_MAX)
    slots = threading.Semaphore(WINDOWS_IN_FLIGHT_MAX)
    stop = threading.Event()
    reader = threading.Thread(target=_read_windows, args=(windows, read, flight, ready, slots, stop),
                              name="tensora-tp-rows")
    reader.start()
    shapes = {n: (shape, dim) for n, _, shape, dim, _, _ in reads}
    tensors: Dict[str, Any] = {}
    rep = {"tensors": len(grouped), "windows": len(windows), "bytes_read": 0, "bytes_sent": 0,
           "bytes_received": 0, "exchange_seconds": 0.0, "read_wait_seconds": 0.0}
    try:
        for names, most in windows:
            t = time.perf_counter()
            try:
                got = ready.get(timeout=WINDOW_READ_WAIT_S_MAX)
            except queue.Empty:
                got = f"TimeoutError: its rows of {names[0]!r} were not read in {WINDOW_READ_WAIT_S_MAX:.0f} s"
            rep["read_wait_seconds"] += time.perf_counter() - t
            # Every rank read this window's rows (or every rank raises, naming the first that
            # failed) before any of its slices is exchanged.
            g.agree({"error": got if isinstance(got, str) else None, "regions": ["tp-rows", names[0]]})
            rows, load = got
            rep["bytes_read"] += load["bytes_read"]
            t = time.perf_counter()
            for n in names:
                shape, dim = shapes[n]
                tensors[n], sent, received = _exchange_split(g, n, rows.pop(n), list(shape), dim, flight)
                rep["bytes_sent"] += sent
                rep["bytes_received"] += received
            rep["exchange_seconds"] += time.perf_counter() - t
            del rows, got
            flight.add(-1, -most)
            slots.release()
    finally:
        stop.set()
        reader.join()
    rep.update(windows_in_flight_max=flight.windows_max, bytes_in_flight_max=flight.bytes_max)
    return tensors, rep


def _tp_plan(g: _Group, p: str, rules, backend: str, remote):
    """The checkpoint opened once (``_native.TpSource``: every part of the load reads from it, its
    headers parsed once) and every rank's view of it (``TpSource.reads``), agreed on: the same
    files and tensors on every rank (else every rank raises naming the first rank that differs),
    and the group-split set, the tensors split on an inner dimension that some rank would read as
    a covering range. Returns ``(source, reads, group-split names)``."""
    source, reads, plan, error = None, [], None, None
    try:
        source = _native.TpSource(p, remote)
        files, reads = source.reads(g.rank, g.world, rules, backend)
        plan = list(files) + [("tensor", n, f"{n} {dt} {shape} split {dim}") for n, dt, shape, dim, *_ in reads]
    except Exception as e:  # reported to every rank by `agree`, then raised there
        error = f"{type(e).__name__}: {e}"
    covering = [n for n, _, _, dim, kind, _ in reads if dim is not None and dim > 0 and kind == "covering"]
    statuses = g.agree({"error": error, "regions": ["tp"], "covering": covering}, plan)
    union = set().union(*(s["covering"] for s in statuses))
    return source, reads, [n for n, *_ in reads if n in union]


# Replicated tensors of at most this many bytes in all are read by every rank itself, in the load
# of its own slices (Llama's norms are 184 KiB: a collective load's agreement rounds and windows
# cost more than reading them); more are read once across the group and exchanged, as load_file.
REPLICATED_OWN_BYTES_MAX = 64 << 20


def _source_load(source, names, tp, rules, backend):
    """``load_file_with_report(path, framework="pt", select=names, tp=tp, rules=rules)`` from the
    checkpoint ``source`` opened (no header read again)."""
    datas, report = source.load(names, tp[0], tp[1], rules, backend)
    return {n: _convert(d, "pt") for n, d in datas.items()}, json.loads(report)


def _load_part(out: Dict[str, Any], key: str, source, names, rules, backend, tp):
    """One sharded load from ``source``: ``out[key]`` is ``(tensors, report)``, or the error's text."""
    try:
        out[key] = _source_load(source, names, tp, rules, backend)
    except Exception as e:  # reported to every rank by `agree`, then raised there
        out[key] = f"{type(e).__name__}: {e}"


def _part_error(parts: Dict[str, Any], key: str) -> Optional[str]:
    got = parts.get(key)
    return got if isinstance(got, str) else None


def load_tp_with_report(
    path: PathLike,
    group=None,
    framework: str = "pt",
    rules: Any = None,
    backend: str = "auto",
    budget: Optional[int] = None,
    remote: Optional[RemoteOptions] = None,
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """:func:`load_tp`, plus this rank's report: ``rank``, ``world``, ``bytes_read`` (from
    storage, every part), ``bytes_received`` (from the other ranks), and each part's own figures:
    ``split`` (the load of its own slices, and of the replicated tensors when they are small),
    ``group_split`` (``tensors``, ``windows``, ``bytes_read``: its rows of them, ``bytes_sent``,
    ``bytes_received``, ``exchange_seconds``, ``read_wait_seconds``: the exchange waiting for a
    window's rows, ``windows_in_flight_max`` and ``bytes_in_flight_max``: the most held at once,
    see ``EXCHANGE_BYTES_MAX``) and ``replicated`` (the collective load's report, when the
    replicated tensors are read that way)."""
    import threading

    fw = _check_framework(framework)
    g = _Group(group)
    p = os.fspath(path)
    source, reads, grouped = _tp_plan(g, p, rules, backend, _remote_dict(remote, None))
    in_group = set(grouped)
    replicated = [n for n, _, _, dim, _, _ in reads if dim is None]
    small = sum(nbytes for _, _, _, dim, _, nbytes in reads if dim is None) <= REPLICATED_OWN_BYTES_MAX
    own = [n for n, _, _, dim, _, _ in reads if dim is not None and n not in in_group] + (replicated if small else [])
    tp = (g.rank, g.world)
    report: Dict[str, Any] = {"rank": g.rank, "world": g.world, "bytes_read": 0, "bytes_received": 0}
    tensors: Dict[str, Any] = {}
    parts: Dict[str, Any] = {}
    # This rank's own slices load on a thread while it reads its rows of the group-split tensors
    # and exchanges them.
    mine = threading.Thread(target=_load_part, args=(parts, "own", source, own, rules, backend, tp),
                            name="tensora-tp-own") if own else None
    if mine is not None:
        mine.start()
    try:
        if grouped:
            # Rows torch.chunk(world, 0)[rank] of every group-split tensor: one range each, every
            # window read from the one open checkpoint.
            def read(names):
                return _source_load(source, names, tp, [(_glob_exact(n), "column") for n in names], backend)

            split, report["group_split"] = _exchange_windows(g, reads, grouped, read)
            tensors.update(split)
            report["bytes_read"] += report["group_split"]["bytes_read"]
            report["bytes_received"] += report["group_split"]["bytes_received"]
    finally:
        if mine is not None:
            mine.join()
    g.agree({"error": _part_error(parts, "own"), "regions": ["tp-own"]})
    if own:
        part, rep = parts.pop("own")
        tensors.update(part)
        report["split"] = rep
        report["bytes_read"] += rep["bytes_read"]
    if replicated and not small:
        whole, rep = load_file_with_report(p, group, "pt", replicated, backend, "owned", remote, budget)
        tensors.update(whole)
        report["replicated"] = rep
        report["bytes_read"] += rep["bytes_read"]
        report["bytes_received"] += rep["bytes_received"]
    if fw == "np":
        tensors = {n: t.numpy() for n, t in tensors.items()}
    return tensors, report


def weights_iterator(
    path_or_files: Union[PathLike, Iterable[PathLike]],
    group=None,
    framework: str = "pt",
    budget: Optional[int] = None,
    select: Union[None, str, List[str]] = None,
    backend: str = "auto",
    remote: Optional[RemoteOptions] = None,
    dtype: Any = None,
) -> Iterator[Tuple[str, Any]]:
    """Yield ``(name, tensor)`` on every rank, one window of at most ``budget / 2`` bytes (the
    budget is 256 MiB by default) at a time: each rank reads its share of the window, the ranks
    exchange, the window's tensors are yielded. The next window is read while the consumer works,
    and the one after only once the consumer has moved on, so a rank holds at most about
    ``2 x budget`` besides what the caller keeps: two windows, and the window a tensor the caller
    still holds belongs to (a tensor is a view of its window's memory). Paths may be URLs
    (``remote`` as in :func:`load_file`). ``dtype`` is as in :func:`load_file`: each window's
    floating-point tensors are converted after its exchange into a buffer of the window's own
    (so a window holds its stored bytes and its converted ones until the caller moves on)."""
    fw = _check_framework(framework)
    g = _Group(group)
    budget = BUDGET_DEFAULT_BYTES if budget is None else budget
    if budget < 1:
        raise ValueError("budget must be at least 1 byte")
    window_bytes = _native.iterator_window_bytes(budget)  # half the budget
    windows = _windows(_paths(path_or_files), g, fw, window_bytes, select, backend, _remote_dict(remote, None),
                       _dtype_name(dtype))
    for window, *_ in windows:
        # Handed out of the dict one by one: once the caller has the last one, nothing here
        # pins the window while the next is exchanged.
        for name in list(window):
            yield name, window.pop(name)
