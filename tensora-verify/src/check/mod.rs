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

mod against_manifest;
mod failed_open;
mod finding;
mod report;

use std::fmt;
use std::path::Path;

use tensora_format::{Checkpoint, Format};

use self::against_manifest::manifest_file_path;
pub use self::against_manifest::manifest_findings;
use self::failed_open::{collect_after_failed_open, format_error_finding, partition_truncation};
pub use self::finding::{Finding, FindingKind, Severity};
pub use self::report::Report;
use crate::digest::{Algo, Digest};
use crate::manifest::Manifest;
use crate::scan::{FileProblem, Scan, ScanConfig};

/// Bound on directory entries examined when collecting per-file findings after a failed open.
pub const DIR_ENTRIES_MAX: usize = 100_000;

/// The digests one backend produced, for [`VerifyOptions::cross_check`].
#[derive(Debug)]
pub struct BackendDigests {
    /// The backend's name, as `tensora_io::registry` spells it.
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

/// Open `path` and check it. A checkpoint that does not open still yields a report (see the
/// module docs for what is collected then).
///
/// ```
/// use tensora_verify::{verify_path, VerifyOptions};
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
    let mut findings = parser_findings(ckpt);
    findings.extend(tensor_layout_findings(ckpt));

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
            findings.extend(backend_findings(ckpt, &scan.digests, b, &mut backends_checked));
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

/// What the parser saw but did not refuse: its warnings, then, for safetensors, the fields of
/// tensor entries it skipped (each file's header is read again for them).
fn parser_findings(ckpt: &Checkpoint) -> Vec<Finding> {
    let mut findings: Vec<Finding> = ckpt
        .warnings()
        .iter()
        .map(|w| FindingKind::ParserWarning { path: w.path.clone(), message: w.message.clone() }.into())
        .collect();
    if matches!(ckpt.format(), Format::Safetensors | Format::SafetensorsSharded) {
        for file in ckpt.files() {
            let path = file.path().to_path_buf();
            match crate::header_fields::unknown_fields(file.path()) {
                Ok(unknown) => findings.extend(unknown.into_iter().map(|(tensor, field)| {
                    Finding::from(FindingKind::UnknownHeaderField { path: path.clone(), tensor, field })
                })),
                Err(e) => {
                    findings.push(FindingKind::Unreadable { path, offset_bytes: Some(0), message: e }.into())
                }
            }
        }
    }
    findings
}

/// Tensors whose placement defeats zero-copy views (misaligned for their element size), then
/// tensors whose strides put elements outside the bytes their digest covers.
fn tensor_layout_findings(ckpt: &Checkpoint) -> Vec<Finding> {
    let path_of = |t: &tensora_format::TensorInfo| ckpt.file(t.file()).path().to_path_buf();
    let misaligned = ckpt.tensors().iter().filter_map(|t| {
        let align_bytes = t.dtype().align_bytes();
        (t.nbytes() > 0 && t.offset_bytes() % align_bytes != 0).then(|| FindingKind::Misaligned {
            tensor: t.name().to_owned(),
            path: path_of(t),
            offset_bytes: t.offset_bytes(),
            align_bytes,
        })
    });
    let strided = ckpt.tensors().iter().filter_map(|t| {
        let strides = t.strides()?;
        (t.numel() > 0 && !is_row_major(t.shape(), strides)).then(|| FindingKind::Strided {
            tensor: t.name().to_owned(),
            path: path_of(t),
            digest_bytes: t.nbytes(),
            storage_bytes: t.len_bytes(),
        })
    });
    misaligned.chain(strided).map(Finding::from).collect()
}

/// One backend's cross-check: its digests against the scan's (`scanned`, `None` for tensors the
/// scan could not read), a wrong count, or why it did not run. A backend whose digests were
/// compared is added to `checked`.
fn backend_findings(
    ckpt: &Checkpoint,
    scanned: &[Option<Digest>],
    b: BackendDigests,
    checked: &mut Vec<String>,
) -> Vec<Finding> {
    let mut findings: Vec<Finding> = Vec::new();
    match b.result {
        Ok(digests) => {
            for ((t, scanned), got) in ckpt.tensors().iter().zip(scanned).zip(&digests) {
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
                let message = format!("{} digests for {} tensors", digests.len(), ckpt.tensors().len());
                findings.push(FindingKind::BackendFailed { backend: b.backend.clone(), message }.into());
            }
            checked.push(b.backend);
        }
        Err(reason) if b.unavailable => {
            findings.push(FindingKind::BackendUnavailable { backend: b.backend, reason }.into());
        }
        Err(message) => findings.push(FindingKind::BackendFailed { backend: b.backend, message }.into()),
    }
    findings
}

/// The problems the integrity scan found, one per file at most, and each sparse file.
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
            Some(p @ FileProblem::Changed(_)) => {
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

#[cfg(test)]
mod tests;
