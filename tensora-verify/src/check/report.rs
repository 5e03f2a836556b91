//! [`Report`]: the outcome of a check, its one-line summary and its JSON document.

use std::path::PathBuf;

use serde_json::{Map, Value};
use tensora_format::Format;

use super::{Finding, Severity};
use crate::digest::Algo;

/// The outcome of a check.
#[derive(Debug, Clone)]
pub struct Report {
    /// The path checked.
    pub path: PathBuf,
    /// Its layout; `None` when it did not open.
    pub format: Option<Format>,
    /// The digest algorithm used (the manifest's, when there is one).
    pub algo: Algo,
    /// Every finding, in the order the checks ran.
    pub findings: Vec<Finding>,
    /// Files of the checkpoint (0 when it did not open).
    pub files: usize,
    /// Tensors of the checkpoint (0 when it did not open).
    pub tensors: usize,
    /// Tensors whose digest was computed (and compared, when there is a manifest).
    pub tensors_digested: usize,
    /// Bytes the integrity scan read.
    pub bytes_scanned: u64,
    /// Backends whose digests were compared with the scan's.
    pub backends_checked: Vec<String>,
}

impl Report {
    /// How many findings are errors.
    pub fn errors(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error).count()
    }
    /// How many findings are warnings.
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
