"""``tensora.patch()`` / ``unpatch()`` and ``TENSORA_PATCH_SAFETENSORS=1``: HF's names (and the
copies other modules imported) route to Tensora and back; HF modules imported later are routed as
they load."""

import subprocess
import sys
import types

import safetensors
import safetensors.numpy
import safetensors.torch

import tensora
import tensora.numpy
import tensora.safetensors
import tensora.torch
from tensora import _patch

HF = {
    "load_file": safetensors.torch.load_file,
    "safe_open": safetensors.safe_open,
    "np_save_file": safetensors.numpy.save_file,
    "error": safetensors.SafetensorError,
}


def test_patch_routes_hf_names_and_earlier_imports_and_unpatch_restores(tmp_path):
    # A module that imported HF's functions before patch() (as transformers does).
    caller = types.ModuleType("tensora_test_caller")
    caller.safe_load_file = safetensors.torch.load_file
    caller.safe_open = safetensors.safe_open
    sys.modules[caller.__name__] = caller
    try:
        tensora.patch()
        tensora.patch()  # idempotent
        assert _patch.patched()
        assert safetensors.torch.load_file is tensora.torch.load_file
        assert safetensors.numpy.save_file is tensora.numpy.save_file
        assert safetensors.safe_open is tensora.safetensors.safe_open
        assert safetensors.SafetensorError is tensora.SafetensorError
        assert caller.safe_load_file is tensora.torch.load_file
        assert caller.safe_open is tensora.safetensors.safe_open
        # The routed functions work, and HF's own saver still reads what they write.
        import torch

        safetensors.torch.save_file({"w": torch.arange(6.0)}, tmp_path / "w.safetensors")
        assert torch.equal(caller.safe_load_file(tmp_path / "w.safetensors")["w"], torch.arange(6.0))
        tensora.unpatch()
        assert not _patch.patched()
        assert safetensors.torch.load_file is HF["load_file"]
        assert safetensors.numpy.save_file is HF["np_save_file"]
        assert safetensors.safe_open is HF["safe_open"]
        assert safetensors.SafetensorError is HF["error"]
        assert caller.safe_load_file is HF["load_file"]
        assert caller.safe_open is HF["safe_open"]
    finally:
        tensora.unpatch()
        del sys.modules[caller.__name__]


def _run(code: str, **env) -> str:
    import os

    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_hf_modules_imported_after_patch_are_routed_as_they_load():
    code = (
        "import sys, tensora; tensora.patch(); assert 'safetensors.torch' not in sys.modules;"
        "import safetensors.torch, tensora.torch;"
        "print(safetensors.torch.load_file is tensora.torch.load_file)"
    )
    assert _run(code) == "True"


def test_the_environment_variable_patches_at_import():
    code = (
        "import safetensors.torch, tensora, tensora.torch;"
        "print(safetensors.torch.load_file is tensora.torch.load_file)"
    )
    assert _run(code, TENSORA_PATCH_SAFETENSORS="1") == "True"
    assert _run(code, TENSORA_PATCH_SAFETENSORS="0") == "False"


def test_the_pth_file_patches_code_that_never_imports_tensora():
    """The wheel's ``tensora_patch.pth`` runs at start-up: with the variable set, a program that
    only imports ``safetensors`` gets Tensora's functions; without it nothing of Tensora loads."""
    code = (
        "import sys, safetensors.torch;"
        "print(safetensors.torch.load_file.__module__, 'tensora' in sys.modules)"
    )
    assert _run(code, TENSORA_PATCH_SAFETENSORS="1") == "tensora.torch True"
    assert _run(code, TENSORA_PATCH_SAFETENSORS="") == "safetensors.torch False"
