//! What `verify` still reports when the checkpoint does not open: the parser's error as a
//! finding (truncation where the numbers say so), every broken shard of a directory, and the
//! manifest's file list.

use std::path::{Path, PathBuf};

use tensora_format::ErrorKind;

use super::{DIR_ENTRIES_MAX, Finding, FindingKind};
use crate::manifest::Manifest;

/// The finding for a parser error: truncation when the header claims more bytes than the file
/// holds, a structural finding otherwise.
pub(super) fn format_error_finding(e: &tensora_format::Error) -> FindingKind {
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
pub(super) fn partition_truncation(e: &tensora_format::Error) -> Vec<Finding> {
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
pub(super) fn collect_after_failed_open(
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
