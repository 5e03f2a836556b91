//! HTTP(S) servers: `http(s)://[user:password@]host[:port]/path`, ranged GETs from any server
//! (nginx, a CDN); no listing, so a directory's index names are probed.

use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use url::Url;

use super::{Built, Scheme, Store, no_retries, object_path, unchanged};
use crate::location::StoreConfig;
use crate::redact::redact_url;
use crate::retry_after::RetryAfterConnector;

pub(super) static STORE: Store = Store {
    about: Scheme {
        store: "HTTP(S) servers answering ranged GETs",
        schemes: &["http", "https"],
        example: "https://[user:password@]host/path/",
        endpoint: "not used (the URL names the server)",
        credentials: "user:password@ in the URL, sent as HTTP basic auth; none otherwise",
        lists: false,
        backend: "remote-http",
    },
    env_prefixes: &[],
    parse,
    url_of,
    resolve: unchanged,
    build,
};

/// The origin `scheme://[user:password@]host[:port]/` as the root: a query string is refused
/// (object_store's HTTP store requests paths only, so a presigned URL's signature would be
/// dropped).
fn parse(url: &Url) -> Result<(Url, ObjectPath), String> {
    if url.host_str().is_none_or(str::is_empty) {
        return Err("no host".to_owned());
    }
    if url.query().is_some() {
        return Err("a query string cannot be sent (object_store's HTTP store requests paths only; \
                    a presigned URL's signature would be dropped): give the URL without it"
            .to_owned());
    }
    let mut origin = url.clone();
    origin.set_path("/");
    origin.set_query(None);
    origin.set_fragment(None);
    Ok((origin, object_path(url)?))
}

fn url_of(origin: &Url, path: &ObjectPath) -> String {
    let mut url = origin.clone();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().extend(path.parts());
    }
    redact_url(&url)
}

fn build(origin: &Url, config: &StoreConfig, client: object_store::ClientOptions) -> Built {
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
        .build();
    Ok(store.map(|s| Arc::new(s) as Arc<dyn object_store::ObjectStore>))
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

    #[test]
    fn base64_and_percent_decoding() {
        assert_eq!(base64(b"u:hunter2"), "dTpodW50ZXIy");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(percent_decode("p%40ss%2F%zz"), "p@ss/%zz");
    }

    /// A password in the URL becomes a basic-auth header marked sensitive (kept out of the HTTP
    /// client's logs), and the URL printed for an object under the origin shows it as `***`.
    #[test]
    fn url_credentials_become_a_sensitive_header() {
        let (origin, path) = parse(&Url::parse("http://u:hunter2@h:1/ckpt/m.safetensors").unwrap()).unwrap();
        assert!(basic_auth(&origin).is_some_and(|h| h.is_sensitive()));
        assert_eq!(url_of(&origin, &path), "http://u:***@h:1/ckpt/m.safetensors");
        assert!(basic_auth(&Url::parse("http://h/").unwrap()).is_none());
    }
}
