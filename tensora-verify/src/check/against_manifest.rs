//! A checkpoint against its manifest: file sizes, missing files, and each tensor's dtype, shape
//! and digest.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tensora_format::Checkpoint;

use super::{Finding, FindingKind};
use crate::digest::Digest;
use crate::manifest::{Manifest, file_key};

/// `ckpt` against manifest `m`: file sizes (a shorter file is truncation, never reported as digest
/// mismatches), files the manifest names that the checkpoint lacks (`missing_path` turns a manifest
/// file key into the path to report), and each tensor's dtype, shape and digest (`digests` in
/// [`Checkpoint::tensors`] order; `None` for a tensor whose bytes could not be read), then tensors
/// missing from either side. Used by `verify` on local files and on remote checkpoints.
pub fn manifest_findings(
    ckpt: &Checkpoint,
    digests: &[Option<Digest>],
    m: &Manifest,
    missing_path: &dyn Fn(&str) -> PathBuf,
) -> Vec<Finding> {
    let mut out = Vec::new();
    // File sizes. A shorter file is truncation (never reported as digest mismatches: tensors of a
    // file with a problem have no digest).
    let mut seen_keys = BTreeSet::new();
    for f in ckpt.files() {
        let key = file_key(ckpt, f.path());
        if let Some(mf) = m.files.get(&key) {
            let actual = f.len_bytes();
            if actual < mf.len_bytes {
                out.push(FindingKind::Truncated {
                    path: f.path().to_path_buf(),
                    expected_len_bytes: mf.len_bytes,
                    actual_len_bytes: actual,
                });
            } else if actual != mf.len_bytes {
                out.push(FindingKind::SizeMismatch {
                    path: f.path().to_path_buf(),
                    manifest_len_bytes: mf.len_bytes,
                    actual_len_bytes: actual,
                });
            }
        }
        seen_keys.insert(key);
    }
    for key in m.files.keys() {
        if !seen_keys.contains(key) {
            out.push(FindingKind::FileMissing { path: missing_path(key) });
        }
    }
    // Tensors.
    for (t, d) in ckpt.tensors().iter().zip(digests) {
        let Some(mt) = m.tensors.get(t.name()) else {
            out.push(FindingKind::TensorNotInManifest { tensor: t.name().to_owned() });
            continue;
        };
        if mt.dtype != t.dtype().as_str() || mt.shape != t.shape() {
            out.push(FindingKind::MetaMismatch {
                tensor: t.name().to_owned(),
                expected: format!("{} {:?}", mt.dtype, mt.shape),
                actual: format!("{} {:?}", t.dtype(), t.shape()),
            });
        }
        if let Some(d) = d
            && *d != mt.digest
        {
            out.push(FindingKind::DigestMismatch {
                tensor: t.name().to_owned(),
                path: ckpt.file(t.file()).path().to_path_buf(),
                offset_bytes: t.offset_bytes(),
                expected: mt.digest,
                actual: *d,
            });
        }
    }
    for name in m.tensors.keys() {
        if ckpt.tensor(name).is_none() {
            out.push(FindingKind::TensorMissing { tensor: name.clone() });
        }
    }
    out.into_iter().map(Finding::from).collect()
}

/// Where a manifest file key points, relative to the checkpoint root: inside it when the root is
/// a directory (whatever the format: a directory of one `*.safetensors` opens as
/// [`Format::Safetensors`] too), beside it when the root is a file.
pub(super) fn manifest_file_path(root: &Path, key: &str) -> PathBuf {
    if root.is_dir() {
        root.join(key)
    } else {
        root.parent().map_or_else(|| PathBuf::from(key), |d| d.join(key))
    }
}
