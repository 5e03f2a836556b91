"""HF safetensors 0.8.0's own Python tests, run against Tensora by import substitution only.

The sdist is fetched from PyPI at test time (pinned URL and SHA-256 in ``hf_suite/expected.json``,
cached under ``target/hf-safetensors``; nothing of it is in the repository). Its torch and numpy
test files run in a child pytest with ``hf_suite/tensora_hf_shim.py`` loaded first, which points
``safetensors``, ``safetensors.torch`` and ``safetensors.numpy`` at ``tensora.safetensors``,
``tensora.torch`` and ``tensora.numpy``. Every test that does not pass is listed in
``hf_suite/expected.json`` with its reason: ``not_passing`` (deliberate differences, which must
fail, so the list stays true) and ``skipped_without_device`` (HF itself skips them where CUDA, MPS,
an NPU or an HPU is absent; where one is present they must pass). Any other test must pass.
"""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from conftest import TARGET

HERE = Path(__file__).resolve().parent / "hf_suite"
EXPECTED = json.loads((HERE / "expected.json").read_text())
DOWNLOAD_TIMEOUT_S = 120
SUITE_TIMEOUT_S = 900


def _sdist_tests() -> Path:
    """The sdist's ``bindings/python/tests`` directory, fetched and extracted once."""
    src = EXPECTED["sdist"]
    cache = TARGET / "hf-safetensors"
    tests = cache / "tests"
    stamp = cache / "extracted.sha256"
    if tests.is_dir() and stamp.exists() and stamp.read_text() == src["sha256"]:
        return tests
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / Path(src["url"]).name
    if not archive.exists() or hashlib.sha256(archive.read_bytes()).hexdigest() != src["sha256"]:
        part = archive.with_suffix(".part")
        with urllib.request.urlopen(src["url"], timeout=DOWNLOAD_TIMEOUT_S) as r, open(part, "wb") as out:
            out.write(r.read())
        assert hashlib.sha256(part.read_bytes()).hexdigest() == src["sha256"], "not the pinned sdist"
        part.replace(archive)
    prefix = src["tests_in_archive"].rstrip("/") + "/"
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            rel = member.name[len(prefix):]
            if not rel or rel.startswith("/") or ".." in Path(rel).parts:
                continue
            dest = tests / rel
            if member.isdir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(tar.extractfile(member).read())
    stamp.write_text(src["sha256"])
    return tests


def _outcomes(junit: Path) -> dict:
    """``{file::Class::test: "passed" | "failed" | "skipped"}`` from a JUnit report."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        # classname is "test_simple.TestCase" or "test_simple" (a function test).
        file = parts[0] + ".py"
        name = "::".join([file, *parts[1:], case.get("name")])
        if case.find("failure") is not None or case.find("error") is not None:
            out[name] = "failed"
        elif case.find("skipped") is not None:
            out[name] = "skipped"
        else:
            out[name] = "passed"
    return out


def test_hf_safetensors_suite_passes_against_tensora(tmp_path):
    tests = _sdist_tests()
    every = sorted(p.name for p in tests.glob("test_*.py"))
    assert sorted(EXPECTED["files"] + list(EXPECTED["not_run"])) == every, "a test file is neither run nor listed"
    junit = tmp_path / "hf.xml"
    (tests / "data").mkdir(exist_ok=True)  # the tests write ./tests/data/*.safetensors
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(tests)]))
    env.pop("TENSORA_PATCH_SAFETENSORS", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tensora_hf_shim", "-p", "no:cacheprovider", "-q",
         f"--junitxml={junit}", "--rootdir", str(tests), *[str(tests / f) for f in EXPECTED["files"]]],
        cwd=tests.parent, env=env, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S,
    )
    assert junit.exists(), run.stdout[-4000:] + run.stderr[-4000:]
    outcomes = _outcomes(junit)
    listed = EXPECTED["not_passing"]  # deliberate differences: must not pass
    device = EXPECTED["skipped_without_device"]  # HF skips them without the device: pass or skip
    unexpected = {
        k: v for k, v in outcomes.items()
        if v != "passed" and k not in listed and not (k in device and v == "skipped")
    }
    now_passing = [k for k in listed if outcomes.get(k) == "passed"]
    missing = [k for k in [*listed, *device] if k not in outcomes]
    passed = sum(v == "passed" for v in outcomes.values())
    summary = (f"{passed} of {len(outcomes)} HF tests pass against tensora "
               f"({sum(v == 'skipped' for v in outcomes.values())} skipped for want of a device, "
               f"{len(listed)} deliberate differences)")
    print(summary)
    assert not unexpected, f"{summary}; not passing and not listed: {unexpected}\n{run.stdout[-6000:]}"
    assert not now_passing, f"listed in hf_suite/expected.json but passing now: {now_passing}"
    assert not missing, f"listed in hf_suite/expected.json but not in the suite: {missing}"
    assert run.returncode == 0 or listed, run.stdout[-6000:]
