//! The DeepSeek-V3-shaped checkpoint: real headers and a real index over sparse data files.
//!
//! The tensor names, dtypes and shapes follow DeepSeek-V3's safetensors release (MLA attention,
//! 3 dense layers then 58 MoE layers of 256 routed experts and one shared expert, fp8 weights
//! with their block scales), packed in file order into about 163 shards of ~4 GB. Only the
//! headers are written (a few MB in all); each file is then extended to its full size without
//! writing, so the data section is a hole that reads as zeros. Generated at run time, never
//! committed; reused when the marker beside it says the same generator wrote it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tensora_format::Dtype;
use tensora_format::write::{SafetensorsLayout, TensorSpec};

/// Bump when the generated files change.
pub const GENERATOR_VERSION: u32 = 1;
/// The fixture's directory name under the fixtures root.
pub const NAME: &str = "moe-deepseek-v3";
/// The index file's name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The marker that says which generator wrote the directory.
const MARKER_FILE: &str = ".tensora-bench-moe.json";
/// fp8 weights carry one f32 scale per block of this many rows and columns.
const SCALE_BLOCK: u64 = 128;

/// The dimensions of a DeepSeek-V3-like model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MoeShape {
    /// Decoder layers.
    pub layers: u32,
    /// The first layers, with a dense MLP instead of experts.
    pub dense_layers: u32,
    /// Routed experts per MoE layer.
    pub experts: u32,
    /// Model width.
    pub hidden: u64,
    /// Dense MLP width.
    pub intermediate: u64,
    /// Expert MLP width.
    pub moe_intermediate: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// MLA query compression rank.
    pub q_lora_rank: u64,
    /// MLA key/value compression rank.
    pub kv_lora_rank: u64,
    /// Attention heads.
    pub heads: u64,
    /// Per-head query/key width without rotary embedding.
    pub qk_nope: u64,
    /// Per-head rotary width.
    pub qk_rope: u64,
    /// Per-head value width.
    pub v_head: u64,
    /// Shards to pack the tensors into.
    pub shards: usize,
}

impl MoeShape {
    /// DeepSeek-V3 (671B): about 90,000 tensors in 163 shards, 673 GB.
    pub const DEEPSEEK_V3: MoeShape = MoeShape {
        layers: 61,
        dense_layers: 3,
        experts: 256,
        hidden: 7168,
        intermediate: 18432,
        moe_intermediate: 2048,
        vocab: 129_280,
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        heads: 128,
        qk_nope: 128,
        qk_rope: 64,
        v_head: 128,
        shards: 163,
    };

    /// The same structure, small (for tests): 4 layers of 8 experts.
    #[cfg(test)]
    pub const TINY: MoeShape = MoeShape {
        layers: 4,
        dense_layers: 1,
        experts: 8,
        hidden: 256,
        intermediate: 512,
        moe_intermediate: 128,
        vocab: 1000,
        q_lora_rank: 64,
        kv_lora_rank: 32,
        heads: 4,
        qk_nope: 16,
        qk_rope: 8,
        v_head: 16,
        shards: 5,
    };

    /// Every tensor, in file order.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut out = Vec::new();
        let h = self.hidden;
        out.push(spec("model.embed_tokens.weight", Dtype::BF16, &[self.vocab, h]));
        for l in 0..self.layers {
            let p = format!("model.layers.{l}.");
            out.push(spec(&format!("{p}input_layernorm.weight"), Dtype::BF16, &[h]));
            let attn = format!("{p}self_attn.");
            fp8_linear(&mut out, &format!("{attn}q_a_proj"), self.q_lora_rank, h);
            out.push(spec(&format!("{attn}q_a_layernorm.weight"), Dtype::BF16, &[self.q_lora_rank]));
            fp8_linear(
                &mut out,
                &format!("{attn}q_b_proj"),
                self.heads * (self.qk_nope + self.qk_rope),
                self.q_lora_rank,
            );
            fp8_linear(&mut out, &format!("{attn}kv_a_proj_with_mqa"), self.kv_lora_rank + self.qk_rope, h);
            out.push(spec(&format!("{attn}kv_a_layernorm.weight"), Dtype::BF16, &[self.kv_lora_rank]));
            fp8_linear(
                &mut out,
                &format!("{attn}kv_b_proj"),
                self.heads * (self.qk_nope + self.v_head),
                self.kv_lora_rank,
            );
            fp8_linear(&mut out, &format!("{attn}o_proj"), h, self.heads * self.v_head);
            out.push(spec(&format!("{p}post_attention_layernorm.weight"), Dtype::BF16, &[h]));
            if l < self.dense_layers {
                mlp(&mut out, &format!("{p}mlp."), self.intermediate, h);
                continue;
            }
            out.push(spec(&format!("{p}mlp.gate.weight"), Dtype::BF16, &[u64::from(self.experts), h]));
            out.push(spec(
                &format!("{p}mlp.gate.e_score_correction_bias"),
                Dtype::F32,
                &[u64::from(self.experts)],
            ));
            for e in 0..self.experts {
                mlp(&mut out, &format!("{p}mlp.experts.{e}."), self.moe_intermediate, h);
            }
            mlp(&mut out, &format!("{p}mlp.shared_experts."), self.moe_intermediate, h);
        }
        out.push(spec("model.norm.weight", Dtype::BF16, &[h]));
        out.push(spec("lm_head.weight", Dtype::BF16, &[self.vocab, h]));
        out
    }

    /// The selection of one expert of the first MoE layer (what an expert-parallel rank loads).
    pub fn one_expert_glob(&self) -> String {
        format!("model.layers.{}.mlp.experts.7.*", self.dense_layers)
    }

    /// The selection of the first MoE layer.
    pub fn one_layer_glob(&self) -> String {
        format!("model.layers.{}.*", self.dense_layers)
    }
}

fn spec(name: &str, dtype: Dtype, shape: &[u64]) -> TensorSpec {
    TensorSpec { name: name.to_owned(), dtype, shape: shape.to_vec() }
}

/// An fp8 weight `[out, inp]` and its f32 block scales.
fn fp8_linear(out: &mut Vec<TensorSpec>, prefix: &str, rows: u64, cols: u64) {
    out.push(spec(&format!("{prefix}.weight"), Dtype::F8E4M3, &[rows, cols]));
    out.push(spec(
        &format!("{prefix}.weight_scale_inv"),
        Dtype::F32,
        &[rows.div_ceil(SCALE_BLOCK), cols.div_ceil(SCALE_BLOCK)],
    ));
}

/// A gated MLP: gate and up `[width, hidden]`, down `[hidden, width]`.
fn mlp(out: &mut Vec<TensorSpec>, prefix: &str, width: u64, hidden: u64) {
    fp8_linear(out, &format!("{prefix}gate_proj"), width, hidden);
    fp8_linear(out, &format!("{prefix}up_proj"), width, hidden);
    fp8_linear(out, &format!("{prefix}down_proj"), hidden, width);
}

/// The generated checkpoint.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MoeFixture {
    /// The directory (what to open).
    pub dir: PathBuf,
    /// The shard files, in name order.
    pub files: Vec<PathBuf>,
    /// Number of tensors.
    pub tensors: usize,
    /// Sum of the shards' `8 + n` header bytes.
    pub header_bytes: u64,
    /// The index file's size.
    pub index_bytes: u64,
    /// Sum of the shards' sizes (almost all of it holes).
    pub files_len_bytes: u64,
    /// Whether this run wrote it (else it was reused).
    pub generated: bool,
}

/// Which shard each tensor goes to: tensors in file order, cut where the running byte count
/// crosses a multiple of `total / shards` (so shards are ~equal and never split a tensor).
fn pack(specs: &[TensorSpec], shards: usize) -> Vec<Vec<usize>> {
    let sizes: Vec<u64> = specs.iter().map(|s| s.nbytes().unwrap_or(0)).collect();
    let total: u64 = sizes.iter().sum();
    let per_shard = total.div_ceil(shards.max(1) as u64).max(1);
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); shards.max(1)];
    let mut before = 0u64;
    for (i, size) in sizes.iter().enumerate() {
        let k = usize::try_from(before / per_shard).unwrap_or(usize::MAX).min(groups.len() - 1);
        groups[k].push(i);
        before += size;
    }
    groups.retain(|g| !g.is_empty());
    groups
}

/// Generate the fixture under `root` (or reuse it when its marker matches).
pub fn ensure(root: &Path, shape: &MoeShape) -> Result<MoeFixture> {
    let dir = root.join(NAME);
    let marker = serde_json::json!({ "generator": GENERATOR_VERSION, "shape": shape }).to_string();
    let reuse = std::fs::read_to_string(dir.join(MARKER_FILE)).is_ok_and(|m| m == marker);
    if !reuse {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
        }
        generate(&dir, shape)?;
        crate::writer::write_text(&dir.join(MARKER_FILE), &marker)?;
    }
    describe(&dir, !reuse)
}

fn shard_name(k: usize, n: usize) -> String {
    format!("model-{:05}-of-{n:06}.safetensors", k + 1)
}

fn generate(dir: &Path, shape: &MoeShape) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let specs = shape.tensors();
    let groups = pack(&specs, shape.shards);
    let mut weight_map = BTreeMap::new();
    let mut total_size = 0u64;
    for (k, group) in groups.iter().enumerate() {
        let name = shard_name(k, groups.len());
        let shard_specs: Vec<TensorSpec> = group.iter().map(|&i| specs[i].clone()).collect();
        for s in &shard_specs {
            weight_map.insert(s.name.clone(), name.clone());
            total_size += s.nbytes().unwrap_or(0);
        }
        let meta = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
        let layout = SafetensorsLayout::new(shard_specs, meta).context("shard layout")?;
        let path = dir.join(&name);
        let mut file = std::fs::File::create(&path).with_context(|| format!("create {}", path.display()))?;
        file.write_all(layout.header_bytes())?;
        file.set_len(layout.file_len_bytes())?;
        if k == 0 {
            check_sparse(&path)?;
        }
    }
    let index = serde_json::json!({ "metadata": { "total_size": total_size }, "weight_map": weight_map });
    crate::writer::write_text(&dir.join(INDEX_FILE), &serde_json::to_string_pretty(&index)?)
}

/// Refuse to go on where the filesystem fills holes (it would write hundreds of GB).
fn check_sparse(path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    let allocated = meta.blocks().saturating_mul(512);
    if allocated > meta.len() / 2 {
        bail!(
            "{} is not sparse ({allocated} of {} bytes allocated): this filesystem fills holes",
            path.display(),
            meta.len()
        );
    }
    Ok(())
}

fn describe(dir: &Path, generated: bool) -> Result<MoeFixture> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let mut header_bytes = 0u64;
    let mut files_len_bytes = 0u64;
    let mut tensors = 0usize;
    for f in &files {
        let header = tensora_format::safetensors::read_header(f)?;
        header_bytes += header.data_start_bytes();
        files_len_bytes += header.file_len_bytes();
        tensors += header.len();
    }
    let index_bytes = std::fs::metadata(dir.join(INDEX_FILE))?.len();
    Ok(MoeFixture {
        dir: dir.to_path_buf(),
        files,
        tensors,
        header_bytes,
        index_bytes,
        files_len_bytes,
        generated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tiny_shape_opens_strictly_with_every_tensor() {
        let root = tempfile::tempdir().unwrap();
        let f = ensure(root.path(), &MoeShape::TINY).unwrap();
        assert!(f.generated);
        assert_eq!(f.tensors, MoeShape::TINY.tensors().len());
        assert_eq!(f.files.len(), MoeShape::TINY.shards);
        let ckpt = tensora_format::open(&f.dir).unwrap();
        assert_eq!(ckpt.tensors().len(), f.tensors);
        assert!(ckpt.warnings().is_empty(), "{:?}", ckpt.warnings());
        let expert =
            ckpt.select(&tensora_format::Selection::Glob(vec![MoeShape::TINY.one_expert_glob()])).unwrap();
        assert_eq!(expert.len(), 6);
        assert!(!ensure(root.path(), &MoeShape::TINY).unwrap().generated, "reused");
    }

    #[test]
    fn deepseek_v3_has_about_ninety_thousand_tensors() {
        let n = MoeShape::DEEPSEEK_V3.tensors().len();
        assert!((89_000..91_000).contains(&n), "{n}");
        let groups = pack(&MoeShape::DEEPSEEK_V3.tensors(), 163);
        assert_eq!(groups.len(), 163);
    }
}
