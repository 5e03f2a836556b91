"""The bench runs every subject end to end (each in its own process) on a small file and writes its
JSON and markdown; a peer that fails or is missing fails this test (CI installs every peer)."""

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_load.py"
HOOK = BENCH.parent / "run_python_peers.sh"  # what `cargo xtask bench` calls
SUBJECTS = ["hf_numpy", "hf_torch", "runai", "fastsafetensors", "owned", "auto", "stream", "roofline", "device"]


def test_every_subject_runs_and_the_report_is_complete(tmp_path, big_file):
    """Through the hook `cargo xtask bench` calls, with this venv's Python."""
    out = tmp_path / "report.json"
    env = dict(os.environ, TENSORA_PY_VENV=str(Path(sys.executable).parents[1]))
    r = subprocess.run(
        ["bash", str(HOOK), str(big_file), str(out), "--runs", "1", "--warmups", "0", "--temps", "warm",
         "--timeout", "300"],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["bytes"] == 24 * 512 * 1024 * 4 and doc["subjects"] == SUBJECTS
    results = doc["temps"]["warm"]["results"]
    failed = {s: v["error"] for s, v in results.items() if "error" in v}
    assert not failed, failed
    for s in SUBJECTS:
        v = results[s]
        assert len(v["seconds"]) == 1 and 0 < v["gbps_min"] <= v["gbps_median"] <= v["gbps_max"], s
        assert v["x_roofline"] > 0, s
    assert results["auto"]["io_modes"] == ["mapped"], results["auto"]["report"]["reason"]
    assert results["owned"]["report"]["reason"].startswith("owned: residence"), results["owned"]["report"]
    assert all(v is not None for k, v in doc["acceptance"].items() if k.startswith("warm")), doc["acceptance"]
    assert doc["markdown"] in r.stdout


def test_the_breakdown_and_the_verification_cost_scripts_run(tmp_path, big_file):
    bench = BENCH.parent
    out = tmp_path / "breakdown.json"
    r = subprocess.run([sys.executable, str(bench / "auto_breakdown.py"), str(big_file), "--runs", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert results["tensora_auto"][0]["io_mode"] == "mapped" and results["tensora_auto"][0]["mappings"] == 1
    assert set(results) == {"hf_torch", "tensora_auto", "raw_lazy", "raw_populate_1_thread", "raw_populate_2_threads", "raw_map_populate"}
    r = subprocess.run([sys.executable, str(bench / "verify_cost.py"), str(big_file), "--runs", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("verified/plain") == 3, r.stdout


def test_the_xtask_hook_says_why_when_it_cannot_run(tmp_path, big_file):
    env = dict(os.environ, TENSORA_PY_VENV=str(tmp_path / "no-venv"), PYTHON="/bin/false")
    r = subprocess.run(["bash", str(HOOK), str(big_file), str(tmp_path / "x.json")], capture_output=True, text=True, env=env)
    assert r.returncode == 3 and r.stdout.startswith("python peers skipped: "), (r.returncode, r.stdout)


def test_the_model_subjects_run_once_a_round_and_print_one_row_each(tmp_path):
    """`--subjects from_pretrained,from_pretrained_tensora --with-models` (the form in the docs)
    names the model subjects twice: each still runs once a round and has one row in each table."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, tie_word_embeddings=False)
    ckpt = tmp_path / "llama"
    LlamaForCausalLM(cfg).to(torch.float16).save_pretrained(ckpt)
    out = tmp_path / "report.json"
    r = subprocess.run(
        [sys.executable, str(BENCH), str(ckpt), "--runs", "1", "--warmups", "0", "--temps", "warm",
         "--subjects", "from_pretrained,from_pretrained_tensora", "--with-models", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["subjects"] == ["from_pretrained", "from_pretrained_tensora"], doc["subjects"]
    results = doc["temps"]["warm"]["results"]
    for s in doc["subjects"]:
        assert "error" not in results[s], results[s]
        assert len(results[s]["seconds"]) == 1, (s, results[s]["seconds"])
        label = results[s]["label"]
        # one row in the text table and one in the markdown table
        assert sum(line.strip().startswith(label) for line in r.stdout.splitlines()) == 1, r.stdout
        assert sum(line.startswith(f"| {label} |") for line in r.stdout.splitlines()) == 1, r.stdout
    ratios = [k for k in doc["acceptance"] if "from_pretrained" in k]
    assert ratios == ["warm patched from_pretrained speed-up over unpatched (goal >= 1.0)"], doc["acceptance"]
    assert r.stdout.count("from_pretrained speed-up") == 1, r.stdout


def test_a_model_subject_imports_the_model_code_before_the_timer(tmp_path):
    """transformers imports a model's code at its first use (seconds): `prepare` does it untimed,
    so the from_pretrained cells time the load."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, tie_word_embeddings=False)
    ckpt = tmp_path / "llama"
    LlamaForCausalLM(cfg).to(torch.float16).save_pretrained(ckpt)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import bench_load; "
        "bench_load.prepare('from_pretrained', sys.argv[2]); "
        "print('transformers.models.llama.modeling_llama' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", probe, str(BENCH.parent), str(ckpt)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "True", r.stdout


def test_the_vllm_bench_can_evict_only_the_checkpoint(tmp_path):
    """`bench_vllm.py --evict checkpoint`: a cold sample drops the checkpoint's pages and leaves
    every other file's (a shared machine's other work keeps its cache); `--evict all` is
    `drop_caches`."""
    import argparse

    sys.path.insert(0, str(BENCH.parent))
    import bench_vllm
    from test_residence import _resident_fraction

    ckpt, other = tmp_path / "ckpt.bin", tmp_path / "other.bin"
    for p in (ckpt, other):
        p.write_bytes(os.urandom(1 << 20))
        p.read_bytes()
    assert _resident_fraction(ckpt) == 1.0 and _resident_fraction(other) == 1.0
    how = bench_vllm.evict(argparse.Namespace(evict="checkpoint"), [str(ckpt)])
    assert how.startswith("fadvise"), how
    assert _resident_fraction(ckpt) == 0.0
    assert _resident_fraction(other) == 1.0
    assert bench_vllm.stats([2.0, None, 1.0, 3.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3,
                                                       "values": [2.0, 1.0, 3.0]}


def test_the_share_plans_read_a_ranks_rows_exactly_or_their_covering_ranges(tmp_path):
    """bench_tp.py's share roofline: rank 0 of 2 under the Llama rules, each plan's requests against
    the slices torch.chunk gives, and both plans run end to end with O_DIRECT."""
    import numpy as np
    from safetensors.numpy import save_file

    sys.path.insert(0, str(BENCH.parent))
    import share_plans
    from bench_tp import split_dim

    rng = np.random.default_rng(3)
    tensors = {
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 96)).astype(np.float16),
        "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((64, 2048)).astype(np.float16),
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((8, 5633)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(96).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    plan, needed = share_plans.share(str(tmp_path), 0, 2, split_dim)
    want = {name: np.array_split(t, 2, axis=split_dim(name))[0] if split_dim(name) is not None else t
            for name, t in tensors.items()}
    # torch.chunk and array_split agree on these shapes (the first part is the larger one).
    assert needed == sum(t.nbytes for t in want.values())
    ((path, (whole, strided)),) = plan.items()
    import tensora

    at = {t["name"]: t["offset_bytes"] for t in tensora.inspect(str(tmp_path))["tensors"]}
    o, d = at["model.layers.0.self_attn.o_proj.weight"], at["model.layers.0.mlp.down_proj.weight"]
    assert sorted(strided) == sorted([(o, 64, 1024 * 2, 2048 * 2), (d, 8, 2817 * 4, 5633 * 4)])
    rows = share_plans.requests(plan, "rows", 512)
    covering = share_plans.requests(plan, "covering", 512)
    assert all(off % 512 == 0 and n % 512 == 0 for _, off, n in rows)
    assert all(off % 4096 == 0 and n % 4096 == 0 for _, off, n in covering)
    # Every row of both row-parallel slices is inside one request of its own in the rows plan ...
    for first, n_rows, width, stride in strided:
        for r in range(n_rows):
            at = first + r * stride
            assert any(off <= at and at + width <= off + n for _, off, n in rows)
    # ... and the covering plan reads fewer, larger requests, holding the other rank's columns too.
    assert len(covering) < len(rows) and sum(n for *_, n in covering) >= needed + 63 * 1024 * 2  # o_proj's gaps
    for kind, count in (("covering", len(covering)), ("rows", len(rows))):
        r = subprocess.run([sys.executable, str(BENCH.parent / "share_plans.py"), str(tmp_path), "0", "2", kind],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        assert doc["plan"] == kind and doc["requests"] == count and doc["needed_bytes"] == needed
        assert doc["seconds"] > 0 and doc["block_bytes"] in (512, 1024, 2048, 4096)
