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
    /// Backend name: `auto` or one of `tensora_io::registry::names` (parsed as a
    /// `tensora_io::BackendChoice`); `None` chooses automatically.
    pub backend: Option<String>,
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
    /// [`HashOptions::backend`] names no backend of `tensora_io::registry`.
    #[error("unknown backend {name:?} (known: {known})")]
    UnknownBackend {
        /// The name as given.
        name: String,
        /// The registry's names, comma-separated.
        known: String,
    },
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
/// use tensora_verify::{Algo, hash::{hash_checkpoint, HashOptions}};
///
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let ckpt = tensora_verify::open_checkpoint(std::path::Path::new(dir))?;
/// let digests = hash_checkpoint(&ckpt, &HashOptions { algo: Algo::Sha256, ..HashOptions::default() })?;
/// let empty = ckpt.tensor_index("empty").unwrap();
/// assert_eq!(digests[empty].to_hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn hash_checkpoint(ckpt: &Checkpoint, opts: &HashOptions) -> Result<Vec<Digest>, HashError> {
    let backend = match &opts.backend {
        None => BackendChoice::Auto,
        // The one parser of backend names: `auto` or a registered name.
        Some(name) => name.parse::<BackendChoice>().map_err(|e| HashError::UnknownBackend {
            name: e.name,
            known: tensora_io::registry::names().join(", "),
        })?,
    };
    let load = LoadOptions { backend, progress: opts.progress.clone(), ..LoadOptions::default() };
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
    fn backend_names_are_parsed_as_a_load_parses_them() {
        let ckpt = tensora_format::open(TINY).unwrap();
        let with = |name: &str| HashOptions { backend: Some(name.to_owned()), ..HashOptions::default() };
        let auto = hash_checkpoint(&ckpt, &with("auto")).unwrap();
        assert_eq!(hash_checkpoint(&ckpt, &with("sync")).unwrap(), auto);
        match hash_checkpoint(&ckpt, &with("nope")) {
            Err(HashError::UnknownBackend { name, known }) => {
                assert_eq!(name, "nope");
                assert!(known.contains("sync"), "{known}");
            }
            other => panic!("expected UnknownBackend, got {other:?}"),
        }
    }
}
