"""The DLPack export, consumed by numpy (torch is covered in test_torch.py when installed)."""

import numpy as np
import pytest
from safetensors.numpy import load_file as hf_load_file

import tensora
from tensora import _native
from conftest import SLLM_TINY, collect


def test_numpy_from_dlpack_is_zero_copy_and_exact(every_dtype_file):
    want = hf_load_file(str(every_dtype_file))
    datas, _ = _native.load(str(every_dtype_file), None, "auto", None)
    for name, data in datas.items():
        if data.dtype == "C64" and not hasattr(np, "complex64"):
            continue
        arr = np.from_dlpack(data)
        assert arr.dtype == want[name].dtype and arr.shape == want[name].shape, name
        assert arr.tobytes() == want[name].tobytes(), name
        if arr.size:
            assert arr.__array_interface__["data"][0] == np.frombuffer(data, dtype=np.uint8).__array_interface__["data"][0]
    assert datas["uint8.0"].__dlpack_device__() == (1, 0)


def test_dlpack_keeps_the_owner_alive_and_frees_it(every_dtype_file):
    collect()
    base = _native.owners_live()
    data = _native.load(str(every_dtype_file), ["float64.1"], "auto", None)[0]["float64.1"]
    arr = np.from_dlpack(data)
    del data
    collect()
    assert _native.owners_live() == base + 1
    del arr
    collect()
    assert _native.owners_live() == base


def test_an_unconsumed_capsule_frees_on_drop(every_dtype_file):
    collect()
    base = _native.owners_live()
    data = _native.load(str(every_dtype_file), ["int16.0"], "auto", None)[0]["int16.0"]
    capsule = data.__dlpack__()
    del data
    collect()
    assert _native.owners_live() == base + 1, "the capsule holds the memory"
    del capsule
    collect()
    assert _native.owners_live() == base


def test_bf16_exports_but_numpy_refuses_it():
    data = _native.load(str(SLLM_TINY), ["embed.weight"], "auto", None)[0]["embed.weight"]
    assert data.dtype == "BF16" and data.shape == [100, 64]
    with pytest.raises((BufferError, TypeError, ValueError, RuntimeError)):
        np.from_dlpack(data)


def test_cross_device_and_copy_requests_are_refused(every_dtype_file):
    data = _native.load(str(every_dtype_file), ["int16.0"], "auto", None)[0]["int16.0"]
    with pytest.raises(BufferError):
        data.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        data.__dlpack__(copy=True)
