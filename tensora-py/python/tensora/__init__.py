"""Tensora: fast, strict, memory-bounded checkpoint loading with zero-copy tensors.

A drop-in for ``safetensors``: ``tensora.torch``, ``tensora.numpy`` and ``tensora.safetensors``
are ``safetensors.torch``, ``safetensors.numpy`` and ``safetensors`` 0.8 (same signatures and
errors), and ``tensora.patch()`` (or ``TENSORA_PATCH_SAFETENSORS=1``) routes unchanged code that
imports ``safetensors`` to them (``docs/dropin.md``). Tensora's own API::

    import tensora
    weights = tensora.load_file("model.safetensors")            # {name: numpy.ndarray}
    with tensora.safe_open("model.safetensors", framework="pt") as f:
        w = f.get_tensor("lm_head.weight")                       # torch.Tensor, zero copy
    for name, t in tensora.weights_iterator(files, framework="pt", budget=512 << 20):
        model.load_weight(name, t)                               # streaming, memory-bounded

Arrays and tensors point into memory owned by the load: for numpy by default an owned buffer, a
snapshot of the files; for torch by default (as HF's torch loader) a private copy-on-write mapping
of the files when they are warm and local, as ``safe_open`` uses; it is freed when the last of them
goes. Writing into them never changes the file.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np

from . import _native
from ._native import (
    SafetensorError,
    CancelledError,
    ConvertError,
    DtypeError,
    FormatError,
    LoadError,
    SelectionError,
    TensoraError,
    VerifyError,
)
from ._save import NoSpaceError, load, save, save_file, save_file_with_report, save_sharded
from ._save import __all__ as _save_all

__all__ = [
    "safe_open",
    "load_file",
    "load_file_with_report",
    "weights_iterator",
    "inspect",
    "hash",
    "verify",
    "convert",
    "backends",
    "wait_cache",
    "RemoteOptions",
    "patch",
    "unpatch",
    "SafetensorError",
    "TensoraError",
    "FormatError",
    "LoadError",
    "SelectionError",
    "CancelledError",
    "DtypeError",
    "VerifyError",
    "ConvertError",
]
__all__ += _save_all  # save_file, save, load, save_sharded (tensora._save)

PathLike = Union[str, "os.PathLike[str]"]
Rules = Union[None, str, List[Tuple[str, Union[None, int, str]]]]
Progress = Callable[[int, int], Optional[bool]]

# Safetensors dtype -> numpy dtype, for the dtypes numpy has.
_NP_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"),
}

_FRAMEWORKS = ("np", "numpy", "pt", "torch", "pytorch")


def _check_framework(framework: str) -> str:
    if framework not in _FRAMEWORKS:
        raise ValueError(f"framework must be one of {_FRAMEWORKS}, not {framework!r}")
    return "np" if framework in ("np", "numpy") else "pt"


def _to_numpy(data: "_native.TensorData") -> np.ndarray:
    dt = _NP_DTYPES.get(data.dtype)
    if dt is None:
        raise DtypeError(
            f"tensor {data.name!r}: numpy has no dtype for {data.dtype}; use framework=\"pt\""
        )
    flat = np.frombuffer(data, dtype=dt)  # zero copy; the array's base keeps `data` alive
    shape = tuple(data.shape)
    strides = data.strides
    if strides is None:
        return flat.reshape(shape)
    return np.lib.stride_tricks.as_strided(
        flat, shape=shape, strides=tuple(s * dt.itemsize for s in strides)
    )


def _to_torch(data: "_native.TensorData"):
    import torch

    return torch.from_dlpack(data)


def _convert(data: "_native.TensorData", fw: str):
    return _to_numpy(data) if fw == "np" else _to_torch(data)


@dataclasses.dataclass(frozen=True)
class RemoteOptions:
    """How to reach the store of a URL path (each store, its schemes, what ``endpoint`` means for
    it and where its credentials come from: ``tensora._native.schemes()``), as the CLI's flags:
    ``endpoint`` (the store's endpoint, e.g. an S3-compatible server's), ``allow_http``
    (plain-HTTP endpoints), ``anonymous`` (unsigned requests), ``region``, ``allow_unversioned``
    (load objects whose server sends neither ETag nor Last-Modified), ``open_timeout`` (seconds
    for opening: every request and retry; 120 by default), ``cache`` (a directory: a verified
    local cache, written from where the ranges landed, resumed after an
    interruption, read back at disk speed next time), ``cache_max`` (bytes; least recently used
    objects go first), ``offline`` (load from the cache only) and ``cache_writes``: ``"before"``
    (the default: every range is on disk before the tensors are handed over, whatever is done
    with them next) or ``"behind"`` (the tensors come back as soon as they have arrived and the
    copies are written behind them, see :func:`wait_cache`; a tensor rewritten in place before
    its pieces are written leaves them out of the cache). Credentials come from the environment
    (each store's variables: ``tensora._native.schemes()``), never from here."""

    endpoint: Optional[str] = None
    allow_http: bool = False
    anonymous: bool = False
    region: Optional[str] = None
    allow_unversioned: bool = False
    open_timeout: Optional[float] = None
    cache: Optional[PathLike] = None
    cache_max: Optional[int] = None
    offline: bool = False
    cache_writes: Optional[str] = None


def _remote_dict(remote: Optional[RemoteOptions], cache: Optional[PathLike]) -> Optional[Dict[str, Any]]:
    """The ``remote=`` dict the native side takes; ``cache=`` is a shortcut for
    ``RemoteOptions(cache=...)``."""
    if remote is None and cache is None:
        return None
    if remote is not None and not isinstance(remote, RemoteOptions):
        raise TypeError(f"remote must be a tensora.RemoteOptions, not {type(remote).__name__}")
    if cache is not None:
        remote = dataclasses.replace(remote or RemoteOptions(), cache=cache)
    d = dataclasses.asdict(remote)
    if d["cache"] is not None:
        d["cache"] = os.fspath(d["cache"])
    return d


def _default_residence(fw: str) -> str:
    """The default residence of a framework: the semantics of the HF function tensora replaces
    (numpy: owned arrays; torch: a private mapping of the file, decided by "auto" when warm)."""
    return "auto" if fw == "pt" else "owned"


def load_file(
    path: PathLike,
    framework: str = "np",
    select: Union[None, str, List[str]] = None,
    backend: str = "auto",
    progress: Optional[Progress] = None,
    residence: Optional[str] = None,
    manifest: Optional[PathLike] = None,
    cache: Optional[PathLike] = None,
    remote: Optional[RemoteOptions] = None,
    tp: Optional[Tuple[int, int]] = None,
    rules: Rules = None,
    dtype: Any = None,
    *,
    cache_pages: bool = True,
) -> Dict[str, Any]:
    """Load every tensor (or the selected ones) of a checkpoint, like
    ``safetensors.numpy.load_file`` (``framework="np"``) or ``safetensors.torch.load_file``
    (``framework="pt"``). ``path`` is a safetensors file, a sharded directory or index, or a
    ServerlessLLM directory, local or at a URL (``s3://bucket/model/``,
    ``https://host/model/model.safetensors``; every store: ``tensora._native.schemes()``).
    ``select`` is a glob string or a list of exact names.

    A URL is loaded with ranged GETs straight into owned memory, every range conditional on the
    object's version seen at open (a replaced object fails the load, never mixes); ``remote``
    (a :class:`RemoteOptions`) says how to reach the store, and ``cache=DIR`` (a shortcut for
    ``RemoteOptions(cache=DIR)``) keeps a verified local copy: the next load of the same URL
    reads it at disk speed after one request per object (with
    ``RemoteOptions(cache_writes="behind")`` the copies are written behind the load: see
    :func:`wait_cache`).

    ``residence`` says where the tensors live; by default it follows the HF function this
    replaces: ``"owned"`` for ``framework="np"`` (HF's numpy ``load_file`` returns owned
    arrays) and ``"auto"`` for ``framework="pt"`` (HF's torch ``load_file`` returns tensors on a
    private mapping of the file, with the same ``SIGBUS`` caveat; warm, a mapped load is a
    page-table fill, tens of times faster than copying: see the README's bench):

    - ``"owned"``: one copy into a buffer this process owns, a snapshot of the files: nothing
      done to the files afterwards, ``save_file(load_file(p), p)`` included, affects the arrays.
    - ``"auto"``: when ``backend`` is ``"auto"`` and the files are on a local filesystem and
      (mostly) in the page cache, or cold but small enough for the page cache to keep them for
      the next process, zero-copy views of private copy-on-write mappings of the files, otherwise
      ``"owned"`` (remote data, or cold data too large to keep cached: a snapshot is safer).
      ``load_file_with_report`` says which and why.

    A cold load reads through the page cache, so the next process on the node finds the pages
    cached, whenever they fit in the memory the machine (or its cgroup) can give the cache
    beside the load's own; ``cache_pages=False`` (keyword) reads cold data around the cache
    (``O_DIRECT``, as ``tensora load --direct``), leaving other files' cached pages in place.
    - ``"mapped"``: the mapped views, whatever the facts.

    Mapped views have every page read in before this returns, so an I/O error or a file already
    truncated is an exception here. That protects the load, not what follows: the views stay
    backed by the files, so truncating or rewriting a file in place while its arrays live raises
    ``SIGBUS`` at the next access to a page not yet written. In particular never
    ``save_file(weights, same_path)`` with mapped arrays alive (write a new path and rename, or
    pass ``residence="owned"``). Another process's in-place writes to a file show through its
    mapped arrays (pages this process has not written). Writes into the arrays never reach the
    files. A view residence (``"mapped"`` or ``"auto"``, the default for
    ``framework="pt"``, as HF's torch ``load_file`` maps the file) is your promise that nothing truncates
    or rewrites the files while the arrays live.

    The whole load runs with the GIL released. ``progress(bytes_done, bytes_total)`` is called
    on this thread as reads complete; returning ``False`` cancels (``CancelledError``), and an
    exception it raises propagates unchanged. Ctrl-C also cancels.

    ``manifest`` (a file written by ``tensora.hash(..., write_manifest=...)`` or ``tensora hash
    --write-manifest``) makes this a verified load: every tensor's digest is computed as its bytes
    land (crc32c: on the worker that read them, while they are in its cache) and compared with the
    manifest before the tensor is complete; the first that differs raises ``VerifyError`` naming
    the tensor, its file and its offset, and nothing is returned. Every tensor of the checkpoint
    must be in the manifest.

    The arrays share one owner (buffer or mappings), freed when the last of them is gone.
    Every array is aligned for its dtype: a tensor whose file offset is not a multiple of its
    element size (safetensors allows it; HF's writer never does it) is handed out as an aligned
    copy of its own, counted in the report's ``aligned_copies``.

    ``tp=(rank, world)`` loads only this rank's tensor-parallel share: each tensor a ``rules``
    names is narrowed as ``torch.chunk(world, dim)[rank]`` (column-parallel: dimension 0,
    row-parallel: dimension 1; equal to vLLM's ``narrow`` when ``world`` divides the size; a rank
    past the end of an uneven split gets an empty tensor), the others whole. Only the slices' bytes
    are read (a row-parallel slice's rows, or a covering range when its gaps cost less than the
    requests: the report's ``slices`` says which), each slice lands contiguous in one owned buffer
    (``residence`` does not apply). ``rules`` is a preset (``"llama"``, the default, ``"qwen"``,
    ``"mixtral"``, ``"deepseek"``) or a list of ``(glob, split)`` pairs, first match wins, split
    ``"column"``/0, ``"row"``/1 or ``"replicated"``/``None``; names no rule matches are replicated.
    See docs/tensor-parallel.md.

    ``dtype`` (``"bf16"``, ``"f16"``, ``"f32"``, ``torch.bfloat16``/``float16``/``float32``,
    ``numpy.float16``/``float32``): floating-point tensors (F32, BF16, F16, F8_E4M3, F8_E5M2) are
    delivered in that dtype, bit-exact with torch's ``.to()``, each read converted as it lands
    into one owned buffer allocated at the target dtype (no full-size copy at the stored dtype;
    the stored bytes pass through a staging window of at most 256 MiB). Integer and boolean
    tensors keep their dtype; another floating-point dtype (F64, ...) raises ``LoadError`` naming
    the tensor and both dtypes. A cast load is always owned, whatever ``residence`` says (views
    of the file cannot change dtype). The report's ``cast`` lists the converted tensors and the
    seconds spent converting.
    """
    return load_file_with_report(
        path, framework, select, backend, progress, residence, manifest, cache, remote, tp, rules, dtype, cache_pages=cache_pages
    )[0]


def load_file_with_report(
    path: PathLike,
    framework: str = "np",
    select: Union[None, str, List[str]] = None,
    backend: str = "auto",
    progress: Optional[Progress] = None,
    residence: Optional[str] = None,
    manifest: Optional[PathLike] = None,
    cache: Optional[PathLike] = None,
    remote: Optional[RemoteOptions] = None,
    tp: Optional[Tuple[int, int]] = None,
    rules: Rules = None,
    dtype: Any = None,
    *,
    cache_pages: bool = True,
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``load_file``, plus the load report: ``backend``, ``reason`` (which residence was chosen
    and why, then the backend's own reason), ``io_mode`` (``"mapped"`` for zero-copy views),
    ``bytes_selected``, ``seconds``, ``gbps``, ``phases``, the page-fault counts, and
    ``aligned_copies`` (``{"tensors", "bytes"}`` handed out as aligned copies, see ``load_file``),
    and with ``dtype=`` ``cast`` (``to``, ``tensors``: each converted tensor's ``name`` and stored
    dtype ``from``, ``kept``, ``bytes_in``, ``bytes_out``, ``seconds`` converting, ``simd``).
    For a URL also ``url`` (redacted), ``requests``, ``retry_seconds``, the open's requests,
    ``cache`` (hits, bytes written, objects promoted) and ``concurrency`` (the depth the transfer
    settled on, and why). With ``tp=``, ``slices`` counts the tensors read ``contiguous``,
    ``strided`` and ``covering``, ``bytes_selected`` is the slices' bytes, ``bytes_read`` what
    was read and ``bytes_advised_beyond_reads`` the gaps between the rows a cold load asked the
    device to read along (0 warm or direct)."""
    fw = _check_framework(framework)
    m = None if manifest is None else os.fspath(manifest)
    residence = _default_residence(fw) if residence is None else residence
    r = _remote_dict(remote, cache)
    datas, report = _native.load(os.fspath(path), select, backend, progress, residence, m, r, tp, rules, _dtype_name(dtype), cache_pages)
    return {name: _convert(d, fw) for name, d in datas.items()}, json.loads(report)


def _one_dim_slice(index, shape: List[int]) -> Optional[Tuple[int, int, int]]:
    """``(dim, start, len)`` when ``index`` is slices of step 1 (and at most a trailing ``...``)
    that narrow at most one dimension of ``shape``; else ``None``."""
    items = list(index) if isinstance(index, tuple) else [index]
    if items and items[-1] is Ellipsis:
        items.pop()
    if not shape or len(items) > len(shape) or not all(isinstance(i, slice) for i in items):
        return None
    found = (0, 0, shape[0])
    narrowed = False
    for dim, s in enumerate(items):
        start, stop, step = s.indices(shape[dim])
        if step != 1:
            return None
        if (start, stop) == (0, shape[dim]):
            continue
        if narrowed:
            return None
        narrowed = True
        found = (dim, start, max(0, stop - start))
    return found


def _dtype_name(dtype: Any) -> Optional[str]:
    """``dtype=`` as the native side's name: a string as given, a torch dtype as its name
    (``torch.bfloat16`` -> ``"bfloat16"``), anything numpy takes for a dtype as numpy's name."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    if type(dtype).__module__ == "torch":
        return str(dtype).removeprefix("torch.")
    import numpy

    return numpy.dtype(dtype).name


class _Slice:
    """A tensor that is indexed before it is materialised (HF ``get_slice``)."""

    def __init__(self, mapped: "_native.Mapped", name: str, fw: str):
        self._mapped = mapped
        self._name = name
        self._fw = fw

    def get_shape(self) -> List[int]:
        return list(self._mapped.info(self._name)[1])

    def get_dtype(self) -> str:
        return self._mapped.info(self._name)[0]

    def __getitem__(self, index):
        # One dimension narrowed, step 1: only the slice's bytes are read, contiguous, into memory
        # of its own (the planner reads its rows or a covering range, whichever costs less).
        spec = _one_dim_slice(index, self.get_shape())
        if spec is not None:
            got = self._mapped.slice(self._name, *spec)
            if got is not None:
                return _convert(got[0], self._fw)
        # A view of the file's mapping with nothing read in: copying the indexed part out faults in
        # only its pages (a tensor-parallel shard of a row-split tensor reads just its rows). The
        # copy is the caller's own, as HF's.
        full = _convert(self._mapped.tensor_lazy(self._name), self._fw)
        part = full[index]
        return part.clone() if self._fw == "pt" else part.copy()


class safe_open:
    """``with tensora.safe_open(path, framework="np") as f:`` — HF ``safe_open`` semantics.

    Each file is mapped once, privately and writable (copy-on-write), and ``get_tensor`` returns
    a zero-copy view of it with the tensor's pages read in before returning: writes never reach
    the file, and any number of tensors costs one mapping per file. A second ``get_tensor`` of
    the same name returns an independent tensor (as HF's, which copies): a mapping of its own,
    or a heap copy once ``CALL_MAPPINGS_MAX`` such mappings are alive. ``get_slice(name)[...]``
    reads only the bytes of the part indexed when it narrows one dimension (step 1), else only its
    pages, and returns memory of its own. Do not modify or truncate a
    file in place while tensors of it are alive (``SIGBUS``).

    ``backend``: ``"auto"`` or ``"mmap"`` (the mapped views above) or ``"pread"`` (each
    ``get_tensor`` reads the tensor into memory of its own: nothing stays mapped); the load
    backends of ``tensora.backends()`` apply to ``load_file``, not here (``LoadError``).

    With ``manifest`` (see ``load_file``), every ``get_tensor`` checks the tensor's bytes against
    it before returning (``VerifyError`` naming tensor, file and offset otherwise); a
    ``get_slice`` checks the whole tensor, so it reads all of it.

    ``offset_keys()`` lists the names in the order of their bytes in the file(s).
    """

    def __init__(
        self,
        path: PathLike,
        framework: str = "np",
        device: str = "cpu",
        *,
        backend: str = "auto",
        manifest: Optional[PathLike] = None,
    ):
        if device not in ("cpu", None):
            raise ValueError(
                "tensora.safe_open loads to the CPU only; move tensors afterwards, or use"
                " tensora.torch.safe_open (HF's devices)"
            )
        self._fw = _check_framework(framework)
        m = None if manifest is None else os.fspath(manifest)
        self._mapped = _native.Mapped(os.fspath(path), m, backend)

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc) -> None:
        self._mapped = None

    def _m(self) -> "_native.Mapped":
        if self._mapped is None:
            raise TensoraError("safe_open is closed")
        return self._mapped

    def keys(self) -> List[str]:
        return self._m().keys()

    def offset_keys(self) -> List[str]:
        return self._m().offset_keys()

    def metadata(self) -> Optional[Dict[str, str]]:
        return self._m().metadata()

    def get_tensor(self, name: str):
        return _convert(self._m().tensor(name), self._fw)

    def get_slice(self, name: str) -> _Slice:
        self._m().info(name)  # raise now for a missing name
        return _Slice(self._m(), name, self._fw)


def weights_iterator(
    path_or_files: Union[PathLike, Iterable[PathLike]],
    framework: str = "pt",
    budget: Optional[int] = None,
    select: Union[None, str, List[str]] = None,
    backend: str = "auto",
    residence: Optional[str] = None,
    manifest: Optional[PathLike] = None,
    tp: Optional[Tuple[int, int]] = None,
    rules: Rules = None,
    dtype: Any = None,
) -> Iterator[Tuple[str, Any]]:
    """Yield ``(name, tensor)`` as each tensor lands (vLLM's ``Iterable[tuple[str, Tensor]]``).

    A background thread loads runs of consecutive tensors of at most ``budget / 3`` bytes each
    (the budget is 256 MiB by default; a larger tensor is a run of its own) and yields them zero
    copy. It loads the next run while you work through one (faulting in the memory of the one
    after it meanwhile), and loads that one only once you have moved on, so it holds at most about
    ``1.33 x budget`` (the run you are on, the next, the one after it, and the run before while
    you still hold a tensor of it: a tensor is a view of its run's memory; with tensors larger
    than ``budget / 3``, four times the largest) besides what you keep.
    A run's memory is freed when its last tensor is gone. Waiting releases the GIL. Breaking out
    of the loop stops the load.
    ``residence`` is as in ``load_file`` (default: ``"auto"`` for torch, ``"owned"`` for numpy):
    ``"owned"`` gives each run an owned buffer; ``"auto"`` decides per file (warm local files:
    mapped views, each run's pages read in before it is yielded, with the same ``SIGBUS``
    caveat; cold local files whose pages fit the page cache: mapped views too, in runs of at most
    32 MiB read ahead up to 256 MiB past the one being read in, so each tensor is yielded soon
    after its own pages land while the next ones are read).
    ``manifest`` (one for the whole model, all files): each tensor is checked as it lands and is
    yielded only if it matches; the first that does not raises ``VerifyError`` from the loop.
    ``tp=(rank, world)`` and ``rules`` (as in ``load_file``, one checkpoint path only): the rank's
    share is loaded at once into one owned buffer (its size, not ``budget``, bounds the memory)
    and yielded in file order.

    ``dtype`` is as in ``load_file``: each run is converted as it lands into its own owned
    buffer at the target dtype.
    """
    fw = _check_framework(framework)
    if tp is not None:
        if not isinstance(path_or_files, (str, os.PathLike)):
            raise ValueError("tp= takes one checkpoint path (a file, a directory or an index)")
        if manifest is not None:
            raise ValueError("manifest= checks whole tensors; it does not apply with tp=")
        yield from _tp_items(os.fspath(path_or_files), fw, select, backend, tp, rules, dtype)
        return
    if isinstance(path_or_files, (str, os.PathLike)):
        paths: Union[str, List[str]] = os.fspath(path_or_files)
    else:
        paths = [os.fspath(p) for p in path_or_files]
    m = None if manifest is None else os.fspath(manifest)
    residence = _default_residence(fw) if residence is None else residence
    stream = _native.open_stream(paths, select, budget, backend, residence, m, _dtype_name(dtype))
    try:
        for name, data in stream:
            yield name, _convert(data, fw)
    finally:
        stream.close()


def _tp_items(path: str, fw: str, select, backend: str, tp, rules, dtype) -> Iterator[Tuple[str, Any]]:
    """``weights_iterator``'s items under ``tp=``: one sharded load, in file order (a ``dtype``
    cast is refused by name: sharded loads deliver the stored dtype)."""
    datas, _ = _native.load(path, select, backend, None, "owned", None, None, tp, rules, _dtype_name(dtype))
    order = {name: i for i, name in enumerate(_native.Mapped(path).offset_keys())}
    for name in sorted(datas, key=lambda n: order.get(n, len(order))):
        yield name, _convert(datas.pop(name), fw)


def inspect(path: PathLike) -> Dict[str, Any]:
    """The checkpoint's structure: format, files, metadata, tensors (dtype, shape, offsets)."""
    return json.loads(_native.inspect_json(os.fspath(path)))


def hash(
    path: PathLike,
    algo: str = "crc32c",
    backend: str = "auto",
    progress: Optional[Progress] = None,
    write_manifest: Optional[PathLike] = None,
) -> Dict[str, str]:
    """One hex digest per tensor (``crc32c``, ``xxh3`` or ``sha256``) of its stored bytes.
    ``write_manifest``: also write the manifest (digests, file sizes, format) there, atomically,
    for verified loads (``manifest=`` of ``load_file``, ``safe_open``, ``weights_iterator``)."""
    out = None if write_manifest is None else os.fspath(write_manifest)
    return _native.hash(os.fspath(path), algo, backend, progress, out)


def verify(path: PathLike, manifest: Optional[PathLike] = None, remote: Optional[RemoteOptions] = None) -> Dict[str, Any]:
    """Check structure and integrity (and digests against ``manifest``); the report as a dict
    (``ok``, ``errors``, ``warnings``, ``findings``, ``summary``). ``path`` may be a URL of a store
    (``tensora._native.schemes()``): structure, and with ``manifest`` object sizes and tensor
    digests from a streamed load; ``remote=`` holds its store settings."""
    m = None if manifest is None else os.fspath(manifest)
    return json.loads(_native.verify_json(os.fspath(path), m, _remote_dict(remote, None)))


def convert(src: PathLike, dst: PathLike, to: str, shard_bytes_max: Optional[int] = None) -> Dict[str, Any]:
    """Convert a checkpoint to ``"safetensors"`` or ``"serverlessllm"`` at ``dst`` (created
    atomically; it must not exist)."""
    return json.loads(_native.convert_json(os.fspath(src), os.fspath(dst), to, shard_bytes_max))


def wait_cache() -> int:
    """Wait until the cache copies of every earlier remote load with
    ``RemoteOptions(cache=..., cache_writes="behind")`` are written, durable and promoted (such a
    load returns its tensors first and finishes its copies behind them: a piece not written yet
    when the tensors can be changed is read back and kept only if the disk holds what arrived,
    so a tensor rewritten before it is written is left out and fetched again next time); the number of loads waited for. Registered with :mod:`atexit`, so a process that
    exits right after a load still leaves its copies complete (one killed first leaves them
    partial, and the next load fetches only what is missing).

    >>> import tensora
    >>> tensora.wait_cache()
    0
    """
    return int(_native.wait_cache_writes())


atexit.register(wait_cache)


def patch() -> None:
    """Route HF ``safetensors`` to Tensora for this process: ``safetensors.safe_open``,
    ``safetensors.torch.*`` and ``safetensors.numpy.*`` (and every name already imported from
    them into other modules, e.g. transformers' ``safe_load_file``) become ``tensora.safetensors``,
    ``tensora.torch`` and ``tensora.numpy``'s. ``unpatch()`` undoes it. Set
    ``TENSORA_PATCH_SAFETENSORS=1`` to do this at interpreter start-up for code you cannot edit
    (see ``docs/dropin.md``)."""
    from . import _patch

    _patch.patch()


def unpatch() -> None:
    """Undo :func:`patch`: every name it replaced is HF's again."""
    from . import _patch

    _patch.unpatch()


def backends() -> List[str]:
    """The registered I/O backend names (plus ``"auto"``)."""
    return list(_native.backends())


if os.environ.get("TENSORA_PATCH_SAFETENSORS") == "1":
    patch()  # as tensora_patch.pth does at start-up, for an interpreter started without it
