"""Arrays keep their memory alive, free it when the last one goes, and never write to the file."""

import numpy as np
from safetensors.numpy import load_file as hf_load_file

import tensora
from tensora import _native
from conftest import collect, file_sha256


def test_load_file_arrays_outlive_the_dict_and_free_with_the_last(every_dtype_file):
    collect()
    base = _native.owners_live()
    d = tensora.load_file(every_dtype_file)
    assert _native.owners_live() == base + 1
    keep = d["float32.0"]
    want = hf_load_file(str(every_dtype_file))["float32.0"]
    del d
    collect()
    assert _native.owners_live() == base + 1, "one live array keeps the whole load"
    assert keep.tobytes() == want.tobytes()
    view = keep[1:3]
    del keep
    collect()
    assert _native.owners_live() == base + 1, "a view of a view still holds it"
    assert view.tobytes() == want[1:3].tobytes()
    del view
    collect()
    assert _native.owners_live() == base


def test_safe_open_arrays_outlive_the_context(every_dtype_file):
    collect()
    base = _native.owners_live()
    with tensora.safe_open(every_dtype_file) as f:
        a = f.get_tensor("int32.1")
        s = f.get_slice("float64.0")[1:2]
    collect()
    # get_tensor keeps the file's mapping; a slice of one dimension is memory of its own (the
    # buffer its bytes were read into), not the mapping.
    assert _native.owners_live() == base + 2, "the file's mapping and the slice's own buffer"
    want = hf_load_file(str(every_dtype_file))
    assert a.tobytes() == want["int32.1"].tobytes()
    assert s.tobytes() == want["float64.0"][1:2].tobytes()
    del a, s
    collect()
    assert _native.owners_live() == base


def test_weights_iterator_chunks_free_with_their_last_tensor(every_dtype_file):
    collect()
    base = _native.owners_live()
    # A 1-byte budget puts every tensor in a chunk (an arena) of its own.
    kept = dict(tensora.weights_iterator(every_dtype_file, framework="np", budget=1))
    collect()
    assert _native.owners_live() == base + len(kept)
    kept.popitem()
    collect()
    assert _native.owners_live() == base + len(kept)
    kept.clear()
    collect()
    assert _native.owners_live() == base
    # A large budget loads everything as one chunk, alive while any of its tensors is.
    kept = dict(tensora.weights_iterator(every_dtype_file, framework="np", budget=1 << 30))
    collect()
    assert _native.owners_live() == base + 1
    last = kept.popitem()
    kept.clear()
    collect()
    assert _native.owners_live() == base + 1
    del last
    collect()
    assert _native.owners_live() == base


def test_writing_into_arrays_leaves_the_file_unchanged(every_dtype_file):
    before = file_sha256(every_dtype_file)
    with tensora.safe_open(every_dtype_file) as f:
        a = f.get_tensor("uint8.0")
        assert a.flags.writeable
        a[...] = 0xAB  # copy-on-write: private to this process
        again = f.get_tensor("uint8.0")
        assert not (again == 0xAB).all(), "each get_tensor is independent (HF semantics)"
    loaded = tensora.load_file(every_dtype_file)
    for arr in loaded.values():
        if arr.size:
            arr.reshape(-1)[0] = arr.reshape(-1)[-1]
    assert file_sha256(every_dtype_file) == before
    fresh = hf_load_file(str(every_dtype_file))["uint8.0"]
    assert not (fresh == 0xAB).all()
    with tensora.safe_open(every_dtype_file) as f:
        assert f.get_tensor("uint8.0").tobytes() == fresh.tobytes(), "a new mapping sees the file"


def test_buffers_are_writable_through_the_buffer_protocol(every_dtype_file):
    data = _native.load(str(every_dtype_file), ["uint8.1"], "auto", None)[0]["uint8.1"]
    mv = memoryview(data)
    assert not mv.readonly and mv.nbytes == data.nbytes
    mv[0] = 7
    assert np.frombuffer(data, dtype=np.uint8)[0] == 7
