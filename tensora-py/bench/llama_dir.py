"""A transformers model directory over a Llama-shaped checkpoint, for the `from_pretrained` cells.

The bench's checkpoints are tensors only. `model_dir(path)` makes (once per checkpoint, untimed) a
directory holding symbolic links to the checkpoint's files and a `config.json` read off the
tensors' shapes (Llama layout, 64-wide attention heads), so `AutoModelForCausalLM.from_pretrained`
loads the very files the other cells read: evicting them from the page cache makes this cell cold.
"""

import hashlib
import json
import os
import re
import tempfile

HEAD_DIM = 64
LAYER_NORM = re.compile(r"^model\.layers\.(\d+)\.input_layernorm\.weight$")
TORCH_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}


def llama_config(tensors):
    """`config.json` for the tensors `{name: (dtype, shape)}` of a Llama-shaped checkpoint; raises
    ValueError naming what is missing otherwise."""

    def shape(name):
        if name not in tensors:
            raise ValueError(f"not a Llama-shaped checkpoint: no tensor {name!r}")
        return tensors[name][1]

    vocab, hidden = shape("model.embed_tokens.weight")
    layers = sum(1 for n in tensors if LAYER_NORM.match(n))
    if layers == 0 or hidden % HEAD_DIM:
        raise ValueError(f"not a Llama-shaped checkpoint: {layers} layers, hidden size {hidden}")
    dtype = tensors["model.embed_tokens.weight"][0]
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"no torch dtype for {dtype}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": shape("model.layers.0.mlp.gate_proj.weight")[0],
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // HEAD_DIM,
        "num_key_value_heads": shape("model.layers.0.self_attn.k_proj.weight")[0] // HEAD_DIM,
        "head_dim": HEAD_DIM,
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "torch_dtype": TORCH_DTYPES[dtype],
        "dtype": TORCH_DTYPES[dtype],
    }


def model_dir(path):
    """The model directory over the checkpoint at `path` (a directory of shards with their index,
    or one file); made under the temporary directory, reused while the checkpoint is unchanged."""
    import tensora

    info = tensora.inspect(path)
    tensors = {t["name"]: (t["dtype"], t["shape"]) for t in info["tensors"]}
    config = llama_config(tensors)
    files = [f["path"] for f in info["files"]]
    index = os.path.join(path, "model.safetensors.index.json") if os.path.isdir(path) else None
    links = files + ([index] if index and os.path.exists(index) else [])
    key = hashlib.sha256(json.dumps([os.path.abspath(p) for p in links] + [config]).encode()).hexdigest()[:16]
    out = os.path.join(tempfile.gettempdir(), f"tensora-bench-llama-{key}")
    if not os.path.exists(os.path.join(out, "config.json")):
        os.makedirs(out, exist_ok=True)
        for p in links:
            dst = os.path.join(out, os.path.basename(p) if len(files) > 1 or p == index else "model.safetensors")
            if not os.path.lexists(dst):
                os.symlink(os.path.abspath(p), dst)
        with open(os.path.join(out, "config.json.tmp"), "w") as f:
            json.dump(config, f)
        os.replace(os.path.join(out, "config.json.tmp"), os.path.join(out, "config.json"))
    return out, config["dtype"]
