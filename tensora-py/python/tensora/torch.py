"""``safetensors.torch`` 0.8, served by Tensora: the same functions, signatures, defaults,
return types and errors (``load_file(filename, device="cpu", *, backend="mmap")``, ``load``,
``save_file``, ``save``, ``save_model``, ``load_model``, and the shared-tensor helpers
``_find_shared_tensors``, ``_remove_duplicate_names``, ``storage_ptr``, ``storage_size``).

``load_file`` runs Tensora's parallel loader (warm local files: zero-copy views of a private
mapping, as HF's; cold ones: read at the disk's speed into owned memory). ``save_file`` keeps
HF's durability (written beside the destination and renamed: never a torn file after a crash of
the process; not synced) unless ``durability="synced"``.

Tensora's extras are keyword-only: ``load_file(path_or_dir_or_url, select=..., residence=...,
manifest=..., cache=..., remote=..., progress=...)`` also takes sharded directories, indexes and
URLs; ``backend=`` also takes Tensora's I/O backend names (``tensora.backends()``).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import torch

from . import RemoteOptions, _native, _remote_dict
from . import _save
from .safetensors import SafetensorError, check_exists, device_of, in_file_order, safe_open, to_torch

__all__ = ["load_file", "load", "save_file", "save", "save_model", "load_model", "safe_open", "SafetensorError"]

PathLike = Union[str, "os.PathLike[str]"]

# Bytes per element of each torch dtype safetensors stores (HF's table, by name).
_SIZE: Dict[torch.dtype, int] = {
    getattr(torch, name): getattr(torch, name).itemsize
    for name in _save._TORCH_TO_ST
    if getattr(torch, name, None) is not None
}


def _backend(backend: str, residence: Optional[str]) -> Tuple[str, str]:
    """HF's ``backend`` as Tensora's ``(io backend, residence)``: ``"mmap"`` keeps Tensora's
    default (views of a mapping when warm), ``"pread"`` reads into owned memory; Tensora's own
    backend names pass through."""
    if backend == "mmap":
        return "auto", residence or "auto"
    if backend == "pread":
        return "auto", residence or "owned"
    if backend == "auto" or backend in _native.backends():
        return backend, residence or "auto"
    raise SafetensorError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")')


def load_file(
    filename: PathLike,
    device: Union[str, int, "torch.device", None] = "cpu",
    *,
    backend: str = "mmap",
    select: Union[None, str, List[str]] = None,
    residence: Optional[str] = None,
    manifest: Optional[PathLike] = None,
    cache: Optional[PathLike] = None,
    remote: Optional[RemoteOptions] = None,
    progress=None,
) -> Dict[str, torch.Tensor]:
    """``safetensors.torch.load_file``: every tensor of ``filename``, in file order, on
    ``device``. See the module docs for the keyword-only extras; ``residence`` is as in
    ``tensora.load_file``."""
    dev = device_of(device, "pt")
    path = check_exists(filename)
    io_backend, res = _backend(backend, residence)
    m = None if manifest is None else os.fspath(manifest)
    datas, _ = _native.load(path, select, io_backend, progress, res, m, _remote_dict(remote, cache))
    out = in_file_order(path, {name: to_torch(d) for name, d in datas.items()})
    if dev is not None:
        out = {k: v.to(dev) for k, v in out.items()}
    return out


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """``safetensors.torch.load``: the tensors of a safetensors file held in ``data``."""
    return _save.load(data, framework="pt")


def _check_for_save(tensors: Dict[str, torch.Tensor]) -> None:
    """HF's checks before a torch save, with its errors and messages."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
        if v.layout != torch.strided:
            sparse.append(k)
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support."
            " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
            " make a much larger file than needed."
        )
    failing = [names for names in _find_shared_tensors(tensors) if len(names) > 1]
    if failing:
        raise RuntimeError(_save._SHARED.format(failing=failing))
    for k, v in tensors.items():
        if not v.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. It either"
                " means you are trying to save tensors which are reference of each other in which case"
                " it's recommended to save only the full tensors, and reslice at load time, or simply"
                " call `.contiguous()` on your tensor to pack it before saving."
            )


def save_file(
    tensors: Dict[str, torch.Tensor],
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    *,
    durability: str = "process-crash-safe",
) -> None:
    """``safetensors.torch.save_file``: written beside ``filename`` and renamed into place (an
    interrupted save leaves the previous file or nothing). ``durability="synced"`` also syncs
    the file and its directory (survives a power loss); the default, HF's, does not."""
    _check_for_save(tensors)
    _save.save_file(_save.hf_order(tensors), filename, metadata, durability=durability, overlap="allow")


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """``safetensors.torch.save``: the safetensors file of ``tensors`` as ``bytes``."""
    _check_for_save(tensors)
    return _save.save(_save.hf_order(tensors), metadata, overlap="allow")


def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of the tensor's storage (0 for storage without data, e.g. on ``meta``)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor: torch.Tensor) -> int:
    """The size in bytes of the tensor's storage."""
    try:
        return tensor.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.nelement() * _SIZE[tensor.dtype]


def _end_ptr(tensor: torch.Tensor) -> int:
    """One past the last byte of the tensor's last element (its start when it has none)."""
    if tensor.nelement():
        return tensor.view(-1)[-1].data_ptr() + _SIZE[tensor.dtype]
    return tensor.data_ptr()


def _filter_shared_not_shared(tensors: List[Set[str]], state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Split each group of names on one storage into the runs whose byte ranges overlap."""
    out: List[Set[str]] = []
    for group in tensors:
        if len(group) < 2:
            out.append(group)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in group)
        reach = None
        for begin, end, name in spans:
            if reach is None or begin >= reach:
                out.append({name})
            else:
                out[-1].add(name)
            reach = end
    return out


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Groups of names whose tensors share memory (one storage, overlapping bytes), HF's rule;
    tensors without storage (``meta``, empty) are left out."""
    by_storage: Dict[Any, Set[str]] = defaultdict(set)
    for name, t in state_dict.items():
        if t.device != torch.device("meta") and storage_ptr(t) != 0 and storage_size(t) != 0:
            by_storage[(t.device, storage_ptr(t), storage_size(t))].add(name)
    return _filter_shared_not_shared(sorted(by_storage.values()), state_dict)


def _is_complete(tensor: torch.Tensor) -> bool:
    """Whether the tensor covers its whole storage."""
    return tensor.data_ptr() == storage_ptr(tensor) and tensor.nelement() * _SIZE[tensor.dtype] == storage_size(
        tensor
    )


def _remove_duplicate_names(
    state_dict: Dict[str, torch.Tensor],
    *,
    preferred_names: Optional[List[str]] = None,
    discard_names: Optional[List[str]] = None,
) -> Dict[str, List[str]]:
    """For each group of shared tensors, the name kept (one covering the whole storage: the
    first of ``preferred_names``, else of those not in ``discard_names``, else the first) and
    the names dropped. Raises ``RuntimeError`` when no name covers the storage."""
    preferred = set(preferred_names or [])
    discard = set(discard_names or [])
    to_remove: Dict[str, List[str]] = defaultdict(list)
    for group in _find_shared_tensors(state_dict):
        complete = {n for n in group if _is_complete(state_dict[n])}
        if not complete:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no suitable name"
                f" to keep for saving amongst: {group}. None is covering the entire storage.Refusing to"
                " save/load the model since you could be storing much more memory than needed. Please"
                " refer to https://huggingface.co/docs/safetensors/torch_shared_tensors for more"
                " information. Or open an issue."
            )
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        dropped = [n for n in sorted(group) if n != keep]
        if dropped:  # as HF's: a name that shares with nothing gets no key
            to_remove[keep].extend(dropped)
    return to_remove


def save_model(
    model: torch.nn.Module,
    filename: str,
    metadata: Optional[Dict[str, str]] = None,
    force_contiguous: bool = True,
    *,
    durability: str = "process-crash-safe",
) -> None:
    """``safetensors.torch.save_model``: the model's state dict with shared tensors saved once
    (each dropped name recorded in the metadata as ``{dropped: kept}`` unless the caller set it),
    made contiguous unless ``force_contiguous=False``."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata, durability=durability)
    except ValueError as e:
        raise ValueError(
            f"{e} Or use save_model(..., force_contiguous=True), read the docs for potential caveats."
        ) from None


def load_model(
    model: torch.nn.Module,
    filename: PathLike,
    strict: bool = True,
    device: Union[str, int] = "cpu",
    *,
    backend: str = "mmap",
) -> Tuple[List[str], List[str]]:
    """``safetensors.torch.load_model``: load ``filename`` into ``model`` where shared tensors
    were saved once; ``(missing, unexpected)``, or ``RuntimeError`` listing them when
    ``strict``."""
    state_dict = load_file(filename, device=device, backend=backend)
    to_removes = _remove_duplicate_names(model.state_dict(), preferred_names=list(state_dict.keys()))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for dropped in to_removes.values():
        for name in dropped:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected
