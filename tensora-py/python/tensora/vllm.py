"""The vLLM load format ``tensora``: ``vllm serve MODEL --load-format tensora``.

Registered by the ``vllm.general_plugins`` entry point of this package (``register``), so an
install of tensora beside vLLM is all it takes; nothing happens unless a model is loaded with
``load_format="tensora"``. The loader is vLLM's own ``DefaultModelLoader`` with the weights read
by tensora: vLLM still finds the files (its index filter, its shard filters), copies every tensor
into the model through ``model.load_weights``, loads the model's secondary weights, checks that
every parameter was loaded, and logs ``Loading weights took``. Tensora adds its placement
(``residence``), its backends, remote URLs with the verified cache, and ``manifest=`` verification:
a tensor whose digest differs stops the engine's start with ``tensora.VerifyError`` naming the
tensor, its file and offset, before it reaches the model.

Every option is a key of ``model_loader_extra_config`` (see ``OPTIONS`` and docs/vllm.md)::

    vllm serve /models/llama --load-format tensora \\
        --model-loader-extra-config '{"manifest": "/models/llama/tensora.manifest.json"}'

vLLM's private API used here (checked on the tested range, ``VLLM_TESTED``):
``DefaultModelLoader._prepare_weights`` (the files of a source), ``DefaultModelLoader.Source``,
``DefaultModelLoader.counter_before_loading_weights`` (the start of the logged time) and the
override of ``DefaultModelLoader.get_all_weights`` and ``download_model``. Another vLLM version
is refused with an error naming the range, unless ``allow_untested_vllm`` is true.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Iterator, Optional, Tuple

from . import _native

# The vLLM versions this loader was tested on: [first, last_excluded).
VLLM_TESTED = ("0.32.0", "0.33")
# The weights iterator's budget when none is given (the most it holds is about 1.33 x this).
BUDGET_DEFAULT_BYTES = 1 << 30

# Each key of model_loader_extra_config: its type and what it does.
OPTIONS: Dict[str, Tuple[type, str]] = {
    "weights": (str, "where the weights are, when not in the model directory: a URL of any store "
                     "tensora._native.schemes() lists, or a local path"),
    "residence": (str, '"auto" (default), "owned" or "mapped" (tensora.load_file)'),
    "backend": (str, 'the I/O backend ("auto" by default; tensora.backends())'),
    "budget_bytes": (int, "the local weights iterator's memory budget (1 GiB by default)"),
    "manifest": (str, "a manifest (tensora hash --write-manifest): a verified load"),
    "cache": (str, "a directory: the verified local cache of a remote location"),
    "allow_untested_vllm": (bool, f"load on a vLLM outside {VLLM_TESTED[0]} .. <{VLLM_TESTED[1]}"),
}
# The RemoteOptions fields, keys too (how to reach the store of a URL in "weights").
_REMOTE_KEYS = {
    "endpoint": str, "allow_http": bool, "anonymous": bool, "region": str,
    "allow_unversioned": bool, "open_timeout": (int, float), "cache_max": int, "offline": bool,
    "cache_writes": str,
}
# Every store's URL prefixes, from the one table of stores (``tensora._native.schemes()``).
_URL_SCHEMES = tuple(f"{s}://" for store in _native.schemes() for s in store["schemes"])


class UntestedVllmError(RuntimeError):
    """vLLM's version is outside ``VLLM_TESTED`` and ``allow_untested_vllm`` is not set."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """``model_loader_extra_config``, checked."""

    weights: Optional[str] = None
    residence: str = "auto"
    backend: str = "auto"
    budget_bytes: int = BUDGET_DEFAULT_BYTES
    manifest: Optional[str] = None
    cache: Optional[str] = None
    allow_untested_vllm: bool = False
    remote: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def load_kwargs(self) -> Dict[str, Any]:
        """The arguments every tensora load of the loader takes."""
        return {"framework": "pt", "backend": self.backend, "residence": self.residence, "manifest": self.manifest}

    @property
    def is_remote(self) -> bool:
        return self.weights is not None and self.weights.startswith(_URL_SCHEMES)


def settings(extra: Any) -> Settings:
    """Check ``model_loader_extra_config``: every key known and of its type (``ValueError``
    naming the key and the known ones otherwise)."""
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise ValueError(f"model_loader_extra_config must be a dict, not {type(extra).__name__}")
    kinds = {k: t for k, (t, _) in OPTIONS.items()}
    kinds.update(_REMOTE_KEYS)
    unknown = sorted(set(extra) - set(kinds))
    if unknown:
        raise ValueError(
            f"load format tensora: unknown model_loader_extra_config keys {unknown}; "
            f"known: {sorted(kinds)}"
        )
    for key, value in extra.items():
        kind = kinds[key]
        # bool is an int in Python: an int option refuses it.
        bad_bool = isinstance(value, bool) and kind is not bool
        if value is not None and (bad_bool or not isinstance(value, kind)):
            raise ValueError(f"load format tensora: {key} must be {_kind_name(kind)}, not {value!r}")
    remote = {k: v for k, v in extra.items() if k in _REMOTE_KEYS}
    own = {k: v for k, v in extra.items() if k in OPTIONS and v is not None}
    s = Settings(remote=remote, **own)
    if s.residence not in ("auto", "owned", "mapped"):
        raise ValueError(f"load format tensora: residence must be auto, owned or mapped, not {s.residence!r}")
    if s.budget_bytes <= 0:
        raise ValueError(f"load format tensora: budget_bytes must be positive, not {s.budget_bytes}")
    if (remote or s.cache is not None) and not s.is_remote:
        raise ValueError(
            "load format tensora: cache and the store options "
            f"({sorted(remote) or 'cache'}) apply to a URL in \"weights\" only"
        )
    return s


def _kind_name(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def check_vllm_version(version: str, allow_untested: bool) -> None:
    """Refuse a vLLM outside ``VLLM_TESTED`` (``UntestedVllmError``) unless allowed."""
    from packaging.version import Version

    first, end = (Version(v) for v in VLLM_TESTED)
    # A local or dev suffix (0.32.0+cpu) is the release it builds on.
    if allow_untested or first <= Version(Version(version).base_version) < end:
        return
    raise UntestedVllmError(
        f"load format tensora was tested on vLLM {VLLM_TESTED[0]} up to (not including) "
        f"{VLLM_TESTED[1]}; this is vLLM {version}. It uses private parts of vLLM's "
        "DefaultModelLoader (tensora/vllm.py names them) that may have changed. Set "
        "model_loader_extra_config {\"allow_untested_vllm\": true} to try it anyway."
    )


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register the load format ``tensora``.

    Never refuses here (vLLM runs every installed plugin, whatever the load format): the version
    check is the loader's, when a model is loaded with ``load_format="tensora"``."""
    from vllm.model_executor.model_loader import register_model_loader

    register_model_loader("tensora")(_loader_class())


_LOADER = None


def _loader_class():
    """The loader class, built once (it subclasses vLLM's, which is imported only here)."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import vllm
    from vllm.model_executor.model_loader import DefaultModelLoader

    class TensoraModelLoader(DefaultModelLoader):
        """vLLM's default loader with the weights read by tensora (see the module's docs)."""

        def __init__(self, load_config):
            self.tensora = settings(load_config.model_loader_extra_config)
            check_vllm_version(vllm.__version__, self.tensora.allow_untested_vllm)
            # vLLM's own code paths see a safetensors load without extra keys (its loader refuses
            # keys it does not know); the tensora settings are kept above.
            inner = dataclasses.replace(load_config, load_format="safetensors", model_loader_extra_config={})
            super().__init__(inner)

        def download_model(self, model_config) -> None:
            if not self.tensora.is_remote:
                super().download_model(model_config)

        def get_all_weights(self, model_config, model):
            primary = DefaultModelLoader.Source(
                model_config.model,
                model_config.revision,
                prefix="",
                fall_back_to_pt=False,
                allow_patterns_overrides=getattr(model, "allow_patterns_overrides", None),
                is_unused_weight=getattr(model, "is_unused_checkpoint_weight", None),
            )
            yield from self._tensora_weights(primary, self.tensora.weights, self.tensora)
            # A model's secondary weights (their own files, local) are not in the primary
            # checkpoint's manifest: loaded as vLLM's default loader loads them, unverified.
            secondary = dataclasses.replace(self.tensora, weights=None, manifest=None)
            for source in getattr(model, "secondary_weights", ()):
                yield from self._tensora_weights(source, None, secondary)

        def _tensora_weights(self, source, location: Optional[str], s: Settings) -> Iterator[Tuple[str, Any]]:
            if location is not None and s.is_remote:
                tensors = _remote_weights(location, s)
            else:
                tensors = _local_weights(self._local_files(source, location), s)
            # Where vLLM's loader starts its clock: the files found, nothing read yet (both
            # iterators start reading at their first item).
            if self.counter_before_loading_weights == 0.0:
                self.counter_before_loading_weights = time.perf_counter()
            for name, tensor in tensors:
                yield source.prefix + name, tensor

        def _local_files(self, source, location: Optional[str]):
            from vllm.model_executor.model_loader.weight_utils import filter_safetensors_files_by_weight_name

            _, files, _, _ = self._prepare_weights(
                location or source.model_or_path,
                source.subfolder,
                source.revision,
                False,
                source.allow_patterns_overrides,
            )
            if source.is_unused_weight is not None:
                files = filter_safetensors_files_by_weight_name(files, source.is_unused_weight)
            return sorted(files)

    _LOADER = TensoraModelLoader
    return _LOADER


def _local_weights(files, s: Settings) -> Iterator[Tuple[str, Any]]:
    """The local files through ``tensora.weights_iterator`` (bounded memory, verified with a
    manifest)."""
    import tensora

    return tensora.weights_iterator(files, budget=s.budget_bytes, **s.load_kwargs())


def _remote_weights(url: str, s: Settings) -> Iterator[Tuple[str, Any]]:
    """A URL's checkpoint through ``tensora.load_file`` (ranged GETs into owned memory, the
    verified cache with ``cache``): held whole until the last tensor is copied into the model."""
    import tensora

    remote = tensora.RemoteOptions(**s.remote) if s.remote else None
    tensors = tensora.load_file(url, cache=s.cache, remote=remote, **s.load_kwargs())
    while tensors:
        # Handed out and dropped one by one, file order.
        name = next(iter(tensors))
        yield name, tensors.pop(name)


__all__ = ["register", "settings", "Settings", "OPTIONS", "VLLM_TESTED", "UntestedVllmError", "check_vllm_version"]
