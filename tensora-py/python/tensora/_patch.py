"""``tensora.patch()`` / ``tensora.unpatch()``: route HF ``safetensors`` to Tensora for the
process (see ``docs/dropin.md`` for what is and is not routed).

Routing replaces, in each HF module (``safetensors``, ``safetensors.torch``,
``safetensors.numpy``), every name Tensora's counterpart defines, and the same objects wherever
other modules already imported them (``from safetensors.torch import load_file as
safe_load_file`` in transformers). HF modules imported later are routed as they load (an import
hook), so ``patch()`` imports nothing itself. ``unpatch()`` puts every replaced object back and
removes the hook.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading
from typing import Any, Dict, List, Tuple

# HF module -> (Tensora module, the names routed).
ROUTES: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "safetensors": (
        "tensora.safetensors",
        ("safe_open", "_safe_open_handle", "SafetensorError", "TensorSpec", "serialize", "serialize_file",
         "deserialize"),
    ),
    "safetensors.torch": (
        "tensora.torch",
        ("load_file", "load", "save_file", "save", "save_model", "load_model", "safe_open", "storage_ptr",
         "storage_size", "_end_ptr", "_find_shared_tensors", "_filter_shared_not_shared", "_is_complete",
         "_remove_duplicate_names"),
    ),
    "safetensors.numpy": ("tensora.numpy", ("load_file", "load", "save_file", "save", "safe_open")),
}

_lock = threading.RLock()
# Every replacement made: (namespace dict, name, the original object), to undo in reverse.
_replaced: List[Tuple[Dict[str, Any], str, Any]] = []
_hook: "_Hook | None" = None


def _route_module(hf_name: str) -> None:
    """Replace the routed names of the (imported) HF module ``hf_name``, and every other
    module's reference to the originals."""
    hf = sys.modules[hf_name]
    ours_name, names = ROUTES[hf_name]
    ours = importlib.import_module(ours_name)
    originals: Dict[int, Any] = {}
    for name in names:
        if name in vars(hf) and getattr(hf, name) is not getattr(ours, name):
            original = getattr(hf, name)
            originals[id(original)] = getattr(ours, name)
            _replaced.append((vars(hf), name, original))
            setattr(hf, name, getattr(ours, name))
    if not originals:
        return
    for mod in list(sys.modules.values()):
        ns = getattr(mod, "__dict__", None)
        name = getattr(mod, "__name__", "")
        if not isinstance(ns, dict) or mod is hf or name == "tensora" or name.startswith("tensora."):
            continue
        for key, value in list(ns.items()):
            replacement = originals.get(id(value))
            if replacement is not None and ns.get(key) is value:
                _replaced.append((ns, key, value))
                ns[key] = replacement


class _RoutingLoader(importlib.abc.Loader):
    """Runs the real loader, then routes the module it made."""

    def __init__(self, inner: importlib.abc.Loader):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def __getattr__(self, name):
        # The real loader's optional methods (get_source, get_resource_reader, is_package, ...),
        # so inspect, importlib.resources and pkgutil see the routed module as before.
        return getattr(self._inner, name)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        with _lock:
            if _hook is not None:
                _route_module(module.__name__)


class _Hook(importlib.abc.MetaPathFinder):
    """Finds the HF modules with the finders after it, and wraps their loaders."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in ROUTES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RoutingLoader(spec.loader)
                return spec
        return None


def patch() -> None:
    global _hook
    with _lock:
        if _hook is not None:
            return
        _hook = _Hook()
        sys.meta_path.insert(0, _hook)
        for hf_name in ROUTES:
            if hf_name in sys.modules:
                _route_module(hf_name)


def unpatch() -> None:
    global _hook
    with _lock:
        if _hook is None:
            return
        if _hook in sys.meta_path:
            sys.meta_path.remove(_hook)
        _hook = None
        while _replaced:
            ns, key, original = _replaced.pop()
            ns[key] = original


def patched() -> bool:
    """Whether ``patch()`` is in effect."""
    return _hook is not None
