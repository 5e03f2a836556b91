//! Tensor parallelism as a selection: which part of each tensor one rank of a group keeps
//! ([`TensorParallel`]), from rules that map name patterns to a split ([`TpRules`], with presets
//! for the Llama, Qwen, Mixtral and DeepSeek layouts).
//!
//! A split divides a dimension as `torch.chunk(world, dim)` does: every rank but the last ones gets
//! `ceil(size / world)` indexes; when `world` does not divide the size the last rank gets fewer, and
//! a rank past the end gets an empty tensor (`torch.chunk` then returns fewer than `world` chunks).
//! When `world` divides the size this is vLLM's `narrow(dim, rank × size / world, size / world)`.

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::select::SelectionError;
use crate::slice::{Slice, SliceError};
use crate::{Checkpoint, TensorInfo};

/// How a tensor is divided among the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// Column-parallel (vLLM's `ColumnParallelLinear`, vocabulary-parallel embeddings): dimension 0
    /// of the weight (the output features) is divided.
    Column,
    /// Row-parallel (`RowParallelLinear`): dimension 1 (the input features) is divided.
    Row,
    /// Every rank keeps the whole tensor.
    Replicated,
}

impl Split {
    /// The dimension divided, or `None` for [`Split::Replicated`].
    pub const fn dim(self) -> Option<usize> {
        match self {
            Split::Column => Some(0),
            Split::Row => Some(1),
            Split::Replicated => None,
        }
    }
}

/// Rules: the first pattern (a glob, as in [`Selection::Glob`](crate::Selection::Glob)) that
/// matches a tensor's name decides its split; a name no rule matches is replicated.
#[derive(Debug, Clone, Default)]
pub struct TpRules {
    rules: Vec<(String, Split)>,
}

/// The patterns of the Llama-style layout that every preset shares (q/k/v and gate/up column,
/// o/down row, embeddings and the head column as vLLM's vocabulary-parallel layers).
const LLAMA_RULES: [(&str, Split); 8] = [
    ("*.q_proj.weight", Split::Column),
    ("*.k_proj.weight", Split::Column),
    ("*.v_proj.weight", Split::Column),
    ("*.o_proj.weight", Split::Row),
    ("*.gate_proj.weight", Split::Column),
    ("*.up_proj.weight", Split::Column),
    ("*.down_proj.weight", Split::Row),
    ("*embed_tokens.weight", Split::Column),
];

impl TpRules {
    /// Rules from `(glob, split)` pairs, first match wins. Fails on a pattern that does not parse.
    pub fn new(rules: Vec<(String, Split)>) -> Result<TpRules, SelectionError> {
        for (pattern, _) in &rules {
            Glob::new(pattern).map_err(|e| SelectionError::BadGlob {
                pattern: pattern.clone(),
                reason: e.kind().to_string(),
            })?;
        }
        Ok(TpRules { rules })
    }

    /// A preset by name: `llama`, `qwen`, `mixtral` or `deepseek` (see [`TpRules::preset_names`]).
    pub fn preset(name: &str) -> Option<TpRules> {
        let mut rules: Vec<(&str, Split)> = LLAMA_RULES.to_vec();
        rules.push(("lm_head.weight", Split::Column));
        match name {
            "llama" => {}
            // Qwen2: q/k/v carry biases, divided as their weights.
            "qwen" => rules.extend([
                ("*.q_proj.bias", Split::Column),
                ("*.k_proj.bias", Split::Column),
                ("*.v_proj.bias", Split::Column),
            ]),
            // Mixtral's experts: w1 and w3 column, w2 row; the router (`gate`) is replicated.
            "mixtral" => rules.extend([
                ("*.experts.*.w1.weight", Split::Column),
                ("*.experts.*.w3.weight", Split::Column),
                ("*.experts.*.w2.weight", Split::Row),
            ]),
            // DeepSeek V2/V3 MLA: q_b_proj and kv_b_proj column; q_a_proj and kv_a_proj_with_mqa
            // (and their norms) replicated, as vLLM's `ReplicatedLinear`; experts as gate/up/down.
            "deepseek" => {
                rules.extend([("*.q_b_proj.weight", Split::Column), ("*.kv_b_proj.weight", Split::Column)])
            }
            _ => return None,
        }
        Some(TpRules { rules: rules.into_iter().map(|(p, s)| (p.to_owned(), s)).collect() })
    }

    /// The names [`TpRules::preset`] knows.
    pub const fn preset_names() -> &'static [&'static str] {
        &["llama", "qwen", "mixtral", "deepseek"]
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[(String, Split)] {
        &self.rules
    }

    fn compile(&self) -> Result<GlobSet, SelectionError> {
        let mut builder = GlobSetBuilder::new();
        for (pattern, _) in &self.rules {
            let glob = Glob::new(pattern).map_err(|e| SelectionError::BadGlob {
                pattern: pattern.clone(),
                reason: e.kind().to_string(),
            })?;
            builder.add(glob);
        }
        builder.build().map_err(|e| SelectionError::BadGlob { pattern: String::new(), reason: e.to_string() })
    }
}

/// Why a tensor-parallel selection was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TpError {
    /// `rank` is not below `world`, or `world` is 0.
    #[error(
        "tensor parallel rank {rank} of world {world}: the rank must be below the world size, which must be at least 1"
    )]
    Rank {
        /// The rank given.
        rank: u32,
        /// The world size given.
        world: u32,
    },
    /// A rule's pattern does not parse, or a slice names a tensor the checkpoint lacks.
    #[error(transparent)]
    Rules(#[from] SelectionError),
    /// A rule divides a dimension the tensor does not have (a row split of a 1-D bias).
    #[error(transparent)]
    Slice(#[from] SliceError),
}

/// One rank's part of a tensor-parallel group.
#[derive(Debug, Clone)]
pub struct TensorParallel {
    /// This rank, below `world`.
    pub rank: u32,
    /// The group's size.
    pub world: u32,
    /// Which tensors are divided along which dimension.
    pub rules: TpRules,
}

/// The part of a dimension of `size` indexes that `rank` of `world` keeps, as `torch.chunk`:
/// `(start, len)`. `world` must be at least 1.
pub fn chunk(size: u64, rank: u32, world: u32) -> (u64, u64) {
    let world = u64::from(world.max(1));
    let per_rank = size.div_ceil(world);
    let start = per_rank.saturating_mul(u64::from(rank)).min(size);
    (start, per_rank.min(size - start))
}

impl TensorParallel {
    /// The slice of each of `selected` (indexes into `ckpt`) that this rank keeps: `None` for a
    /// replicated tensor. Fails naming the tensor when a rule divides a dimension it lacks.
    ///
    /// ```
    /// use tensora_format::{TensorParallel, TpRules};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.safetensors");
    /// let ckpt = tensora_format::open(path)?;
    /// let all: Vec<usize> = (0..ckpt.tensors().len()).collect();
    /// let tp = TensorParallel { rank: 1, world: 2, rules: TpRules::preset("llama").unwrap() };
    /// let slices = tp.slices(&ckpt, &all)?;
    /// assert_eq!(slices.len(), all.len());
    /// let bad = TensorParallel { rank: 2, world: 2, rules: TpRules::default() };
    /// assert!(bad.slices(&ckpt, &all).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slices(&self, ckpt: &Checkpoint, selected: &[usize]) -> Result<Vec<Option<Slice>>, TpError> {
        if self.world == 0 || self.rank >= self.world {
            return Err(TpError::Rank { rank: self.rank, world: self.world });
        }
        let set = self.rules.compile()?;
        let mut hits = Vec::new();
        let mut out = Vec::with_capacity(selected.len());
        for &i in selected {
            let Some(t) = ckpt.tensors().get(i) else {
                out.push(None);
                continue;
            };
            set.matches_into(t.name(), &mut hits);
            let split = hits.iter().min().map_or(Split::Replicated, |&first| self.rules.rules[first].1);
            out.push(self.slice_of(t, split)?);
        }
        Ok(out)
    }

    /// This rank's slice of `t` under `split`, checked against the tensor.
    pub fn slice_of(&self, t: &TensorInfo, split: Split) -> Result<Option<Slice>, SliceError> {
        let Some(dim) = split.dim() else { return Ok(None) };
        let Some(&size) = t.shape().get(dim) else {
            return Err(SliceError::Dim { tensor: t.name().to_owned(), dim, rank: t.shape().len() });
        };
        let (start, len) = chunk(size, self.rank, self.world);
        let slice = Slice { dim, start, len };
        t.sliced(slice)?;
        Ok(Some(slice))
    }
}

/// What part of each selected tensor a load keeps: a rank's tensor-parallel share, or slices
/// named tensor by tensor (`safe_open(...).get_slice(name)[a:b]`).
#[derive(Debug, Clone)]
pub enum Shard {
    /// One rank's share under rules.
    TensorParallel(TensorParallel),
    /// These tensors narrowed as given; every other selected tensor whole.
    Slices(Vec<(String, Slice)>),
}

impl Shard {
    /// The slice of each of `selected` (indexes into `ckpt`): `None` keeps it whole. Every slice
    /// is checked against its tensor here, so a bad one fails before any read, naming the tensor;
    /// a name in [`Shard::Slices`] that the checkpoint lacks is [`SelectionError::UnknownNames`].
    pub fn slices(&self, ckpt: &Checkpoint, selected: &[usize]) -> Result<Vec<Option<Slice>>, TpError> {
        match self {
            Shard::TensorParallel(tp) => tp.slices(ckpt, selected),
            Shard::Slices(named) => {
                let mut by_index = std::collections::HashMap::with_capacity(named.len());
                let mut unknown = Vec::new();
                for (name, slice) in named {
                    match ckpt.tensor_index(name) {
                        Some(i) => {
                            ckpt.tensors()[i].sliced(*slice)?;
                            by_index.insert(i, *slice);
                        }
                        None => unknown.push(name.clone()),
                    }
                }
                if !unknown.is_empty() {
                    return Err(TpError::Rules(SelectionError::UnknownNames { names: unknown }));
                }
                Ok(selected.iter().map(|i| by_index.get(i).copied()).collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn uneven_splits_are_torch_chunk() {
        // torch.arange(10).chunk(4) -> sizes 3, 3, 3, 1; arange(5).chunk(4) -> 2, 2, 1 (no 4th).
        let parts: Vec<_> = (0..4).map(|r| chunk(10, r, 4)).collect();
        assert_eq!(parts, vec![(0, 3), (3, 3), (6, 3), (9, 1)]);
        let parts: Vec<_> = (0..4).map(|r| chunk(5, r, 4)).collect();
        assert_eq!(parts, vec![(0, 2), (2, 2), (4, 1), (5, 0)]);
        // Divisible: vLLM's narrow(dim, rank * size / world, size / world).
        assert_eq!(chunk(2048, 3, 4), (1536, 512));
    }

    #[test]
    fn presets_split_llama_names_and_bad_ranks_are_typed() {
        let rules = TpRules::preset("llama").unwrap();
        let set = rules.compile().unwrap();
        let split_of = |name: &str| {
            set.matches(name).into_iter().min().map_or(Split::Replicated, |i| rules.rules()[i].1)
        };
        assert_eq!(split_of("model.layers.3.self_attn.q_proj.weight"), Split::Column);
        assert_eq!(split_of("model.layers.3.self_attn.o_proj.weight"), Split::Row);
        assert_eq!(split_of("model.layers.3.mlp.down_proj.weight"), Split::Row);
        assert_eq!(split_of("model.embed_tokens.weight"), Split::Column);
        assert_eq!(split_of("model.layers.3.input_layernorm.weight"), Split::Replicated);
        for name in TpRules::preset_names() {
            assert!(TpRules::preset(name).is_some(), "{name}");
        }
        assert!(TpRules::preset("gpt2").is_none());
        let bad = TpRules::new(vec![("layers.[0-".into(), Split::Row)]).unwrap_err();
        assert!(matches!(bad, SelectionError::BadGlob { .. }));
        let t = TensorInfo::owned("b", crate::Dtype::F32, &[8], None, (crate::FileId(0), 0, 32));
        let tp = TensorParallel { rank: 0, world: 2, rules: TpRules::default() };
        assert_eq!(tp.slice_of(&t, Split::Column).unwrap(), Some(Slice { dim: 0, start: 0, len: 4 }));
        assert!(matches!(tp.slice_of(&t, Split::Row), Err(SliceError::Dim { dim: 1, .. })));
    }

    proptest! {
        /// The ranks' chunks tile the dimension in order, each at most ceil(size / world).
        #[test]
        fn chunks_tile_the_dimension(size in 0u64..10_000, world in 1u32..64) {
            let mut next = 0;
            for rank in 0..world {
                let (start, len) = chunk(size, rank, world);
                prop_assert_eq!(start, next);
                prop_assert!(len <= size.div_ceil(u64::from(world)));
                next = start + len;
            }
            prop_assert_eq!(next, size);
        }
    }
}
