//! Per-tensor digests, manifests, integrity checks and cross-backend verification.
//!
//! - [`digest`]: [`Algo`] (crc32c, xxh3-128, sha256) and the streaming [`Hasher`]. A tensor's
//!   digest covers exactly its `nbytes` raw stored bytes.
//! - [`fused`]: digests computed inside a `tensora_io` load, on the worker that completed each
//!   read, while its bytes are hot in cache (crc32c combines the pieces; no second pass over
//!   memory), and the cross-backend check.
//! - [`hash`]: one digest per tensor of a checkpoint, through a fused load.
//! - [`pieces`]: digests of bytes as a writer hands them out piece by piece (a save's manifest
//!   in the same pass as its writes).
//! - [`manifest`]: the JSON manifest (digests, file sizes, format), read with a size limit and
//!   written atomically.
//! - [`scan`]: the integrity scan, reading every file once to its end and digesting tensors from
//!   the same bytes.
//! - [`check`]: `verify`, collecting every finding (structure, integrity, digests, warnings).
//! - [`verified`]: verified loads: every tensor checked against a manifest as it lands, inside
//!   any load (`LoadOptions` hooks), before it is handed out.
//!
//! Nothing here writes to a checkpoint, and a manifest is never trusted beyond its checked size.
//!
//! ```
//! use std::path::Path;
//! use tensora_verify::{Algo, Manifest, check, hash};
//!
//! let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny"));
//! let ckpt = tensora_verify::open_checkpoint(dir)?;
//! let digests = hash::hash_checkpoint(&ckpt, &hash::HashOptions::default())?;
//! let manifest = Manifest::from_checkpoint(&ckpt, Algo::Crc32c, &digests)?;
//!
//! let opts = check::VerifyOptions { manifest: Some(&manifest), ..Default::default() };
//! let report = check::verify_checkpoint(&ckpt, &opts);
//! assert!(report.is_clean());
//! assert!(report.summary_line().starts_with("OK"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
pub mod digest;
pub mod fused;
pub mod hash;
mod header_fields;
pub mod manifest;
pub mod pieces;
pub mod scan;
pub mod verified;

use std::path::Path;

pub use digest::{Algo, BadDigest, Digest, Hasher, UnknownAlgo};
pub use manifest::{Manifest, ManifestError, ManifestFile, ManifestTensor};

/// Open a checkpoint of any supported layout (see [`tensora_format::open`]).
pub fn open_checkpoint(path: &Path) -> Result<tensora_format::Checkpoint, tensora_format::Error> {
    tensora_format::open(path)
}
