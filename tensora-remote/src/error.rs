//! [`RemoteError`]: every way a remote open or load fails, each naming the object it concerns.

use std::time::Duration;

/// A remote open or load failed. Every variant names the object (as a URL) it concerns.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The location string is not a URL or path this crate understands.
    #[error("bad location {input:?}: {reason}")]
    Location { input: String, reason: String },
    /// The location is a local path; load it with `tensora_io::load_path` instead.
    #[error("{path:?} is a local path, not a remote location")]
    NotRemote { path: std::path::PathBuf },
    /// The object store client could not be built (bad endpoint, missing credentials, ...).
    #[error("cannot configure the object store for {url}: {source}")]
    Store {
        url: String,
        #[source]
        source: object_store::Error,
    },
    /// The object does not exist.
    #[error("{url}: not found")]
    NotFound { url: String },
    /// No checkpoint layout was found at a directory location.
    #[error("{url}: no checkpoint found ({reason})")]
    NoCheckpoint { url: String, reason: String },
    /// A safetensors header failed validation.
    #[error("{url}: {source}")]
    Format {
        url: String,
        #[source]
        source: tensora_format::Error,
    },
    /// An index (`model.safetensors.index.json`) failed validation.
    #[error("{url}: {kind}")]
    Index { url: String, kind: tensora_format::ErrorKind },
    /// The object changed after the plan was made (ETag or size/last-modified differs, or the
    /// server refused `If-Match`). The load fails rather than mixing two versions.
    #[error("{url} changed during the load (planned {planned}, now {found})")]
    Changed { url: String, planned: String, found: String },
    /// The server answered with a different range or length than asked for.
    #[error("{url}: asked for bytes {offset_bytes}..+{len_bytes}, {what}")]
    BadResponse { url: String, offset_bytes: u64, len_bytes: u64, what: String },
    /// A range could not be fetched within the retry bounds.
    #[error(
        "{url}: bytes {offset_bytes}..+{len_bytes} failed after {attempts} attempts and {:.2} s of retrying: {last_error}",
        retry_time.as_secs_f64()
    )]
    RetriesExhausted {
        url: String,
        offset_bytes: u64,
        len_bytes: u64,
        attempts: u32,
        retry_time: Duration,
        last_error: String,
    },
    /// A read of a load failed for good: the object, the offset of the read and the tensor it
    /// was for, with the remote cause (`RetriesExhausted`, `BadResponse`, `Changed`, ...) as the
    /// source, which names the first byte that did not land.
    #[error("{url}: reading at offset {offset_bytes} for tensor {tensor:?}: {source}")]
    Read {
        url: String,
        tensor: String,
        offset_bytes: u64,
        #[source]
        source: Box<RemoteError>,
    },
    /// An object is larger than this crate will handle in memory (an index over its cap).
    #[error("{url}: {len_bytes} bytes is over the {limit_bytes}-byte limit for this object")]
    TooLarge { url: String, len_bytes: u64, limit_bytes: u64 },
    /// The options are inconsistent.
    #[error("invalid option {field}: {reason}")]
    Options { field: &'static str, reason: String },
    /// The completion sink asked to stop the load.
    #[error("stopped by the completion sink")]
    Stopped,
    /// The load layer failed for a reason of its own (a selection naming no tensor, a hook's
    /// error, an unsupported residence, memory): see the `tensora_io::LoadError`.
    #[error("{0}")]
    Load(#[from] tensora_io::LoadError),
    /// The destination arena or the async runtime could not be created.
    #[error("{what}: {source}")]
    Resource {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl RemoteError {
    /// The byte range a fetch error names (its first byte did not land), if it names one.
    pub fn range(&self) -> Option<(u64, u64)> {
        match self {
            RemoteError::RetriesExhausted { offset_bytes, len_bytes, .. }
            | RemoteError::BadResponse { offset_bytes, len_bytes, .. } => Some((*offset_bytes, *len_bytes)),
            _ => None,
        }
    }

    /// Whether the load failed because an object was replaced or modified mid-load (also when
    /// that is the cause behind a [`RemoteError::Read`]).
    pub fn is_changed(&self) -> bool {
        match self {
            RemoteError::Changed { .. } => true,
            RemoteError::Read { source, .. } => source.is_changed(),
            _ => false,
        }
    }
}
