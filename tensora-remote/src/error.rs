//! [`RemoteError`]: every way a remote open or load fails, each naming the object it concerns.

use std::time::Duration;

/// A remote open or load failed. Every variant names the object (as a URL) it concerns. No
/// variant holds a credential: URLs are redacted (passwords, query values, bare query tokens and
/// fragments shown as `***`), and so is every message that comes from the HTTP client.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The location string is not a URL or path this crate understands.
    #[error("bad location {input:?}: {reason}")]
    Location {
        /// The location as given.
        input: String,
        /// Why it was refused (bad URL, no host or bucket, unsupported scheme).
        reason: String,
    },
    /// The location is a local path; load it with `tensora_io::load_path` instead.
    #[error("{path:?} is a local path, not a remote location")]
    NotRemote {
        /// The local path.
        path: std::path::PathBuf,
    },
    /// The object store client could not be built (bad endpoint, missing credentials, ...).
    #[error("cannot configure the object store for {url}: {reason}")]
    Store {
        /// The store's root: the HTTP origin (credentials redacted) or `s3://bucket/`.
        url: String,
        /// object_store's reason, with any URL in it redacted.
        reason: String,
    },
    /// An Azure URL names one storage account (`az://container@account/`) while the credential
    /// that would authorize its requests is another account's: an access key (the credentials',
    /// or `AZURE_STORAGE_ACCOUNT_NAME`'s with `AZURE_STORAGE_ACCOUNT_KEY`) or a SAS token
    /// (`AZURE_STORAGE_SAS_TOKEN`, given for `AZURE_STORAGE_ACCOUNT_NAME`). Refused before any
    /// request, as every request for the URL's account would carry it.
    #[error(
        "{url}: the URL names storage account {url_account:?}, but the {credential} given is account \
         {credential_account:?}'s; name {credential_account:?} in the URL, or give {url_account:?}'s {credential}"
    )]
    AccountMismatch {
        /// The store's root (`az://container@account/`).
        url: String,
        /// The account the URL names.
        url_account: String,
        /// What was given: `"access key"` or `"SAS token"` (never the credential itself).
        credential: &'static str,
        /// The account the credential was given for.
        credential_account: String,
    },
    /// The object does not exist.
    #[error("{url}: not found")]
    NotFound {
        /// The missing object.
        url: String,
    },
    /// No checkpoint layout was found at a directory location.
    #[error("{url}: no checkpoint found ({reason})")]
    NoCheckpoint {
        /// The directory (prefix) or the index that was looked at.
        url: String,
        /// What was missing or wrong (no index, two indexes, too many partitions, ...).
        reason: String,
    },
    /// A safetensors header failed validation.
    #[error("{url}: {source}")]
    Format {
        /// The object whose header (or layout) was refused.
        url: String,
        /// The parser's error: the rule that failed.
        #[source]
        source: tensora_format::Error,
    },
    /// An index (`model.safetensors.index.json`) failed validation.
    #[error("{url}: {kind}")]
    Index {
        /// The index object.
        url: String,
        /// The rule the index breaks.
        kind: tensora_format::ErrorKind,
    },
    /// The object changed after the plan was made (ETag or size/last-modified differs, or the
    /// server refused `If-Match`). The load fails rather than mixing two versions.
    #[error("{url} changed during the load (planned {planned}, now {found})")]
    Changed {
        /// The object.
        url: String,
        /// Its version when the checkpoint was opened (`etag ...`, or size and last-modified).
        planned: String,
        /// What the server reports now, or why it refused the conditional request.
        found: String,
    },
    /// The server sends neither an ETag nor a Last-Modified date for the object, and reading it
    /// would take more than one request (its header and its tensors, or a resumed body): nothing
    /// could show that they came from one version, so it is refused unless allowed.
    #[error(
        "{url}: the server sends neither an ETag nor a Last-Modified date, so {what} cannot be checked \
         to come from the same version of the object; load it anyway with --allow-unversioned \
         (RemoteOptions::unversioned = Unversioned::Allow)"
    )]
    Unversioned {
        /// The object.
        url: String,
        /// What would need a second request (`"its header and its tensors"`, `"a resumed range"`).
        what: &'static str,
    },
    /// Opening the checkpoint (probes, listing, indexes, headers, their retries) did not finish
    /// within `RemoteOptions::open_deadline`.
    #[error(
        "{url}: opening did not finish within the {:.1} s open deadline ({requests} requests sent); \
         raise it with --open-timeout (RemoteOptions::open_deadline)",
        deadline.as_secs_f64()
    )]
    OpenDeadline {
        /// The location being opened.
        url: String,
        /// The deadline that passed.
        deadline: Duration,
        /// Requests the open had sent by then.
        requests: u64,
    },
    /// The cache directory could not be used.
    #[error("cache {}: {what}: {source}", dir.display())]
    Cache {
        /// The cache directory.
        dir: std::path::PathBuf,
        /// What failed.
        what: &'static str,
        /// The system's reason.
        #[source]
        source: std::io::Error,
    },
    /// Offline (`--offline`), and the cache cannot answer.
    #[error("{url} is not in the cache ({what}), and offline nothing is fetched")]
    NotCached {
        /// The location or object.
        url: String,
        /// What is missing.
        what: &'static str,
    },
    /// The server answered with a different range or length than asked for.
    #[error("{url}: asked for bytes {offset_bytes}..+{len_bytes}, {what}")]
    BadResponse {
        /// The object.
        url: String,
        /// First byte of the range asked for.
        offset_bytes: u64,
        /// Length of the range asked for.
        len_bytes: u64,
        /// What came back instead.
        what: String,
    },
    /// A range could not be fetched within the retry bounds.
    #[error(
        "{url}: bytes {offset_bytes}..+{len_bytes} failed after {attempts} attempts and {:.2} s of retrying: {last_error}",
        retry_time.as_secs_f64()
    )]
    RetriesExhausted {
        /// The object.
        url: String,
        /// First byte of the range that had not landed when the retries ran out.
        offset_bytes: u64,
        /// Bytes of the range still missing.
        len_bytes: u64,
        /// Requests made for the range, the first included.
        attempts: u32,
        /// Time from the range's first failure to giving up.
        retry_time: Duration,
        /// The last attempt's error.
        last_error: String,
    },
    /// A read of a load failed for good: the object, the offset of the read and the tensor it
    /// was for, with the remote cause (`RetriesExhausted`, `BadResponse`, `Changed`, ...) as the
    /// source, which names the first byte that did not land.
    #[error("{url}: reading at offset {offset_bytes} for tensor {tensor:?}: {source}")]
    Read {
        /// The object read.
        url: String,
        /// The tensor the first missing byte belongs to.
        tensor: String,
        /// The first byte (in the object) that did not land.
        offset_bytes: u64,
        /// The remote cause.
        #[source]
        source: Box<RemoteError>,
    },
    /// An object is larger than this crate will handle in memory (an index over its cap).
    #[error("{url}: {len_bytes} bytes is over the {limit_bytes}-byte limit for this object")]
    TooLarge {
        /// The object.
        url: String,
        /// Its size.
        len_bytes: u64,
        /// The largest size accepted for it.
        limit_bytes: u64,
    },
    /// The options are inconsistent.
    #[error("invalid option {field}: {reason}")]
    Options {
        /// The option's name, e.g. `"reads_inflight_max"`.
        field: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
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
        /// What could not be created.
        what: &'static str,
        /// The system's reason.
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
