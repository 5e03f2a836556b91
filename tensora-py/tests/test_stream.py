"""weights_iterator: order, completeness, bounds, early exit, lists of files."""

import numpy as np
import pytest
from safetensors.numpy import load_file as hf_load_file, save_file

import tensora
from tensora import _native
from conftest import REAL, collect
from procstat import rss_kib


@pytest.mark.parametrize("residence", ["auto", "owned", "mapped"])
def test_yields_every_tensor_bit_exact(every_dtype_file, residence):
    want = hf_load_file(str(every_dtype_file))
    got = list(tensora.weights_iterator(every_dtype_file, framework="np", budget=4096, residence=residence))
    assert sorted(n for n, _ in got) == sorted(want)
    for name, arr in got:
        assert arr.dtype == want[name].dtype and arr.shape == want[name].shape
        assert arr.tobytes() == want[name].tobytes()


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_fixtures_stream_like_load_file(path):
    want = tensora.load_file(path)
    got = dict(tensora.weights_iterator(path, framework="np", budget=64 << 10))
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].tobytes() == want[k].tobytes()


@pytest.mark.parametrize("residence", ["owned", "mapped"])
def test_queue_stays_under_the_budget(big_file, residence):
    """While the consumer holds a tensor, the producer queues the next one (waited for, with a
    bound, not slept on: a producer that never runs ahead fails), and the queue never holds more
    than the budget. Runs are a third of the budget, so each 2 MiB tensor is a run of its own."""
    import time

    budget = 4 << 20
    tensor_bytes = 2 << 20
    count = 24
    stream = _native.open_stream(str(big_file), None, budget, "auto", residence)
    seen = 0
    peak = 0
    for _name, _data in stream:
        seen += 1
        deadline = time.monotonic() + 60
        while True:
            items, queued = stream.queued()
            peak = max(peak, queued)
            assert queued <= budget, f"{queued} bytes queued, over the budget"
            if items >= 1 or seen == count:
                break
            assert time.monotonic() < deadline, f"tensor {seen} taken and the next one never queued"
            time.sleep(0.001)
    assert seen == count
    assert peak >= tensor_bytes


def test_breaking_early_stops_and_frees(big_file):
    collect()
    base = _native.owners_live()
    it = tensora.weights_iterator(big_file, framework="np", budget=4 << 20)
    first = next(it)
    it.close()
    del it
    collect()
    assert _native.owners_live() == base + 1  # only `first` remains
    del first
    collect()
    assert _native.owners_live() == base


def test_list_of_files_and_select(tmp_path):
    a = {"x.0": np.arange(6, dtype=np.float32), "y.0": np.ones(3, dtype=np.int64)}
    b = {"x.1": np.arange(4, dtype=np.float16)}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    files = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    got = dict(tensora.weights_iterator(files, framework="np"))
    assert sorted(got) == ["x.0", "x.1", "y.0"]
    assert got["x.1"].tobytes() == b["x.1"].tobytes()
    assert sorted(dict(tensora.weights_iterator(files, framework="np", select="x.*"))) == ["x.0", "x.1"]
    assert sorted(dict(tensora.weights_iterator(files, framework="np", select=["x.1", "y.0"]))) == ["x.1", "y.0"]
    with pytest.raises(tensora.SelectionError, match="absent"):
        list(tensora.weights_iterator(files, framework="np", select=["x.1", "absent"]))


def test_a_broken_file_raises_from_the_iterator(tmp_path, every_dtype_file):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 4)
    with pytest.raises(tensora.FormatError):
        list(tensora.weights_iterator([every_dtype_file, bad], framework="np"))


def test_an_unknown_residence_is_a_value_error(every_dtype_file):
    with pytest.raises(ValueError, match="residence"):
        list(tensora.weights_iterator(every_dtype_file, residence="lazy"))


@pytest.mark.parametrize("residence", ["owned", "mapped"])
def test_streamed_writes_stay_private(every_dtype_file, residence):
    from conftest import file_sha256

    before = file_sha256(every_dtype_file)
    for _, arr in tensora.weights_iterator(every_dtype_file, framework="np", residence=residence):
        if arr.size:
            arr.reshape(-1)[0] = arr.reshape(-1)[-1]
    assert file_sha256(every_dtype_file) == before


@pytest.fixture(scope="module")
def file_384mib(tmp_path_factory):
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("f384") / "m.safetensors"
    save_file({f"w{i}": rng.random((1024, 3072), dtype=np.float32) for i in range(32)}, str(path))
    return path


@pytest.mark.parametrize("residence", ["owned", "mapped"])
def test_peak_memory_stays_near_one_and_a_half_budgets(file_384mib, residence):
    """384 MiB through a 48 MiB budget, the caller keeping each tensor until the next arrives:
    the process's peak RSS grows by at most 1.5 x budget + 16 MiB (runs of a third of the budget:
    the one consumed, the next, the one after it, faulted in meanwhile, and the one the caller's
    last tensor pins). A thread that loaded the
    next run while the consumer was still on the one before grew by about 2 x budget."""
    budget = 48 << 20
    collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux): the peak below is this test's own
    before_kib = rss_kib("VmRSS")
    assert rss_kib("VmHWM") <= before_kib + (4 << 10), "writing 5 to clear_refs did not reset VmHWM"
    seen = 0
    for _name, arr in tensora.weights_iterator(file_384mib, framework="np", budget=budget, residence=residence):
        seen += int(arr[0, 0] >= 0)
    grown_bytes = (rss_kib("VmHWM") - before_kib) << 10
    print(f"{residence}: peak RSS grew by {grown_bytes >> 20} MiB (budget {budget >> 20} MiB)")
    assert seen == 32
    assert grown_bytes <= budget * 3 // 2 + (16 << 20), f"peak grew by {grown_bytes >> 20} MiB"
