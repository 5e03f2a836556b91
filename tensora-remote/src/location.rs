//! Where a checkpoint lives: [`Location`] parsing, and [`StoreConfig`] for building the
//! `object_store` client (endpoint, plain HTTP, anonymous access, credentials).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use url::Url;

use crate::RemoteError;
use crate::redact::redact;
use crate::stores::{Store, scheme_list, store_of};

/// A parsed checkpoint location.
///
/// An HTTP origin may carry `user:password@` (sent as HTTP basic auth); the password never
/// leaves it: `Display`, `Debug`, every URL in an error, a report or a checkpoint's file paths
/// show it as `***`. A query string is refused (object_store's HTTP store requests paths only,
/// so a presigned URL's signature would be dropped), and its values never appear in the error.
///
/// ```
/// use tensora_remote::Location;
/// let s3 = Location::parse("s3://models/llama/")?;
/// assert!(s3.is_remote() && s3.is_dir());
/// let http = Location::parse("http://127.0.0.1:8080/ckpt/model.safetensors")?;
/// assert!(!http.is_dir());
/// assert!(!Location::parse("/data/model.safetensors")?.is_remote());
/// // Every store's scheme (`tensora_remote::schemes()`, the one list of them).
/// for store in tensora_remote::schemes() {
///     assert!(Location::parse(&format!("{}://bucket/llama/", store.schemes[0]))?.is_remote());
/// }
/// assert!(Location::parse("ftp://host/x").is_err());
/// # Ok::<(), tensora_remote::RemoteError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Location(Place);

#[derive(Clone, PartialEq, Eq)]
enum Place {
    /// A local file or directory (no scheme, or `file://`).
    Local(PathBuf),
    /// An object or prefix in one of the stores of the table (`stores/`).
    Remote(Remote),
}

/// A remote location: its store's table entry, the store's root (an HTTP origin with any
/// credentials as given, `s3://bucket/`, `az://container@account/`: print the location, never
/// the root), the object path below it (percent-decoded) and whether that is a prefix.
#[derive(Clone)]
struct Remote {
    store: &'static Store,
    root: Url,
    path: ObjectPath,
    dir: bool,
}

impl PartialEq for Remote {
    fn eq(&self, other: &Remote) -> bool {
        std::ptr::eq(self.store, other.store)
            && (&self.root, &self.path, self.dir) == (&other.root, &other.path, other.dir)
    }
}

impl Eq for Remote {}

/// Suffixes that make a location a file rather than a directory.
const FILE_SUFFIXES: [&str; 2] = [".safetensors", ".json"];

fn looks_like_dir(path: &str) -> bool {
    path.is_empty() || path.ends_with('/') || !FILE_SUFFIXES.iter().any(|s| path.ends_with(s))
}

impl Location {
    /// Parse a URL of one of the stores [`crate::schemes`] lists (`s3://bucket/prefix/`,
    /// `https://host/path/`, ...), a `file:///path` or a plain path. A location is a directory when it ends with `/` or does
    /// not end in `.safetensors` or `.json`.
    pub fn parse(input: &str) -> Result<Location, RemoteError> {
        // The input may hold a password or a signature: errors show it redacted.
        let bad = |reason: &str| RemoteError::Location { input: redact(input), reason: redact(reason) };
        let Some((scheme, _)) = input.split_once("://") else {
            return Ok(Location(Place::Local(PathBuf::from(input))));
        };
        let url = Url::parse(input).map_err(|e| bad(&e.to_string()))?;
        if scheme.eq_ignore_ascii_case("file") {
            let path = url.to_file_path().map_err(|()| bad("not a local file URL"))?;
            return Ok(Location(Place::Local(path)));
        }
        let Some(store) = store_of(scheme) else {
            return Err(bad(&format!("unsupported scheme (use {} or a local path)", scheme_list())));
        };
        let (root, path) = (store.parse)(&url).map_err(|reason| bad(&reason))?;
        Ok(Location(Place::Remote(Remote { store, root, path, dir: looks_like_dir(url.path()) })))
    }

    fn remote(&self) -> Option<&Remote> {
        match &self.0 {
            Place::Remote(remote) => Some(remote),
            Place::Local(_) => None,
        }
    }

    /// Whether this names a remote object or prefix.
    pub fn is_remote(&self) -> bool {
        self.remote().is_some()
    }

    /// Whether this names a directory (prefix) rather than one file.
    pub fn is_dir(&self) -> bool {
        match &self.0 {
            Place::Local(p) => p.is_dir(),
            Place::Remote(remote) => remote.dir,
        }
    }

    /// The local path, for a local location.
    pub(crate) fn local_path(&self) -> Option<&std::path::Path> {
        match &self.0 {
            Place::Local(p) => Some(p),
            Place::Remote(_) => None,
        }
    }

    /// The object path (a key or prefix) inside the store.
    pub(crate) fn object_path(&self) -> Option<&ObjectPath> {
        self.remote().map(|remote| &remote.path)
    }

    /// A printable URL for `path` inside this location's store.
    pub(crate) fn url_of(&self, path: &ObjectPath) -> String {
        match &self.0 {
            Place::Local(p) => p.display().to_string(),
            Place::Remote(remote) => (remote.store.url_of)(&remote.root, path),
        }
    }

    /// This location with what `config` or the environment adds to its root before it is opened
    /// (Azure: the storage account the URL names, else the one the store is reached in). Other
    /// locations are returned as they are.
    pub(crate) fn in_account(&self, config: &StoreConfig) -> Location {
        match &self.0 {
            Place::Remote(remote) => Location(Place::Remote(Remote {
                root: (remote.store.resolve)(&remote.root, config),
                ..remote.clone()
            })),
            Place::Local(_) => self.clone(),
        }
    }

    /// Whether the store can list a prefix (object stores can; a plain HTTP server cannot).
    pub(crate) fn can_list(&self) -> bool {
        self.remote().is_some_and(|remote| remote.store.about.lists)
    }

    /// The backend name reports show for loads from this location.
    pub(crate) fn backend_name(&self) -> &'static str {
        self.remote().map_or(LOCAL_BACKEND_NAME, |remote| remote.store.backend())
    }

    /// What makes two clients of this location's store interchangeable: the store's root as
    /// given (an HTTP origin with its password) and the environment variables its builder reads.
    /// The key stays in this process's memory and is never printed.
    pub(crate) fn client_key(&self) -> String {
        match &self.0 {
            Place::Local(p) => format!("local {}", p.display()),
            Place::Remote(remote) => {
                let prefixes = remote.store.env_prefixes;
                let mut env: Vec<(String, String)> = std::env::vars()
                    .filter(|(k, _)| prefixes.iter().any(|prefix| k.starts_with(prefix)))
                    .collect();
                env.sort();
                format!("{} {env:?}", remote.root)
            }
        }
    }
}

/// The backend name of a local location (which no remote load takes: it is refused).
const LOCAL_BACKEND_NAME: &str = "remote-http";

/// The location as a URL (`s3://bucket/key`, `http://host/path`), or the local path.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = match self.object_path() {
            Some(path) => self.url_of(path),
            None => self.url_of(&ObjectPath::default()),
        };
        f.write_str(&url)
    }
}

/// The printable URL (credentials redacted), as `Display` shows it.
impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Location({self})")
    }
}

/// How to reach the store. Unset fields fall back to the environment variables of the store the
/// location names (`AWS_*` for S3; [`crate::schemes`] lists each store's); HTTP origins need
/// none of them. Its `Debug` output shows the access key id but never the secret key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreConfig {
    /// S3 endpoint, e.g. `http://127.0.0.1:4568` for a local server (path-style requests).
    pub endpoint: Option<String>,
    /// Allow plain `http://` endpoints (S3). HTTP origins given as `http://` always allow it.
    pub allow_http: bool,
    /// Send unsigned requests (public buckets).
    pub anonymous: bool,
    /// S3 region; the environment or `us-east-1` when unset.
    pub region: Option<String>,
    /// Access key id and secret (Azure: account name and access key); the environment when unset.
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credentials = self.credentials.as_ref().map(|(key, _)| (key.as_str(), "<redacted>"));
        // An endpoint may carry a password or a signed query (an Azure account URL with a SAS).
        let endpoint = self.endpoint.as_deref().map(redact);
        f.debug_struct("StoreConfig")
            .field("endpoint", &endpoint)
            .field("allow_http", &self.allow_http)
            .field("anonymous", &self.anonymous)
            .field("region", &self.region)
            .field("credentials", &credentials)
            .finish()
    }
}

/// Client-level timeouts, derived from [`crate::RemoteOptions`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientTimeouts {
    pub connect: Duration,
    pub request: Duration,
    /// Idle connections kept per host: at least the reads in flight, so that none reconnects.
    pub idle_per_host: usize,
}

/// Build the object store for `location` (its store's builder). object_store's own retries are
/// off: the loader retries (and resumes) itself, so every retry is counted and bounded in one
/// place.
pub(crate) fn build_store(
    location: &Location,
    config: &StoreConfig,
    timeouts: ClientTimeouts,
) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    let remote = match &location.0 {
        Place::Local(path) => return Err(RemoteError::NotRemote { path: path.clone() }),
        Place::Remote(remote) => remote,
    };
    let client = object_store::ClientOptions::new()
        .with_connect_timeout(timeouts.connect)
        .with_timeout(timeouts.request)
        .with_pool_max_idle_per_host(timeouts.idle_per_host)
        .with_http1_only();
    (remote.store.build)(&remote.root, config, client)?.map_err(|e| RemoteError::Store {
        url: location.url_of(&ObjectPath::default()),
        reason: redact(&e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_each_scheme() {
        let l = Location::parse("s3://b/a/b/").unwrap();
        let path = l.object_path().map(|p| p.as_ref().to_owned());
        assert_eq!(
            (l.to_string(), path.as_deref(), l.is_dir()),
            ("s3://b/a/b".to_owned(), Some("a/b"), true)
        );
        assert_eq!((l.backend_name(), l.can_list()), ("remote-s3", true));
        assert_eq!(Location::parse("S3A://b/a/b/").unwrap(), l, "an alias of the store, any case");
        let l = Location::parse("s3://b/a/model.safetensors.index.json").unwrap();
        assert!(!l.is_dir());
        let l = Location::parse("https://h:9/x/y.safetensors").unwrap();
        let Place::Remote(Remote { root: origin, path, dir, .. }) = &l.0 else { panic!("not remote") };
        assert_eq!((origin.as_str(), path.as_ref(), *dir), ("https://h:9/", "x/y.safetensors", false));
        assert_eq!((l.backend_name(), l.can_list()), ("remote-http", false));
        // Every scheme of every store of the table parses to that store, printed with one of its own.
        for store in crate::schemes() {
            for scheme in store.schemes {
                let l = Location::parse(&format!("{scheme}://b/m/")).unwrap();
                assert_eq!((l.backend_name(), l.can_list()), (store.backend, store.lists), "{scheme}");
                let printed = l.to_string();
                assert!(store.schemes.iter().any(|s| printed.starts_with(&format!("{s}://"))), "{printed}");
            }
        }
        assert_eq!(Location::parse("file:///tmp/x").unwrap(), Location(Place::Local("/tmp/x".into())));
        assert_eq!(Location::parse("rel/dir").unwrap(), Location(Place::Local("rel/dir".into())));
        assert!(Location::parse("http://host").unwrap().is_dir());
    }

    #[test]
    fn debug_redacts_the_secret_key() {
        let config = StoreConfig {
            endpoint: Some("http://minio:endpoint-pass@127.0.0.1:9000/?sv=1&sig=endpoint-sig".into()),
            credentials: Some(("AKIDEXAMPLE".into(), "wJalrXUtnFEMI-secret".into())),
            ..StoreConfig::default()
        };
        let text =
            format!("{config:?} {:?}", crate::RemoteOptions { store: config.clone(), ..Default::default() });
        for secret in ["wJalrXUtnFEMI-secret", "endpoint-pass", "endpoint-sig"] {
            assert!(!text.contains(secret), "{secret}: {text}");
        }
        assert!(text.contains("AKIDEXAMPLE") && text.contains("<redacted>"), "{text}");
        assert!(text.contains("http://minio:***@127.0.0.1:9000/?sv=***&sig=***"), "{text}");
    }

    /// Finding 1 of issue 14: a password or a query credential given in a location never shows
    /// in `Display`, `Debug`, the parse error or the URLs of the objects under it.
    #[test]
    fn passwords_in_http_urls_do_not_leak() {
        let l = Location::parse("http://u:hunter2@127.0.0.1:1/ckpt/").unwrap();
        let child = l.url_of(&ObjectPath::from("ckpt/model.safetensors"));
        for text in [l.to_string(), format!("{l:?}"), child.clone()] {
            assert!(!text.contains("hunter2"), "{text}");
            assert!(text.contains("u:***@127.0.0.1:1/"), "{text}");
        }
        let Place::Remote(Remote { root: origin, .. }) = &l.0 else { panic!("not remote") };
        assert_eq!(origin.password(), Some("hunter2"), "the store still gets the password");
        for input in [
            "http://u:hunter2@h/m.safetensors?X-Amz-Signature=hunter2&X-Amz-Credential=hunter2",
            "https://acct.blob/c/m.safetensors?sv=2020&sig=hunter2",
            "https://h/m.safetensors?token=hunter2",
            "http://u:hunter2@/nohost",
            "ftp://u:hunter2@h/x",
            // Unescaped `/`, `?`, `#` in the password: no parser takes the URL, the error echoes it.
            "http://u:hunter2/x@h/m.safetensors",
            "http://u:hunter2?x=1@h/m.safetensors",
            "http://u:hunter2#x@h/m.safetensors",
        ] {
            let err = Location::parse(input).unwrap_err();
            let text = format!("{err} {err:?}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn refuses_unsupported() {
        for bad in ["gs:///x", "az://c/x?sig=1", "ftp://h/x", "s3:///x", "http://"] {
            assert!(matches!(Location::parse(bad), Err(RemoteError::Location { .. })), "{bad}");
        }
        // The message lists every scheme of the table.
        let Err(RemoteError::Location { reason, .. }) = Location::parse("ftp://h/x") else {
            panic!("parsed")
        };
        for about in crate::schemes() {
            for scheme in about.schemes {
                assert!(reason.contains(&format!("{scheme}://")), "{reason}");
            }
        }
    }

    #[test]
    fn url_of_round_trips_percent_encoding() {
        let l = Location::parse("http://h/a%20b/m.safetensors").unwrap();
        let p = l.object_path().unwrap().clone();
        assert_eq!(p.as_ref(), "a b/m.safetensors");
        assert_eq!(l.url_of(&p), "http://h/a%20b/m.safetensors");
    }

    /// Every scheme of the table, an unknown one and none: the parser's inputs.
    fn schemes_and_others() -> Vec<&'static str> {
        crate::schemes().flat_map(|store| store.schemes.iter().copied()).chain(["x", ""]).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Parsing never panics; a remote location yields an object path and prints as a URL that
        /// parses back to the same location (issue 21: a property of each `Ok`), and every
        /// refusal is a `Location` error naming the input.
        #[test]
        fn parse_never_panics(
            scheme in prop::sample::select(schemes_and_others()),
            rest in "(://)?[a-z0-9./%:_-]{0,24}",
        ) {
            let s = format!("{scheme}{rest}");
            match Location::parse(&s) {
                Ok(l) => {
                    prop_assert_eq!(l.is_remote(), l.object_path().is_some());
                    if l.is_remote() {
                        let again = Location::parse(&l.to_string());
                        prop_assert!(again.as_ref().ok() == Some(&l), "{} -> {} -> {:?}", s, l, again);
                    }
                }
                Err(RemoteError::Location { input, .. }) => prop_assert_eq!(input, s),
                Err(other) => prop_assert!(false, "{}: not a Location error: {}", s, other),
            }
        }
    }
}
