"""Tensor-parallel shares (load_file/weights_iterator tp=) and get_slice reading only a slice."""

import json
import os

import numpy as np
import pytest
import torch

import tensora
from tensora import _native
from tensora.numpy import save_file as np_save_file

LLAMA = {
    "model.embed_tokens.weight": (np.float16, (10, 4)),
    "model.layers.0.self_attn.q_proj.weight": (np.float32, (7, 6)),
    "model.layers.0.self_attn.o_proj.weight": (np.float32, (6, 7)),
    "model.layers.0.mlp.down_proj.weight": (np.float16, (4, 9)),
    "model.layers.0.input_layernorm.weight": (np.float32, (6,)),
}
SPLIT = {
    "model.embed_tokens.weight": 0,
    "model.layers.0.self_attn.q_proj.weight": 0,
    "model.layers.0.self_attn.o_proj.weight": 1,
    "model.layers.0.mlp.down_proj.weight": 1,
}


@pytest.fixture
def llama_file(tmp_path):
    rng = np.random.default_rng(5)
    tensors = {n: rng.standard_normal(shape).astype(dt) for n, (dt, shape) in LLAMA.items()}
    path = tmp_path / "model.safetensors"
    np_save_file(tensors, str(path))
    return path, {n: torch.from_numpy(t) for n, t in tensors.items()}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_each_rank_is_torch_chunk_of_the_whole_tensor(llama_file, world):
    path, whole = llama_file
    for rank in range(world):
        got, report = tensora.load_file_with_report(path, framework="pt", tp=(rank, world))
        assert set(got) == set(whole)
        for name, t in whole.items():
            dim = SPLIT.get(name)
            if dim is None:
                want = t
            else:
                chunks = t.chunk(world, dim)
                want = chunks[rank] if rank < len(chunks) else t.narrow(dim, 0, 0)
            assert got[name].shape == want.shape, (name, rank, world)
            assert torch.equal(got[name], want.contiguous()), (name, rank, world)
        assert report["bytes_selected"] == sum(v.numel() * v.element_size() for v in got.values())
        slices = report["slices"]
        assert slices["contiguous"] + slices["strided"] + slices["covering"] == len(whole)


def test_rules_as_pairs_and_bad_arguments(llama_file):
    path, whole = llama_file
    rules = [("*.q_proj.weight", "row"), ("*embed_tokens*", 0), ("*", None)]
    got = tensora.load_file(path, framework="pt", tp=(1, 2), rules=rules)
    q = whole["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(got["model.layers.0.self_attn.q_proj.weight"], q.chunk(2, 1)[1].contiguous())
    assert torch.equal(got["model.layers.0.self_attn.o_proj.weight"], whole["model.layers.0.self_attn.o_proj.weight"])
    with pytest.raises(ValueError, match="below the world size"):
        tensora.load_file(path, tp=(2, 2))
    with pytest.raises(ValueError, match="preset"):
        tensora.load_file(path, tp=(0, 2), rules="gpt9")
    with pytest.raises(ValueError, match="only with tp"):
        tensora.load_file(path, rules="llama")
    with pytest.raises(tensora.LoadError, match="input_layernorm"):
        tensora.load_file(path, tp=(0, 2), rules=[("*layernorm*", "row")])


def test_weights_iterator_yields_the_share_in_file_order(llama_file):
    path, _ = llama_file
    want = tensora.load_file(path, framework="pt", tp=(1, 3))
    items = list(tensora.weights_iterator(path, framework="pt", tp=(1, 3)))
    assert [n for n, _ in items] == [n for n in _native.Mapped(str(path)).offset_keys()]
    for name, t in items:
        assert torch.equal(t, want[name])


def test_get_slice_of_one_dimension_reads_only_the_slice(tmp_path):
    rng = np.random.default_rng(9)
    full = rng.standard_normal((64, 16384)).astype(np.float32)  # 64 rows of 64 KiB
    path = tmp_path / "w.safetensors"
    np_save_file({"w": full}, str(path))
    with tensora.safe_open(path) as f:
        s = f.get_slice("w")
        for index in [np.s_[8:16], np.s_[:, 2048:4096], np.s_[:, -5:], np.s_[3:3], np.s_[...], np.s_[:, 1:2, ...]]:
            assert s[index].tobytes() == np.ascontiguousarray(full[index]).tobytes(), index
        # Two dimensions, or a step: the lazy view, still the right values.
        assert s[1:3, 4:9].tobytes() == np.ascontiguousarray(full[1:3, 4:9]).tobytes()
        assert s[::2].tobytes() == np.ascontiguousarray(full[::2]).tobytes()
        data, report = f._m().slice("w", 1, 2048, 2048)
        report = json.loads(report)
    slice_bytes = 64 * 2048 * 4
    assert report["bytes_selected"] == slice_bytes
    # Rows 56 KiB apart: read row by row, each widened at most to its 4 KiB blocks.
    assert report["slices"]["strided"] == 1, report
    assert slice_bytes <= report["bytes_read"] <= slice_bytes + 64 * 2 * 4096, report


def test_a_cold_strided_share_reports_the_gaps_the_device_reads_along(tmp_path):
    """A row-parallel F16 [128, 6144] weight at TP=3, cold, read through the page cache by the
    sync backend: the rank's rows of 4096 bytes are copied one by one (strided) while the 8 KiB
    gaps between them are advised to the device along with them; the report dict counts those
    gaps in ``bytes_advised_beyond_reads`` (not in ``bytes_read``): the gaps the helper advised,
    whole ones, at most the 127 (a row the copies reach first is not advised)."""
    w = np.random.default_rng(7).standard_normal((128, 6144)).astype(np.float16)
    path = tmp_path / "w.safetensors"
    np_save_file({"w": w}, str(path))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    got, report = tensora.load_file_with_report(path, framework="pt", backend="sync", tp=(0, 3), rules=[("w", "row")])
    assert torch.equal(got["w"], torch.from_numpy(w).chunk(3, 1)[0].contiguous())
    assert report["slices"]["strided"] == 1, report
    assert report["bytes_read"] == 128 * 4096, report
    advised = report["bytes_advised_beyond_reads"]
    assert advised <= 127 * 8192 and advised % 8192 == 0, report
