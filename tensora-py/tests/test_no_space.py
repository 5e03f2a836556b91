"""A full disk is tensora.NoSpaceError and leaves nothing behind: save_file (the previous file
kept) and save_sharded (no directory), on a 1 MiB tmpfs. Mounting needs root; where it fails, the
test fails if TENSORA_TEST_REQUIRE lists `mount` (CI) and is skipped otherwise (and a skip fails
the run unless TENSORA_PY_ALLOW_SKIPS=1, tests/conftest.py)."""

import os
import subprocess
import tempfile

import numpy as np
import pytest

import tensora

TMPFS_BYTES = 1 << 20


@pytest.fixture
def full_disk():
    """A fresh directory with a 1 MiB tmpfs mounted on it, unmounted afterwards."""
    d = tempfile.mkdtemp(prefix="tensora-no-space-")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", d],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        os.rmdir(d)
        why = f"cannot mount a tmpfs: {mounted.stderr.strip()}"
        required = [c.strip() for c in os.environ.get("TENSORA_TEST_REQUIRE", "").split(",")]
        if "mount" in required:
            pytest.fail(f"mount is required here (TENSORA_TEST_REQUIRE) but {why}")
        pytest.skip(why)
    try:
        yield d
    finally:
        subprocess.run(["umount", d], check=True)
        os.rmdir(d)


def test_a_full_disk_is_no_space_error_and_leaves_the_previous_file(full_disk):
    path = os.path.join(full_disk, "m.safetensors")
    tensora.save_file({"w": np.full(100 << 10, 3, dtype=np.uint8)}, path)
    with open(path, "rb") as f:
        before = f.read()
    with pytest.raises(tensora.NoSpaceError) as e:
        tensora.save_file({"w": np.full(2 << 20, 5, dtype=np.uint8)}, path)
    assert isinstance(e.value, tensora.TensoraError)
    assert "No space left on device" in str(e.value) or "ENOSPC" in str(e.value), str(e.value)
    with open(path, "rb") as f:
        assert f.read() == before
    assert os.listdir(full_disk) == ["m.safetensors"]


def test_a_full_disk_during_a_sharded_save_leaves_no_directory(full_disk):
    target = os.path.join(full_disk, "shards")
    with pytest.raises(tensora.NoSpaceError):
        tensora.save_sharded({f"w{i}": np.full(512 << 10, i, dtype=np.uint8) for i in range(4)}, target,
                             max_shard_size=512 << 10)
    assert os.listdir(full_disk) == []
