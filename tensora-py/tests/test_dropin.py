"""tensora.torch / tensora.numpy / tensora.safetensors against HF safetensors 0.8 on what HF's own
suite does not pin down: devices (torch's own error where one is absent), backends (honoured, not
just checked), offset order, stored-empty metadata, F4, errors (``SafetensorError`` at the root,
``FileNotFoundError``), and the keyword-only extras."""

import json
import struct

import numpy as np
import pytest
import safetensors
import safetensors.torch as hf_torch
import torch

import tensora
import tensora.numpy as tn
import tensora.safetensors as ts
import tensora.torch as tt


@pytest.fixture
def pt_file(tmp_path):
    path = tmp_path / "m.safetensors"
    # Names sorted one way, offsets another: HF lays out by dtype, then name.
    hf_torch.save_file({"a": torch.arange(4, dtype=torch.int8), "b": torch.arange(6.0),
                        "c": torch.ones(3, dtype=torch.float16)}, path)
    return path


def test_every_error_is_a_safetensor_error_and_missing_files_are_file_not_found(tmp_path):
    assert issubclass(tensora.TensoraError, tensora.SafetensorError)
    assert issubclass(tensora.FormatError, ts.SafetensorError)
    for call in (lambda p: tt.load_file(p), lambda p: tn.load_file(p), lambda p: ts.safe_open(p, "pt")):
        with pytest.raises(FileNotFoundError, match="No such file or directory"):
            call(tmp_path / "missing.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ts.SafetensorError):
        tt.load_file(tmp_path / "bad.safetensors")


def test_devices_as_hf_takes_them(pt_file):
    want = hf_torch.load_file(pt_file)
    for device in ("cpu", None, torch.device("cpu")):
        got = tt.load_file(pt_file, device)  # positional, as HF's
        assert all(torch.equal(got[k], want[k]) and got[k].device.type == "cpu" for k in want)
        with ts.safe_open(pt_file, "pt", device) as f:
            assert torch.equal(f.get_tensor("b"), want["b"])
    for bad in ("bogus", "cuda:x", "mps:1"):
        with pytest.raises(ts.SafetensorError):
            tt.load_file(pt_file, device=bad)
    with pytest.raises(ts.SafetensorError, match="not supported for framework"):
        ts.safe_open(pt_file, "np", "cuda")


def test_cuda_devices_load_there_or_fail_with_torchs_own_error(pt_file):
    if torch.cuda.is_available():
        for device in ("cuda", "cuda:0", 0, torch.device("cuda:0")):
            assert tt.load_file(pt_file, device)["b"].device == torch.device("cuda:0")
        return
    with pytest.raises(Exception) as torch_err:
        torch.zeros(1).to("cuda:0")
    for device in ("cuda", "cuda:0", 0):
        with pytest.raises(type(torch_err.value)):
            tt.load_file(pt_file, device)
        with ts.safe_open(pt_file, "pt", device=device) as f:  # opening is fine, as HF's
            with pytest.raises(type(torch_err.value)):
                f.get_tensor("a")


def test_offset_keys_metadata_and_get_tensors_follow_hf(pt_file, tmp_path):
    with safetensors.safe_open(str(pt_file), "pt") as h, ts.safe_open(pt_file, "pt") as f:
        assert f.keys() == h.keys() == ["a", "b", "c"]
        assert f.offset_keys() == h.offset_keys() != h.keys()
        assert f.metadata() == h.metadata() is None
        assert list(f.get_tensors()) == list(h.get_tensors())
    assert list(tt.load_file(pt_file)) == list(hf_torch.load_file(pt_file)) == ["b", "c", "a"]
    assert list(tn.load_file(pt_file, select=["a", "c"])) == ["c", "a"]
    with tensora.safe_open(pt_file, "pt") as f:
        assert f.offset_keys() == ["b", "c", "a"]
    # Stored empty: HF says {}, not None.
    empty = tmp_path / "empty-meta.safetensors"
    header = json.dumps({"__metadata__": {}, "x": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}).encode()
    header += b" " * (-len(header) % 8)
    empty.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with safetensors.safe_open(str(empty), "np") as h, ts.safe_open(empty, "np") as f:
        assert f.metadata() == h.metadata() == {}


def test_backends_are_honoured(pt_file):
    with tensora.safe_open(pt_file, "pt", backend="pread") as f:
        t = f.get_tensor("b")
        assert f._mapped.file_mappings() == 0, "pread maps nothing"
    with tensora.safe_open(pt_file, "pt") as f:
        f.get_tensor("b")
        assert f._mapped.file_mappings() == 1
    assert torch.equal(t, torch.arange(6.0))
    with pytest.raises(tensora.LoadError, match="apply to load_file"):
        tensora.safe_open(pt_file, "pt", backend=tensora.backends()[0])
    with pytest.raises(ts.SafetensorError, match="is invalid"):
        ts.safe_open(pt_file, "pt", backend="uring")
    with pytest.raises(ts.SafetensorError, match="is invalid"):
        tt.load_file(pt_file, backend="nope")
    for backend in ("mmap", "pread", *tensora.backends()):
        assert torch.equal(tt.load_file(pt_file, backend=backend)["b"], torch.arange(6.0))


def test_f4_and_fp8_round_trip_with_hf(tmp_path):
    tensors = {"f4": torch.tensor([[0x12, 0x34], [0x56, 0x78]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
               "e8": torch.tensor([1.0, 2.0], dtype=torch.float8_e8m0fnu),
               "e4": torch.tensor([0.5, -1.0], dtype=torch.float8_e4m3fn)}
    tt.save_file(tensors, tmp_path / "t.safetensors")
    hf_torch.save_file(tensors, tmp_path / "hf.safetensors")
    assert (tmp_path / "t.safetensors").read_bytes() == (tmp_path / "hf.safetensors").read_bytes()
    for got in (tt.load_file(tmp_path / "hf.safetensors"), hf_torch.load_file(tmp_path / "t.safetensors")):
        for k, v in tensors.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k


def test_extras_are_keyword_only_and_work(pt_file, tmp_path):
    got = tt.load_file(pt_file, select=["b"], residence="owned")
    assert list(got) == ["b"]
    with pytest.raises(TypeError):
        tt.load_file(pt_file, "cpu", "mmap")  # backend is keyword-only, as HF's
    sharded = tmp_path / "sharded"
    tensora.save_sharded({"x": np.arange(1000, dtype=np.float32), "y": np.ones(1000, np.float32)}, sharded,
                         max_shard_size=4000)
    assert sorted(tn.load_file(sharded)) == ["x", "y"]


def test_saves_are_hfs_bytes_whatever_the_order_and_durability(tmp_path):
    t = {"z": torch.arange(4.0), "a": torch.arange(3, dtype=torch.int64), "m": torch.ones(2, dtype=torch.bfloat16)}
    reordered = dict(reversed(list(t.items())))
    hf_torch.save_file(t, tmp_path / "hf.safetensors", metadata={"k": "v"})
    want = (tmp_path / "hf.safetensors").read_bytes()
    tt.save_file(reordered, tmp_path / "a.safetensors", metadata={"k": "v"})
    tt.save_file(t, tmp_path / "b.safetensors", metadata={"k": "v"}, durability="synced")
    assert (tmp_path / "a.safetensors").read_bytes() == want == (tmp_path / "b.safetensors").read_bytes()
    assert tt.save(reordered, {"k": "v"}) == hf_torch.save(t, {"k": "v"})
