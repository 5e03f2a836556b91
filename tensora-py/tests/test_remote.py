"""URL paths against a real nginx on 127.0.0.1: load_file equals a local load (numpy and torch),
the verified cache is written then read back, secrets in URLs never reach a message, and the
options say what is wrong with them."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import tensora

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from servers import Nginx  # noqa: E402  (bench/servers.py, shared with the collective bench)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    d = root / "model"
    d.mkdir()
    rng = np.random.default_rng(11)
    weight_map = {}
    for s in range(2):
        name = f"model-{s:05d}-of-00002.safetensors"
        tensors = {f"s{s}.w{i}": rng.standard_normal((32, 100 + i)).astype(np.float32) for i in range(4)}
        save_file(tensors, str(d / name))
        weight_map.update({k: name for k in tensors})
    # An HTTP server cannot be listed: a sharded checkpoint is found through its index, as HF writes it.
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with Nginx(root) as n:
        yield n, d


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert np.array_equal(np.asarray(got[k]), want[k]), k


def test_a_url_loads_what_the_local_files_hold(served):
    nginx, d = served
    want = tensora.load_file(d)
    got, report = tensora.load_file_with_report(nginx.url("model/"))
    assert_same(got, want)
    assert report["url"].rstrip("/") == nginx.url("model") and report["requests"] >= 1
    assert report["bytes_selected"] == sum(v.nbytes for v in want.values())
    # torch: the default residence for "pt" is "auto", which is owned for a URL.
    import torch

    pt, report = tensora.load_file_with_report(nginx.url("model/"), framework="pt", select="s1.*")
    assert sorted(pt) == sorted(k for k in want if k.startswith("s1."))
    for k, t in pt.items():
        assert isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), want[k]), k
    assert report["io_mode"] != "mapped"


def test_the_cache_is_written_then_read_back_and_works_offline(served, tmp_path):
    nginx, d = served
    want = tensora.load_file(d)
    url = nginx.url("model/")
    cold, r1 = tensora.load_file_with_report(url, cache=tmp_path / "cache")
    assert_same(cold, want)
    # By default every range is on disk before the tensors are handed over.
    assert r1["cache"]["written_bytes"] >= r1["bytes_selected"], r1["cache"]
    assert r1["cache"]["promoted"] == 2, r1["cache"]
    warm, r2 = tensora.load_file_with_report(url, cache=tmp_path / "cache")
    assert_same(warm, want)
    assert r2["cache"]["local_objects"] == 2 and r2["requests"] == 0, r2
    offline = tensora.RemoteOptions(cache=tmp_path / "cache", offline=True)
    assert_same(tensora.load_file(url, remote=offline), want)


def test_copies_written_behind_are_finished_at_exit_and_never_hold_rewritten_bytes(served, tmp_path):
    nginx, d = served
    url = nginx.url("model/")
    want = tensora.load_file(d)
    # A process that exits right after a load written behind: the copies are finished at exit.
    run = "import sys, tensora\nt = tensora.load_file(sys.argv[1], remote=tensora.RemoteOptions(cache=sys.argv[2], cache_writes='behind'))\n"
    subprocess.run([sys.executable, "-c", run, url, str(tmp_path / "a")], check=True, timeout=120)
    offline = tensora.RemoteOptions(cache=tmp_path / "a", offline=True)
    assert_same(tensora.load_file(url, remote=offline), want)
    # Arrays rewritten in place at once: what the cache keeps is still what the server sent
    # (pieces rewritten first are left out, and the next load fetches them again).
    behind = tensora.RemoteOptions(cache=tmp_path / "b", cache_writes="behind")
    got, r = tensora.load_file_with_report(url, remote=behind)
    assert r["cache"]["promoting"] == 2, r["cache"]
    # The pieces not written when the arrays were handed over were sealed first.
    assert 0 <= r["cache"]["sealed_bytes"] <= r["bytes_read"], r["cache"]
    for a in got.values():
        a.fill(7)
    assert tensora.wait_cache() >= 1
    assert tensora.wait_cache() == 0
    assert_same(tensora.load_file(url, remote=behind), want)
    tensora.wait_cache()
    assert_same(tensora.load_file(url, remote=tensora.RemoteOptions(cache=tmp_path / "b", offline=True)), want)
    with pytest.raises(ValueError, match="cache_writes"):
        tensora.load_file(url, remote=tensora.RemoteOptions(cache=tmp_path / "b", cache_writes="later"))


def test_secrets_in_urls_never_reach_a_message(served):
    nginx, _ = served
    url = nginx.url("missing/").replace("http://", "http://user:hunter2@")
    with pytest.raises(tensora.TensoraError) as e:
        tensora.load_file(url)
    assert "hunter2" not in str(e.value)
    with pytest.raises(ValueError) as e:
        next(tensora.weights_iterator(url))
    assert "hunter2" not in str(e.value) and "load_file" in str(e.value)


def test_options_that_do_not_apply_are_errors(served, tmp_path):
    nginx, d = served
    with pytest.raises(ValueError, match="URLs only"):
        tensora.load_file(d, cache=tmp_path / "c")
    with pytest.raises(ValueError, match="need cache"):
        tensora.load_file(nginx.url("model/"), remote=tensora.RemoteOptions(offline=True))
    with pytest.raises(ValueError, match="open_timeout"):
        tensora.load_file(nginx.url("model/"), remote=tensora.RemoteOptions(open_timeout=-1.0))
    with pytest.raises(TypeError, match="RemoteOptions"):
        tensora.load_file(nginx.url("model/"), remote={"endpoint": "x"})
    with pytest.raises(tensora.TensoraError, match="cache"):
        tensora.load_file(nginx.url("nothing-here/"), remote=tensora.RemoteOptions(cache=tmp_path / "c2", offline=True))


def test_the_stores_come_from_the_native_table():
    """``tensora._native.schemes()`` is tensora_remote's table of stores (issue 45): every store
    with its schemes, endpoint and credential help; the docstrings that name stores point there."""
    stores = tensora._native.schemes()
    schemes = [s for store in stores for s in store["schemes"]]
    for scheme in ("http", "https", "s3", "s3a", "az", "azure", "gs"):
        assert scheme in schemes
    assert len(schemes) == len(set(schemes))
    for store in stores:
        assert store["endpoint"] and store["credentials"] and store["backend"].startswith("remote-")
        assert store["example"].startswith(store["schemes"][0][:2])
    by_backend = {store["backend"]: store for store in stores}
    assert by_backend["remote-s3"]["lists"] and not by_backend["remote-http"]["lists"]
    for documented in (tensora.RemoteOptions, tensora.load_file, tensora.verify):
        assert "tensora._native.schemes()" in documented.__doc__
    # The vLLM loader tells a URL from a path by the same table (it once missed s3a:// and azure://).
    from tensora import vllm as tensora_vllm

    for scheme in schemes:
        assert tensora_vllm.Settings(weights=f"{scheme}://b/k/").is_remote, scheme
    assert not tensora_vllm.Settings(weights="/models/llama").is_remote
