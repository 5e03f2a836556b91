"""The top level of HF ``safetensors`` 0.8 (``from safetensors import safe_open, SafetensorError,
serialize, ...``) served by Tensora: :class:`safe_open` with HF's signature and semantics
(``device`` positional, ``backend="mmap"`` or ``"pread"``), :class:`TensorSpec`,
:func:`serialize`, :func:`serialize_file`, :func:`deserialize` and :class:`SafetensorError`, the
base class of every Tensora error. ``tensora.torch`` and ``tensora.numpy`` build on it;
``tensora.patch()`` routes ``safetensors`` here (see ``docs/dropin.md``).

Tensora's extras are keyword-only: ``safe_open(..., manifest=PATH)`` checks every tensor against
a manifest.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import struct
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _Slice, _native, _to_numpy
from . import safe_open as _tensora_safe_open
from ._native import SafetensorError
from ._save import _ST_TO_TORCH, _metadata

__all__ = [
    "SafetensorError",
    "TensorSpec",
    "safe_open",
    "serialize",
    "serialize_file",
    "deserialize",
    "_safe_open_handle",
]

PathLike = Union[str, "os.PathLike[str]"]

# HF's framework names; tensora serves numpy and torch.
_PT = ("pt", "torch", "pytorch")
_NP = ("np", "numpy")
_OTHER = ("tf", "tensorflow", "jax", "flax", "mlx", "paddle")

# HF's device names (a bare name is index 0; "mps" has only index 0).
_DEVICE_TYPES = ("cpu", "cuda", "musa", "mps", "npu", "xpu", "xla", "mlu", "hpu")

# HF's ``TensorSpec`` dtype names -> safetensors dtype.
_SPEC_DTYPES = {
    "bool": "BOOL", "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16",
    "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16",
    "float32": "F32", "float64": "F64", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2": "F8_E5M2", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4", "complex64": "C64",
}


def framework_of(framework: Any) -> str:
    """``"pt"`` or ``"np"`` for HF's framework names; HF's error for others."""
    if framework in _PT:
        return "pt"
    if framework in _NP:
        return "np"
    if framework in _OTHER:
        raise SafetensorError(f"framework {framework} is not supported by tensora (numpy and torch are)")
    raise SafetensorError(f"framework {framework} is invalid")


def device_of(device: Any, fw: str):
    """The ``torch.device`` tensors go to, or ``None`` for the CPU. HF's forms: ``None``,
    ``"cpu"``, ``"cuda"``, ``"cuda:1"`` (and the other accelerators' names), an int (an index of
    the default accelerator, as torch reads it), or a ``torch.device``. A device that is not
    present fails where torch fails: when a tensor is moved there."""
    if device is None or (isinstance(device, str) and device == "cpu"):
        return None
    if isinstance(device, bool):
        raise SafetensorError(f"device {device!r} is invalid")
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind not in _DEVICE_TYPES or (index and not index.isdigit()):
            raise SafetensorError(f"device {device} is invalid")
        if kind == "mps" and index not in ("", "0"):
            raise SafetensorError(f"device {device} is invalid: only mps or mps:0 is supported")
    elif not isinstance(device, int) and type(device).__name__ != "device":
        raise SafetensorError(f"device {device!r} is invalid")
    if fw != "pt":
        raise SafetensorError(f"Device {device} is not supported for framework numpy")
    import torch

    d = torch.device(device)
    return None if d.type == "cpu" else d


def _torch_dtype(st: str):
    import torch

    return getattr(torch, _ST_TO_TORCH.get(st, ""), None)


def to_torch(data: "_native.TensorData"):
    """A torch tensor of the native buffer, zero copy; F4 (no DLPack code) through its bytes."""
    import torch

    if data.dtype != "F4":
        return torch.from_dlpack(data)
    dt = _torch_dtype("F4")
    if dt is None:
        raise SafetensorError(f"tensor {data.name!r}: this torch has no float4_e2m1fn_x2")
    shape = list(data.shape)
    if shape:
        shape[-1] //= 2  # the header counts values; torch's elements hold two
    if len(memoryview(data)) == 0:
        return torch.empty(shape, dtype=dt)
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8)).view(dt).reshape(shape)


def convert(data: "_native.TensorData", fw: str, device=None):
    """The framework's tensor of a native buffer (numpy array or torch tensor on ``device``)."""
    if fw == "np":
        return _to_numpy(data)
    t = to_torch(data)
    return t if device is None else t.to(device)


def header_metadata(path: PathLike) -> Optional[Dict[str, str]]:
    """The ``__metadata__`` of one safetensors file as stored (``{}`` when present and empty,
    ``None`` when absent), read from its header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    m = header.get("__metadata__")
    return None if m is None else dict(m)


def in_file_order(path: str, tensors: Dict[str, Any]) -> Dict[str, Any]:
    """``tensors`` in the order of their bytes in the checkpoint at ``path`` (HF's ``load_file``
    order); a URL's keep the loader's order."""
    if "://" in path:
        return tensors
    return {k: tensors[k] for k in _native.Mapped(path).offset_keys() if k in tensors}


def check_exists(filename: PathLike) -> str:
    """``filename`` as a string; HF's ``FileNotFoundError`` when it is not there."""
    path = os.fspath(filename)
    if "://" not in path and not os.path.exists(path):
        raise FileNotFoundError(f"No such file or directory: {path}")
    return path


class safe_open(_tensora_safe_open):
    """``safetensors.safe_open(filename, framework, device="cpu", *, backend="mmap")``.

    ``backend="mmap"`` (HF's default) hands out zero-copy views of a private copy-on-write
    mapping of the file, pages read in before returning; ``"pread"`` reads each tensor into
    memory of its own. With ``"mmap"``, a cold local file whose pages fit in the page cache
    (``tensora.load_file``'s rule) is read into it by a thread of its own from open, so the
    caller's reads (``get_slice`` views paged in as used) find the pages cached or in flight. ``get_tensor`` on a non-CPU ``device`` loads on the CPU and moves the
    tensor there (torch's error where the device is absent). ``manifest=`` (keyword, Tensora's
    extra) checks every tensor against a manifest (``tensora.VerifyError`` otherwise). The rest
    (``keys``, ``offset_keys``, closing) is ``tensora.safe_open``'s.
    """

    def __init__(
        self,
        filename: PathLike,
        framework: str,
        device: Any = "cpu",
        *,
        backend: str = "mmap",
        manifest: Optional[PathLike] = None,
    ):
        self._fw = framework_of(framework)
        self._device = device_of(device, self._fw)
        if backend not in ("mmap", "pread"):
            raise SafetensorError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")')
        self._path = check_exists(filename)
        self._backend = backend
        m = None if manifest is None else os.fspath(manifest)
        # HF's callers (transformers, diffusers) read every tensor: a cold file that fits in the
        # page cache is read into it from open, ahead of their page faults (auto's rule).
        self._mapped = _native.Mapped(self._path, m, backend, read_ahead=True)

    def metadata(self) -> Optional[Dict[str, str]]:
        m = self._m().metadata()
        if m is None and os.path.isfile(self._path):
            return header_metadata(self._path)  # HF: {} when stored empty, None when absent
        return m

    def get_tensor(self, name: str):
        return convert(self._m().tensor(name), self._fw, self._device)

    def get_tensors(self) -> Dict[str, Any]:
        return {k: self.get_tensor(k) for k in self.offset_keys()}

    def get_slice(self, name: str) -> "_DeviceSlice":
        # torch over the mapping (HF's "mmap"): the part indexed is a view of the file's private
        # mapping, paged in as it is used, as HF's (transformers indexes every tensor with
        # `[...]` while loading); otherwise a copy of the part.
        how = "view" if self._fw == "pt" and self._backend == "mmap" else "copy"
        return _DeviceSlice(super().get_slice(name), self._device, how)


def _index_text(item) -> str:
    if isinstance(item, int):
        return str(item)
    start, stop, step = item
    text = f"{'' if start is None else start}:{'' if stop is None else stop}"
    return text if step == 1 else f"{text}:{step}"


def hf_index(index, shape: List[int]) -> Tuple:
    """``index`` checked as HF's ``get_slice`` checks it (ints, positive-step slices, one
    ``...``, an empty list; bounds checked, never clipped), with HF's messages; the equivalent
    numpy/torch index."""
    if isinstance(index, list):
        if index:
            raise SafetensorError("Non empty lists are not implemented")
        index = (slice(0, 0),)
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(it is Ellipsis for it in items) > 1:
        raise SafetensorError("Only one ellipsis (...) is allowed in slice index")
    expand = max(len(shape) - (len(items) - (Ellipsis in items)), 0)
    parsed: List[Any] = []  # int, or (start, stop, step) with None for an open end
    for it in items:
        dim = len(parsed)
        if it is Ellipsis:
            parsed.extend([(None, None, 1)] * expand)
        elif isinstance(it, slice):
            step = 1 if it.step is None else int(it.step)
            if step <= 0:
                raise SafetensorError(f"Slice step must be a positive integer, got {step}")
            for end in (it.start, it.stop):
                if end is not None and int(end) < 0:
                    raise OverflowError("can't convert negative int to unsigned")
            parsed.append((it.start, it.stop, step))
        elif isinstance(it, (int, np.integer)) and not isinstance(it, bool):
            size = shape[dim] if dim < len(shape) else 0
            i = int(it)
            if i < 0:
                if size + i < 0:
                    raise SafetensorError(f"Invalid index {i} for dimension {dim} of size {size}")
                i += size
            parsed.append(i)
        else:
            raise SafetensorError(
                f"Unsupported slice index at position {dim}: expected slice, int, or ellipsis"
            )
    shown = "[" + ", ".join(_index_text(p) for p in parsed) + "]"
    if len(parsed) > len(shape):
        raise SafetensorError(
            f"Error during slicing {shown} with shape {shape}: more slicing indexes than dimensions in tensor"
        )
    for dim in reversed(range(len(parsed))):
        p, size = parsed[dim], shape[dim]
        start, stop = (p, p + 1) if isinstance(p, int) else (p[0] or 0, size if p[1] is None else p[1])
        if start >= size or stop > size:
            asked = start if start >= size else max(stop - 1, 0)
            raise SafetensorError(
                f"Error during slicing {shown} with shape {shape}: index {asked} out of bounds for tensor"
                f" dimension #{dim} of size {size}"
            )
    return tuple(p if isinstance(p, int) else slice(*p) for p in parsed)


def _whole(index: Tuple, shape: List[int]) -> bool:
    """Whether ``index`` (from ``hf_index``) selects every element of a tensor of ``shape``, in
    order and with its shape kept (``[...]``, ``[:]``, ``[:, :]``)."""
    return len(index) <= len(shape) and all(
        isinstance(i, slice) and i.step == 1 and (i.start or 0) == 0 and i.stop in (None, size)
        for i, size in zip(index, shape)
    )


class _DeviceSlice:
    """HF's slice object: ``get_shape()``, ``get_dtype()``, ``[index]`` (the index checked as HF
    checks it; on the device; a view of the file's private mapping, or a copy)."""

    def __init__(self, inner: _Slice, device, how: str):
        self._inner = inner
        self._device = device
        self._how = how  # "view" or "copy"

    def get_shape(self) -> List[int]:
        return self._inner.get_shape()

    def get_dtype(self) -> str:
        return self._inner.get_dtype()

    def __getitem__(self, index):
        shape = self.get_shape()
        index = hf_index(index, shape)
        if self._how == "view" and _whole(index, shape):
            # The whole tensor (transformers' `[...]`): its pages read in now, with read-ahead,
            # on the caller's thread (transformers' loading threads), as HF's slice reads them;
            # left to the caller's first touch they would be faulted in one by one.
            part = convert(self._inner._mapped.tensor(self._inner._name), "pt")
        elif self._how == "view":
            part = convert(self._inner._mapped.tensor_lazy(self._inner._name), "pt")[index]
        else:
            part = self._inner[index]
        return part if self._device is None else part.to(self._device)


class _BytesOpen:
    """``safe_open`` over a safetensors file held in memory (``_safe_open_handle`` of a handle
    that has no file descriptor)."""

    def __init__(self, data: bytes, fw: str, device):
        from ._save import load

        entries, meta, _ = _native.parse_bytes(data)
        self._names = [e[0] for e in entries]  # file order
        self._tensors = load(data, fw)
        self._meta = meta or None
        self._device = device

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._tensors = None

    def keys(self) -> List[str]:
        return sorted(self._names)

    def offset_keys(self) -> List[str]:
        return list(self._names)

    def metadata(self) -> Optional[Dict[str, str]]:
        return self._meta

    def get_tensor(self, name: str):
        if self._tensors is None:
            raise SafetensorError("File is closed")
        if name not in self._tensors:
            raise SafetensorError(f"File does not contain tensor {name}")
        t = self._tensors[name].copy() if isinstance(self._tensors[name], np.ndarray) else self._tensors[name].clone()
        return t if self._device is None else t.to(self._device)

    def get_tensors(self) -> Dict[str, Any]:
        return {k: self.get_tensor(k) for k in self._names}


def _safe_open_handle(f: Any, framework: str, device: Any = "cpu"):
    """HF's ``_safe_open_handle``: ``safe_open`` over an open file object. A handle with a file
    descriptor is opened through it (``/proc/self/fd``); any other is read whole."""
    fw = framework_of(framework)
    try:
        fd = f.fileno()
    except (AttributeError, io.UnsupportedOperation, OSError):
        fd = None
    if fd is not None and os.path.exists(f"/proc/self/fd/{fd}"):
        return safe_open(f"/proc/self/fd/{fd}", framework, device)
    f.seek(0)
    return _BytesOpen(bytes(f.read()), fw, device_of(device, fw))


class TensorSpec:
    """HF's raw tensor description for :func:`serialize`: ``dtype`` (a framework dtype name such
    as ``"float32"`` or ``"bfloat16"``), ``shape``, and ``data_ptr`` / ``data_len``, the address
    and length of its bytes, which the caller keeps alive while serializing (HF's contract). The
    bytes are read through a ``ctypes`` buffer of exactly that extent."""

    def __init__(self, *, dtype: str, shape, data_ptr: int, data_len: int):
        st = _SPEC_DTYPES.get(dtype)
        if st is None:
            raise SafetensorError(f"Unknown dtype {dtype!r}. Supported dtypes: {', '.join(_SPEC_DTYPES)}")
        shape = [int(d) for d in shape]
        if st == "F4" and shape:
            shape[-1] *= 2  # HF: the header counts F4 values, two per byte
        self._st = st
        self._shape = shape
        self._ptr = int(data_ptr)
        self._len = int(data_len)

    @property
    def dtype(self) -> str:
        return self._st

    @property
    def shape(self) -> List[int]:
        return list(self._shape)

    @property
    def data_ptr(self) -> int:
        return self._ptr

    @property
    def data_len(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"TensorSpec(dtype={self._st!r}, shape={self._shape}, data_ptr={self._ptr}, data_len={self._len})"

    def _spec(self, name: str) -> Tuple:
        if self._len == 0:
            return (name, self._st, self._shape, None, None, None)
        raw = (ctypes.c_ubyte * self._len).from_address(self._ptr)
        return (name, self._st, self._shape, np.frombuffer(raw, dtype=np.uint8), None, None)


def _specs(tensor_dict: Dict[str, TensorSpec]) -> List[Tuple]:
    out = []
    for k, v in tensor_dict.items():
        if not isinstance(v, TensorSpec):
            raise TypeError(f"'{type(v).__name__}' object cannot be converted to 'TensorSpec'")
        out.append(v._spec(k))
    return out


def _spec_error(e: Exception) -> SafetensorError:
    return e if isinstance(e, SafetensorError) else SafetensorError(f"Error while serializing: {e}")


def serialize(tensor_dict: Dict[str, TensorSpec], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """HF's ``serialize``: the safetensors file of ``tensor_dict`` as ``bytes``."""
    try:
        return _native.save_bytes(_specs(tensor_dict), _metadata(metadata))
    except ValueError as e:
        raise _spec_error(e) from None


def serialize_file(
    tensor_dict: Dict[str, TensorSpec],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    durability: str = "process-crash-safe",
) -> None:
    """HF's ``serialize_file`` (written and renamed, not synced, unless
    ``durability="synced"``). The GIL is released while writing."""
    try:
        _native.save_file(
            _specs(tensor_dict), os.fspath(filename), _metadata(metadata), None, "auto", 0, durability
        )
    except ValueError as e:
        raise _spec_error(e) from None


def deserialize(data: bytes) -> List[Tuple[str, Dict[str, Any]]]:
    """HF's ``deserialize``: ``[(name, {"shape", "dtype", "data"})]`` with each tensor's bytes as
    a ``bytearray``, in file order."""
    entries, _, _ = _native.parse_bytes(data)
    view = memoryview(data)
    return [
        (name, {"shape": list(shape), "dtype": dtype, "data": bytearray(view[a:b])})
        for name, dtype, shape, a, b in entries
    ]
