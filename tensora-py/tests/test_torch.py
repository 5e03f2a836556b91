"""torch through DLPack: dtypes (bf16, fp8), shapes, zero copy, lifetimes, copy-on-write."""

import pytest
import torch

import tensora
from tensora import _native
from conftest import SLLM_TINY, SLLM_TINY_EXPECTED, collect, expected, file_sha256, sha256


def raw(t) -> bytes:
    return t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def test_load_file_pt_matches_expected_digests_including_bf16():
    got = tensora.load_file(SLLM_TINY, framework="pt")
    want = expected(SLLM_TINY_EXPECTED)
    assert got["embed.weight"].dtype == torch.bfloat16
    for name, e in want.items():
        assert list(got[name].shape) == e["shape"]
        assert sha256(raw(got[name])) == e["sha256"], name


def test_fp8_dtypes_round_trip(tmp_path):
    from safetensors.torch import save_file

    t = {
        "e4m3": torch.randn(4, 8).to(torch.float8_e4m3fn),
        "e5m2": torch.randn(4, 8).to(torch.float8_e5m2),
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
    }
    path = tmp_path / "fp8.safetensors"
    save_file(t, str(path))
    got = tensora.load_file(path, framework="pt")
    for k, v in t.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape
        assert raw(got[k]) == raw(v)


def test_torch_tensor_keeps_memory_alive_and_writes_stay_private(every_dtype_file):
    collect()
    base = _native.owners_live()
    before = file_sha256(every_dtype_file)
    with tensora.safe_open(every_dtype_file, framework="pt") as f:
        t = f.get_tensor("float32.0")
    t.add_(1.0)  # torch ignores read-only flags: the mapping must be copy-on-write
    assert file_sha256(every_dtype_file) == before
    assert _native.owners_live() == base + 1
    del t
    collect()
    assert _native.owners_live() == base


def test_weights_iterator_yields_torch_tensors(every_dtype_file):
    got = dict(tensora.weights_iterator(every_dtype_file))
    assert all(isinstance(v, torch.Tensor) for v in got.values())
    assert got["int64.0"].numpy().tobytes() == tensora.load_file(every_dtype_file)["int64.0"].tobytes()


@pytest.mark.parametrize("residence", ["owned", "mapped"])
def test_in_place_torch_writes_stay_in_their_load(every_dtype_file, residence):
    before = file_sha256(every_dtype_file)
    a = tensora.load_file(every_dtype_file, framework="pt", residence=residence)
    b = tensora.load_file(every_dtype_file, framework="pt", residence=residence)
    orig = b["float32.1"].clone()
    a["float32.1"].add_(1.0)
    assert torch.equal(a["float32.1"], orig + 1.0)
    assert torch.equal(b["float32.1"], orig), "another load does not see the write"
    assert file_sha256(every_dtype_file) == before


def test_safe_open_get_tensor_twice_is_independent_in_torch(every_dtype_file):
    with tensora.safe_open(every_dtype_file, framework="pt") as f:
        a = f.get_tensor("float64.0")
        b = f.get_tensor("float64.0")
        orig = b.clone()
        a.mul_(2.0)
        assert torch.equal(b, orig)


def test_get_slice_in_torch_is_a_copy_of_the_file_bytes(every_dtype_file):
    from safetensors import safe_open as hf_safe_open

    with hf_safe_open(str(every_dtype_file), framework="pt") as h, tensora.safe_open(every_dtype_file, framework="pt") as f:
        whole = f.get_tensor("float32.0")
        whole.fill_(7.0)  # a write into the file's shared mapping
        got = f.get_slice("float32.0")[1:3]
        want = h.get_slice("float32.0")[1:3]
        assert torch.equal(got, want), "a slice reads the file, not earlier writes"
        got.zero_()
        assert torch.equal(f.get_tensor("float32.0")[1:3], want), "the slice is its own copy"
