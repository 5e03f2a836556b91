"""Where load_file puts tensors (mapped views or an owned buffer), why, and HF's copy semantics."""

import ctypes
import inspect
import mmap
import os
import subprocess
import sys

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
    d, report = tensora.load_file_with_report(every_dtype_file, residence="auto")
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
    _, named = tensora.load_file_with_report(every_dtype_file, backend="sync", residence="auto")
    assert not _mapped(named) and named["backend"] == "sync", named
    assert named["reason"].startswith("owned: a backend was named"), named["reason"]


def test_an_unknown_residence_is_a_value_error(every_dtype_file):
    with pytest.raises(ValueError, match="residence"):
        tensora.load_file(every_dtype_file, residence="lazy")


def test_cold_files_are_read_in_as_views_and_left_cached_for_the_next_load(tmp_path):
    path = tmp_path / "cold.safetensors"
    save_file({"w": np.arange(1 << 20, dtype=np.float32)}, str(path))  # 4 MiB
    _evict(path)
    # The default: the pages fit in the page cache, so they are read in as views and stay for the
    # next process, which finds the file warm.
    d, report = tensora.load_file_with_report(path, residence="auto")
    assert _mapped(report), report
    assert report["reason"].startswith("mapped: cold, on local"), report["reason"]
    assert "pages kept cached for the next load" in report["reason"], report["reason"]
    assert d["w"].tobytes() == np.arange(1 << 20, dtype=np.float32).tobytes()
    del d
    assert _resident_fraction(path) == 1.0, "the cold load left its pages cached"
    _, again = tensora.load_file_with_report(path, residence="auto")
    assert again["reason"].startswith("mapped: warm"), again["reason"]


def test_cache_pages_false_reads_cold_files_around_the_page_cache(tmp_path):
    path = tmp_path / "cold.safetensors"
    save_file({"w": np.arange(1 << 20, dtype=np.float32)}, str(path))  # 4 MiB
    _evict(path)
    d, report = tensora.load_file_with_report(path, residence="auto", cache_pages=False)
    assert not _mapped(report), report
    assert report["reason"].startswith("owned: cold, around the page cache (O_DIRECT asked)"), report["reason"]
    assert d["w"].tobytes() == np.arange(1 << 20, dtype=np.float32).tobytes()
    with pytest.raises(TypeError):
        tensora.load_file(path, "np", None, "auto", None, None, None, None, None, False)  # keyword only


def test_the_drop_in_safe_open_reads_a_cold_file_ahead_from_open(tmp_path):
    import time

    from tensora.safetensors import safe_open as dropin_safe_open

    path = tmp_path / "cold.safetensors"
    save_file({"w": np.arange(4 << 20, dtype=np.float32)}, str(path))  # 16 MiB
    _evict(path)
    if _resident_fraction(path) > 0.05:
        pytest.skip("this filesystem keeps the pages cached after DONTNEED")
    with dropin_safe_open(str(path), "np") as f:
        deadline = time.monotonic() + 10
        while _resident_fraction(path) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        # Nothing was read by the caller: the pages came from the read-ahead started at open.
        assert _resident_fraction(path) == 1.0
        assert f.get_tensor("w").tobytes() == np.arange(4 << 20, dtype=np.float32).tobytes()


def test_a_whole_slice_of_the_drop_in_reads_its_pages_in_and_a_part_stays_lazy(tmp_path):
    """transformers materialises every weight with `get_slice(name)[...]` on its loading
    threads: the whole tensor's pages are read in there (as HF's slice reads them), not left to
    be faulted in one by one by whoever touches them first; a part stays a lazy view."""
    import time

    import torch

    from tensora.safetensors import safe_open as dropin_safe_open

    path = tmp_path / "two.safetensors"
    n = 8 << 20  # 32 MiB of float32 each (the kernel's own read-ahead, up to 8 MiB here, reads past a)
    save_file({"a": np.arange(n, dtype=np.float32), "b": np.ones(n, dtype=np.float32)}, str(path))
    with dropin_safe_open(str(path), "pt") as f:
        deadline = time.monotonic() + 10
        while _resident_fraction(path) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the read-ahead from open
        time.sleep(0.05)
        _evict(path)
        if _resident_fraction(path) > 0.05:
            pytest.skip("this filesystem keeps the pages cached after DONTNEED")
        a = f.get_slice("a")[...]
        assert 0.49 <= _resident_fraction(path) <= 0.7, "the whole of a, and not all of b, read in"
        b = f.get_slice("b")[0:1024]
        assert _resident_fraction(path) <= 0.7, "a part of b stays lazy"
        assert torch.equal(a, torch.arange(n, dtype=torch.float32))
        assert torch.equal(b, torch.ones(1024))


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


def test_get_slice_then_get_tensor_never_share_bytes(every_dtype_file):
    with tensora.safe_open(every_dtype_file) as f:
        orig = f.get_slice("float32.1")[:]
        t = f.get_tensor("float32.1")
        t[...] = 7.0
        again = f.get_slice("float32.1")[:]
        assert again.tobytes() == orig.tobytes(), "a slice reads the file, not a get_tensor's writes"


def test_get_tensor_shares_one_mapping_per_file_until_a_name_repeats(every_dtype_file):
    collect()
    base = _native.owners_live()
    with tensora.safe_open(every_dtype_file) as f:
        a = f.get_tensor("int8.0")
        b = f.get_tensor("int8.1")
        assert _native.owners_live() == base + 1, "first get_tensor of each name: the file's mapping"
        c = f.get_tensor("int8.0")
        assert _native.owners_live() == base + 2, "a repeated name gets memory of its own"
        assert f._mapped.file_mappings() == 1
    del a, b
    collect()
    assert _native.owners_live() == base + 1
    del c
    collect()
    assert _native.owners_live() == base


def _maps_of(path) -> int:
    """How many mappings of `path` this process has (/proc/self/maps)."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as m:
        return sum(1 for line in m if line.rstrip("\n").endswith(" " + real))


def test_many_get_tensor_calls_use_one_mapping_per_file(tmp_path):
    path = tmp_path / "many.safetensors"
    tensors = {f"t.{i:04d}": np.full((3, 5), i, dtype=np.float32) for i in range(600)}
    save_file(tensors, str(path))
    with tensora.safe_open(path) as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
        assert _maps_of(path) == 1, "one copy-on-write mapping of the file, whatever the tensor count"
    for k, want in tensors.items():
        assert got[k].tobytes() == want.tobytes(), k
    got["t.0007"][...] = -1.0
    assert (got["t.0006"] == 6).all() and (got["t.0008"] == 8).all(), "neighbours keep their bytes"
    del got
    collect()
    assert _maps_of(path) == 0, "the mapping goes with the last tensor"


def test_repeated_get_tensor_is_bounded_then_copies(every_dtype_file):
    collect()
    assert _native.call_mappings_live() == 0
    n = _native.CALL_MAPPINGS_MAX + 3
    with tensora.safe_open(every_dtype_file) as f:
        first = f.get_tensor("float32.1")
        want = first.copy()
        first[...] = 9.0  # the shared mapping's copy; later calls read the file
        kept = [f.get_tensor("float32.1") for _ in range(n)]
        assert _native.call_mappings_live() == _native.CALL_MAPPINGS_MAX
    for t in kept:
        assert t.tobytes() == want.tobytes()
    kept[-1][...] = 2.0  # a heap copy
    kept[0][...] = 3.0  # a mapping of its own
    assert kept[-2].tobytes() == want.tobytes() and kept[1].tobytes() == want.tobytes()
    del kept, first
    collect()
    assert _native.call_mappings_live() == 0


def test_a_slice_reads_only_its_own_pages(tmp_path):
    # 64 MiB of F32, one tensor: well above readahead (read_ahead_kb is often 8 MiB on VMs).
    rows, cols = 4096, 4096
    path = tmp_path / "sharded_rows.safetensors"
    full = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    save_file({"w": full}, str(path))
    _evict(path)
    if _resident_fraction(path) > 0.05:
        pytest.skip("this filesystem keeps the pages cached after DONTNEED")
    with tensora.safe_open(path) as f:
        part = f.get_slice("w")[2048:2112]  # 1 MiB of rows in the middle
        assert part.tobytes() == full[2048:2112].tobytes()
        resident = _resident_fraction(path)
        # The slice plus readahead around it, not the whole tensor.
        assert resident < 0.5, f"{resident:.0%} of the file read in for a 1/64 slice"
        again = f.get_tensor("w")  # the first get_tensor still reads the whole tensor in
        assert again.tobytes() == full.tobytes()
    part[...] = 0
    assert again[2048:2112].tobytes() == full[2048:2112].tobytes(), "a slice is a copy"


def _evict(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _resident_fraction(path) -> float:
    """Fraction of the file's pages in the page cache (mincore on a private mapping)."""
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        buf = (ctypes.c_char * size).from_buffer(mm)
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(ctypes.addressof(buf), size, vec)
        del buf
        assert rc == 0, os.strerror(ctypes.get_errno())
        return sum(b & 1 for b in vec) / pages
    finally:
        mm.close()


def test_the_default_follows_the_hf_function_replaced(every_dtype_file):
    """numpy: an owned snapshot (as safetensors.numpy.load_file); torch: "auto", a private mapping
    when warm (as safetensors.torch.load_file, which maps the file)."""
    hf_load_file(str(every_dtype_file))  # warm: "auto" maps
    _, report = tensora.load_file_with_report(every_dtype_file)
    assert not _mapped(report) and report["reason"].startswith("owned: residence"), report
    _, report = tensora.load_file_with_report(every_dtype_file, framework="pt")
    assert _mapped(report) and report["reason"].startswith("mapped: warm"), report
    for fn in (tensora.load_file, tensora.load_file_with_report, tensora.weights_iterator):
        assert inspect.signature(fn).parameters["residence"].default is None, fn
    stream = tensora.weights_iterator(every_dtype_file)  # torch by default
    assert next(stream)[1].__class__.__name__ == "Tensor"
    stream.close()


SAVE_OVER_ITS_INPUT = """
import sys
from safetensors.numpy import load_file as hf, save, save_file
import tensora
path = sys.argv[1]
want = hf(path)  # also warms the page cache: "auto" would map
w = tensora.load_file(path)
names = sorted(w)
with open(path, "wb") as f:  # rewrite in place, shorter (older safetensors, open(p, "wb"), ...)
    f.write(save({k: w[k] for k in names[:1]}))
assert names == sorted(want)
for k, v in want.items():
    assert w[k].tobytes() == v.tobytes(), k
save_file(w, path)  # the common pattern: the arrays are a snapshot, so this restores the file
got = hf(path)
for k, v in want.items():
    assert got[k].tobytes() == v.tobytes(), k
print("ok")
"""


def test_save_file_over_the_loaded_file_works_by_default(tmp_path):
    path = tmp_path / "roundtrip.safetensors"
    save_file({f"w{i}": np.full((256, 1024), i, dtype=np.float32) for i in range(8)}, str(path))
    # In a child: with mapped views this dies of SIGBUS, which must not take pytest with it.
    r = subprocess.run([sys.executable, "-c", SAVE_OVER_ITS_INPUT, str(path)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def test_a_file_truncated_after_open_is_an_exception_not_a_crash(tmp_path):
    path = tmp_path / "shrinks.safetensors"
    tensors = make_tensors(seed=3)
    save_file(tensors, str(path))
    with tensora.safe_open(path) as f:
        with open(path, "r+b") as w:
            w.truncate(os.path.getsize(path) // 2)
        with pytest.raises(tensora.LoadError, match="changed since it was parsed"):
            f.get_tensor("float64.1")


REWRITE_UNDER_MAPPED_VIEWS = """
import sys
from safetensors.numpy import save
import tensora
path = sys.argv[1]
w = tensora.load_file(path, residence="mapped")
names = sorted(w)
last = w[names[-1]]
shorter = save({names[0]: w[names[0]][:1].copy()})
with open(path, "wb") as f:  # rewritten in place, shorter: the mapped pages past the end are gone
    f.write(shorter)
print("rewritten", flush=True)
print(int(last.reshape(-1)[-1]), flush=True)  # SIGBUS: the documented caveat of mapped views
print("survived", flush=True)
"""


def test_mapped_views_die_of_sigbus_when_the_file_is_rewritten_in_place(tmp_path):
    """The caveat `load_file` documents for `residence="mapped"` (and `"auto"` when warm): the views
    stay backed by the file, so rewriting it shorter in place kills the process at the next
    access (in a child, so pytest survives). The owned default survives the same rewrite
    (`test_save_file_over_the_loaded_file_works_by_default`)."""
    import signal

    path = tmp_path / "rewritten.safetensors"
    save_file({f"w{i}": np.full((256, 1024), i, dtype=np.float32) for i in range(8)}, str(path))
    r = subprocess.run([sys.executable, "-c", REWRITE_UNDER_MAPPED_VIEWS, str(path)], capture_output=True, text=True)
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stdout, r.stderr[-2000:])
    assert r.stdout.splitlines() == ["rewritten"], r.stdout


def test_in_place_writes_by_others_show_through_mapped_views_not_owned(tmp_path):
    """Mapped views are live views of the page cache (documented): a same-size in-place write to
    the file shows through pages not yet written by this process; an owned load is a snapshot."""
    path = tmp_path / "overwritten.safetensors"
    save_file({"w": np.zeros((64, 1024), dtype=np.float32)}, str(path))
    mapped = tensora.load_file(path, residence="mapped")["w"]
    owned = tensora.load_file(path, residence="owned")["w"]
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # same length, new bytes: no truncation, so no SIGBUS
        f.seek(size - 4)
        f.write(np.float32(7.0).tobytes())
    assert mapped.reshape(-1)[-1] == 7.0, "mapped views show another writer's bytes"
    assert owned.reshape(-1)[-1] == 0.0, "owned arrays are a snapshot"
