"""Imported at interpreter start-up by ``tensora_patch.pth`` when ``TENSORA_PATCH_SAFETENSORS=1``:
routes HF ``safetensors`` to Tensora for the process (``tensora.patch()``), for code that cannot
be edited. Nothing else is imported until ``safetensors`` is."""

from . import _patch

_patch.patch()
