//! What the CLI's integration tests share: the fixture paths, running the built binary, and the
//! one-error-line check every failing command must pass. Each test binary uses part of it.
#![allow(dead_code)]

use std::process::{Command, Output};

/// The real HF-written checkpoints (with `*.expected.json`).
pub const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real");
/// The upstream-layout ServerlessLLM checkpoint.
pub const SLLM_TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");

/// Runs `tensora ARGS...` and collects its output.
pub fn tensora(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensora")).args(args).output().expect("run tensora")
}

/// Exit status 1 and exactly one stderr line, starting `error: `. Returns that line.
pub fn assert_one_error_line(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_owned()
}

/// A small Llama-shaped checkpoint's tensors (2.4 MB): embeddings, two layers (q/k/v/o,
/// gate/up/down, norms) and the head, F16 weights and F32 norms, with sizes that do not all divide
/// by 3 (so a TP=3 split is uneven, as `torch.chunk`). down_proj's rows are 6 KiB: a row-parallel
/// share read from the page cache skips gaps of 3 KiB and more, above what a request costs, so it
/// is read strided there, and covering from a store.
pub fn llama_specs() -> Vec<tensora_format::write::TensorSpec> {
    use tensora_format::Dtype;
    let (vocab, hidden, inter) = (96u64, 64u64, 3072u64);
    let mut specs = vec![("model.embed_tokens.weight".to_owned(), Dtype::F16, vec![vocab, hidden])];
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        specs.extend([
            (format!("{p}.input_layernorm.weight"), Dtype::F32, vec![hidden]),
            (format!("{p}.self_attn.q_proj.weight"), Dtype::F16, vec![hidden, hidden]),
            (format!("{p}.self_attn.k_proj.weight"), Dtype::F16, vec![hidden / 4, hidden]),
            (format!("{p}.self_attn.v_proj.weight"), Dtype::F16, vec![hidden / 4, hidden]),
            (format!("{p}.self_attn.o_proj.weight"), Dtype::F16, vec![hidden, hidden]),
            (format!("{p}.post_attention_layernorm.weight"), Dtype::F32, vec![hidden]),
            (format!("{p}.mlp.gate_proj.weight"), Dtype::F16, vec![inter, hidden]),
            (format!("{p}.mlp.up_proj.weight"), Dtype::F16, vec![inter, hidden]),
            (format!("{p}.mlp.down_proj.weight"), Dtype::F16, vec![hidden, inter]),
        ]);
    }
    specs.push(("model.norm.weight".to_owned(), Dtype::F32, vec![hidden]));
    specs.push(("lm_head.weight".to_owned(), Dtype::F16, vec![vocab, hidden]));
    specs
        .into_iter()
        .map(|(name, dtype, shape)| tensora_format::write::TensorSpec { name, dtype, shape })
        .collect()
}

/// [`llama_specs`] written to `dir` as HF writes a sharded checkpoint (shards of at most
/// `shard_bytes_max` data bytes and `model.safetensors.index.json`), every byte a function of
/// its tensor and position.
pub fn write_llama(dir: &std::path::Path, shard_bytes_max: u64) {
    let specs = llama_specs();
    let layout =
        tensora_format::write::ShardedLayout::new(specs.clone(), Default::default(), shard_bytes_max)
            .expect("layout");
    tensora_format::write::write_sharded(dir, &layout, |i, out: &mut dyn std::io::Write| {
        let len = specs[i].nbytes().expect("size") as usize;
        let bytes: Vec<u8> = (0..len).map(|k| ((k * 7 + i * 31) % 251) as u8).collect();
        out.write_all(&bytes)
    })
    .expect("write the checkpoint");
}
