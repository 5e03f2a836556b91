//! Per-tensor digests, manifests, integrity checks and cross-backend verification.
//!
//! The modules are private; everything public is listed once, at the bottom of this file.
//!
//! - `digest`: [`Algo`] (crc32c, xxh3-128, sha256) and the streaming [`Hasher`]. A tensor's
//!   digest covers exactly its `nbytes` raw stored bytes.
//! - `fused`: digests computed inside a `tensora_io` load, on the worker that completed each
//!   read, while its bytes are hot in cache (crc32c combines the pieces; no second pass over
//!   memory), and the cross-backend check.
//! - `hash`: one digest per tensor of a checkpoint, through a fused load.
//! - `pieces`: digests of bytes as a writer hands them out piece by piece (a save's manifest
//!   in the same pass as its writes).
//! - `manifest`: the JSON manifest (digests, file sizes, format), read with a size limit and
//!   written atomically.
//! - `scan`: the integrity scan, reading every file once to its end and digesting tensors from
//!   the same bytes.
//! - `check`: `verify`, collecting every finding (structure, integrity, digests, warnings).
//! - `verified`: verified loads: every tensor checked against a manifest as it lands, inside
//!   any load (`LoadOptions` hooks), before it is handed out.
//!
//! Nothing here writes to a checkpoint, and a manifest is never trusted beyond its checked size.
//!
//! ```
//! use std::path::Path;
//! use tensora_verify::{Algo, HashOptions, Manifest, VerifyOptions, hash_checkpoint, verify_checkpoint};
//!
//! let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny"));
//! let ckpt = tensora_verify::open_checkpoint(dir)?;
//! let digests = hash_checkpoint(&ckpt, &HashOptions::default())?;
//! let manifest = Manifest::from_checkpoint(&ckpt, Algo::Crc32c, &digests)?;
//!
//! let opts = VerifyOptions { manifest: Some(&manifest), ..Default::default() };
//! let report = verify_checkpoint(&ckpt, &opts);
//! assert!(report.is_clean());
//! assert!(report.summary_line().starts_with("OK"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod check;
mod digest;
mod fused;
mod hash;
mod header_fields;
mod manifest;
mod pieces;
mod scan;
mod verified;

use std::path::Path;

pub use check::{
    BackendDigests, CrossChecker, Finding, FindingKind, Report, Severity, VerifyOptions, manifest_findings,
    verify_checkpoint, verify_path,
};
pub use digest::{Algo, BadDigest, Digest, Hasher, UnknownAlgo, crc32c_combine};
pub use fused::{DigestCollector, DigestStats, cross_check, hash_with_load};
pub use hash::{HashError, HashOptions, ProgressFn, hash_checkpoint};
pub use manifest::{
    MANIFEST_LEN_BYTES_MAX, MANIFEST_RANK_MAX, Manifest, ManifestError, ManifestFile, ManifestTensor,
    file_key, write_atomic,
};
pub use pieces::PieceDigests;
pub use scan::{FileProblem, FileScan, Opener, Progress, ReadAt, Scan, ScanConfig, scan, scan_with};
pub use verified::{
    CheckBytesError, ManifestCheck, ManifestCheckError, TensorMismatch, VerifiedLoadError, load_verified,
    mismatch_of,
};

/// Open a checkpoint of any supported layout (see [`tensora_format::open`]).
pub fn open_checkpoint(path: &Path) -> Result<tensora_format::Checkpoint, tensora_format::Error> {
    tensora_format::open(path)
}
