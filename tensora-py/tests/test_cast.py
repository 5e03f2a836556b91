"""``dtype=``: casts fused into the load, bit-exact with torch's ``.to()`` on every 16-bit and
8-bit pattern, F32 patterns of every class (finite, NaN payloads, +-Inf, subnormals, ties), and
the typed error for a dtype with no cast."""

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import tensora

# Lengths are multiples of 16: torch's own F16 -> F32 writes another NaN in the last len % 8
# elements (its scalar tail) than in its vectorised loop, which tensora follows everywhere.
EVERY_16_BIT = torch.arange(65536, dtype=torch.int32).to(torch.int16)
EVERY_8_BIT = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def _f32_patterns() -> torch.Tensor:
    rng = np.random.default_rng(44)
    random = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    ties = (random[:4096] & 0xFFFF0000) | 0x8000
    f16_ties = (random[4096:8192] & 0xFFFFE000) | 0x1000
    subnormal_f16 = rng.integers(0x32800000, 0x39000000, size=4096, dtype=np.uint64).astype(np.uint32)
    overflow_f16 = rng.integers(0x47700000, 0x47900000, size=4096, dtype=np.uint64).astype(np.uint32)
    nan = 0x7F800000 | rng.integers(1, 1 << 23, size=4096, dtype=np.uint64).astype(np.uint32)
    subnormal_f32 = rng.integers(1, 1 << 23, size=4096, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F7FFFFF, 1] * 2, np.uint32)
    parts = [random, ties, f16_ties, subnormal_f16, overflow_f16, nan, subnormal_f32]
    signed = [p | np.uint32(0x80000000) for p in parts[1:]]
    bits = np.concatenate(parts + signed + [specials])
    assert len(bits) % 16 == 0
    return torch.from_numpy(bits.view(np.int32).copy()).view(torch.float32)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    tensors = {
        "f32": _f32_patterns(),
        "bf16": EVERY_16_BIT.clone().view(torch.bfloat16),
        "f16": EVERY_16_BIT.clone().view(torch.float16),
        "e4m3": EVERY_8_BIT.clone().view(torch.float8_e4m3fn),
        "e5m2": EVERY_8_BIT.clone().view(torch.float8_e5m2),
        "ids": torch.arange(100, dtype=torch.int64),
    }
    path = tmp_path_factory.mktemp("cast") / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_tensor_is_bit_exact_with_torch_to(stored, dtype):
    path, tensors = stored
    loaded, report = tensora.load_file_with_report(path, framework="pt", dtype=dtype)
    for name, want in tensors.items():
        got = loaded[name]
        target = want.dtype if not want.is_floating_point() else dtype
        assert got.dtype == target, name
        assert torch.equal(_bits(got), _bits(want.to(target))), name
    cast = report["cast"]
    assert sorted(t["name"] for t in cast["tensors"]) == sorted(
        n for n, t in tensors.items() if t.is_floating_point() and t.dtype != dtype
    )
    assert cast["kept"] == len(tensors) - len(cast["tensors"])
    assert cast["seconds"] > 0 and report["residence"] == "owned"


def test_dtype_names_strings_and_numpy_dtypes(stored):
    path, tensors = stored
    want = tensors["bf16"].to(torch.float32).numpy()
    for dtype in ["f32", "float32", np.float32, np.dtype("float32")]:
        got = tensora.load_file(path, framework="np", select="bf16", dtype=dtype)["bf16"]
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), dtype
    with pytest.raises(ValueError, match="bf16, f16, f32"):
        tensora.load_file(path, dtype="f64")


def test_views_become_an_owned_cast_copy(stored):
    path, tensors = stored
    loaded, report = tensora.load_file_with_report(path, framework="pt", residence="mapped", dtype="bf16")
    assert report["residence"] == "owned" and "cast to BF16" in report["reason"]
    assert torch.equal(_bits(loaded["f16"]), _bits(tensors["f16"].to(torch.bfloat16)))


def test_a_float_dtype_with_no_cast_is_an_error_naming_tensor_and_dtypes(tmp_path):
    path = tmp_path / "f64.safetensors"
    save_file({"w": torch.ones(4, dtype=torch.float64)}, str(path))
    with pytest.raises(tensora.LoadError, match=r'"w".*F64 to BF16'):
        tensora.load_file(path, dtype=torch.bfloat16)


def test_weights_iterator_yields_cast_runs(stored):
    path, tensors = stored
    got = dict(tensora.weights_iterator(path, framework="pt", budget=1 << 20, dtype=torch.bfloat16))
    assert sorted(got) == sorted(tensors)
    for name, want in tensors.items():
        target = torch.bfloat16 if want.is_floating_point() else want.dtype
        assert torch.equal(_bits(got[name]), _bits(want.to(target))), name
