"""``safetensors.numpy`` 0.8, served by Tensora: ``load_file(filename, *, backend="mmap")``,
``load``, ``save_file``, ``save`` with HF's signatures, defaults, return types and errors.

``load_file`` returns owned arrays (HF's numpy ``load_file`` copies too), read by Tensora's
parallel loader. ``save_file`` keeps HF's durability (renamed into place, not synced) unless
``durability="synced"``. Tensora's extras are keyword-only: ``select=``, ``manifest=``,
``cache=``, ``remote=``, ``progress=`` and sharded directories, indexes and URLs as
``filename``.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Union

import numpy as np

from . import RemoteOptions, _native, _remote_dict, _to_numpy
from . import _save
from .safetensors import SafetensorError, check_exists, in_file_order, safe_open

__all__ = ["load_file", "load", "save_file", "save", "safe_open", "SafetensorError"]

PathLike = Union[str, "os.PathLike[str]"]


def _check_for_save(tensor_dict: Dict[str, np.ndarray]) -> None:
    if not isinstance(tensor_dict, dict):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received {type(tensor_dict)}")
    for k, v in tensor_dict.items():
        if not isinstance(v, np.ndarray):
            raise ValueError(f"Key `{k}` is invalid, expected np.ndarray but received {type(v)}")


def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """``safetensors.numpy.save``: the safetensors file of ``tensor_dict`` as ``bytes``."""
    _check_for_save(tensor_dict)
    return _save.save(_save.hf_order(tensor_dict), metadata, overlap="allow")


def save_file(
    tensor_dict: Dict[str, np.ndarray],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    durability: str = "process-crash-safe",
) -> None:
    """``safetensors.numpy.save_file`` (renamed into place; ``durability="synced"`` also syncs
    the file and its directory)."""
    _check_for_save(tensor_dict)
    _save.save_file(_save.hf_order(tensor_dict), filename, metadata, durability=durability, overlap="allow")


def load(data: bytes) -> Dict[str, np.ndarray]:
    """``safetensors.numpy.load``: the arrays of a safetensors file held in ``data``."""
    return _save.load(data, framework="np")


def load_file(
    filename: PathLike,
    *,
    backend: str = "mmap",
    select: Union[None, str, List[str]] = None,
    manifest: Optional[PathLike] = None,
    cache: Optional[PathLike] = None,
    remote: Optional[RemoteOptions] = None,
    progress=None,
) -> Dict[str, np.ndarray]:
    """``safetensors.numpy.load_file``: every array of ``filename``, owned, in file order.
    ``backend``: ``"mmap"`` or ``"pread"`` (both read into owned arrays here) or one of
    ``tensora.backends()``."""
    if backend in ("mmap", "pread"):
        io_backend = "auto"
    elif backend == "auto" or backend in _native.backends():
        io_backend = backend
    else:
        raise SafetensorError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")')
    path = check_exists(filename)
    m = None if manifest is None else os.fspath(manifest)
    datas, _ = _native.load(path, select, io_backend, progress, "owned", m, _remote_dict(remote, cache))
    return in_file_order(path, {name: _to_numpy(d) for name, d in datas.items()})
