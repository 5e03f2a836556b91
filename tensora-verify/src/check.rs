//! `verify`: structure, file integrity, digests against a manifest, and (through a caller-supplied
//! cross-checker) agreement between backends. The result is a list of [`Finding`]s, every one of
//! them, not only the first.
//!
//! # What is collected when parsing fails
//!
//! The format parsers stop at their first error. When the checkpoint does not open, `verify`
//! reports that error and then checks what it still can, file by file:
//! - every `*.safetensors` file of a directory has its header parsed on its own, so a sharded
//!   checkpoint reports each broken shard (not only the first one the opener met);
//! - every file the manifest lists is checked for existence and size;
//! - a header that claims more bytes than the file holds is reported as truncation.
//!
//! When the checkpoint opens, the structure is valid by construction and the remaining checks
//! run: parser warnings, unknown header fields, misaligned tensors, the integrity scan
//! ([`crate::scan`]), the manifest comparison, and the cross-check.
//!
//! `verify` never changes data and never trusts a manifest beyond its checked size.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tensora_format::{Checkpoint, ErrorKind, Format};

use crate::digest::{Algo, Digest};
use crate::manifest::{Manifest, file_key};
use crate::scan::{FileProblem, Scan, ScanConfig};

/// Bound on directory entries examined when collecting per-file findings after a failed open.
pub const DIR_ENTRIES_MAX: usize = 100_000;

/// How bad a finding is. Any [`Severity::Error`] makes the check fail (exit 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Error,
}

impl Severity {
    pub const fn as_str(self) -> &'static str {
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
    Structure { path: PathBuf, tensor: Option<String>, message: String },
    /// The file is shorter than its header, its parse-time size or its manifest size.
    Truncated { path: PathBuf, expected_len_bytes: u64, actual_len_bytes: u64 },
    /// The file could not be opened or read.
    Unreadable { path: PathBuf, offset_bytes: Option<u64>, message: String },
    /// Fewer bytes are allocated to the file than its length needs: `sparse_bytes` of its length
    /// are not backed by storage. The file has holes (read back as zeros), or lives on a
    /// compressing filesystem (ZFS, btrfs) that stores it in fewer blocks. An error only when
    /// under half of the length is allocated (see [`Self::severity`]), a warning otherwise.
    Sparse { path: PathBuf, sparse_bytes: u64, len_bytes: u64, allocated_bytes: u64 },
    /// The file was modified or replaced while it was being checked.
    Changed { path: PathBuf, message: String },
    /// The file's size differs from the manifest's (and it is not shorter: see `Truncated`).
    SizeMismatch { path: PathBuf, manifest_len_bytes: u64, actual_len_bytes: u64 },
    /// A file the manifest lists is missing.
    FileMissing { path: PathBuf },
    /// A tensor's digest differs from the manifest's.
    DigestMismatch { tensor: String, path: PathBuf, offset_bytes: u64, expected: Digest, actual: Digest },
    /// A tensor's dtype or shape differs from the manifest's.
    MetaMismatch { tensor: String, expected: String, actual: String },
    /// The manifest lists a tensor the checkpoint lacks.
    TensorMissing { tensor: String },
    /// The checkpoint has a tensor the manifest does not list.
    TensorNotInManifest { tensor: String },
    /// Backend `backend` produced a different digest than the integrity scan.
    CrossCheckMismatch { tensor: String, backend: String, scan: Digest, backend_digest: Digest },
    /// Backend `backend` failed to load the checkpoint.
    BackendFailed { backend: String, message: String },
    /// A parser warning (e.g. `total_size` disagreement).
    ParserWarning { path: PathBuf, message: String },
    /// A safetensors tensor entry has a field other than dtype, shape and data_offsets.
    UnknownHeaderField { path: PathBuf, tensor: String, field: String },
    /// A tensor's absolute file offset is not a multiple of its element size: zero-copy typed
    /// views of a mapping of this file are impossible.
    Misaligned { tensor: String, path: PathBuf, offset_bytes: u64, align_bytes: u64 },
    /// A backend was skipped by the cross-check because it cannot run here.
    BackendUnavailable { backend: String, reason: String },
    /// A ServerlessLLM tensor whose strides are not row-major: some of its elements lie outside the
    /// `numel × itemsize` bytes from its offset that its digest covers (`digest_bytes` of its
    /// `storage_bytes`), so a digest match does not prove those elements intact.
    Strided { tensor: String, path: PathBuf, digest_bytes: u64, storage_bytes: u64 },
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
    pub severity: Severity,
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

/// The digests one backend produced, for [`VerifyOptions::cross_check`].
#[derive(Debug)]
pub struct BackendDigests {
    pub backend: String,
    /// `Ok(digest per tensor, in Checkpoint::tensors order)`, `Err(reason)` if the backend could
    /// not run here (a warning), or `Err` from a failed load (an error), told apart by `unavailable`.
    pub result: Result<Vec<Digest>, String>,
    /// The backend cannot run on this machine (probed): skipped with a warning.
    pub unavailable: bool,
}

/// Computes digests with every backend; see [`crate::fused::cross_check`].
pub type CrossChecker<'a> = &'a dyn Fn(&Checkpoint, Algo) -> Vec<BackendDigests>;

/// What to check.
#[derive(Clone, Copy, Default)]
pub struct VerifyOptions<'a> {
    /// Digests and sizes to compare with. Without one, digests are computed (proving every byte
    /// readable) but compared with nothing.
    pub manifest: Option<&'a Manifest>,
    /// Run every backend and compare its digests with the integrity scan's.
    pub cross_check: Option<CrossChecker<'a>>,
    /// The integrity scan's knobs. Its algorithm is replaced by the manifest's when there is one.
    pub scan: ScanConfig,
}

impl fmt::Debug for VerifyOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifyOptions")
            .field("manifest", &self.manifest.map(|m| m.tensors.len()))
            .field("cross_check", &self.cross_check.is_some())
            .field("scan", &self.scan)
            .finish()
    }
}

/// The outcome of a check.
#[derive(Debug, Clone)]
pub struct Report {
    pub path: PathBuf,
    pub format: Option<Format>,
    pub algo: Algo,
    pub findings: Vec<Finding>,
    pub files: usize,
    pub tensors: usize,
    /// Tensors whose digest was computed (and compared, when there is a manifest).
    pub tensors_digested: usize,
    pub bytes_scanned: u64,
    /// Backends whose digests were compared with the scan's.
    pub backends_checked: Vec<String>,
}

impl Report {
    pub fn errors(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error).count()
    }
    pub fn warnings(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Warning).count()
    }
    /// No errors (warnings allowed).
    pub fn is_clean(&self) -> bool {
        self.errors() == 0
    }

    /// One line: verdict and counts.
    pub fn summary_line(&self) -> String {
        let verdict = if self.is_clean() { "OK" } else { "FAILED" };
        let mut s = format!(
            "{verdict}: {} errors, {} warnings; {} file{}, {}/{} tensors digested ({}), {} bytes read",
            self.errors(),
            self.warnings(),
            self.files,
            if self.files == 1 { "" } else { "s" },
            self.tensors_digested,
            self.tensors,
            self.algo,
            self.bytes_scanned
        );
        if !self.backends_checked.is_empty() {
            s.push_str(&format!("; cross-checked {}", self.backends_checked.join(", ")));
        }
        s
    }

    /// `{"path", "ok", "errors", "warnings", "findings": [{"severity", "code", "message", "tensor"?}], "summary"}`.
    pub fn to_json(&self) -> Value {
        let findings: Vec<Value> = self
            .findings
            .iter()
            .map(|f| {
                let mut m = Map::new();
                m.insert("severity".into(), f.severity.as_str().into());
                m.insert("code".into(), f.kind.code().into());
                m.insert("message".into(), f.kind.to_string().into());
                if let Some(t) = f.kind.tensor() {
                    m.insert("tensor".into(), t.into());
                }
                Value::Object(m)
            })
            .collect();
        let mut m = Map::new();
        m.insert("path".into(), self.path.display().to_string().into());
        m.insert("format".into(), self.format.map(Format::as_str).into());
        m.insert("algo".into(), self.algo.as_str().into());
        m.insert("ok".into(), self.is_clean().into());
        m.insert("errors".into(), self.errors().into());
        m.insert("warnings".into(), self.warnings().into());
        m.insert("files".into(), self.files.into());
        m.insert("tensors".into(), self.tensors.into());
        m.insert("tensors_digested".into(), self.tensors_digested.into());
        m.insert("bytes_scanned".into(), self.bytes_scanned.into());
        m.insert("backends_checked".into(), self.backends_checked.clone().into());
        m.insert("findings".into(), Value::Array(findings));
        m.insert("summary".into(), self.summary_line().into());
        Value::Object(m)
    }
}

/// Open `path` and check it. A checkpoint that does not open still yields a report (see the
/// module docs for what is collected then).
///
/// ```
/// use tensora_verify::check::{verify_path, VerifyOptions};
///
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let report = verify_path(std::path::Path::new(dir), &VerifyOptions::default());
/// assert!(report.is_clean(), "{:?}", report.findings);
/// println!("{}", report.summary_line());
/// ```
pub fn verify_path(path: &Path, opts: &VerifyOptions<'_>) -> Report {
    match crate::open_checkpoint(path) {
        Ok(ckpt) => verify_checkpoint(&ckpt, opts),
        Err(e) => {
            let algo = opts.manifest.map_or(opts.scan.algo, |m| m.algo);
            let mut findings = partition_truncation(&e);
            if findings.is_empty() {
                findings.push(Finding::from(format_error_finding(&e)));
            }
            findings.extend(collect_after_failed_open(path, &e, opts.manifest));
            Report {
                path: path.to_path_buf(),
                format: None,
                algo,
                findings,
                files: 0,
                tensors: 0,
                tensors_digested: 0,
                bytes_scanned: 0,
                backends_checked: Vec::new(),
            }
        }
    }
}

/// Check an opened checkpoint: warnings, integrity scan, manifest, cross-check.
pub fn verify_checkpoint(ckpt: &Checkpoint, opts: &VerifyOptions<'_>) -> Report {
    let algo = opts.manifest.map_or(opts.scan.algo, |m| m.algo);
    let mut findings: Vec<Finding> = Vec::new();

    for w in ckpt.warnings() {
        findings.push(FindingKind::ParserWarning { path: w.path.clone(), message: w.message.clone() }.into());
    }
    if matches!(ckpt.format(), Format::Safetensors | Format::SafetensorsSharded) {
        for file in ckpt.files() {
            match crate::header_fields::unknown_fields(file.path()) {
                Ok(unknown) => findings.extend(unknown.into_iter().map(|(tensor, field)| {
                    Finding::from(FindingKind::UnknownHeaderField {
                        path: file.path().to_path_buf(),
                        tensor,
                        field,
                    })
                })),
                Err(e) => findings.push(
                    FindingKind::Unreadable {
                        path: file.path().to_path_buf(),
                        offset_bytes: Some(0),
                        message: e,
                    }
                    .into(),
                ),
            }
        }
    }
    for t in ckpt.tensors() {
        let align_bytes = t.dtype().align_bytes();
        if t.nbytes() > 0 && t.offset_bytes() % align_bytes != 0 {
            findings.push(
                FindingKind::Misaligned {
                    tensor: t.name().to_owned(),
                    path: ckpt.file(t.file()).path().to_path_buf(),
                    offset_bytes: t.offset_bytes(),
                    align_bytes,
                }
                .into(),
            );
        }
    }

    for t in ckpt.tensors() {
        if let Some(strides) = t.strides()
            && t.numel() > 0
            && !is_row_major(t.shape(), strides)
        {
            findings.push(
                FindingKind::Strided {
                    tensor: t.name().to_owned(),
                    path: ckpt.file(t.file()).path().to_path_buf(),
                    digest_bytes: t.nbytes(),
                    storage_bytes: t.len_bytes(),
                }
                .into(),
            );
        }
    }

    let scan_config = ScanConfig { algo, ..opts.scan };
    let scan = crate::scan::scan(ckpt, &scan_config);
    findings.extend(scan_findings(&scan));

    if let Some(m) = opts.manifest {
        let root = ckpt.root();
        findings.extend(manifest_findings(ckpt, &scan.digests, m, &|key| manifest_file_path(root, key)));
    }

    let mut backends_checked = Vec::new();
    if let Some(cross) = opts.cross_check {
        for b in cross(ckpt, algo) {
            match b.result {
                Ok(digests) => {
                    for ((t, scanned), got) in ckpt.tensors().iter().zip(&scan.digests).zip(&digests) {
                        if let Some(s) = scanned
                            && s != got
                        {
                            findings.push(
                                FindingKind::CrossCheckMismatch {
                                    tensor: t.name().to_owned(),
                                    backend: b.backend.clone(),
                                    scan: *s,
                                    backend_digest: *got,
                                }
                                .into(),
                            );
                        }
                    }
                    if digests.len() != ckpt.tensors().len() {
                        findings.push(
                            FindingKind::BackendFailed {
                                backend: b.backend.clone(),
                                message: format!(
                                    "{} digests for {} tensors",
                                    digests.len(),
                                    ckpt.tensors().len()
                                ),
                            }
                            .into(),
                        );
                    }
                    backends_checked.push(b.backend);
                }
                Err(reason) if b.unavailable => {
                    findings.push(FindingKind::BackendUnavailable { backend: b.backend, reason }.into());
                }
                Err(message) => {
                    findings.push(FindingKind::BackendFailed { backend: b.backend, message }.into())
                }
            }
        }
    }

    Report {
        path: ckpt.root().to_path_buf(),
        format: Some(ckpt.format()),
        algo,
        findings,
        files: ckpt.files().len(),
        tensors: ckpt.tensors().len(),
        tensors_digested: scan.digests.iter().filter(|d| d.is_some()).count(),
        bytes_scanned: scan.files.iter().map(|f| f.read_bytes).sum(),
        backends_checked,
    }
}

fn scan_findings(scan: &Scan) -> Vec<Finding> {
    let mut out = Vec::new();
    for f in &scan.files {
        let path = f.path.clone();
        match &f.problem {
            None => {}
            Some(FileProblem::Open(e)) => out.push(FindingKind::Unreadable {
                path: path.clone(),
                offset_bytes: None,
                message: e.to_string(),
            }),
            Some(FileProblem::Truncated { expected_len_bytes, actual_len_bytes }) => {
                out.push(FindingKind::Truncated {
                    path: path.clone(),
                    expected_len_bytes: *expected_len_bytes,
                    actual_len_bytes: *actual_len_bytes,
                })
            }
            Some(FileProblem::Read { offset_bytes, error }) => out.push(FindingKind::Unreadable {
                path: path.clone(),
                offset_bytes: Some(*offset_bytes),
                message: error.to_string(),
            }),
            Some(p @ FileProblem::Changed { .. }) => {
                out.push(FindingKind::Changed { path: path.clone(), message: p.to_string() })
            }
        }
        if let (Some(sparse_bytes), Some(allocated_bytes)) = (f.sparse_bytes(), f.allocated_bytes) {
            out.push(FindingKind::Sparse {
                path,
                sparse_bytes,
                len_bytes: f.expected_len_bytes,
                allocated_bytes,
            });
        }
    }
    out.into_iter().map(Finding::from).collect()
}

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

/// Whether `strides` (in elements) are the row-major strides of `shape`, so the tensor's elements
/// are exactly the `numel` consecutive elements from its offset. Dimensions of extent 1 may have
/// any stride (torch leaves them arbitrary); callers skip empty tensors.
fn is_row_major(shape: &[u64], strides: &[u64]) -> bool {
    let mut expected = 1u64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        let Some(next) = expected.checked_mul(d) else { return false };
        expected = next;
    }
    shape.len() == strides.len()
}

/// Where a manifest file key points, relative to the checkpoint root: inside it when the root is
/// a directory (whatever the format: a directory of one `*.safetensors` opens as
/// [`Format::Safetensors`] too), beside it when the root is a file.
fn manifest_file_path(root: &Path, key: &str) -> PathBuf {
    if root.is_dir() {
        root.join(key)
    } else {
        root.parent().map_or_else(|| PathBuf::from(key), |d| d.join(key))
    }
}

/// The finding for a parser error: truncation when the header claims more bytes than the file
/// holds, a structural finding otherwise.
fn format_error_finding(e: &tensora_format::Error) -> FindingKind {
    let path = e.path().to_path_buf();
    match e.kind() {
        ErrorKind::DataLenMismatch { end, data_len_bytes } if end > data_len_bytes => {
            // The file may have changed since the parse, and a crafted header can claim an end
            // near 2^64: every step is checked, and anything that does not add up is structural.
            let lens = file_len(&path).and_then(|len| {
                let header_bytes = len.checked_sub(*data_len_bytes)?;
                Some((header_bytes.checked_add(*end)?, header_bytes.checked_add(*data_len_bytes)?))
            });
            match lens {
                Some((expected_len_bytes, actual_len_bytes)) => {
                    FindingKind::Truncated { path, expected_len_bytes, actual_len_bytes }
                }
                None => FindingKind::Structure {
                    path,
                    tensor: e.tensor().map(str::to_owned),
                    message: format!("truncated: {}", e.kind()),
                },
            }
        }
        ErrorKind::HeaderBeyondFile { header_len_bytes, file_len_bytes } => FindingKind::Truncated {
            path,
            expected_len_bytes: header_len_bytes.saturating_add(8),
            actual_len_bytes: *file_len_bytes,
        },
        ErrorKind::Io(io) => FindingKind::Unreadable { path, offset_bytes: None, message: io.to_string() },
        kind => {
            FindingKind::Structure { path, tensor: e.tensor().map(str::to_owned), message: kind.to_string() }
        }
    }
}

/// A ServerlessLLM tensor outside its partition is most often a truncated partition: the
/// partitions shorter than the index needs, as truncation findings naming each one with its
/// expected and actual length (empty when the error is another one, or no partition is short).
fn partition_truncation(e: &tensora_format::Error) -> Vec<Finding> {
    if !matches!(e.kind(), ErrorKind::OutsidePartition { .. }) {
        return Vec::new();
    }
    let Some(dir) = e.path().parent() else { return Vec::new() };
    match tensora_format::sllm::partition_shortfalls(dir) {
        Ok(short) => short
            .into_iter()
            .map(|s| {
                Finding::from(FindingKind::Truncated {
                    path: s.path,
                    expected_len_bytes: s.expected_len_bytes,
                    actual_len_bytes: s.actual_len_bytes,
                })
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn file_len(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// After a failed open: per-file header checks of every `*.safetensors` in a directory, and the
/// manifest's file list (existence and size).
fn collect_after_failed_open(
    path: &Path,
    first: &tensora_format::Error,
    m: Option<&Manifest>,
) -> Vec<Finding> {
    let mut out: Vec<FindingKind> = Vec::new();
    let first_message = first.to_string();
    if path.is_dir() {
        let mut shards: Vec<PathBuf> = match std::fs::read_dir(path) {
            Ok(rd) => rd
                .take(DIR_ENTRIES_MAX)
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
                .collect(),
            Err(_) => Vec::new(),
        };
        shards.sort();
        for shard in shards {
            if let Err(e) = tensora_format::safetensors::read_header(&shard)
                && e.to_string() != first_message
            {
                out.push(format_error_finding(&e));
            }
        }
    }
    if let Some(m) = m {
        let base: PathBuf = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        for (key, mf) in &m.files {
            let p = base.join(key);
            match std::fs::metadata(&p) {
                Err(_) => out.push(FindingKind::FileMissing { path: p }),
                Ok(meta) if meta.len() < mf.len_bytes => {
                    let already =
                        out.iter().any(|k| matches!(k, FindingKind::Truncated { path, .. } if *path == p));
                    let first_is_this = matches!(format_error_finding(first), FindingKind::Truncated { path, .. } if path == p);
                    if !already && !first_is_this {
                        out.push(FindingKind::Truncated {
                            path: p,
                            expected_len_bytes: mf.len_bytes,
                            actual_len_bytes: meta.len(),
                        });
                    }
                }
                Ok(meta) if meta.len() != mf.len_bytes => out.push(FindingKind::SizeMismatch {
                    path: p,
                    manifest_len_bytes: mf.len_bytes,
                    actual_len_bytes: meta.len(),
                }),
                Ok(_) => {}
            }
        }
    }
    out.into_iter().map(Finding::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");

    fn tiny() -> Checkpoint {
        tensora_format::open(TINY).unwrap()
    }

    fn manifest_of(ckpt: &Checkpoint, algo: Algo) -> Manifest {
        let scan = crate::scan::scan(ckpt, &ScanConfig { algo, ..ScanConfig::default() });
        let digests: Vec<Digest> = scan.digests.into_iter().map(Option::unwrap).collect();
        Manifest::from_checkpoint(ckpt, algo, &digests).unwrap()
    }

    #[test]
    fn a_clean_checkpoint_with_its_manifest_has_no_findings() {
        let ckpt = tiny();
        let m = manifest_of(&ckpt, Algo::Sha256);
        let report = verify_checkpoint(&ckpt, &VerifyOptions { manifest: Some(&m), ..Default::default() });
        assert_eq!(report.findings, []);
        assert_eq!(report.algo, Algo::Sha256);
        assert_eq!(report.tensors_digested, ckpt.tensors().len());
        assert_eq!(report.bytes_scanned, ckpt.files().iter().map(|f| f.len_bytes()).sum::<u64>());
        let json = report.to_json();
        assert_eq!(json["ok"], true);
        assert_eq!(json["summary"], report.summary_line());
    }

    #[test]
    fn a_wrong_digest_names_tensor_file_and_offset() {
        let ckpt = tiny();
        let mut m = manifest_of(&ckpt, Algo::Crc32c);
        m.tensors.get_mut("q8").unwrap().digest = Algo::Crc32c.digest(b"not q8");
        let report = verify_checkpoint(&ckpt, &VerifyOptions { manifest: Some(&m), ..Default::default() });
        let t = ckpt.tensor("q8").unwrap();
        match report.findings.as_slice() {
            [
                Finding {
                    severity: Severity::Error,
                    kind: FindingKind::DigestMismatch { tensor, path, offset_bytes, .. },
                },
            ] => {
                assert_eq!(tensor, "q8");
                assert_eq!(path, ckpt.file(t.file()).path());
                assert_eq!(*offset_bytes, t.offset_bytes());
            }
            other => panic!("{other:?}"),
        }
        assert!(!report.is_clean());
        assert!(report.summary_line().starts_with("FAILED: 1 errors, 0 warnings"));
    }

    #[test]
    fn cross_check_results_become_findings() {
        let ckpt = tiny();
        let good = manifest_of(&ckpt, Algo::Crc32c);
        let digests: Vec<Digest> = ckpt.tensors().iter().map(|t| good.tensors[t.name()].digest).collect();
        let mut bad = digests.clone();
        let q8 = ckpt.tensor_index("q8").unwrap();
        bad[q8] = Algo::Crc32c.digest(b"x");
        let checker = move |_: &Checkpoint, _: Algo| {
            vec![
                BackendDigests { backend: "same".into(), result: Ok(digests.clone()), unavailable: false },
                BackendDigests { backend: "flaky".into(), result: Ok(bad.clone()), unavailable: false },
                BackendDigests { backend: "absent".into(), result: Err("no ring".into()), unavailable: true },
                BackendDigests { backend: "broken".into(), result: Err("EIO".into()), unavailable: false },
            ]
        };
        let report =
            verify_checkpoint(&ckpt, &VerifyOptions { cross_check: Some(&checker), ..Default::default() });
        let codes: Vec<(&str, Option<&str>)> =
            report.findings.iter().map(|f| (f.kind.code(), f.kind.tensor())).collect();
        assert_eq!(
            codes,
            [("cross-check-mismatch", Some("q8")), ("backend-unavailable", None), ("backend-failed", None)]
        );
        assert_eq!(report.backends_checked, ["same", "flaky"]);
        assert_eq!(report.errors(), 2);
        assert_eq!(report.warnings(), 1);
    }

    #[test]
    fn header_overrun_is_classified_as_truncation() {
        let e = tensora_format::Error::new(
            "/x.safetensors",
            ErrorKind::HeaderBeyondFile { header_len_bytes: 100, file_len_bytes: 50 },
        );
        assert_eq!(
            format_error_finding(&e),
            FindingKind::Truncated {
                path: "/x.safetensors".into(),
                expected_len_bytes: 108,
                actual_len_bytes: 50
            }
        );
        let e = tensora_format::Error::new("/x", ErrorKind::HeaderLenZero);
        assert!(matches!(format_error_finding(&e), FindingKind::Structure { .. }));
    }

    fn copy_tiny() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(TINY).unwrap() {
            let from = entry.unwrap().path();
            let to = dir.path().join(from.file_name().unwrap());
            std::fs::write(&to, std::fs::read(&from).unwrap()).unwrap();
        }
        dir
    }

    #[test]
    fn a_truncated_partition_is_reported_as_truncation_naming_it() {
        let dir = copy_tiny();
        let part = dir.path().join("tensor.data_2");
        let full_len = std::fs::metadata(&part).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&part).unwrap().set_len(1000).unwrap();
        let report = verify_path(dir.path(), &VerifyOptions::default());
        assert_eq!(
            report.findings,
            [Finding::from(FindingKind::Truncated {
                path: part,
                expected_len_bytes: full_len,
                actual_len_bytes: 1000
            })]
        );
        assert_eq!(report.findings[0].kind.code(), "truncated");
    }

    /// Writes a safetensors file with `header` and `data_len_bytes` zero bytes of data.
    fn raw_safetensors(path: &Path, header: &str, data_len_bytes: usize) {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + data_len_bytes, 0);
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn a_header_claiming_almost_two_to_the_64_bytes_gives_a_finding_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.safetensors");
        let n: u64 = 2_305_843_009_213_693_951; // 2^61 - 1: eight of them end at 2^64 - 8
        let entries: Vec<String> = (0..8u64)
            .map(|i| {
                format!(r#""t{i}":{{"dtype":"U8","shape":[{n}],"data_offsets":[{},{}]}}"#, i * n, (i + 1) * n)
            })
            .collect();
        raw_safetensors(&path, &format!("{{{}}}", entries.join(",")), 16);
        let report = verify_path(&path, &VerifyOptions::default());
        assert!(!report.is_clean());
        for f in &report.findings {
            if let FindingKind::Truncated { expected_len_bytes, actual_len_bytes, .. } = &f.kind {
                assert!(expected_len_bytes > actual_len_bytes, "{f}");
            }
        }
        // The same error against a file that shrank after the parse: the header length no longer
        // fits in the file, which is structural, not a subtraction below zero.
        let e = tensora_format::Error::new(
            &path,
            ErrorKind::DataLenMismatch { end: u64::MAX - 7, data_len_bytes: u64::MAX - 100 },
        );
        assert!(matches!(format_error_finding(&e), FindingKind::Structure { .. }));
        let e = tensora_format::Error::new(
            &path,
            ErrorKind::DataLenMismatch { end: u64::MAX - 7, data_len_bytes: 16 },
        );
        assert!(matches!(format_error_finding(&e), FindingKind::Structure { .. }));
    }

    #[test]
    fn manifest_file_keys_are_inside_a_directory_root_and_beside_a_file_root() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.safetensors");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(manifest_file_path(dir.path(), "model.safetensors"), file);
        assert_eq!(manifest_file_path(&file, "other.safetensors"), dir.path().join("other.safetensors"));
    }

    #[test]
    fn sparse_is_an_error_only_below_half_allocation() {
        let sparse = |allocated_bytes| FindingKind::Sparse {
            path: "/m".into(),
            sparse_bytes: 1000 - allocated_bytes,
            len_bytes: 1000,
            allocated_bytes,
        };
        assert_eq!(sparse(499).severity(), Severity::Error);
        assert_eq!(sparse(500).severity(), Severity::Warning);
        assert_eq!(sparse(900).severity(), Severity::Warning);
        let text = sparse(900).to_string();
        assert!(text.contains("900 of 1000 bytes allocated") && text.contains("compressing"), "{text}");
        assert!(sparse(0).to_string().contains("holes"));
    }

    #[test]
    fn row_major_strides_are_recognised() {
        assert!(is_row_major(&[2, 3], &[3, 1]));
        assert!(is_row_major(&[], &[]));
        assert!(is_row_major(&[1, 17], &[99, 1]), "extent-1 dimensions may have any stride");
        assert!(!is_row_major(&[4, 3], &[1, 4]));
        assert!(!is_row_major(&[2, 3], &[0, 1]));
        assert!(!is_row_major(&[2], &[1, 1]));
    }

    /// Element offsets (in elements) of every index of `shape`, in row-major index order.
    fn element_offsets(shape: &[u64], strides: &[u64]) -> Vec<u64> {
        let mut out = vec![0u64];
        for (&d, &st) in shape.iter().zip(strides) {
            out = out.iter().flat_map(|&base| (0..d).map(move |i| base + i * st)).collect();
        }
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        /// Row-major exactly when the elements are the first `numel` elements in order: then the
        /// digest of `numel × itemsize` bytes from the offset covers every element.
        #[test]
        fn row_major_means_the_elements_are_the_dense_prefix(
            dims in proptest::collection::vec((1u64..4, 0u64..13), 0..5)
        ) {
            let (shape, strides): (Vec<u64>, Vec<u64>) = dims.into_iter().unzip();
            let dense: Vec<u64> = (0..shape.iter().product::<u64>()).collect();
            proptest::prop_assert_eq!(
                is_row_major(&shape, &strides),
                element_offsets(&shape, &strides) == dense
            );
        }

        /// Sparse is an error exactly below half allocation, whatever the figures.
        #[test]
        fn sparse_severity_is_the_half_rule(len_bytes in 0u64..1 << 40, allocated_bytes in 0u64..1 << 40) {
            let k = FindingKind::Sparse {
                path: "/m".into(),
                sparse_bytes: len_bytes.saturating_sub(allocated_bytes),
                len_bytes,
                allocated_bytes,
            };
            let error = allocated_bytes < len_bytes / 2 + len_bytes % 2;
            proptest::prop_assert_eq!(k.severity() == Severity::Error, error);
        }
    }

    #[test]
    fn a_strided_tensor_gets_a_warning_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tensor_index.json"),
            r#"{"t": [0, 24, [2, 2], [1, 4], "torch.float32"]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("tensor.data_0"), [0u8; 24]).unwrap();
        let report = verify_path(dir.path(), &VerifyOptions::default());
        assert_eq!(report.errors(), 0, "{:?}", report.findings);
        let texts: Vec<String> = report.findings.iter().map(ToString::to_string).collect();
        assert_eq!(texts.len(), 1, "{texts:?}");
        assert!(texts[0].starts_with("warning: tensor \"t\""), "{texts:?}");
        assert!(texts[0].contains("strided: digest covers 16 of 24 storage bytes"), "{texts:?}");
    }

    #[test]
    fn a_path_that_does_not_open_still_gives_a_report() {
        let report = verify_path(Path::new("/nonexistent/model.safetensors"), &VerifyOptions::default());
        assert!(!report.is_clean());
        assert_eq!(report.findings.len(), 1);
        assert_eq!(report.findings[0].kind.code(), "unreadable");
        assert!(report.summary_line().starts_with("FAILED"));
    }
}
