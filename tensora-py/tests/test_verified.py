"""Verified loads: `manifest=` checks every tensor against a manifest as it lands and raises
VerifyError, naming the tensor, its file and its offset, before a bad tensor is returned."""

import json
import shutil

import pytest
import torch
from safetensors.numpy import load_file as hf_load_file

import tensora
from conftest import collect


@pytest.fixture
def model(tmp_path, every_dtype_file):
    """A copy of the every-dtype file and its manifest."""
    path = tmp_path / "model.safetensors"
    shutil.copy(every_dtype_file, path)
    manifest = tmp_path / "model.manifest.json"
    digests = tensora.hash(path, write_manifest=manifest)
    doc = json.loads(manifest.read_text())
    assert doc["algo"] == "crc32c" and {k: v["crc32c"] for k, v in doc["tensors"].items()} == digests
    return path, manifest


def offsets(path) -> dict:
    return {t["name"]: (t["offset_bytes"], t["len_bytes"]) for t in tensora.inspect(path)["tensors"]}


def flip_inside(path, name) -> int:
    """Flip one byte in the middle of tensor `name`; its file offset."""
    off, n = offsets(path)[name]
    data = bytearray(path.read_bytes())
    data[off + n // 2] ^= 0x20
    path.write_bytes(bytes(data))
    return off


def assert_names(e, path, name, offset):
    msg = str(e.value)
    assert f'"{name}"' in msg and str(path) in msg and f"offset {offset}" in msg, msg


EVERY_LOAD = [
    ("load_file", "owned"),
    ("load_file", "mapped"),
    ("load_file", "auto"),
    ("weights_iterator", "owned"),
    ("weights_iterator", "mapped"),
]


@pytest.mark.parametrize("fn,residence", EVERY_LOAD)
def test_a_clean_checkpoint_loads_verified_on_every_path(model, fn, residence):
    path, manifest = model
    want = hf_load_file(str(path))
    if fn == "load_file":
        got = tensora.load_file(path, residence=residence, manifest=manifest)
    else:
        got = dict(tensora.weights_iterator(path, framework="np", residence=residence, manifest=manifest, budget=4096))
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].tobytes() == w.tobytes(), k


def test_safe_open_and_torch_verified_loads_of_a_clean_checkpoint(model):
    path, manifest = model
    want = hf_load_file(str(path))
    with tensora.safe_open(path, framework="pt", manifest=manifest) as f:
        for k in f.keys():
            assert f.get_tensor(k).numpy().tobytes() == want[k].tobytes(), k
            assert f.get_tensor(k).numpy().tobytes() == want[k].tobytes(), k  # a repeat: own memory
    got = tensora.load_file(path, framework="pt", manifest=manifest)
    assert all(isinstance(t, torch.Tensor) for t in got.values())


@pytest.mark.parametrize("fn,residence", EVERY_LOAD)
def test_a_flipped_byte_in_any_tensor_raises_naming_it_before_it_is_returned(model, fn, residence):
    path, manifest = model
    clean = path.read_bytes()
    for name, (_, n) in offsets(path).items():
        if n == 0:
            continue
        path.write_bytes(clean)
        offset = flip_inside(path, name)
        yielded = []
        with pytest.raises(tensora.VerifyError) as e:
            if fn == "load_file":
                tensora.load_file(path, residence=residence, manifest=manifest)
            else:
                for k, _ in tensora.weights_iterator(
                    path, framework="np", residence=residence, manifest=manifest, budget=4096
                ):
                    yielded.append(k)
        assert_names(e, path, name, offset)
        assert name not in yielded, "the bad tensor was yielded"


def test_safe_open_checks_each_tensor_before_returning_it(model):
    path, manifest = model
    offset = flip_inside(path, "float32.1")
    with tensora.safe_open(path, manifest=manifest) as f:
        assert f.get_tensor("float32.0").shape  # the others are fine
        with pytest.raises(tensora.VerifyError) as e:
            f.get_tensor("float32.1")
        assert_names(e, path, "float32.1", offset)
        with pytest.raises(tensora.VerifyError):
            f.get_tensor("float32.1")  # again: still refused (the bytes were never handed out)
        with pytest.raises(tensora.VerifyError):
            f.get_slice("float32.1")[0:1]  # a slice checks the whole tensor
    collect()


def test_manifests_that_cannot_be_used_are_verify_errors(model, tmp_path):
    path, manifest = model
    with pytest.raises(tensora.VerifyError):
        tensora.load_file(path, manifest=tmp_path / "absent.json")
    doc = json.loads(manifest.read_text())
    del doc["tensors"]["int8.0"]
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(doc))
    for call in (
        lambda: tensora.load_file(path, manifest=partial),
        lambda: list(tensora.weights_iterator(path, manifest=partial)),
        lambda: tensora.safe_open(path, manifest=partial),
    ):
        with pytest.raises(tensora.VerifyError, match="int8.0.*not in the manifest"):
            call()


def test_a_manifest_in_sha256_works_too(model, tmp_path):
    path, _ = model
    manifest = tmp_path / "sha.json"
    tensora.hash(path, "sha256", write_manifest=manifest)
    assert len(tensora.load_file(path, manifest=manifest)) == len(offsets(path))
    offset = flip_inside(path, "int64.1")
    with pytest.raises(tensora.VerifyError) as e:
        tensora.load_file(path, manifest=manifest)
    assert_names(e, path, "int64.1", offset)
