"""inspect, hash, verify, convert."""

import json

import pytest
from safetensors.numpy import load_file as hf_load_file

import tensora
from conftest import REAL, SLLM_TINY, SLLM_TINY_EXPECTED, expected


def test_inspect_describes_the_checkpoint(every_dtype_file):
    info = tensora.inspect(every_dtype_file)
    assert info["format"] == "safetensors"
    assert info["metadata"] == {"format": "np", "origin": "tensora-tests"}
    names = {t["name"]: t for t in info["tensors"]}
    want = hf_load_file(str(every_dtype_file))
    assert names.keys() == want.keys()
    assert names["float32.0"]["dtype"] == "F32"
    assert names["float32.0"]["shape"] == list(want["float32.0"].shape)
    assert info["files"][0]["len_bytes"] == every_dtype_file.stat().st_size


@pytest.mark.parametrize("path", REAL + [SLLM_TINY], ids=lambda p: p.name)
def test_sha256_matches_expected(path):
    want = expected(SLLM_TINY_EXPECTED if path == SLLM_TINY else path)
    got = tensora.hash(path, "sha256")
    assert got == {k: v["sha256"] for k, v in want.items()}


def test_unknown_algo_is_a_verify_error(every_dtype_file):
    with pytest.raises(tensora.VerifyError, match="md5"):
        tensora.hash(every_dtype_file, "md5")


def test_verify_clean_and_against_a_manifest(tmp_path, every_dtype_file):
    path = REAL[0]
    manifest = path.with_name(path.name[: -len(".safetensors")] + ".expected.json")
    report = tensora.verify(path, manifest)
    assert report["ok"], report
    assert report["summary"].startswith("OK")
    doc = json.loads(manifest.read_text())
    name = next(iter(doc["tensors"]))
    doc["tensors"][name]["sha256"] = "0" * 64
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    report = tensora.verify(path, bad)
    assert not report["ok"]
    assert any(f.get("tensor") == name for f in report["findings"])
    with pytest.raises(tensora.VerifyError):
        tensora.verify(path, tmp_path / "absent.json")


def test_convert_round_trip(tmp_path, every_dtype_file):
    sllm = tmp_path / "sllm"
    report = tensora.convert(every_dtype_file, sllm, "serverlessllm")
    assert report["tensors"] == len(hf_load_file(str(every_dtype_file)))
    back = tmp_path / "back"
    tensora.convert(sllm, back, "safetensors")
    want = hf_load_file(str(every_dtype_file))
    got = tensora.load_file(back)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].tobytes() == want[k].tobytes()
    with pytest.raises(tensora.ConvertError, match="already exists"):
        tensora.convert(every_dtype_file, sllm, "serverlessllm")
    with pytest.raises(tensora.ConvertError, match="unknown target"):
        tensora.convert(every_dtype_file, tmp_path / "x", "onnx")


def test_inspect_is_the_cli_schema(every_dtype_file):
    """One schema for `tensora.inspect` and `tensora inspect --json` (tensora_format::Inspection)."""
    info = tensora.inspect(every_dtype_file)
    assert set(info) == {"path", "format", "files", "metadata", "tensors", "tensor_bytes", "warnings"}
    t = info["tensors"][0]
    assert set(t) == {"name", "dtype", "shape", "file", "offset_bytes", "len_bytes", "nbytes", "strides"}
    assert info["tensor_bytes"] == sum(t["len_bytes"] for t in info["tensors"])
    assert info["files"][0]["tensors"] == len(info["tensors"])
