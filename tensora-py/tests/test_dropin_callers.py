"""Real callers of ``safetensors`` loading through Tensora (``tensora.patch()``), unchanged:
transformers' ``from_pretrained`` on a sharded BF16 checkpoint, diffusers' ``load_state_dict``
(``safetensors.torch.load_file(f, device=...)``), PEFT's adapter loading and accelerate's
``load_checkpoint_in_model``. Each gives bit-identical tensors (and outputs) to HF's path, and
each is shown to have gone through Tensora (its native entry points are counted)."""

import contextlib
from collections import Counter

import pytest
import torch

import tensora
import tensora.torch as tt
from tensora import _native


@contextlib.contextmanager
def routed(monkeypatch):
    """``tensora.patch()`` for the block; yields a Counter of Tensora's native entry points used."""
    calls = Counter()
    real_load, real_mapped = _native.load, _native.Mapped

    def load(*a, **k):
        calls["load"] += 1
        return real_load(*a, **k)

    def mapped(*a, **k):
        calls["safe_open"] += 1
        return real_mapped(*a, **k)

    monkeypatch.setattr(_native, "load", load)
    monkeypatch.setattr(_native, "Mapped", mapped)
    tensora.patch()
    try:
        yield calls
    finally:
        tensora.unpatch()


def assert_same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].view(torch.uint8) if a[k].dtype == torch.bool else a[k], b[k]), k


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    tiny_llama().save_pretrained(path, max_shard_size="100KB")
    assert len(list(path.glob("model-*.safetensors"))) > 1, "the checkpoint should be sharded"
    return path


def test_transformers_from_pretrained_is_identical_with_and_without_patch(llama_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    ids = torch.arange(16).reshape(1, 16)
    plain = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.bfloat16).eval()
    with routed(monkeypatch) as calls:
        fast = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.bfloat16).eval()
    assert sum(calls.values()) > 0, "from_pretrained did not go through tensora"
    assert_same_state(plain.state_dict(), fast.state_dict())
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, fast(ids).logits)


def test_diffusers_load_state_dict_goes_through_tensora(llama_dir, monkeypatch):
    from diffusers.models.model_loading_utils import load_state_dict
    from safetensors.torch import load_file as hf_load_file

    shard = sorted(llama_dir.glob("model-*.safetensors"))[0]
    want = hf_load_file(shard, device="cpu")
    with routed(monkeypatch) as calls:
        got = load_state_dict(str(shard), map_location="cpu")
    assert calls["load"] == 1
    assert_same_state(got, want)


def test_peft_adapter_from_a_tensora_loaded_state_dict(tmp_path):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    cfg = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(1)
    trained = get_peft_model(tiny_llama(), cfg)
    adapter = get_peft_model_state_dict(trained)
    tt.save_file(adapter, tmp_path / "adapter_model.safetensors")
    fresh = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    result = set_peft_model_state_dict(fresh, tt.load_file(tmp_path / "adapter_model.safetensors", device="cpu"))
    assert not result.unexpected_keys
    assert_same_state(get_peft_model_state_dict(fresh), adapter)


def test_peft_load_peft_weights_goes_through_tensora(tmp_path, monkeypatch):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from peft.utils.save_and_load import load_peft_weights

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    model.save_pretrained(tmp_path)
    with routed(monkeypatch) as calls:
        got = load_peft_weights(str(tmp_path), device="cpu")
    assert calls["load"] == 1
    want = {k.replace(".default", ""): v for k, v in get_peft_model_state_dict(model).items()}
    assert_same_state(got, want)


def test_accelerate_load_checkpoint_in_model_is_identical(llama_dir, monkeypatch):
    from accelerate.utils import load_checkpoint_in_model

    plain = tiny_llama()
    load_checkpoint_in_model(plain, str(llama_dir))
    fast = tiny_llama()
    for p in fast.parameters():
        p.data.zero_()
    with routed(monkeypatch) as calls:
        load_checkpoint_in_model(fast, str(llama_dir))
    assert sum(calls.values()) > 0
    assert_same_state(plain.state_dict(), fast.state_dict())
