//! Hash every tensor of a checkpoint.

use std::sync::Arc;

use tensora_format::Checkpoint;

use tensora_io::{BackendChoice, LoadOptions};

use crate::digest::{Algo, Digest};

/// Progress callback: `(bytes_done, bytes_total)`, from any thread.
pub type ProgressFn = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// What to hash with.
#[derive(Clone, Default)]
pub struct HashOptions {
    /// The digest algorithm.
    pub algo: Algo,
    /// Which backend runs the load (`auto` by default; parse names with `BackendChoice`'s
    /// `FromStr`).
    pub backend: BackendChoice,
    /// Told the load's progress; `None` for no reports.
    pub progress: Option<ProgressFn>,
}

impl std::fmt::Debug for HashOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashOptions")
            .field("algo", &self.algo)
            .field("backend", &self.backend)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// Why hashing failed.
#[derive(Debug, thiserror::Error)]
pub enum HashError {
    /// The load failed (a read error, a truncated file, a file changed under it, ...).
    #[error("{0}")]
    Load(#[from] tensora_io::LoadError),
    /// The load finished without delivering a tensor, so it has no digest.
    #[error("no digest for tensor {tensor:?}: {reason}")]
    Incomplete {
        /// The tensor without a digest.
        tensor: String,
        /// Why it has none.
        reason: String,
    },
}

/// One digest per tensor, in [`Checkpoint::tensors`] order.
///
/// ```
/// use tensora_verify::{Algo, {hash_checkpoint, HashOptions}};
///
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let ckpt = tensora_verify::open_checkpoint(std::path::Path::new(dir))?;
/// let digests = hash_checkpoint(&ckpt, &HashOptions { algo: Algo::Sha256, ..HashOptions::default() })?;
/// let empty = ckpt.tensor_index("empty").unwrap();
/// assert_eq!(digests[empty].to_hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn hash_checkpoint(ckpt: &Checkpoint, opts: &HashOptions) -> Result<Vec<Digest>, HashError> {
    let load = LoadOptions {
        backend: opts.backend.clone(),
        progress: opts.progress.clone(),
        ..LoadOptions::default()
    };
    crate::fused::hash_with_load(ckpt, opts.algo, &load).map(|(digests, _)| digests)
}

impl HashError {
    /// The load hit the end of a file before the end of a tensor: the file is truncated (as
    /// opposed to a read error or a digest mismatch).
    pub fn is_truncation(&self) -> bool {
        matches!(
            self,
            HashError::Load(tensora_io::LoadError::Read {
                kind: tensora_io::ReadErrorKind::UnexpectedEof { .. },
                ..
            })
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");

    #[test]
    fn every_backend_gives_the_digests_of_auto() {
        let ckpt = tensora_format::open(TINY).unwrap();
        let with = |backend: BackendChoice| HashOptions { backend, ..HashOptions::default() };
        let auto = hash_checkpoint(&ckpt, &with(BackendChoice::Auto)).unwrap();
        for name in tensora_io::registry::names() {
            let named = with(name.parse().unwrap());
            assert_eq!(hash_checkpoint(&ckpt, &named).unwrap(), auto, "{name}");
        }
    }
}
