"""Bit-exact agreement with HF safetensors, and HF-compatible API semantics."""

import numpy as np
import pytest
from safetensors import safe_open as hf_safe_open
from safetensors.numpy import load_file as hf_load_file

import tensora
from conftest import REAL, SLLM_TINY, SLLM_TINY_EXPECTED, expected, sha256


def assert_same(a: dict, b: dict) -> None:
    assert list(a.keys()) == sorted(b.keys())
    for k, want in b.items():
        got = a[k]
        assert isinstance(got, np.ndarray), k
        assert got.dtype == want.dtype, k
        assert got.shape == want.shape, k
        assert got.tobytes() == want.tobytes(), k


def test_real_fixtures_exist():
    assert len(REAL) >= 2, "fixtures/real is missing"


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_load_file_matches_hf_on_real_fixtures(path):
    assert_same(tensora.load_file(path), hf_load_file(str(path)))


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_load_file_matches_expected_sha256(path):
    got = tensora.load_file(path)
    for name, e in expected(path).items():
        assert sha256(got[name].tobytes()) == e["sha256"], name
        assert list(got[name].shape) == e["shape"]


@pytest.mark.parametrize("backend", ["auto"] + tensora.backends())
def test_every_backend_matches_hf_on_every_numpy_dtype(every_dtype_file, backend):
    assert_same(tensora.load_file(every_dtype_file, backend=backend), hf_load_file(str(every_dtype_file)))


def test_safe_open_matches_hf(every_dtype_file):
    with hf_safe_open(str(every_dtype_file), framework="np") as h, tensora.safe_open(every_dtype_file) as f:
        assert f.keys() == sorted(h.keys())
        assert f.metadata() == h.metadata()
        for k in h.keys():
            want = h.get_tensor(k)
            got = f.get_tensor(k)
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("index", [np.s_[1:3], np.s_[:1], np.s_[2:], np.s_[1:3, 2:5], np.s_[..., 1], np.s_[::2]])
def test_get_slice_matches_hf(every_dtype_file, index):
    with hf_safe_open(str(every_dtype_file), framework="np") as h, tensora.safe_open(every_dtype_file) as f:
        for k in ("float32.0", "int64.1", "float16.0"):
            hs, ts = h.get_slice(k), f.get_slice(k)
            assert ts.get_shape() == hs.get_shape()
            assert ts.get_dtype() == hs.get_dtype()
            want = hs[index]
            got = ts[index]
            assert got.shape == want.shape and got.tobytes() == want.tobytes(), (k, index)


def test_select_by_names_and_glob(every_dtype_file):
    got = tensora.load_file(every_dtype_file, select=["float32.1", "int8.0"])
    assert sorted(got) == ["float32.1", "int8.0"]
    got = tensora.load_file(every_dtype_file, select="float*")
    assert sorted(got) == ["float16.0", "float16.1", "float32.0", "float32.1", "float64.0", "float64.1"]


def test_missing_name_is_a_selection_error(every_dtype_file):
    with pytest.raises(tensora.SelectionError, match="nope"):
        tensora.load_file(every_dtype_file, select=["nope"])
    with tensora.safe_open(every_dtype_file) as f:
        with pytest.raises(tensora.SelectionError):
            f.get_tensor("nope")


def test_serverlessllm_matches_expected_digests():
    want = expected(SLLM_TINY_EXPECTED)
    names = [n for n, e in want.items() if e["dtype"] not in ("BF16",)]
    got = tensora.load_file(SLLM_TINY, select=names)
    assert sorted(got) == sorted(names) and any(a.size == 0 for a in got.values())
    for name, arr in got.items():
        assert list(arr.shape) == want[name]["shape"]
        assert sha256(np.ascontiguousarray(arr).tobytes()) == want[name]["sha256"], name


def test_bf16_to_numpy_is_a_dtype_error():
    with pytest.raises(tensora.DtypeError, match="BF16"):
        tensora.load_file(SLLM_TINY)
    with tensora.safe_open(SLLM_TINY) as f:
        with pytest.raises(tensora.DtypeError):
            f.get_tensor("embed.weight")


def test_errors_are_typed_and_carry_the_message(tmp_path, every_dtype_file):
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(every_dtype_file.read_bytes()[:-7])
    with pytest.raises(tensora.FormatError) as e:
        tensora.load_file(bad)
    assert str(bad) in str(e.value)
    assert isinstance(e.value, tensora.TensoraError)
    with pytest.raises(tensora.FormatError):
        tensora.safe_open(bad)
    with pytest.raises(tensora.TensoraError):
        tensora.load_file(tmp_path / "absent.safetensors")
    with pytest.raises(tensora.LoadError, match="unknown backend"):
        tensora.load_file(every_dtype_file, backend="warp-drive")
    with pytest.raises(ValueError):
        tensora.load_file(every_dtype_file, framework="jax")


def test_exception_classes_are_named_and_rooted():
    names = ["FormatError", "LoadError", "SelectionError", "CancelledError", "DtypeError", "VerifyError", "ConvertError"]
    for n in names:
        cls = getattr(tensora, n)
        assert cls.__name__ == n and cls.__module__ == "tensora"
        assert issubclass(cls, tensora.TensoraError)
    assert issubclass(tensora.TensoraError, Exception)
