"""Where load_file puts tensors (mapped views or an owned buffer), why, and HF's copy semantics."""

import os

import numpy as np
import pytest
from safetensors.numpy import load_file as hf_load_file
from safetensors.numpy import save_file

import tensora
from tensora import _native
from conftest import collect, file_sha256, make_tensors


def _mapped(report: dict) -> bool:
    return report["io_mode"] == "mapped"


def test_warm_local_files_load_as_mapped_views(every_dtype_file):
    hf_load_file(str(every_dtype_file))  # reads the file: it is in the page cache now
    d, report = tensora.load_file_with_report(every_dtype_file)
    assert _mapped(report), report
    assert report["reason"].startswith("mapped: warm"), report["reason"]
    assert report["backend"] == "mmap"
    assert report["bytes_selected"] == sum(a.nbytes for a in d.values())


@pytest.mark.parametrize("residence", ["auto", "owned", "mapped"])
def test_every_residence_matches_hf(every_dtype_file, residence):
    want = hf_load_file(str(every_dtype_file))
    got, report = tensora.load_file_with_report(every_dtype_file, residence=residence)
    assert report["reason"].startswith("owned:" if residence == "owned" else "mapped:"), report["reason"]
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape and got[k].tobytes() == w.tobytes(), k


def test_owned_when_asked_or_a_backend_is_named(every_dtype_file):
    _, owned = tensora.load_file_with_report(every_dtype_file, residence="owned")
    assert not _mapped(owned) and owned["reason"].startswith("owned: residence"), owned
    _, named = tensora.load_file_with_report(every_dtype_file, backend="sync")
    assert not _mapped(named) and named["backend"] == "sync", named
    assert named["reason"].startswith("owned: a backend was named"), named["reason"]


def test_an_unknown_residence_is_a_value_error(every_dtype_file):
    with pytest.raises(ValueError, match="residence"):
        tensora.load_file(every_dtype_file, residence="lazy")


def test_cold_files_get_an_owned_load(tmp_path):
    path = tmp_path / "cold.safetensors"
    save_file({"w": np.arange(1 << 20, dtype=np.float32)}, str(path))  # 4 MiB
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    d, report = tensora.load_file_with_report(path)
    if _mapped(report):
        pytest.skip(f"this filesystem kept the pages cached after DONTNEED: {report['reason']}")
    assert report["reason"].startswith("owned: cold"), report["reason"]
    assert d["w"].tobytes() == np.arange(1 << 20, dtype=np.float32).tobytes()


@pytest.mark.parametrize("residence", ["owned", "mapped"])
def test_loads_are_independent_and_private(every_dtype_file, residence):
    before = file_sha256(every_dtype_file)
    a = tensora.load_file(every_dtype_file, residence=residence)
    b = tensora.load_file(every_dtype_file, residence=residence)
    orig = b["uint8.0"].copy()
    a["uint8.0"][...] = 0xAB
    assert (a["uint8.0"] == 0xAB).all()
    assert (b["uint8.0"] == orig).all(), "another load's arrays do not see the write"
    assert file_sha256(every_dtype_file) == before, "the file never changes"


def test_safe_open_get_tensor_twice_gives_independent_tensors(every_dtype_file):
    before = file_sha256(every_dtype_file)
    with tensora.safe_open(every_dtype_file) as f:
        a = f.get_tensor("float32.1")
        b = f.get_tensor("float32.1")
        orig = b.copy()
        a[...] = 1.5
        assert (a == 1.5).all()
        assert b.tobytes() == orig.tobytes(), "HF semantics: each get_tensor is its own tensor"
        assert not np.shares_memory(a, b)
        c = f.get_slice("float32.1")[0:2]
        assert c.tobytes() == orig[0:2].tobytes()
    assert file_sha256(every_dtype_file) == before


def test_each_get_tensor_owns_its_mapping(every_dtype_file):
    collect()
    base = _native.owners_live()
    with tensora.safe_open(every_dtype_file) as f:
        a = f.get_tensor("int8.0")
        b = f.get_tensor("int8.1")
        assert _native.owners_live() == base + 2
    del a
    collect()
    assert _native.owners_live() == base + 1
    del b
    collect()
    assert _native.owners_live() == base


def test_a_file_truncated_after_open_is_an_exception_not_a_crash(tmp_path):
    path = tmp_path / "shrinks.safetensors"
    tensors = make_tensors(seed=3)
    save_file(tensors, str(path))
    with tensora.safe_open(path) as f:
        with open(path, "r+b") as w:
            w.truncate(os.path.getsize(path) // 2)
        with pytest.raises(tensora.LoadError, match="changed since it was parsed"):
            f.get_tensor("float64.1")
