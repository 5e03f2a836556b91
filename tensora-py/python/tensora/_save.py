"""Saving: ``save_file``, ``save``, ``save_sharded`` and ``load`` with Hugging Face safetensors'
semantics, for numpy arrays and torch tensors (every dtype, bf16 and fp8 included).

The native writer gets each tensor's memory as an exported buffer (held, so numpy and torch
refuse to resize or free it, until the write is over) with its strides, so a non-contiguous tensor
is written correctly, in row-major order; a tensor on another device is copied to the CPU first,
as HF does, and a conjugate or negative view is resolved. Each piece of the file is gathered from
the tensors into a staging buffer and written from there (buffered, or ``O_DIRECT`` for large
saves), a copy HF's writer makes too. Tensors that share memory are refused with HF's message. The write runs with the
GIL released, in parallel, at the disk's speed, and is atomic: the file appears complete or not at
all (the previous file stays until then).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _native
from ._native import DtypeError, NoSpaceError

PathLike = Union[str, "os.PathLike[str]"]

# numpy dtype -> safetensors dtype.
_NP_TO_ST = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.float16): "F16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.float32): "F32",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.float64): "F64",
    np.dtype(np.complex64): "C64",
}
_ST_TO_NP = {v: k for k, v in _NP_TO_ST.items()}

# torch dtype name -> safetensors dtype (names, so torch is imported only when it is used).
_TORCH_TO_ST = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "bool": "BOOL",
    "complex64": "C64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "float4_e2m1fn_x2": "F4",
}
_ST_TO_TORCH = {v: k for k, v in _TORCH_TO_ST.items()}

# HF's dtype order (its `Dtype` enum): a file lists tensors by this, descending, then by name.
_HF_RANK = {d: i for i, d in enumerate(
    "BOOL F4 F6_E2M3 F6_E3M2 U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ I16 U16 F16 BF16 "
    "I32 U32 F32 C64 F64 I64 U64".split()
)}


def _st_dtype(v: Any) -> Optional[str]:
    if isinstance(v, np.ndarray):
        return _NP_TO_ST.get(np.dtype(v.dtype).newbyteorder("="))
    return _TORCH_TO_ST.get(str(getattr(v, "dtype", "")).split(".")[-1])


def hf_order(tensors: Dict[str, Any]) -> Dict[str, Any]:
    """``tensors`` in the order HF's writer lays them out (dtype descending, then name), so the
    file is byte-identical to HF's whatever the dict's order."""
    return dict(sorted(tensors.items(), key=lambda kv: (-_HF_RANK.get(_st_dtype(kv[1]) or "", -1), kv[0])))


_SHARED = """
            Some tensors share memory, this will lead to duplicate memory on disk and potential differences when loading them again: {failing}.
            A potential way to correctly save your model is to use `save_model`.
            More information at https://huggingface.co/docs/safetensors/torch_shared_tensors
            """


def _torch():
    return sys.modules.get("torch")


def _is_torch(v: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(v, torch.Tensor)


def _extent(shape, strides, itemsize: int) -> Tuple[int, int]:
    """Lowest and one-past-highest byte any element touches, relative to the first element."""
    low = high = 0
    for d, s in zip(shape, strides):
        if d > 1:
            if s < 0:
                low += s * (d - 1)
            else:
                high += s * (d - 1)
    return low, high + itemsize


def _root(a: np.ndarray) -> np.ndarray:
    """The array at the bottom of ``a``'s chain of views (the one owning the memory)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _spec_numpy(name: str, a: np.ndarray, keep: List[Any]):
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        a = a.byteswap().view(a.dtype.newbyteorder("<"))  # HF writes little-endian
        keep.append(a)
    dtype = _NP_TO_ST.get(np.dtype(a.dtype).newbyteorder("="))
    if dtype is None:
        raise DtypeError(f"tensor {name!r}: numpy dtype {a.dtype} has no safetensors equivalent")
    shape = [int(d) for d in a.shape]
    if a.size == 0:
        return (name, dtype, shape, None, None, None)
    if a.flags.c_contiguous:
        return (name, dtype, shape, a.reshape(-1).view(np.uint8), None, None)  # views, 1-D bytes
    root = _root(a)
    if not root.flags.c_contiguous:  # a view of foreign memory not laid out as one block: a copy
        c = np.ascontiguousarray(a)
        keep.append(c)
        return (name, dtype, shape, c, None, None)
    # The root's bytes are handed over (exported: numpy then refuses to resize it), with the
    # view's first element's offset in them.
    start = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    whole = root.reshape(-1).view(np.uint8)
    return (name, dtype, shape, whole, start, [int(s) for s in a.strides])


def _storage_bytes(t):
    """A numpy ``uint8`` view of all of ``t``'s storage. Exporting it makes the storage
    non-resizable (torch refuses ``resize_`` on storage numpy has seen), so it cannot be freed
    under the writer."""
    import torch

    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).numpy()


def _spec_torch(name: str, t, keep: List[Any]):
    if t.device.type != "cpu":
        t = t.to("cpu")  # HF moves tensors to the CPU before saving (torch refuses a meta tensor)
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    keep.append(t)
    dname = str(t.dtype).split(".")[-1]
    dtype = _TORCH_TO_ST.get(dname)
    if dtype is None:
        raise DtypeError(f"tensor {name!r}: torch dtype {dname} has no safetensors equivalent")
    item = t.element_size()
    shape = [int(d) for d in t.shape]
    nbytes = t.numel() * item
    if dtype == "F4":  # two values per byte: the header counts values, as HF writes it
        if not t.is_contiguous():
            raise ValueError(f"tensor {name!r}: a non-contiguous float4_e2m1fn_x2 tensor cannot be saved")
        shape[-1] *= 2
    if nbytes == 0:
        return (name, dtype, shape, None, None, None)
    whole = _storage_bytes(t)
    first = t.storage_offset() * item
    if t.is_contiguous():
        return (name, dtype, shape, whole[first : first + nbytes], None, None)
    strides = [int(s) * item for s in t.stride()]
    low, high = _extent(shape, strides, item)
    return (name, dtype, shape, whole[first + low : first + high], -low, strides)


def _area(v) -> Optional[Tuple[str, int, int]]:
    """The memory ``v``'s elements span, ``(address space, low, high)``, taken before any copy to
    the CPU (as HF does, on the tensor's own device); ``None`` when it has no elements."""
    if isinstance(v, np.ndarray):
        if v.size == 0:
            return None
        low, high = _extent(v.shape, v.strides, v.dtype.itemsize)
        address = v.__array_interface__["data"][0]
        return ("cpu", address + low, address + high)
    if v.layout != _torch().strided or v.numel() == 0 or v.device.type == "meta":
        return None
    item = v.element_size()
    low, high = _extent(v.shape, [s * item for s in v.stride()], item)
    space = "cpu" if v.device.type == "cpu" else str(v.device)
    return (space, v.data_ptr() + low, v.data_ptr() + high)


def _shared(areas: List[Tuple[str, int, int, str]]) -> List[set]:
    """HF's rule: tensors whose memory overlaps share it (one set per group of overlaps)."""
    failing = []
    areas = sorted(areas)
    i = 0
    while i < len(areas):
        space, _, stop, name = areas[i]
        group = {name}
        i += 1
        while i < len(areas) and areas[i][0] == space and areas[i][1] < stop:
            group.add(areas[i][3])
            stop = max(stop, areas[i][2])
            i += 1
        if len(group) > 1:
            failing.append(group)
    return failing


def _flatten(tensors: Dict[str, Any], overlap: str = "refuse") -> Tuple[list, list]:
    """The native specs of ``tensors`` and the objects that must stay alive while they are
    written. Raises as HF's ``save_file`` does for a non-dict, a bad value, sparse tensors and
    (``overlap="refuse"``) tensors that share memory; ``overlap="allow"`` writes each (HF's numpy
    saver does not look)."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    areas, sparse = [], []
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError(f"tensor names must be str, not {type(k).__name__}")
        if not isinstance(v, np.ndarray) and not _is_torch(v):
            raise ValueError(
                f"Key `{k}` is invalid, expected torch.Tensor or numpy.ndarray but received {type(v)}"
            )
        if _is_torch(v) and v.layout != _torch().strided:
            sparse.append(k)
            continue
        area = _area(v)
        if area is not None:
            areas.append((*area, k))
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support."
            " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
            " make a much larger file than needed."
        )
    failing = _shared(areas) if overlap == "refuse" else []
    if failing:
        raise RuntimeError(_SHARED.format(failing=failing))
    keep: List[Any] = []
    specs = []
    for k, v in tensors.items():
        keep.append(v)
        specs.append(_spec_numpy(k, v, keep) if isinstance(v, np.ndarray) else _spec_torch(k, v, keep))
    return specs, keep


def _metadata(metadata: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
    if metadata is None:
        return None
    pairs = metadata.items() if isinstance(metadata, dict) else None
    if pairs is None or not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise ValueError("metadata must be a dict of str to str")
    return metadata


def save_file_with_report(
    tensors: Dict[str, Any],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    progress=None,
    mode: str = "auto",
    threads: int = 0,
    durability: str = "synced",
    overlap: str = "refuse",
) -> Dict[str, Any]:
    """``save_file``, returning the save report: ``mode`` (``"direct"`` or ``"buffered"``) and the
    ``reason`` it was chosen, ``durability``, ``threads``, ``seconds``, ``gbps``,
    ``bytes_written``, ... ``overlap="allow"`` writes tensors that share memory (each in full)."""
    specs, keep = _flatten(tensors, overlap)
    report = _native.save_file(
        specs, os.fspath(filename), _metadata(metadata), progress, mode, threads, durability
    )
    del keep
    return json.loads(report)


def save_file(
    tensors: Dict[str, Any],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    durability: str = "synced",
    overlap: str = "refuse",
) -> None:
    """Save ``tensors`` (numpy arrays or torch tensors) into ``filename`` in safetensors format,
    like ``safetensors.torch.save_file`` / ``safetensors.numpy.save_file``.

    Non-contiguous tensors are written in row-major order (HF refuses them); tensors sharing
    memory are refused with HF's ``RuntimeError``. The file is written beside its destination and
    renamed into place once complete: an interrupted save leaves the previous file (or nothing),
    never a torn one. ``durability``: ``"synced"`` (the default here) also ``fsync``s the file and
    its directory before returning, so the new file survives a power loss right after;
    ``"process-crash-safe"`` (the default of ``tensora.torch`` / ``tensora.numpy``, HF's
    semantics) skips the syncs and writes through the page cache: it survives a crash of the
    process, not of the machine. A full disk raises ``tensora.NoSpaceError`` and leaves nothing
    behind. The GIL is released while writing; Ctrl-C cancels. While the save runs, the arrays'
    memory is exported to the writer: numpy refuses to resize them, and a torch tensor's storage
    becomes non-resizable (torch's rule for storage numpy has seen), which it stays. As with HF's
    savers, no other thread may write to the tensors until the save returns.
    """
    save_file_with_report(tensors, filename, metadata, durability=durability, overlap=overlap)


def save(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]] = None, *, overlap: str = "refuse") -> bytes:
    """The safetensors file of ``tensors`` as ``bytes`` (``safetensors.torch.save``)."""
    specs, keep = _flatten(tensors, overlap)
    data = _native.save_bytes(specs, _metadata(metadata))
    del keep
    return data


def load(data: bytes, framework: str = "np") -> Dict[str, Any]:
    """Tensors of a safetensors file held in ``data`` (``safetensors.numpy.load`` or, with
    ``framework="pt"``, ``safetensors.torch.load``). The arrays share one writable copy of the
    data; the header is validated as strictly as a file's."""
    if framework not in ("np", "numpy", "pt", "torch", "pytorch"):
        raise ValueError(f"framework must be 'np' or 'pt', not {framework!r}")
    entries, _, start = _native.parse_bytes(data)
    buf = bytearray(memoryview(data)[start:])
    out: Dict[str, Any] = {}
    if framework in ("np", "numpy"):
        for name, dtype, shape, a, b in entries:
            dt = _ST_TO_NP.get(dtype)
            if dt is None:
                raise DtypeError(f"tensor {name!r}: numpy has no dtype for {dtype}; use framework=\"pt\"")
            arr = np.frombuffer(buf, dtype=dt, count=(b - a) // dt.itemsize, offset=a - start)
            out[name] = arr.reshape(shape)
        return out
    import torch

    for name, dtype, shape, a, b in entries:
        tdt = getattr(torch, _ST_TO_TORCH.get(dtype, ""), None)
        if tdt is None or dtype == "F4":
            raise DtypeError(f"tensor {name!r}: torch has no dtype for {dtype}")
        if b == a:
            out[name] = torch.empty(shape, dtype=tdt)
            continue
        source, offset = buf, a - start
        if offset % tdt.itemsize:  # a file whose tensors are not aligned: this one gets its own copy
            source, offset = bytearray(buf[offset : offset + b - a]), 0
        t = torch.frombuffer(source, dtype=tdt, count=(b - a) // tdt.itemsize, offset=offset)
        out[name] = t.reshape(shape)
    return out


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _parse_size(size: Union[int, str]) -> int:
    """``huggingface_hub``'s sizes: an int, or ``"5GB"`` (10^9), ``"5GiB"`` (2^30), ``"500MB"``."""
    if isinstance(size, int):
        n = size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*", str(size).upper())
        if m is None:
            raise ValueError(f"cannot parse the size {size!r} (expected e.g. 5GB, 500MiB or a byte count)")
        n = int(float(m.group(1)) * _SIZE_UNITS[m.group(2) or ""])
    if n <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return n


def save_sharded(
    tensors: Dict[str, Any],
    directory: PathLike,
    max_shard_size: Union[int, str] = "5GB",
    metadata: Optional[Dict[str, str]] = None,
    *,
    progress=None,
) -> Dict[str, Any]:
    """Save ``tensors`` as HF-style shards (``model-00001-of-0000N.safetensors``, greedily in
    order, at most ``max_shard_size`` bytes of tensors each, a larger tensor alone) and
    ``model.safetensors.index.json`` into ``directory``; a single shard is ``model.safetensors``
    without an index, as ``huggingface_hub.save_torch_state_dict`` writes them. A new directory
    appears whole or not at all; in an existing one (its other files are kept) the previous
    index goes first and the previous save's stale shards last. Returns the save report."""
    specs, keep = _flatten(tensors)
    cap = _parse_size(max_shard_size)
    report = _native.save_sharded(specs, os.fspath(directory), cap, _metadata(metadata), progress)
    del keep
    return json.loads(report)


__all__ = ["save_file", "save_file_with_report", "save", "load", "save_sharded", "NoSpaceError"]
