"""tensora.save_file / save / load / save_sharded: what HF safetensors reads back, byte for byte
(every dtype, non-contiguous tensors, metadata, shards), HF's refusals, and the save's atomicity."""

import json
import os

import numpy as np
import pytest
from safetensors import safe_open as hf_safe_open
from safetensors.numpy import load as hf_np_load
from safetensors.numpy import load_file as hf_np_load_file
from safetensors.numpy import save as hf_np_save

import tensora
from conftest import make_tensors
from test_progress import _counter_runs_during

torch = pytest.importorskip("torch")
from safetensors.torch import load_file as hf_pt_load_file  # noqa: E402
from safetensors.torch import save_file as hf_pt_save_file  # noqa: E402


def torch_tensors(seed: int = 0) -> dict:
    """Every torch dtype safetensors stores, bf16 and every fp8 included, with random bytes."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    dtypes = [
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.uint16,
        torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
        torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
    ]
    for i, dt in enumerate(dtypes):
        size = torch.empty((), dtype=dt).element_size()
        raw = torch.randint(0, 256, (5 * 7 * size,), dtype=torch.uint8, generator=g)
        if dt is torch.bool:
            raw = raw & 1
        out[f"t{i}.{str(dt).split('.')[-1]}"] = raw.view(dt).reshape(5, 7)
    out["scalar"] = torch.tensor(2.5, dtype=torch.bfloat16)
    out["empty"] = torch.zeros((0, 3), dtype=torch.float32)
    return out


def raw(t) -> bytes:
    """A torch tensor's row-major bytes (any dtype)."""
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def assert_np_equal(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        w = np.array(w, order="C", copy=True)
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert got[k].tobytes() == w.tobytes(), k


def assert_pt_equal(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and tuple(got[k].shape) == tuple(w.shape), k
        assert raw(got[k]) == raw(w), k


@pytest.mark.parametrize("mode", ["auto", "buffered", "direct"])
def test_numpy_every_dtype_reads_back_with_hf(tmp_path, mode):
    tensors = make_tensors(seed=3)
    path = tmp_path / "np.safetensors"
    report = tensora.save_file_with_report(tensors, path, metadata={"format": "np", "k": "v"}, mode=mode)
    assert report["tensors"] == len(tensors) and report["mode"] in ("direct", "buffered"), report
    assert_np_equal(hf_np_load_file(str(path)), tensors)
    with hf_safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"format": "np", "k": "v"}
    assert os.listdir(tmp_path) == ["np.safetensors"], "no temporary file left"


def test_torch_every_dtype_reads_back_with_hf(tmp_path):
    tensors = torch_tensors()
    path = tmp_path / "pt.safetensors"
    tensora.save_file(tensors, path, metadata={"format": "pt"})
    assert_pt_equal(hf_pt_load_file(str(path)), tensors)
    # And what HF writes, tensora reads (both ways, from bytes too).
    hf_path = tmp_path / "hf.safetensors"
    hf_pt_save_file(tensors, str(hf_path))
    assert_pt_equal(tensora.load_file(hf_path, framework="pt"), tensors)
    assert_pt_equal(tensora.load(hf_path.read_bytes(), framework="pt"), tensors)


def test_non_contiguous_tensors_are_written_in_row_major_order(tmp_path):
    def base():  # each view of its own array: views of one array share memory
        return np.arange(6 * 8 * 4, dtype=np.float32).reshape(6, 8, 4)

    def t():
        return torch.arange(5 * 9, dtype=torch.bfloat16).reshape(5, 9)

    tensors_np = {
        "transposed": base().transpose(2, 0, 1),
        "stepped": base()[::2, 1::3],
        "reversed": base()[::-1, :, ::-1][:, 2],
        "broadcast": np.broadcast_to(np.arange(4, dtype=np.int16), (3, 4)),
        "fortran": np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
    }
    path = tmp_path / "np.safetensors"
    tensora.save_file(tensors_np, path)
    assert_np_equal(hf_np_load_file(str(path)), tensors_np)
    expanded = torch.ones(3, dtype=torch.float16).expand(4, 3)
    tensors_pt = {"permuted": t().t(), "narrowed": t()[1:4, ::2], "expanded": expanded}
    path = tmp_path / "pt.safetensors"
    tensora.save_file(tensors_pt, path)
    assert_pt_equal(hf_pt_load_file(str(path)), {k: v.contiguous() for k, v in tensors_pt.items()})


def test_conjugate_views_are_resolved(tmp_path):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    path = tmp_path / "c.safetensors"
    tensora.save_file({"conj": z.conj()}, path)
    assert torch.equal(hf_pt_load_file(str(path))["conj"], z.conj().resolve_conj())


def test_shared_memory_is_refused_with_hfs_message(tmp_path):
    a = torch.zeros(10)
    shared = {"a": a, "b": a[:4]}
    with pytest.raises(RuntimeError) as ours:
        tensora.save_file(shared, tmp_path / "x.safetensors")
    with pytest.raises(RuntimeError) as hf:
        hf_pt_save_file(shared, str(tmp_path / "hf.safetensors"))
    same_order = [str(e.value).replace("'b', 'a'", "'a', 'b'") for e in (ours, hf)]
    assert same_order[0] == same_order[1]
    arr = np.zeros(10, dtype=np.float32)
    mixed = {"x": arr, "y": arr[5:], "z": torch.from_numpy(arr)[2:3]}  # numpy and torch views
    with pytest.raises(RuntimeError, match="Some tensors share memory"):
        tensora.save_file(mixed, tmp_path / "n.safetensors")
    assert os.listdir(tmp_path) == [], "refused before anything is written"
    # Disjoint parts of one storage do not share memory (HF saves them too).
    tensora.save_file({"lo": a[:5], "hi": a[5:]}, tmp_path / "ok.safetensors")
    assert sorted(hf_pt_load_file(str(tmp_path / "ok.safetensors"))) == ["hi", "lo"]


def test_bad_arguments_raise_as_hf_does(tmp_path):
    p = tmp_path / "x.safetensors"
    with pytest.raises(ValueError, match="Expected a dict"):
        tensora.save_file([np.zeros(2)], p)
    with pytest.raises(ValueError, match="Key `a` is invalid"):
        tensora.save_file({"a": [1, 2]}, p)
    with pytest.raises(ValueError, match="sparse"):
        tensora.save_file({"s": torch.eye(3).to_sparse()}, p)
    with pytest.raises(tensora.DtypeError, match="complex128"):
        tensora.save_file({"c": np.zeros(2, dtype=np.complex128)}, p)
    with pytest.raises(ValueError, match="metadata"):
        tensora.save_file({"a": np.zeros(2)}, p, metadata={"n": 1})
    with pytest.raises(TypeError):
        tensora.save_file({1: np.zeros(2)}, p)
    assert not p.exists()


def test_save_and_load_bytes_agree_with_hf():
    tensors = make_tensors(seed=5)
    data = tensora.save(tensors, metadata={"m": "1"})
    assert_np_equal(hf_np_load(data), tensors)
    assert_np_equal(tensora.load(data), tensors)
    assert_np_equal(tensora.load(hf_np_save(tensors)), tensors)
    loaded = tensora.load(data)
    loaded["float32.0"][0, 0] = 7.0  # writable, and the bytes object is untouched
    assert_np_equal(tensora.load(data), tensors)
    pt = torch_tensors(seed=2)
    assert_pt_equal(tensora.load(tensora.save(pt), framework="pt"), pt)
    with pytest.raises(tensora.DtypeError):
        tensora.load(tensora.save({"b": torch.zeros(2, dtype=torch.bfloat16)}))  # numpy has no bf16
    with pytest.raises(tensora.FormatError):
        tensora.load(data[:-1])


def read_sharded(directory) -> dict:
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    out = {}
    for name, file in index["weight_map"].items():
        with hf_safe_open(str(directory / file), framework="pt") as f:
            out[name] = f.get_tensor(name)
    return out


def test_sharded_saves_read_back_with_hf_and_replace_a_previous_save(tmp_path):
    tensors = {f"layer.{i}.w": torch.full((64, 64), float(i)) for i in range(8)}  # 16 KiB each
    out = tmp_path / "ckpt"
    tensora.save_sharded(tensors, out, max_shard_size="40KB", metadata={"format": "pt"})
    names = sorted(os.listdir(out))
    shards = ["model-0000%d-of-00004.safetensors" % k for k in range(1, 5)]
    assert names == shards + ["model.safetensors.index.json"]
    assert_pt_equal(read_sharded(out), tensors)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 8 * 64 * 64 * 4
    # A second save into the same directory: fewer shards, the stale ones go, other files stay.
    (out / "config.json").write_text("{}")
    half = {k: v + 1 for k, v in list(tensors.items())[:4]}
    tensora.save_sharded(half, out, max_shard_size=40_000)
    assert sorted(os.listdir(out)) == ["config.json", "model-00001-of-00002.safetensors",
                                       "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    assert_pt_equal(read_sharded(out), half)
    # One shard: model.safetensors and no index, as huggingface_hub writes it.
    tensora.save_sharded(half, out, max_shard_size="5GB")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    assert_pt_equal(hf_pt_load_file(str(out / "model.safetensors")), half)
    with pytest.raises(ValueError, match="size"):
        tensora.save_sharded(half, out, max_shard_size="lots")


def test_save_replaces_a_file_atomically(tmp_path):
    path = tmp_path / "m.safetensors"
    tensora.save_file({"v": np.ones(4, dtype=np.float32)}, path)
    tensora.save_file({"w": np.zeros(3, dtype=np.int8)}, path)
    assert_np_equal(hf_np_load_file(str(path)), {"w": np.zeros(3, dtype=np.int8)})
    assert os.listdir(tmp_path) == ["m.safetensors"]
    # A failed save (a tensor numpy cannot describe) leaves the previous file as it was.
    with pytest.raises(tensora.DtypeError):
        tensora.save_file({"w": np.zeros(3, dtype=np.longdouble)}, path)
    assert_np_equal(hf_np_load_file(str(path)), {"w": np.zeros(3, dtype=np.int8)})


def test_progress_cancel_and_the_gil(tmp_path, big_file):
    tensors = tensora.load_file(big_file)
    calls = []
    tensora.save_file_with_report(tensors, tmp_path / "a.safetensors", progress=lambda *a: calls.append(a))
    total = sum(a.nbytes for a in tensors.values())
    assert calls and calls[-1] == (total, total)
    with pytest.raises(tensora.CancelledError):
        tensora.save_file_with_report(tensors, tmp_path / "b.safetensors", progress=lambda d, t: False)
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors"], "a cancelled save leaves nothing"
    assert _counter_runs_during(lambda: tensora.save_file(tensors, tmp_path / "c.safetensors")) > 0


def test_a_tensor_resized_mid_save_cannot_free_the_memory_being_written(tmp_path):
    """#39 finding 8: the writer holds each tensor's memory (a buffer export) for the whole
    write, so another thread cannot resize (free) a tensor's storage under it; before, the saver
    read freed memory into the file."""
    t = torch.arange(8 << 20, dtype=torch.float32)  # 32 MiB: many progress calls
    want = t.clone()
    outcomes = []

    def progress(done, total):
        if not outcomes:
            try:
                t.resize_(64 << 20)  # would reallocate the storage and free the old memory
                outcomes.append("resized")
            except RuntimeError as e:
                outcomes.append(str(e))

    tensora.save_file_with_report({"t": t}, tmp_path / "t.safetensors", progress=progress,
                                  mode="buffered", threads=1)
    assert outcomes and "not resizable" in outcomes[0], outcomes
    assert torch.equal(hf_pt_load_file(tmp_path / "t.safetensors")["t"], want)


def test_the_native_savers_take_buffers_never_addresses():
    """#39 finding 8: an integer is not memory; the native savers refuse it (they read any
    address before)."""
    for bad in (12345, 0x7FFF0000):
        with pytest.raises(TypeError):
            tensora._native.save_bytes([("a", "U8", [4], bad, None, None)])
    # A buffer shorter than its shape says is refused, never read past.
    with pytest.raises(ValueError):
        tensora._native.save_bytes([("a", "F32", [4], bytearray(8), None, None)])


def test_both_durabilities_write_the_same_file(tmp_path):
    tensors = torch_tensors(3)
    files = []
    for durability in ("synced", "process-crash-safe"):
        path = tmp_path / f"{durability}.safetensors"
        report = tensora.save_file_with_report(tensors, path, durability=durability)
        assert report["durability"] == durability
        if durability == "process-crash-safe":
            assert report["mode"] == "buffered", report["reason"]
        assert_pt_equal(hf_pt_load_file(str(path)), tensors)
        files.append(path.read_bytes())
    assert files[0] == files[1]
    with pytest.raises(ValueError):
        tensora.save_file(tensors, tmp_path / "x.safetensors", durability="fast")
