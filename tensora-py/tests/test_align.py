"""Tensors whose file offset is not a multiple of their element size (safetensors allows it) reach
numpy and torch aligned, as copies, on every export path, with HF's values."""

import json
import struct

import numpy as np
import pytest
import torch
from safetensors import safe_open as hf_safe_open
from safetensors.torch import load_file as hf_pt_load_file

import tensora

# name -> (safetensors dtype, torch dtype, element count). With a 61-byte header the data starts
# at file offset 69: the first tensor is misaligned for every dtype wider than a byte, and each
# odd-sized tensor keeps the next one misaligned.
LAYOUT = [
    ("a.f32", "F32", torch.float32, 3),
    ("b.bf16", "BF16", torch.bfloat16, 5),
    ("c.f64", "F64", torch.float64, 7),
    ("d.u8", "U8", torch.uint8, 3),
    ("e.f32.big", "F32", torch.float32, 3000),  # spans pages
    ("e2.u8", "U8", torch.uint8, 1),
    ("f.bf16.big", "BF16", torch.bfloat16, 4099),
    ("g.f64.big", "F64", torch.float64, 1500),
]
MISALIGNED = {"a.f32", "b.bf16", "c.f64", "e.f32.big", "f.bf16.big", "g.f64.big"}


def write_safetensors(path, tensors, header_len):
    """A safetensors file with its header padded (with spaces, as the format allows) to exactly
    `header_len` bytes, so the data section starts at `8 + header_len`."""
    meta, raws, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        meta[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        raws.append(raw)
        off += len(raw)
    header = json.dumps(meta, separators=(",", ":")).encode()
    assert len(header) <= header_len, (len(header), header_len)
    header += b" " * (header_len - len(header))
    path.write_bytes(struct.pack("<Q", header_len) + header + b"".join(raws))


@pytest.fixture(scope="module")
def misaligned_file(tmp_path_factory):
    g = torch.Generator().manual_seed(11)
    tensors = {}
    for name, dtype, tdtype, n in LAYOUT:
        t = (torch.rand(n, generator=g) * 1000).to(tdtype) if tdtype != torch.uint8 else torch.arange(n, dtype=torch.uint8)
        tensors[name] = (dtype, [n], t.view(torch.uint8).numpy().tobytes())
    header = json.dumps(
        {k: {"dtype": d, "shape": s, "data_offsets": [0, 0]} for k, (d, s, _) in tensors.items()},
        separators=(",", ":"),
    )
    header_len = len(header) + 64
    header_len += (61 - header_len) % 8  # data at 8 + header_len = 69 (mod 8): odd
    path = tmp_path_factory.mktemp("misaligned") / "misaligned.safetensors"
    write_safetensors(path, tensors, header_len)
    base = 8 + header_len
    offsets, off = {}, base
    for name, (_d, _s, raw) in tensors.items():
        offsets[name] = off
        off += len(raw)
    for name in MISALIGNED:
        size = {"F32": 4, "BF16": 2, "F64": 8}[tensors[name][0]]
        assert offsets[name] % size != 0, (name, offsets[name])
    return path


def hf_values(path):
    return hf_pt_load_file(str(path))


def assert_aligned_and_equal(got: dict, want: dict):
    """Torch tensors: aligned data pointers, HF's dtypes, shapes and values."""
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g.data_ptr() % g.element_size() == 0, (name, g.data_ptr())
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g, w), name


def numpy_names():
    return [n for n, _d, t, _ in LAYOUT if t != torch.bfloat16]


@pytest.mark.parametrize("residence", ["owned", "mapped", "auto"])
def test_load_file_torch_is_aligned_and_equals_hf(misaligned_file, residence):
    got, report = tensora.load_file_with_report(misaligned_file, framework="pt", residence=residence)
    assert_aligned_and_equal(got, hf_values(misaligned_file))
    copies = report["aligned_copies"]
    assert copies["tensors"] == len(MISALIGNED), copies
    assert copies["bytes"] == sum(got[n].numel() * got[n].element_size() for n in MISALIGNED)


@pytest.mark.parametrize("residence", ["owned", "mapped"])
def test_load_file_numpy_is_aligned_and_equals_hf(misaligned_file, residence):
    names = numpy_names()
    got = tensora.load_file(misaligned_file, select=names, residence=residence)
    with hf_safe_open(str(misaligned_file), framework="np") as h:
        want = {n: h.get_tensor(n) for n in names}
    for n in names:
        assert got[n].ctypes.data % got[n].dtype.itemsize == 0 and got[n].flags.aligned, n
        assert got[n].dtype == want[n].dtype and np.array_equal(got[n], want[n]), n


@pytest.mark.parametrize("residence", ["owned", "mapped"])
def test_weights_iterator_is_aligned_and_equals_hf(misaligned_file, residence):
    got = dict(tensora.weights_iterator(misaligned_file, framework="pt", residence=residence, budget=4096))
    assert_aligned_and_equal(got, hf_values(misaligned_file))


def test_safe_open_get_tensor_and_get_slice_are_aligned_and_equal_hf(misaligned_file):
    want = hf_values(misaligned_file)
    with tensora.safe_open(misaligned_file, framework="pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
        again = {k: f.get_tensor(k) for k in f.keys()}  # repeated: memory of its own
        sliced = {k: f.get_slice(k)[1:] for k in f.keys()}
        assert f._mapped.aligned_copies()[0] == 3 * len(MISALIGNED)
    assert_aligned_and_equal(got, want)
    assert_aligned_and_equal(again, want)
    assert_aligned_and_equal(sliced, {k: v[1:] for k, v in want.items()})
    with tensora.safe_open(misaligned_file) as f:
        arr = f.get_tensor("c.f64")
    assert arr.ctypes.data % 8 == 0 and np.array_equal(arr, want["c.f64"].numpy())


def test_aligned_files_are_never_copied(every_dtype_file):
    _, report = tensora.load_file_with_report(every_dtype_file, framework="pt")
    assert report["aligned_copies"] == {"tensors": 0, "bytes": 0}
    stream = tensora._native.open_stream(str(every_dtype_file), None, None, "auto", "owned")
    datas = [d for _, d in stream]
    assert datas and not any(d.aligned_copy for d in datas)
    assert stream.aligned_copies() == (0, 0)
