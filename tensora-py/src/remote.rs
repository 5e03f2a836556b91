//! Remote checkpoints for the bindings: a path that is a URL of a store (one of those
//! `tensora_remote::schemes()` lists, which Python reads as `tensora._native.schemes()`) is opened
//! and loaded by `tensora_remote`, with the options of the Python `remote=` dict (the fields of
//! `tensora.RemoteOptions`, the CLI's flags). Errors carry `tensora_remote`'s messages, which
//! never hold a secret.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensora_remote::{
    CacheOptions, CacheSync, CacheWrites, Location, RemoteCheckpoint, RemoteError, RemoteOptions,
    StoreConfig, Unversioned, open_remote,
};

use crate::{exc, load_err};

/// The keys `remote=` takes, as `tensora.RemoteOptions` names them.
const KEYS: [&str; 10] = [
    "endpoint",
    "allow_http",
    "anonymous",
    "region",
    "allow_unversioned",
    "open_timeout",
    "cache",
    "cache_max",
    "offline",
    "cache_writes",
];

/// `cache_writes=`: when a load's ranges go into the cache's copies. The binding's default is
/// `"before"`: the tensors are handed to Python, which may rewrite them in place at once, with
/// every range already on disk (a piece rewritten before it is written behind is left out of
/// the cache, so a caller that always does that would never find it complete).
fn cache_writes(value: Option<String>) -> PyResult<CacheWrites> {
    match value.as_deref() {
        None | Some("before") => Ok(CacheWrites::BeforeLanding),
        Some("behind") => Ok(CacheWrites::Behind),
        Some(other) => Err(PyValueError::new_err(format!(
            "remote: cache_writes must be \"before\" or \"behind\", not {other:?}"
        ))),
    }
}

/// The caches' write-behinds of this process's remote loads, not yet waited for (see
/// [`wait_cache_writes`]), each with the id of the process that started it. Finished ones are
/// dropped at each new one, so it holds at most one per load whose copies are still being
/// written.
static BEHIND: std::sync::Mutex<Vec<(u32, CacheSync)>> = std::sync::Mutex::new(Vec::new());

/// Keep `sync` until [`wait_cache_writes`]: the tensors go to the caller at once, the cache's
/// copies are finished behind them.
pub(crate) fn behind(sync: CacheSync) {
    let mut behind = BEHIND.lock().unwrap_or_else(|p| p.into_inner());
    // A finished one joins at once.
    behind.retain(|(_, s)| !s.is_finished());
    behind.push((std::process::id(), sync));
}

/// The stores a URL path may name (`tensora._native.schemes()`), from `tensora_remote::schemes()`:
/// one dict per store with `store`, `schemes` (without `://`), `example`, `endpoint` (what
/// `RemoteOptions.endpoint` means for it), `credentials` (where they come from), `lists` (a
/// directory is found by listing) and `backend` (the name load reports show).
#[pyfunction]
pub(crate) fn schemes(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    tensora_remote::schemes()
        .map(|s| {
            let d = PyDict::new(py);
            d.set_item("store", s.store)?;
            d.set_item("schemes", s.schemes.to_vec())?;
            d.set_item("example", s.example)?;
            d.set_item("endpoint", s.endpoint)?;
            d.set_item("credentials", s.credentials)?;
            d.set_item("lists", s.lists)?;
            d.set_item("backend", s.backend)?;
            Ok(d)
        })
        .collect()
}

/// Wait until the cache copies of every earlier remote load are written, durable and promoted
/// (`tensora.wait_cache()`, and at interpreter exit); the number of loads waited for. In a
/// forked child the parent's write-behinds are not there (only the thread that forked is): they
/// are forgotten, never joined (a join would wait forever).
#[pyfunction]
pub(crate) fn wait_cache_writes(py: Python<'_>) -> usize {
    let taken = std::mem::take(&mut *BEHIND.lock().unwrap_or_else(|p| p.into_inner()));
    let me = std::process::id();
    let (mine, inherited): (Vec<_>, Vec<_>) = taken.into_iter().partition(|(pid, _)| *pid == me);
    for (_, sync) in inherited {
        std::mem::forget(sync);
    }
    let n = mine.len();
    py.detach(move || drop(mine));
    n
}

/// The remote location `path` names, or `None` for a local path (no scheme, or `file://`).
pub(crate) fn location(path: &std::path::Path) -> PyResult<Option<Location>> {
    let Some(text) = path.to_str() else { return Ok(None) };
    if !text.contains("://") {
        return Ok(None);
    }
    let location = Location::parse(text).map_err(remote_err)?;
    Ok(location.is_remote().then_some(location))
}

/// The streaming forms read local files only: a URL among `paths` is a `ValueError` saying what
/// to use instead.
pub(crate) fn refuse_urls(paths: &[std::path::PathBuf]) -> PyResult<()> {
    for p in paths {
        if location(p)?.is_some() {
            return Err(PyValueError::new_err(format!(
                "{}: weights_iterator reads local files; load a URL with load_file (owned, within its \
                 in-flight budget), or fetch it once into a cache directory",
                tensora_remote::redact(&p.to_string_lossy())
            )));
        }
    }
    Ok(())
}

/// A remote error as its Python exception: the load layer's errors as for a local load (a
/// selection is a `SelectionError`, a manifest mismatch a `VerifyError`), every other one a
/// `tensora.LoadError` with the (redacted) message.
pub(crate) fn remote_err(e: RemoteError) -> PyErr {
    match e {
        RemoteError::Load(e) => load_err(e),
        e => exc::LoadError::new_err(e.to_string()),
    }
}

/// Open `location` with the options of `remote` (GIL released).
pub(crate) fn open(
    py: Python<'_>,
    location: &Location,
    remote: &RemoteOptions,
) -> PyResult<RemoteCheckpoint> {
    py.detach(|| open_remote(location, remote)).map_err(remote_err)
}

/// `tensora.verify(url, manifest=..., remote=...)`: for a URL, `tensora_remote::verify`'s report
/// as JSON (structure, and with a manifest object sizes and tensor digests from a streamed load;
/// GIL released), the same report `tensora verify URL --json` prints. `None` for a local path,
/// which `remote=` does not apply to (a `ValueError`).
pub(crate) fn verify_json(
    py: Python<'_>,
    path: &std::path::Path,
    manifest: Option<&std::path::Path>,
    remote: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<String>> {
    let Some(location) = location(path)? else {
        if remote.is_some() {
            return Err(PyValueError::new_err("remote= applies to URLs only, not to a local path"));
        }
        return Ok(None);
    };
    let opts = options(remote)?;
    let manifest = manifest.map(|m| py.detach(|| crate::read_manifest(m))).transpose()?;
    let report = py.detach(|| tensora_remote::verify(&location, &opts, manifest.as_ref()));
    Ok(Some(report.to_json().to_string()))
}

/// `RemoteOptions` from the Python `remote=` dict (`None`: the defaults, the store's settings
/// from the environment as for the CLI). An unknown key or a value of the wrong type is a
/// `ValueError` naming it.
pub(crate) fn options(remote: Option<&Bound<'_, PyDict>>) -> PyResult<RemoteOptions> {
    let defaults = RemoteOptions::default();
    let Some(d) = remote else { return Ok(defaults) };
    for key in d.keys() {
        let key: String = key.extract()?;
        if !KEYS.contains(&key.as_str()) {
            return Err(PyValueError::new_err(format!(
                "remote: unknown option {key:?} (known: {})",
                KEYS.join(", ")
            )));
        }
    }
    let flag = |key: &str| -> PyResult<bool> { Ok(get::<bool>(d, key)?.unwrap_or(false)) };
    let open_timeout = match get::<f64>(d, "open_timeout")? {
        None => defaults.open_deadline,
        Some(s) => Duration::try_from_secs_f64(s).ok().filter(|t| !t.is_zero()).ok_or_else(|| {
            PyValueError::new_err(format!("remote: open_timeout must be a positive number, not {s}"))
        })?,
    };
    let cache = get::<std::path::PathBuf>(d, "cache")?;
    if cache.is_none()
        && (get::<u64>(d, "cache_max")?.is_some()
            || flag("offline")?
            || get::<String>(d, "cache_writes")?.is_some())
    {
        return Err(PyValueError::new_err(
            "remote: cache_max, offline and cache_writes need cache (a directory)",
        ));
    }
    let opts = RemoteOptions {
        store: StoreConfig {
            endpoint: get(d, "endpoint")?,
            allow_http: flag("allow_http")?,
            anonymous: flag("anonymous")?,
            region: get(d, "region")?,
            ..StoreConfig::default()
        },
        unversioned: if flag("allow_unversioned")? { Unversioned::Allow } else { Unversioned::Refuse },
        open_deadline: open_timeout,
        cache: cache
            .map(|dir| -> PyResult<CacheOptions> {
                Ok(CacheOptions {
                    dir,
                    size_max_bytes: get(d, "cache_max")?,
                    offline: flag("offline")?,
                    writes: cache_writes(get(d, "cache_writes")?)?,
                })
            })
            .transpose()?,
        ..defaults
    };
    opts.validate().map_err(|e| PyValueError::new_err(format!("remote: {e}")))?;
    Ok(opts)
}

/// `d[key]` as a `T`, `None` when absent or `None`.
fn get<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<T>> {
    match d.get_item(key)? {
        Some(v) if !v.is_none() => v
            .extract::<T>()
            .map(Some)
            .map_err(|e| PyValueError::new_err(format!("remote: {key}: {}", Into::<PyErr>::into(e)))),
        _ => Ok(None),
    }
}
