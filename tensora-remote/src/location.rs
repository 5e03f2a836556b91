//! Where a checkpoint lives: [`Location`] parsing, and [`StoreConfig`] for building the
//! `object_store` client (endpoint, plain HTTP, anonymous access, credentials).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use url::Url;

use crate::RemoteError;
use crate::redact::{redact, redact_url};
use crate::retry_after::RetryAfterConnector;

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
/// assert!(Location::parse("az://container/llama/")?.is_remote());
/// assert!(Location::parse("gs://bucket/llama/model.safetensors")?.is_remote());
/// assert!(Location::parse("ftp://host/x").is_err());
/// # Ok::<(), tensora_remote::RemoteError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// A local file or directory (no scheme, or `file://`).
    Local(PathBuf),
    /// An HTTP(S) origin: `origin` is `scheme://host[:port]/`, `path` the object or prefix below it.
    Http {
        /// `scheme://[user:password@]host[:port]/`. It holds the credentials as given: print the
        /// location (`Display`), never this field.
        origin: Url,
        /// The object or prefix below the origin (percent-decoded).
        path: ObjectPath,
        /// Whether `path` is a directory (prefix) rather than one file.
        dir: bool,
    },
    /// An S3 bucket and a key (file) or prefix (directory).
    S3 {
        /// The bucket.
        bucket: String,
        /// The key or prefix in the bucket.
        path: ObjectPath,
        /// Whether `path` is a directory (prefix) rather than one key.
        dir: bool,
    },
    /// An Azure Blob Storage container (`az://container/path`, or `az://container@account/path`
    /// naming the storage account) and a blob or prefix.
    Azure {
        /// The container.
        container: String,
        /// The storage account: from the URL (`az://container@account/path`), else, once the
        /// store is opened, the options' credentials or the `AZURE_*` environment. Part
        /// of every printable URL, so that the cache keys made of them tell accounts apart.
        account: Option<String>,
        /// The blob or prefix in the container.
        path: ObjectPath,
        /// Whether `path` is a directory (prefix) rather than one blob.
        dir: bool,
    },
    /// A Google Cloud Storage bucket (`gs://bucket/path`) and an object or prefix.
    Gcs {
        /// The bucket.
        bucket: String,
        /// The object or prefix in the bucket.
        path: ObjectPath,
        /// Whether `path` is a directory (prefix) rather than one object.
        dir: bool,
    },
}

/// Suffixes that make a location a file rather than a directory.
const FILE_SUFFIXES: [&str; 2] = [".safetensors", ".json"];

fn looks_like_dir(path: &str) -> bool {
    path.is_empty() || path.ends_with('/') || !FILE_SUFFIXES.iter().any(|s| path.ends_with(s))
}

impl Location {
    /// Parse `s3://bucket/prefix/`, `az://container/prefix/` (or `az://container@account/prefix/`),
    /// `gs://bucket/prefix/`,
    /// `http(s)://host/path/`, `file:///path` or a plain path. A location is a directory when it
    /// ends with `/` or does not end in `.safetensors` or `.json`.
    pub fn parse(input: &str) -> Result<Location, RemoteError> {
        // The input may hold a password or a signature: errors show it redacted.
        let bad = |reason: &str| RemoteError::Location { input: redact(input), reason: redact(reason) };
        let Some((scheme, _)) = input.split_once("://") else {
            return Ok(Location::Local(PathBuf::from(input)));
        };
        let url = Url::parse(input).map_err(|e| bad(&e.to_string()))?;
        let dir = looks_like_dir(url.path());
        match scheme.to_ascii_lowercase().as_str() {
            "file" => {
                let path = url.to_file_path().map_err(|()| bad("not a local file URL"))?;
                Ok(Location::Local(path))
            }
            "http" | "https" => {
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(bad("no host"));
                }
                if url.query().is_some() {
                    return Err(bad(
                        "a query string cannot be sent (object_store's HTTP store requests paths only; \
                         a presigned URL's signature would be dropped): give the URL without it",
                    ));
                }
                let mut origin = url.clone();
                origin.set_path("/");
                origin.set_query(None);
                origin.set_fragment(None);
                let path = ObjectPath::from_url_path(url.path()).map_err(|e| bad(&e.to_string()))?;
                Ok(Location::Http { origin, path, dir })
            }
            "s3" | "s3a" | "az" | "azure" | "gs" => {
                if url.query().is_some() {
                    return Err(bad(
                        "a query string is not part of an object's name: give the URL without it",
                    ));
                }
                let bucket =
                    url.host_str().filter(|b| !b.is_empty()).ok_or_else(|| bad("no bucket"))?.to_owned();
                let path = ObjectPath::from_url_path(url.path()).map_err(|e| bad(&e.to_string()))?;
                let azure = matches!(scheme.to_ascii_lowercase().as_str(), "az" | "azure");
                if azure && url.password().is_some() {
                    return Err(bad("an az:// URL names a container and an account, not a password"));
                }
                Ok(match scheme.to_ascii_lowercase().as_str() {
                    "gs" => Location::Gcs { bucket, path, dir },
                    // `az://container@account/path`: the URL's user is the container.
                    "az" | "azure" if !url.username().is_empty() => Location::Azure {
                        container: url.username().to_owned(),
                        account: Some(bucket),
                        path,
                        dir,
                    },
                    "az" | "azure" => Location::Azure { container: bucket, account: None, path, dir },
                    _ => Location::S3 { bucket, path, dir },
                })
            }
            _ => Err(bad("unsupported scheme (use s3://, az://, gs://, http://, https:// or a local path)")),
        }
    }

    /// Whether this names a remote object or prefix.
    pub fn is_remote(&self) -> bool {
        !matches!(self, Location::Local(_))
    }

    /// Whether this names a directory (prefix) rather than one file.
    pub fn is_dir(&self) -> bool {
        match self {
            Location::Local(p) => p.is_dir(),
            Location::Http { dir, .. }
            | Location::S3 { dir, .. }
            | Location::Azure { dir, .. }
            | Location::Gcs { dir, .. } => *dir,
        }
    }

    /// The object path (a key or prefix) inside the store.
    pub(crate) fn object_path(&self) -> Option<&ObjectPath> {
        match self {
            Location::Local(_) => None,
            Location::Http { path, .. }
            | Location::S3 { path, .. }
            | Location::Azure { path, .. }
            | Location::Gcs { path, .. } => Some(path),
        }
    }

    /// A printable URL for `path` inside this location's store.
    pub(crate) fn url_of(&self, path: &ObjectPath) -> String {
        match self {
            Location::Local(p) => p.display().to_string(),
            Location::Http { origin, .. } => {
                let mut url = origin.clone();
                if let Ok(mut segments) = url.path_segments_mut() {
                    segments.pop_if_empty().extend(path.parts());
                }
                redact_url(&url)
            }
            Location::S3 { bucket, .. } => format!("s3://{bucket}/{path}"),
            Location::Azure { container, account: None, .. } => format!("az://{container}/{path}"),
            Location::Azure { container, account: Some(account), .. } => {
                format!("az://{container}@{account}/{path}")
            }
            Location::Gcs { bucket, .. } => format!("gs://{bucket}/{path}"),
        }
    }

    /// This location with its storage account (Azure): the one the URL names, else the one the
    /// store is reached in (`config`'s credentials, else `AZURE_STORAGE_ACCOUNT_NAME` and the
    /// other variables object_store reads). Other locations are returned as they are.
    pub(crate) fn in_account(&self, config: &StoreConfig) -> Location {
        match self {
            Location::Azure { container, account: None, path, dir } => Location::Azure {
                container: container.clone(),
                account: azure_account(config),
                path: path.clone(),
                dir: *dir,
            },
            other => other.clone(),
        }
    }

    /// Whether the store can list a prefix (object stores can; a plain HTTP server cannot).
    pub(crate) fn can_list(&self) -> bool {
        matches!(self, Location::S3 { .. } | Location::Azure { .. } | Location::Gcs { .. })
    }

    /// The backend name reports show for loads from this location.
    pub(crate) fn backend_name(&self) -> &'static str {
        match self {
            Location::S3 { .. } => "remote-s3",
            Location::Azure { .. } => "remote-azure",
            Location::Gcs { .. } => "remote-gcs",
            Location::Http { .. } | Location::Local(_) => "remote-http",
        }
    }
}

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

/// How to reach the store. Unset fields fall back to the usual `AWS_*` environment variables
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
/// `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`) for S3; HTTP origins need none of them. Its `Debug`
/// output shows the access key id but never the secret key.
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
    /// Access key id and secret; the environment when unset.
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credentials = self.credentials.as_ref().map(|(key, _)| (key.as_str(), "<redacted>"));
        f.debug_struct("StoreConfig")
            .field("endpoint", &self.endpoint)
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

/// Build the object store for `location`. object_store's own retries are off: the loader retries
/// (and resumes) itself, so every retry is counted and bounded in one place.
pub(crate) fn build_store(
    location: &Location,
    config: &StoreConfig,
    timeouts: ClientTimeouts,
) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    let client = object_store::ClientOptions::new()
        .with_connect_timeout(timeouts.connect)
        .with_timeout(timeouts.request)
        .with_pool_max_idle_per_host(timeouts.idle_per_host)
        .with_http1_only();
    let root = location.url_of(&ObjectPath::default());
    let failed =
        |e: object_store::Error| RemoteError::Store { url: root.clone(), reason: redact(&e.to_string()) };
    match location {
        Location::Local(path) => Err(RemoteError::NotRemote { path: path.clone() }),
        Location::Http { origin, .. } => http_store(origin, config, client).map_err(failed),
        Location::S3 { bucket, .. } => s3_store(bucket, config, client)?.map_err(failed),
        Location::Azure { container, account, .. } => {
            check_azure_account(&root, account.as_deref(), config)?;
            azure_store(container, account.as_deref(), config, client).map_err(failed)
        }
        Location::Gcs { bucket, .. } => gcs_store(bucket, config, client).map_err(failed),
    }
}

fn no_retries() -> object_store::RetryConfig {
    object_store::RetryConfig { max_retries: 0, ..object_store::RetryConfig::default() }
}

fn http_store(
    origin: &Url,
    config: &StoreConfig,
    client: object_store::ClientOptions,
) -> object_store::Result<Arc<dyn ObjectStore>> {
    let mut client = client.with_allow_http(origin.scheme() == "http" || config.allow_http);
    // Credentials in the URL become a basic-auth header marked sensitive (kept out of the HTTP
    // client's logs); the URL the store builds requests from has none.
    let mut bare = origin.clone();
    if let Some(auth) = basic_auth(origin) {
        let _ = bare.set_username("");
        let _ = bare.set_password(None);
        let mut headers = object_store::HeaderMap::new();
        headers.insert("authorization", auth);
        client = client.with_default_headers(headers);
    }
    let store = object_store::http::HttpBuilder::new()
        .with_http_connector(RetryAfterConnector)
        .with_url(bare.as_str())
        .with_client_options(client)
        .with_retry(no_retries())
        .build()?;
    Ok(Arc::new(store))
}

/// An S3 store; `Err` (outer) for a plain-http endpoint that was not allowed.
fn s3_store(
    bucket: &str,
    config: &StoreConfig,
    client: object_store::ClientOptions,
) -> Result<object_store::Result<Arc<dyn ObjectStore>>, RemoteError> {
    // A plain-http endpoint without permission fails every request in the HTTP client (retried
    // like a network error); refuse it here, once, with the fix in the message.
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let endpoint =
        config.endpoint.clone().or_else(|| env("AWS_ENDPOINT")).or_else(|| env("AWS_ENDPOINT_URL"));
    let allow_http =
        config.allow_http || env("AWS_ALLOW_HTTP").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if let Some(endpoint) = endpoint.filter(|e| e.to_ascii_lowercase().starts_with("http://"))
        && !allow_http
    {
        return Err(RemoteError::Options {
            field: "allow_http",
            reason: format!(
                "the S3 endpoint {} is plain http: allow it with --allow-http \
                 (StoreConfig::allow_http, or AWS_ALLOW_HTTP=true)",
                redact(&endpoint)
            ),
        });
    }
    let mut builder = object_store::aws::AmazonS3Builder::from_env()
        .with_http_connector(RetryAfterConnector)
        .with_bucket_name(bucket)
        .with_retry(no_retries())
        .with_client_options(client);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_endpoint(endpoint).with_virtual_hosted_style_request(false);
    }
    if config.allow_http {
        builder = builder.with_allow_http(true);
    }
    if config.anonymous {
        builder = builder.with_skip_signature(true);
    }
    if let Some(region) = &config.region {
        builder = builder.with_region(region);
    }
    if let Some((key, secret)) = &config.credentials {
        builder = builder.with_access_key_id(key).with_secret_access_key(secret);
    }
    Ok(builder.build().map(|s| Arc::new(s) as Arc<dyn ObjectStore>))
}

/// An Azure Blob store: `AZURE_*` variables (account, key, SAS, ...) unless the config sets them;
/// `credentials` is (account, access key), `endpoint` the account URL (Azurite:
/// `http://127.0.0.1:10000/devstoreaccount1`).
fn azure_store(
    container: &str,
    account: Option<&str>,
    config: &StoreConfig,
    client: object_store::ClientOptions,
) -> object_store::Result<Arc<dyn ObjectStore>> {
    let mut builder = object_store::azure::MicrosoftAzureBuilder::from_env()
        .with_http_connector(RetryAfterConnector)
        .with_container_name(container)
        .with_retry(no_retries())
        .with_client_options(client);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_endpoint(endpoint.clone());
    }
    if config.allow_http {
        builder = builder.with_allow_http(true);
    }
    if config.anonymous {
        builder = builder.with_skip_signature(true);
    }
    if let Some((account, key)) = &config.credentials {
        builder = builder.with_account(account).with_access_key(key);
    }
    // The account the URL names is the one reached (and the one its cache keys name).
    if let Some(account) = account {
        builder = builder.with_account(account);
    }
    Ok(Arc::new(builder.build()?))
}

/// Refuses an Azure URL naming storage account `account` (`az://container@account/`) when the
/// access key that would sign its requests is another account's ([`azure_key_account`]): the
/// store would sign every request for `account` with that key. The error names both accounts,
/// never the key.
fn check_azure_account(root: &str, account: Option<&str>, config: &StoreConfig) -> Result<(), RemoteError> {
    match (account, azure_key_account(config)) {
        (Some(url_account), Some(key_account)) if url_account != key_account => {
            Err(RemoteError::AccountMismatch {
                url: root.to_owned(),
                url_account: url_account.to_owned(),
                key_account,
            })
        }
        _ => Ok(()),
    }
}

/// The storage account whose access key signs an Azure store's requests: `config`'s credentials'
/// (account, key), else `AZURE_STORAGE_ACCOUNT_NAME`'s when the environment holds an access key
/// too. `None` when no access key signs them (anonymous, or a SAS or token from the environment).
fn azure_key_account(config: &StoreConfig) -> Option<String> {
    use object_store::azure::AzureConfigKey;
    if config.anonymous {
        return None;
    }
    if let Some((account, _)) = &config.credentials {
        return Some(account.clone());
    }
    let env = object_store::azure::MicrosoftAzureBuilder::from_env();
    env.get_config_value(&AzureConfigKey::AccessKey)?;
    env.get_config_value(&AzureConfigKey::AccountName)
}

/// The storage account an Azure store is reached in without one in the URL: `config`'s
/// credentials (account, key), else what object_store reads from the `AZURE_*` environment.
fn azure_account(config: &StoreConfig) -> Option<String> {
    if let Some((account, _)) = &config.credentials {
        return Some(account.clone());
    }
    object_store::azure::MicrosoftAzureBuilder::from_env()
        .get_config_value(&object_store::azure::AzureConfigKey::AccountName)
}

/// A Google Cloud Storage store: `GOOGLE_*` variables (service account, application default
/// credentials) unless the config sets them; `endpoint` the base URL (an emulator's), and
/// `anonymous` sends unsigned requests.
fn gcs_store(
    bucket: &str,
    config: &StoreConfig,
    client: object_store::ClientOptions,
) -> object_store::Result<Arc<dyn ObjectStore>> {
    let client = client.with_allow_http(config.allow_http);
    let mut builder = object_store::gcp::GoogleCloudStorageBuilder::from_env()
        .with_http_connector(RetryAfterConnector)
        .with_bucket_name(bucket)
        .with_retry(no_retries())
        .with_client_options(client);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_base_url(endpoint);
    }
    if config.anonymous {
        builder = builder.with_skip_signature(true);
    }
    Ok(Arc::new(builder.build()?))
}

/// The `Authorization: Basic …` header for the credentials in `origin`, if it has any.
fn basic_auth(origin: &Url) -> Option<object_store::HeaderValue> {
    if origin.username().is_empty() && origin.password().is_none() {
        return None;
    }
    let user = percent_decode(origin.username());
    let password = origin.password().map(percent_decode).unwrap_or_default();
    let mut value = object_store::HeaderValue::from_str(&format!(
        "Basic {}",
        base64(format!("{user}:{password}").as_bytes())
    ))
    .ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// `%XX` sequences decoded (a URL's user name and password are percent-encoded).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Standard base64 with padding (RFC 4648), for the basic-auth header.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_each_scheme() {
        let l = Location::parse("s3://b/a/b/").unwrap();
        assert_eq!(l, Location::S3 { bucket: "b".into(), path: ObjectPath::from("a/b"), dir: true });
        let l = Location::parse("s3://b/a/model.safetensors.index.json").unwrap();
        assert!(!l.is_dir());
        let l = Location::parse("https://h:9/x/y.safetensors").unwrap();
        let Location::Http { origin, path, dir } = l else { panic!("not http") };
        assert_eq!((origin.as_str(), path.as_ref(), dir), ("https://h:9/", "x/y.safetensors", false));
        assert_eq!(Location::parse("file:///tmp/x").unwrap(), Location::Local("/tmp/x".into()));
        assert_eq!(Location::parse("rel/dir").unwrap(), Location::Local("rel/dir".into()));
        assert!(Location::parse("http://host").unwrap().is_dir());
    }

    #[test]
    fn debug_redacts_the_secret_key() {
        let config = StoreConfig {
            credentials: Some(("AKIDEXAMPLE".into(), "wJalrXUtnFEMI-secret".into())),
            ..StoreConfig::default()
        };
        let text =
            format!("{config:?} {:?}", crate::RemoteOptions { store: config.clone(), ..Default::default() });
        assert!(!text.contains("wJalrXUtnFEMI-secret"), "{text}");
        assert!(text.contains("AKIDEXAMPLE") && text.contains("<redacted>"), "{text}");
    }

    #[test]
    fn base64_and_percent_decoding() {
        assert_eq!(base64(b"u:hunter2"), "dTpodW50ZXIy");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(percent_decode("p%40ss%2F%zz"), "p@ss/%zz");
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
        let Location::Http { origin, .. } = &l else { panic!("not http") };
        assert_eq!(origin.password(), Some("hunter2"), "the store still gets the password");
        assert!(basic_auth(origin).is_some_and(|h| h.is_sensitive()));
        for input in [
            "http://u:hunter2@h/m.safetensors?X-Amz-Signature=hunter2&X-Amz-Credential=hunter2",
            "https://acct.blob/c/m.safetensors?sv=2020&sig=hunter2",
            "https://h/m.safetensors?token=hunter2",
            "http://u:hunter2@/nohost",
            "ftp://u:hunter2@h/x",
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
    }

    #[test]
    fn an_azure_location_names_its_account_from_the_url_or_the_credentials() {
        let named = Location::parse("az://c@acct/m/").unwrap();
        assert_eq!(named.to_string(), "az://c@acct/m");
        assert_eq!(Location::parse(&named.to_string()).unwrap(), named);
        let creds =
            StoreConfig { credentials: Some(("other".into(), "key".into())), ..StoreConfig::default() };
        // The URL's account wins; without one, the credentials' is taken.
        assert_eq!(named.in_account(&creds), named);
        let bare = Location::parse("az://c/m/").unwrap();
        assert_eq!(bare.to_string(), "az://c/m");
        assert_eq!(bare.in_account(&creds).to_string(), "az://c@other/m");
        let s3 = Location::parse("s3://b/m/").unwrap();
        assert_eq!(s3.in_account(&creds), s3);
        assert!(matches!(Location::parse("az://c:secret@acct/m/"), Err(RemoteError::Location { .. })));
    }

    /// An `az://container@account/` URL with another account's key is refused before any request
    /// (the store would sign for `account` with that key), naming both accounts and not the key;
    /// the key's own account, an anonymous store, or no account in the URL are built.
    #[test]
    fn an_azure_url_naming_another_account_than_the_key_is_refused() {
        let timeouts = ClientTimeouts {
            connect: Duration::from_secs(1),
            request: Duration::from_secs(1),
            idle_per_host: 1,
        };
        let config = StoreConfig {
            endpoint: Some("http://127.0.0.1:9/acct".into()),
            allow_http: true,
            credentials: Some(("acct".into(), "a2V5LW9mLWFjY3Q=".into())),
            ..StoreConfig::default()
        };
        let other = Location::parse("az://c@other/m/").unwrap();
        match build_store(&other, &config, timeouts) {
            Err(RemoteError::AccountMismatch { url, url_account, key_account }) => {
                assert_eq!((url_account.as_str(), key_account.as_str()), ("other", "acct"));
                assert!(url.starts_with("az://c@other"), "{url}");
            }
            Err(e) => panic!("not the account mismatch: {e}"),
            Ok(_) => panic!("built a store that signs other's requests with acct's key"),
        }
        let message = build_store(&other, &config, timeouts).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("\"other\"") && message.contains("\"acct\""), "{message}");
        assert!(!message.contains("a2V5LW9mLWFjY3Q="), "the key leaked: {message}");
        for fine in ["az://c@acct/m/", "az://c/m/"] {
            assert!(build_store(&Location::parse(fine).unwrap(), &config, timeouts).is_ok(), "{fine}");
        }
        let anonymous = StoreConfig { anonymous: true, ..config };
        assert!(build_store(&other, &anonymous, timeouts).is_ok(), "nothing is signed");
    }

    #[test]
    fn url_of_round_trips_percent_encoding() {
        let l = Location::parse("http://h/a%20b/m.safetensors").unwrap();
        let p = l.object_path().unwrap().clone();
        assert_eq!(p.as_ref(), "a b/m.safetensors");
        assert_eq!(l.url_of(&p), "http://h/a%20b/m.safetensors");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Parsing never panics; a remote location yields an object path and prints as a URL that
        /// parses back to the same location (issue 21: a property of each `Ok`), and every
        /// refusal is a `Location` error naming the input.
        #[test]
        fn parse_never_panics(s in "(s3|http|https|gs|az|x)?(://)?[a-z0-9./%:_-]{0,24}") {
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
