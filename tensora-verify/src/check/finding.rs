//! [`FindingKind`]: every kind of finding, its code, severity and one-line message; [`Finding`]: a
//! kind with its severity.

use std::fmt;
use std::path::PathBuf;

use crate::digest::Digest;

/// How bad a finding is. Any [`Severity::Error`] makes the check fail (exit 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Worth a look, but the checkpoint still passes.
    Warning,
    /// The checkpoint fails the check.
    Error,
}

impl Severity {
    /// The spelling in messages and `--json` output: `"warning"` or `"error"`.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// What a finding is about. Each variant names the file and, where there is one, the tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FindingKind {
    /// A structural rule failed (the parser's error).
    Structure {
        /// The file (or directory) the parser refused.
        path: PathBuf,
        /// The tensor the rule is about, if any.
        tensor: Option<String>,
        /// The parser's message: which rule failed.
        message: String,
    },
    /// The file is shorter than its header, its parse-time size or its manifest size.
    Truncated {
        /// The short file.
        path: PathBuf,
        /// The length it should have.
        expected_len_bytes: u64,
        /// The length it has (or was read to).
        actual_len_bytes: u64,
    },
    /// The file could not be opened or read.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Where the failed read started; `None` when the file could not be opened.
        offset_bytes: Option<u64>,
        /// The I/O error's message.
        message: String,
    },
    /// Fewer bytes are allocated to the file than its length needs: `sparse_bytes` of its length
    /// are not backed by storage. The file has holes (read back as zeros), or lives on a
    /// compressing filesystem (ZFS, btrfs) that stores it in fewer blocks. An error only when
    /// under half of the length is allocated (see [`Self::severity`]), a warning otherwise.
    Sparse {
        /// The file.
        path: PathBuf,
        /// Bytes of its length (rounded down to whole blocks) not backed by storage.
        sparse_bytes: u64,
        /// Its length.
        len_bytes: u64,
        /// Bytes of storage allocated to it (`st_blocks × 512`).
        allocated_bytes: u64,
    },
    /// The file was modified or replaced while it was being checked.
    Changed {
        /// The file (or object URL).
        path: PathBuf,
        /// What changed, e.g. `modified or replaced during the check: size 10 -> 12`.
        message: String,
    },
    /// The file's size differs from the manifest's (and it is not shorter: see `Truncated`).
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// The size the manifest records.
        manifest_len_bytes: u64,
        /// The size it has.
        actual_len_bytes: u64,
    },
    /// A file the manifest lists is missing.
    FileMissing {
        /// Where the file should be.
        path: PathBuf,
    },
    /// A tensor's digest differs from the manifest's.
    DigestMismatch {
        /// The tensor.
        tensor: String,
        /// The file holding it.
        path: PathBuf,
        /// Its first byte in that file.
        offset_bytes: u64,
        /// The manifest's digest.
        expected: Digest,
        /// The digest of the bytes read.
        actual: Digest,
    },
    /// A tensor's dtype or shape differs from the manifest's.
    MetaMismatch {
        /// The tensor.
        tensor: String,
        /// The manifest's dtype and shape, e.g. `F32 [2, 3]`.
        expected: String,
        /// The checkpoint's dtype and shape.
        actual: String,
    },
    /// The manifest lists a tensor the checkpoint lacks.
    TensorMissing {
        /// The tensor the manifest names.
        tensor: String,
    },
    /// The checkpoint has a tensor the manifest does not list.
    TensorNotInManifest {
        /// The checkpoint's tensor.
        tensor: String,
    },
    /// Backend `backend` produced a different digest than the integrity scan.
    CrossCheckMismatch {
        /// The tensor.
        tensor: String,
        /// The backend's name.
        backend: String,
        /// The integrity scan's digest.
        scan: Digest,
        /// The backend's digest.
        backend_digest: Digest,
    },
    /// Backend `backend` failed to load the checkpoint.
    BackendFailed {
        /// The backend's name.
        backend: String,
        /// Why the load failed (or how many digests it gave).
        message: String,
    },
    /// A parser warning (e.g. `total_size` disagreement).
    ParserWarning {
        /// The file the warning is about.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A safetensors tensor entry has a field other than dtype, shape and data_offsets.
    UnknownHeaderField {
        /// The file.
        path: PathBuf,
        /// The tensor whose entry has the field.
        tensor: String,
        /// The field's name.
        field: String,
    },
    /// A tensor's absolute file offset is not a multiple of its element size: zero-copy typed
    /// views of a mapping of this file are impossible.
    Misaligned {
        /// The tensor.
        tensor: String,
        /// The file holding it.
        path: PathBuf,
        /// Its first byte in that file.
        offset_bytes: u64,
        /// The alignment its dtype needs.
        align_bytes: u64,
    },
    /// A backend was skipped by the cross-check because it cannot run here.
    BackendUnavailable {
        /// The backend's name.
        backend: String,
        /// Its probe's reason (e.g. no io_uring).
        reason: String,
    },
    /// A ServerlessLLM tensor whose strides are not row-major: some of its elements lie outside the
    /// `numel × itemsize` bytes from its offset that its digest covers (`digest_bytes` of its
    /// `storage_bytes`), so a digest match does not prove those elements intact.
    Strided {
        /// The tensor.
        tensor: String,
        /// The partition holding it.
        path: PathBuf,
        /// Bytes its digest covers: `numel × itemsize`.
        digest_bytes: u64,
        /// Bytes of storage the index records for it.
        storage_bytes: u64,
    },
}

impl FindingKind {
    /// Stable short code, used in `--json` output.
    pub const fn code(&self) -> &'static str {
        match self {
            FindingKind::Structure { .. } => "structure",
            FindingKind::Truncated { .. } => "truncated",
            FindingKind::Unreadable { .. } => "unreadable",
            FindingKind::Sparse { .. } => "sparse",
            FindingKind::Changed { .. } => "changed",
            FindingKind::SizeMismatch { .. } => "size-mismatch",
            FindingKind::FileMissing { .. } => "file-missing",
            FindingKind::DigestMismatch { .. } => "digest-mismatch",
            FindingKind::MetaMismatch { .. } => "meta-mismatch",
            FindingKind::TensorMissing { .. } => "tensor-missing",
            FindingKind::TensorNotInManifest { .. } => "tensor-not-in-manifest",
            FindingKind::CrossCheckMismatch { .. } => "cross-check-mismatch",
            FindingKind::BackendFailed { .. } => "backend-failed",
            FindingKind::ParserWarning { .. } => "parser-warning",
            FindingKind::UnknownHeaderField { .. } => "unknown-header-field",
            FindingKind::Misaligned { .. } => "misaligned",
            FindingKind::BackendUnavailable { .. } => "backend-unavailable",
            FindingKind::Strided { .. } => "strided",
        }
    }

    /// The severity of this finding.
    ///
    /// [`FindingKind::Sparse`] is an error only when fewer than half of the file's bytes are
    /// allocated. Allocation (`st_blocks`) is all this crate can see: finding the holes themselves
    /// takes `lseek(SEEK_HOLE)`, and `unsafe` is forbidden here. An interrupted download that
    /// preallocated its length by `ftruncate` has allocated little, while compression on ZFS or
    /// btrfs rarely saves more than half of model weights, whose bytes are near random: so below
    /// half is an error, anything else a warning that names the figures (the scan has read every
    /// byte either way, so digests still decide).
    pub const fn severity(&self) -> Severity {
        match self {
            FindingKind::Sparse { len_bytes, allocated_bytes, .. } => {
                if (*allocated_bytes).saturating_mul(2) < *len_bytes {
                    Severity::Error
                } else {
                    Severity::Warning
                }
            }
            FindingKind::ParserWarning { .. }
            | FindingKind::UnknownHeaderField { .. }
            | FindingKind::Misaligned { .. }
            | FindingKind::BackendUnavailable { .. }
            | FindingKind::Strided { .. } => Severity::Warning,
            _ => Severity::Error,
        }
    }

    /// The tensor the finding names, if any.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            FindingKind::Structure { tensor, .. } => tensor.as_deref(),
            FindingKind::DigestMismatch { tensor, .. }
            | FindingKind::MetaMismatch { tensor, .. }
            | FindingKind::TensorMissing { tensor }
            | FindingKind::TensorNotInManifest { tensor }
            | FindingKind::CrossCheckMismatch { tensor, .. }
            | FindingKind::UnknownHeaderField { tensor, .. }
            | FindingKind::Misaligned { tensor, .. }
            | FindingKind::Strided { tensor, .. } => Some(tensor),
            _ => None,
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FindingKind::Structure { path, tensor: Some(t), message } => {
                write!(f, "{}: tensor {t:?}: {message}", path.display())
            }
            FindingKind::Structure { path, tensor: None, message } => {
                write!(f, "{}: {message}", path.display())
            }
            FindingKind::Truncated { path, expected_len_bytes, actual_len_bytes } => write!(
                f,
                "{}: truncated: {actual_len_bytes} bytes, expected {expected_len_bytes} ({} missing)",
                path.display(),
                expected_len_bytes.saturating_sub(*actual_len_bytes)
            ),
            FindingKind::Unreadable { path, offset_bytes: Some(o), message } => {
                write!(f, "{}: unreadable at offset {o}: {message}", path.display())
            }
            FindingKind::Unreadable { path, offset_bytes: None, message } => {
                write!(f, "{}: unreadable: {message}", path.display())
            }
            FindingKind::Sparse { path, sparse_bytes, len_bytes, allocated_bytes } => {
                if self.severity() == Severity::Error {
                    write!(
                        f,
                        "{}: sparse: {sparse_bytes} bytes are holes (read back as zeros): {allocated_bytes} of \
                         {len_bytes} bytes allocated",
                        path.display()
                    )
                } else {
                    write!(
                        f,
                        "{}: sparse: {allocated_bytes} of {len_bytes} bytes allocated ({sparse_bytes} fewer): \
                         holes, or a compressing filesystem (ZFS, btrfs)",
                        path.display()
                    )
                }
            }
            FindingKind::Changed { path, message } => write!(f, "{}: {message}", path.display()),
            FindingKind::SizeMismatch { path, manifest_len_bytes, actual_len_bytes } => write!(
                f,
                "{}: size is {actual_len_bytes} bytes, manifest says {manifest_len_bytes}",
                path.display()
            ),
            FindingKind::FileMissing { path } => {
                write!(f, "{}: missing (listed in the manifest)", path.display())
            }
            FindingKind::DigestMismatch { tensor, path, offset_bytes, expected, actual } => write!(
                f,
                "tensor {tensor:?} ({} at offset {offset_bytes}): {} {actual} differs from the manifest's {expected}",
                path.display(),
                actual.algo()
            ),
            FindingKind::MetaMismatch { tensor, expected, actual } => {
                write!(f, "tensor {tensor:?}: is {actual}, manifest says {expected}")
            }
            FindingKind::TensorMissing { tensor } => {
                write!(f, "tensor {tensor:?}: listed in the manifest but not in the checkpoint")
            }
            FindingKind::TensorNotInManifest { tensor } => {
                write!(f, "tensor {tensor:?}: in the checkpoint but not in the manifest")
            }
            FindingKind::CrossCheckMismatch { tensor, backend, scan, backend_digest } => write!(
                f,
                "tensor {tensor:?}: backend {backend} read {backend_digest}, the integrity scan read {scan}"
            ),
            FindingKind::BackendFailed { backend, message } => write!(f, "backend {backend}: {message}"),
            FindingKind::ParserWarning { path, message } => write!(f, "{}: {message}", path.display()),
            FindingKind::UnknownHeaderField { path, tensor, field } => {
                write!(f, "{}: tensor {tensor:?}: unknown header field {field:?}", path.display())
            }
            FindingKind::Misaligned { tensor, path, offset_bytes, align_bytes } => write!(
                f,
                "tensor {tensor:?} ({} at offset {offset_bytes}): not aligned to its {align_bytes}-byte elements",
                path.display()
            ),
            FindingKind::BackendUnavailable { backend, reason } => {
                write!(f, "backend {backend} skipped: {reason}")
            }
            FindingKind::Strided { tensor, path, digest_bytes, storage_bytes } => write!(
                f,
                "tensor {tensor:?} ({}): strided: digest covers {digest_bytes} of {storage_bytes} storage bytes",
                path.display()
            ),
        }
    }
}

/// One finding: what and how bad.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How bad: [`FindingKind::severity`] of `kind`.
    pub severity: Severity,
    /// What was found.
    pub kind: FindingKind,
}

impl From<FindingKind> for Finding {
    fn from(kind: FindingKind) -> Finding {
        Finding { severity: kind.severity(), kind }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.severity.as_str(), self.kind)
    }
}
