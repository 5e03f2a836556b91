//! The stores a remote URL can name: one file per store (its schemes, how its URL becomes a root
//! and an object path, whether it lists, its report name, its builder, the environment its
//! credentials come from, its help) and [`STORES`], their table. `location.rs` and `client.rs`
//! only ever ask the table, so a new store is a file here and one line below
//! (docs/adding-a-store.md).

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use url::Url;

use crate::RemoteError;
use crate::location::StoreConfig;

mod azure;
mod gcs;
mod http;
mod s3;

/// Every store, in the order help texts list them: one line per store.
static STORES: [&Store; 4] = [&http::STORE, &s3::STORE, &azure::STORE, &gcs::STORE];

/// What a user is told about one store that remote URLs can name: its URL schemes, what
/// `--endpoint` ([`StoreConfig::endpoint`]) means for it and where its credentials come from.
/// [`schemes`] lists them all; `Display` writes one as a line of help.
///
/// ```
/// let s3 = tensora_remote::schemes().find(|s| s.schemes.contains(&"s3")).unwrap();
/// assert_eq!(s3.backend, "remote-s3");
/// assert!(s3.lists && s3.to_string().starts_with("s3://, s3a://"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Scheme {
    /// The store, e.g. `"S3 and S3-compatible servers"`.
    pub store: &'static str,
    /// Its URL schemes (without `://`), the first the one its URLs print with.
    pub schemes: &'static [&'static str],
    /// Locations it takes, e.g. `"s3://bucket/prefix/"`.
    pub example: &'static str,
    /// What the endpoint setting (`--endpoint`, [`StoreConfig::endpoint`]) means for it.
    pub endpoint: &'static str,
    /// Where its credentials come from.
    pub credentials: &'static str,
    /// Whether a directory is found by listing its prefix (else the index names are probed).
    pub lists: bool,
    /// The backend name load reports show for it.
    pub backend: &'static str,
}

/// `s3://, s3a:// (S3 and S3-compatible servers): s3://bucket/prefix/; endpoint: ...; credentials: ...`
impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let schemes: Vec<String> = self.schemes.iter().map(|s| format!("{s}://")).collect();
        write!(
            f,
            "{} ({}): {}; endpoint: {}; credentials: {}",
            schemes.join(", "),
            self.store,
            self.example,
            self.endpoint,
            self.credentials
        )
    }
}

/// Every store a remote location can name, from the crate's table of stores, in the order help
/// texts list them: the one list the CLI's help, the Python docs and the "unsupported scheme"
/// message are made from. Today (a unit test keeps this list equal to the table):
///
/// - `http://`, `https://`: HTTP(S) servers answering ranged GETs (no listing);
/// - `s3://`, `s3a://`: S3 and S3-compatible servers;
/// - `az://`, `azure://`: Azure Blob Storage;
/// - `gs://`: Google Cloud Storage.
pub fn schemes() -> impl ExactSizeIterator<Item = &'static Scheme> + Clone {
    STORES.iter().map(|store| &store.about)
}

/// Every scheme as `s3://`, comma-separated, for messages.
pub(crate) fn scheme_list() -> String {
    let all: Vec<String> =
        schemes().flat_map(|s| s.schemes.iter().map(|scheme| format!("{scheme}://"))).collect();
    all.join(", ")
}

/// The store whose schemes include `scheme` (any case).
pub(crate) fn store_of(scheme: &str) -> Option<&'static Store> {
    STORES.iter().copied().find(|store| store.about.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme)))
}

/// One store's entry in the table.
pub(crate) struct Store {
    /// What a user is told about it.
    pub about: Scheme,
    /// The prefixes of the environment variables its builder reads (`AWS_`): clients built under
    /// different values of them are not shared.
    pub env_prefixes: &'static [&'static str],
    /// A URL with one of its schemes as the store's root (what one client reaches: an origin, a
    /// bucket; normalised, so that equal roots are equal URLs) and the object path under it;
    /// `Err` holds why the URL is refused.
    pub parse: fn(&Url) -> Result<(Url, ObjectPath), String>,
    /// The printable URL of `path` under a root (credentials redacted).
    pub url_of: fn(&Url, &ObjectPath) -> String,
    /// The root with what the options or the environment add to it before it is opened (Azure:
    /// the storage account the key signs for).
    pub resolve: fn(&Url, &StoreConfig) -> Url,
    /// The object store for a root, with object_store's retries off ([`no_retries`]) and
    /// requests through the `Retry-After` connector. `Err` (outer) for a refusal of the crate's
    /// own, the inner error is object_store's.
    pub build: fn(&Url, &StoreConfig, object_store::ClientOptions) -> Built,
}

/// What a store's builder returns: the crate's own refusal (outer), else object_store's result.
pub(crate) type Built = Result<object_store::Result<Arc<dyn ObjectStore>>, RemoteError>;

impl Store {
    /// Its report name (`remote-s3`).
    pub fn backend(&self) -> &'static str {
        self.about.backend
    }
}

/// The root, path-free, as every store but HTTP names it: `scheme://bucket/`, the scheme the
/// store's first, any user, password, port, query or fragment dropped.
fn bucket_root(scheme: &str, bucket: &str) -> Result<Url, String> {
    Url::parse(&format!("{scheme}://{bucket}/")).map_err(|e| e.to_string())
}

/// A bucket store's URL (`s3://bucket/key`): no query string, a non-empty bucket; its root
/// ([`bucket_root`]) and the key.
fn parse_bucket(url: &Url, scheme: &str) -> Result<(Url, ObjectPath), String> {
    refuse_query(url)?;
    let bucket = url.host_str().filter(|b| !b.is_empty()).ok_or("no bucket")?;
    Ok((bucket_root(scheme, bucket)?, object_path(url)?))
}

/// A bucket store's printable URL of `path`: `scheme://bucket/path`.
fn bucket_url(root: &Url, scheme: &str, path: &ObjectPath) -> String {
    format!("{scheme}://{}/{path}", root.host_str().unwrap_or_default())
}

/// Object stores' keys have no query: a URL with one is refused (and its values never shown).
fn refuse_query(url: &Url) -> Result<(), String> {
    match url.query() {
        Some(_) => Err("a query string is not part of an object's name: give the URL without it".to_owned()),
        None => Ok(()),
    }
}

/// The URL's path as an object path (percent-decoded).
fn object_path(url: &Url) -> Result<ObjectPath, String> {
    ObjectPath::from_url_path(url.path()).map_err(|e| e.to_string())
}

/// A root taken as it is (stores that add nothing to it before opening).
fn unchanged(root: &Url, _config: &StoreConfig) -> Url {
    root.clone()
}

/// object_store's own retries off: the loader retries (and resumes) itself, so every retry is
/// counted and bounded in one place.
fn no_retries() -> object_store::RetryConfig {
    object_store::RetryConfig { max_retries: 0, ..object_store::RetryConfig::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The crate docs name every scheme of the table, and no other: the list in [`schemes`]'s
    /// docs (beside the table, so a store's line and its docs change together); no two stores
    /// claim a scheme, and each scheme finds its store in any case.
    #[test]
    fn the_crate_docs_name_every_scheme() {
        let source = include_str!("mod.rs");
        let before = &source[..source.find("pub fn schemes()").unwrap()];
        let docs: Vec<&str> = before
            .lines()
            .rev()
            .take_while(|l| l.starts_with("///"))
            .filter(|l| l.starts_with("/// - "))
            .collect();
        let documented: Vec<&str> =
            docs.iter().flat_map(|l| l.split('`').filter_map(|part| part.strip_suffix("://"))).collect();
        let mut seen = Vec::new();
        for about in schemes() {
            for scheme in about.schemes {
                assert!(documented.contains(scheme), "schemes()'s docs do not name {scheme}://");
                assert!(!seen.contains(scheme), "{scheme} is claimed twice");
                seen.push(*scheme);
                assert_eq!(store_of(&scheme.to_ascii_uppercase()).unwrap().about, *about);
            }
        }
        let mut documented = documented;
        documented.sort_unstable();
        seen.sort_unstable();
        assert_eq!(documented, seen, "schemes()'s docs name a scheme the table does not have");
        assert_eq!(scheme_list().matches("://").count(), seen.len());
    }

    /// Each store's example parses to that store, and a root parsed back from its printed URL
    /// is the same root (the table's `parse` and `url_of` agree).
    #[test]
    fn each_store_parses_its_own_urls() {
        for store in STORES {
            for scheme in store.about.schemes {
                let url = Url::parse(&format!("{scheme}://b/k/m.safetensors")).unwrap();
                let (root, path) = (store.parse)(&url).unwrap();
                assert_eq!(path.as_ref(), "k/m.safetensors", "{scheme}");
                let again = Url::parse(&(store.url_of)(&root, &path)).unwrap();
                assert_eq!((store.parse)(&again).unwrap(), (root, path), "{scheme}");
            }
        }
    }
}
