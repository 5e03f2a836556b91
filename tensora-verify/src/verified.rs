//! Verified loads: every tensor's digest checked against a [`Manifest`] inside the load, as its
//! bytes land, before the tensor is handed out.
//!
//! [`ManifestCheck::install`] puts a [`DigestCollector`] (the fused digests: for crc32c each piece
//! is digested on the worker that landed it, while hot in cache) on a [`LoadOptions`] and compares
//! each tensor's digest with the manifest's in the `on_tensor` hook, which every load path
//! (owned, mapped, streaming, `load_runs`) runs before the tensor is complete. A mismatch stops
//! the load with [`LoadError::Callback`] whose source is a [`TensorMismatch`] naming the tensor,
//! its file and its offset ([`mismatch_of`] finds it): no `Loaded` comes back and no streaming
//! callback sees the tensor. Works with any backend and residence, local or remote.
//!
//! ```
//! use tensora_io::LoadOptions;
//! use tensora_verify::{Algo, HashOptions, Manifest, ManifestCheck, hash_checkpoint};
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.safetensors");
//! let ckpt = tensora_format::open(path)?;
//! let digests = hash_checkpoint(&ckpt, &HashOptions::default())?;
//! let manifest = Manifest::from_checkpoint(&ckpt, Algo::Crc32c, &digests)?;
//!
//! let mut opts = LoadOptions::default();
//! ManifestCheck::new(&ckpt, &manifest)?.install(&mut opts);
//! let loaded = tensora_io::load(&ckpt, &opts)?; // every tensor checked before this returns
//! assert_eq!(loaded.len(), ckpt.tensors().len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use tensora_format::Checkpoint;
use tensora_io::{BoxError, LoadError, LoadOptions, TensorRef};

use crate::digest::{Algo, Digest};
use crate::fused::DigestCollector;
use crate::manifest::Manifest;

/// A tensor whose bytes do not match the manifest: the error a verified load stops with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tensor {tensor:?} in {path} at offset {offset_bytes}: {} digest {} does not match the manifest's {}",
    expected.algo(), actual.to_hex(), expected.to_hex(), path = path.display()
)]
pub struct TensorMismatch {
    /// The tensor.
    pub tensor: String,
    /// The file holding it.
    pub path: PathBuf,
    /// Where its bytes start in that file.
    pub offset_bytes: u64,
    /// The manifest's digest.
    pub expected: Digest,
    /// The digest of the bytes loaded.
    pub actual: Digest,
}

/// Why a checkpoint cannot be checked against a manifest at all (found before any byte is read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestCheckError {
    /// A tensor of the checkpoint has no digest in the manifest, so it could not be verified.
    #[error("tensor {tensor:?} in {path} is not in the manifest", path = path.display())]
    NotInManifest {
        /// The tensor.
        tensor: String,
        /// Its file.
        path: PathBuf,
    },
    /// The manifest records another dtype or shape for a tensor.
    #[error("tensor {tensor:?} in {path}: the manifest says {expected}, the checkpoint has {actual}", path = path.display())]
    Meta {
        /// The tensor.
        tensor: String,
        /// Its file.
        path: PathBuf,
        /// `dtype [shape]` in the manifest.
        expected: String,
        /// `dtype [shape]` in the checkpoint.
        actual: String,
    },
}

/// The manifest's digests for one checkpoint (see the module docs). One check serves any number
/// of loads of its checkpoint: each [`ManifestCheck::install`] digests with a collector of its
/// own, so a load that failed leaves nothing behind for the next.
#[derive(Debug)]
pub struct ManifestCheck {
    /// Names, lengths and the algorithm; each install digests with a [`DigestCollector::fresh`]
    /// copy.
    collector: Arc<DigestCollector>,
    /// The manifest's digest of each tensor, in [`Checkpoint::tensors`] order.
    expected: Vec<Digest>,
    /// File and offset of each tensor, for the error.
    places: Vec<(PathBuf, u64)>,
}

impl ManifestCheck {
    /// A check of `ckpt` against `manifest`. Every tensor of `ckpt` must be in the manifest with
    /// the same dtype and shape (the manifest may describe more: the other shards of a model).
    pub fn new(ckpt: &Checkpoint, manifest: &Manifest) -> Result<Arc<ManifestCheck>, ManifestCheckError> {
        let mut expected = Vec::with_capacity(ckpt.tensors().len());
        let mut places = Vec::with_capacity(ckpt.tensors().len());
        for t in ckpt.tensors() {
            let path = ckpt.file(t.file()).path().to_path_buf();
            let Some(m) = manifest.tensors.get(t.name()) else {
                return Err(ManifestCheckError::NotInManifest { tensor: t.name().to_owned(), path });
            };
            if m.dtype != t.dtype().as_str() || m.shape != t.shape() {
                return Err(ManifestCheckError::Meta {
                    tensor: t.name().to_owned(),
                    path,
                    expected: format!("{} {:?}", m.dtype, m.shape),
                    actual: format!("{} {:?}", t.dtype(), t.shape()),
                });
            }
            expected.push(m.digest);
            places.push((path, t.offset_bytes()));
        }
        let collector = DigestCollector::new(ckpt, manifest.algo);
        Ok(Arc::new(ManifestCheck { collector, expected, places }))
    }

    /// The manifest's algorithm.
    pub fn algo(&self) -> Algo {
        self.collector.algo()
    }

    /// Install the check on `opts`: the collector's piece hook as `on_read` (crc32c), and an
    /// `on_tensor` hook that digests the tensor and compares it with the manifest, both run before
    /// any hook already there. A mismatch fails the load with a [`TensorMismatch`] source.
    pub fn install(self: &Arc<Self>, opts: &mut LoadOptions) {
        let me = Arc::clone(self);
        let collector = self.collector.fresh();
        let piece_hook = collector.read_hook();
        let check = move |t: &TensorRef<'_>| -> Result<(), BoxError> {
            let actual = collector.record_digest(t)?;
            me.compare(t.name(), actual)
        };
        opts.on_tensor = Some(match opts.on_tensor.take() {
            None => Arc::new(check),
            Some(user) => Arc::new(move |t: &TensorRef<'_>| {
                check(t)?;
                user(t)
            }),
        });
        if let Some(piece_hook) = piece_hook {
            opts.on_read = Some(match opts.on_read.take() {
                None => piece_hook,
                Some(user) => Arc::new(move |p: &tensora_io::PieceRef<'_>| {
                    piece_hook(p)?;
                    user(p)
                }),
            });
        }
    }

    /// Check one tensor's stored bytes (its first `nbytes` are digested; a ServerlessLLM storage
    /// may be longer), for callers that read tensors outside a load (`safe_open`).
    /// `tensor_index` is the tensor's index in [`Checkpoint::tensors`].
    pub fn check_bytes(&self, tensor_index: usize, bytes: &[u8]) -> Result<(), CheckBytesError> {
        let (Some((path, _)), Some(nbytes)) =
            (self.places.get(tensor_index), self.collector.nbytes(tensor_index))
        else {
            return Err(CheckBytesError::Unknown { tensor_index });
        };
        let name = self.collector.name_of(tensor_index).unwrap_or_default();
        let data = usize::try_from(nbytes).ok().and_then(|n| bytes.get(..n)).ok_or_else(|| {
            CheckBytesError::Short { tensor: name.to_owned(), path: path.clone(), len_bytes: bytes.len() }
        })?;
        let actual = self.algo().digest(data);
        self.compare_at(tensor_index, name, actual).map_err(CheckBytesError::Mismatch)
    }

    /// Compare a landed tensor's digest with the manifest's.
    fn compare(&self, name: &str, actual: Digest) -> Result<(), BoxError> {
        let i = self
            .collector
            .index_of(name)
            .ok_or_else(|| format!("tensor {name:?} is not in the checkpoint the check was made for"))?;
        self.compare_at(i, name, actual).map_err(|m| -> BoxError { m })
    }

    fn compare_at(&self, i: usize, name: &str, actual: Digest) -> Result<(), Box<TensorMismatch>> {
        let expected = self.expected[i];
        if expected == actual {
            return Ok(());
        }
        let (path, offset_bytes) = self.places[i].clone();
        Err(Box::new(TensorMismatch { tensor: name.to_owned(), path, offset_bytes, expected, actual }))
    }
}

/// Why [`ManifestCheck::check_bytes`] refused a tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckBytesError {
    /// The bytes do not match the manifest.
    #[error("{0}")]
    Mismatch(Box<TensorMismatch>),
    /// Fewer bytes than the tensor's `nbytes` were given.
    #[error("tensor {tensor:?} in {path}: only {len_bytes} bytes given", path = path.display())]
    Short {
        /// The tensor.
        tensor: String,
        /// Its file.
        path: PathBuf,
        /// The bytes given.
        len_bytes: usize,
    },
    /// No tensor has this index in the checkpoint the check was made for.
    #[error("no tensor {tensor_index} in the checkpoint the check was made for")]
    Unknown {
        /// The index given.
        tensor_index: usize,
    },
}

/// The [`TensorMismatch`] that stopped a verified load, if that is why it failed.
pub fn mismatch_of(e: &LoadError) -> Option<&TensorMismatch> {
    match e {
        LoadError::Callback { source, .. } => source.downcast_ref::<TensorMismatch>(),
        _ => None,
    }
}

/// Load `ckpt` with `opts` (owned or mapped, as `opts.residence` says), every tensor checked
/// against `manifest` as it lands ([`ManifestCheck`]); the load fails on the first mismatch.
pub fn load_verified(
    ckpt: &Checkpoint,
    manifest: &Manifest,
    opts: &LoadOptions,
) -> Result<tensora_io::Loaded, VerifiedLoadError> {
    let check = ManifestCheck::new(ckpt, manifest)?;
    let mut opts = opts.clone();
    check.install(&mut opts);
    Ok(tensora_io::load(ckpt, &opts)?)
}

/// Why [`load_verified`] failed.
#[derive(Debug, thiserror::Error)]
pub enum VerifiedLoadError {
    /// The manifest does not describe the checkpoint (nothing was read).
    #[error("{0}")]
    Manifest(#[from] ManifestCheckError),
    /// The load failed; [`mismatch_of`] says whether a tensor did not match the manifest.
    #[error("{0}")]
    Load(#[from] LoadError),
}
