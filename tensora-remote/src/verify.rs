//! Verifying a remote checkpoint: the library side of `tensora verify URL`, `tensora hash URL` and
//! Python's `tensora.verify(url, manifest=...)`. The CLI and the bindings only parse arguments and
//! print; the opening, the digests and the mapping of a [`RemoteError`] to a finding live here.
//!
//! A remote location is checked for structure (the checkpoint opens: every header and index valid,
//! every tensor inside its object) and, with a manifest, object sizes and tensor digests computed
//! on the workers of a streamed load (dtype, shape, digest, missing and extra tensors). The local
//! integrity scan (sparse files, readability to EOF, stamps) has no remote counterpart: every range
//! of the load is conditional on the object version seen at open instead.

use std::path::{Path, PathBuf};

use tensora_io::{LoadOptions, ProgressHook};
use tensora_verify::DigestCollector;
use tensora_verify::HashError;
use tensora_verify::{Algo, Digest, Manifest};
use tensora_verify::{FindingKind, Report};

use crate::{Location, RemoteCheckpoint, RemoteError, RemoteOptions, RemoteReport, open_remote};

/// Why [`digests`] gave no digests.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// The streamed load failed (the error names the object, offset and tensor where it can).
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The load ended without every tensor digested.
    #[error(transparent)]
    Digest(#[from] HashError),
}

/// One digest per tensor (in `Checkpoint::tensors` order), computed on the workers of a streamed
/// remote load as each tensor lands, so memory stays within the load's in-flight cap; and the
/// load's report.
pub fn digests(
    remote: &RemoteCheckpoint,
    algo: Algo,
    progress: Option<ProgressHook>,
) -> Result<(Vec<Digest>, RemoteReport), DigestError> {
    let ckpt = remote.checkpoint();
    let collector = DigestCollector::new(ckpt, algo);
    let mut opts = LoadOptions { progress, ..LoadOptions::default() };
    collector.install(&mut opts);
    let report = remote.load_streaming(&opts, |_| Ok(()))?;
    Ok((collector.finish(ckpt)?, report))
}

/// Verify the checkpoint at `location`: structure, then (with `manifest`) sizes and digests.
/// Never fails: what went wrong is a finding of the report (a missing object is `FileMissing`, a
/// bad header `Structure`, a replaced object `Changed`, a failed read `Unreadable` at its object
/// and offset). The report's path is the location, redacted as it prints.
pub fn verify(location: &Location, opts: &RemoteOptions, manifest: Option<&Manifest>) -> Report {
    let algo = manifest.map_or(Algo::default(), |m| m.algo);
    let url = PathBuf::from(location.to_string());
    let mut report = Report {
        path: url.clone(),
        format: None,
        algo,
        findings: Vec::new(),
        files: 0,
        tensors: 0,
        tensors_digested: 0,
        bytes_scanned: 0,
        backends_checked: Vec::new(),
    };
    let remote = match open_remote(location, opts) {
        Ok(r) => r,
        Err(e) => {
            report.findings.push(open_finding(&url, e).into());
            return report;
        }
    };
    let ckpt = remote.checkpoint();
    report.format = Some(ckpt.format());
    report.files = ckpt.files().len();
    report.tensors = ckpt.tensors().len();
    for w in ckpt.warnings() {
        report
            .findings
            .push(FindingKind::ParserWarning { path: w.path.clone(), message: w.message.clone() }.into());
    }
    let digests = match digests(&remote, algo, None) {
        Ok((d, load)) => {
            report.bytes_scanned = load.load.bytes_read;
            report.tensors_digested = d.len();
            d
        }
        Err(e) => {
            report.findings.push(read_finding(&url, e).into());
            return report;
        }
    };
    if let Some(m) = manifest {
        let digests: Vec<Option<Digest>> = digests.into_iter().map(Some).collect();
        let root = ckpt.root();
        report.findings.extend(tensora_verify::manifest_findings(ckpt, &digests, m, &|key| root.join(key)));
    }
    report
}

/// A failed load as a finding: the object and offset of the read that failed when the error
/// names them (a `RemoteError::Read`), else the checkpoint's location.
fn read_finding(root: &Path, e: DigestError) -> FindingKind {
    let message = e.to_string();
    let DigestError::Remote(e) = e else {
        return FindingKind::Unreadable { path: root.to_path_buf(), offset_bytes: None, message };
    };
    match e {
        RemoteError::Read { url, offset_bytes, source, .. } => match *source {
            RemoteError::Changed { .. } => FindingKind::Changed { path: url.into(), message },
            _ => FindingKind::Unreadable { path: url.into(), offset_bytes: Some(offset_bytes), message },
        },
        RemoteError::Changed { url, .. } => FindingKind::Changed { path: url.into(), message },
        _ => FindingKind::Unreadable { path: root.to_path_buf(), offset_bytes: None, message },
    }
}

/// A failed open as a finding: a missing object, a header or index that breaks a rule, a replaced
/// object, else the location unreadable.
fn open_finding(url: &Path, e: RemoteError) -> FindingKind {
    let message = e.to_string();
    match e {
        RemoteError::NotFound { url } => FindingKind::FileMissing { path: url.into() },
        RemoteError::Format { url, source } => FindingKind::Structure {
            path: url.into(),
            tensor: source.tensor().map(str::to_owned),
            message: source.kind().to_string(),
        },
        RemoteError::Changed { url, .. } => FindingKind::Changed { path: url.into(), message },
        _ => FindingKind::Unreadable { path: url.to_path_buf(), offset_bytes: None, message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJECT: &str = "http://h/m/a.safetensors";

    fn read(source: RemoteError) -> DigestError {
        DigestError::Remote(RemoteError::Read {
            url: OBJECT.into(),
            tensor: "w".into(),
            offset_bytes: 4096,
            source: Box::new(source),
        })
    }

    #[test]
    fn a_failed_read_is_a_finding_at_its_object_and_offset() {
        let root = Path::new("http://h/m/");
        let exhausted = RemoteError::RetriesExhausted {
            url: OBJECT.into(),
            offset_bytes: 4200,
            len_bytes: 10,
            attempts: 3,
            retry_time: std::time::Duration::from_secs(1),
            last_error: "reset".into(),
        };
        let kind = read_finding(root, read(exhausted));
        assert!(
            matches!(&kind, FindingKind::Unreadable { path, offset_bytes: Some(4096), message }
                if path == Path::new(OBJECT) && message.contains("reset")),
            "{kind:?}"
        );
        let changed = RemoteError::Changed { url: OBJECT.into(), planned: "a".into(), found: "b".into() };
        let kind = read_finding(root, read(changed));
        assert!(matches!(&kind, FindingKind::Changed { path, .. } if path == Path::new(OBJECT)), "{kind:?}");
        let kind = read_finding(root, DigestError::Remote(RemoteError::Stopped));
        assert!(matches!(&kind, FindingKind::Unreadable { path, offset_bytes: None, .. } if path == root));
        let incomplete =
            DigestError::Digest(HashError::Incomplete { tensor: "w".into(), reason: "not delivered".into() });
        let kind = read_finding(root, incomplete);
        assert!(
            matches!(&kind, FindingKind::Unreadable { path, offset_bytes: None, message }
                if path == root && message.contains("not delivered")),
            "{kind:?}"
        );
    }

    #[test]
    fn a_failed_open_is_a_missing_object_or_an_unreadable_location() {
        let root = Path::new("http://h/m/");
        let kind = open_finding(root, RemoteError::NotFound { url: OBJECT.into() });
        assert!(matches!(&kind, FindingKind::FileMissing { path } if path == Path::new(OBJECT)), "{kind:?}");
        let changed = RemoteError::Changed { url: OBJECT.into(), planned: "a".into(), found: "b".into() };
        let kind = open_finding(root, changed);
        assert!(matches!(&kind, FindingKind::Changed { path, .. } if path == Path::new(OBJECT)), "{kind:?}");
        let kind = open_finding(root, RemoteError::Stopped);
        assert!(matches!(&kind, FindingKind::Unreadable { path, offset_bytes: None, .. } if path == root));
    }
}
