"""tensora.verify on a URL against a real nginx on 127.0.0.1: the report `tensora verify URL
--json` prints (tensora_remote::verify), structure and, with a manifest, digests from a streamed
load; a broken or missing object is a finding, never an exception; secrets never reach it."""

import json

import pytest

import tensora
from test_remote import served  # noqa: F401  (the served sharded checkpoint: nginx and its directory)

# The tensors of test_remote's checkpoint: 2 shards of 4.
TENSORS = 8


@pytest.fixture(scope="module")
def bad_object(served):  # noqa: F811
    """An object beside the checkpoint whose header length points past its end."""
    nginx, d = served
    (d.parent / "bad.safetensors").write_bytes((1000).to_bytes(8, "little"))
    return nginx.url("bad.safetensors")


def codes(report):
    return [f["code"] for f in report["findings"]]


def test_a_url_verifies_against_the_manifest_of_its_local_files(served, tmp_path):  # noqa: F811
    nginx, d = served
    manifest = tmp_path / "manifest.json"
    tensora.hash(d, write_manifest=manifest)
    report = tensora.verify(nginx.url("model/"), manifest)
    assert report["ok"] and report["errors"] == 0, report
    assert report["tensors"] == TENSORS and report["tensors_digested"] == TENSORS, report
    assert report["files"] == 2 and report["bytes_scanned"] > 0, report
    assert report["path"].rstrip("/") == nginx.url("model"), report
    # The same document as for the local files, but for the path and the scan's bytes.
    local = tensora.verify(d, manifest)
    assert local["ok"] and local["tensors_digested"] == report["tensors_digested"]
    # Without a manifest: structure only, the digests computed all the same.
    plain = tensora.verify(nginx.url("model/"))
    assert plain["ok"] and plain["tensors_digested"] == TENSORS, plain


def test_a_manifest_that_disagrees_is_a_finding_per_tensor(served, tmp_path):  # noqa: F811
    nginx, d = served
    manifest = tmp_path / "manifest.json"
    tensora.hash(d, write_manifest=manifest)
    doc = json.loads(manifest.read_text())
    first = sorted(doc["tensors"])[0]
    doc["tensors"][first]["crc32c"] = "00000000"
    doc["tensors"]["ghost"] = doc["tensors"][first]
    manifest.write_text(json.dumps(doc))
    report = tensora.verify(nginx.url("model/"), manifest=manifest)
    assert not report["ok"], report
    assert "digest-mismatch" in codes(report) and "tensor-missing" in codes(report), report
    mismatch = next(f for f in report["findings"] if f["code"] == "digest-mismatch")
    assert mismatch["tensor"] == first, mismatch


def test_a_broken_or_missing_object_is_a_finding_not_an_exception(served, bad_object):  # noqa: F811
    nginx, _ = served
    bad = tensora.verify(bad_object)
    assert not bad["ok"] and codes(bad) == ["structure"], bad
    gone = tensora.verify(nginx.url("gone.safetensors"))
    assert not gone["ok"] and codes(gone) == ["file-missing"], gone
    assert "gone.safetensors" in gone["findings"][0]["message"], gone


def test_secrets_in_the_url_never_reach_the_report(served):  # noqa: F811
    nginx, _ = served
    url = nginx.url("gone.safetensors").replace("http://", "http://user:hunter2@")
    report = tensora.verify(url)
    assert not report["ok"], report
    assert "hunter2" not in json.dumps(report), report


def test_remote_options_reach_the_store_and_apply_to_urls_only(served):  # noqa: F811
    nginx, d = served
    report = tensora.verify(nginx.url("model/"), remote=tensora.RemoteOptions(open_timeout=30))
    assert report["ok"], report
    with pytest.raises(ValueError, match="open_timeout"):
        tensora.verify(nginx.url("model/"), remote=tensora.RemoteOptions(open_timeout=-1))
    with pytest.raises(ValueError, match="URLs only"):
        tensora.verify(str(d), remote=tensora.RemoteOptions(open_timeout=30))
