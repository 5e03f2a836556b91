//! S3 and S3-compatible servers: `s3://bucket/key` (or `s3a://`), path-style requests to a
//! given endpoint; the `AWS_*` environment unless the options set a field.

use std::sync::Arc;

use url::Url;

use super::{Built, Scheme, Store, bucket_url, no_retries, parse_bucket, unchanged};
use crate::RemoteError;
use crate::location::StoreConfig;
use crate::redact::redact;
use crate::retry_after::RetryAfterConnector;

pub(super) static STORE: Store = Store {
    about: Scheme {
        store: "S3 and S3-compatible servers",
        schemes: &["s3", "s3a"],
        example: "s3://bucket/prefix/",
        endpoint: "the server's URL, e.g. http://127.0.0.1:9000 (path-style requests; default AWS, or \
                   AWS_ENDPOINT)",
        credentials: "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION and the \
                      other AWS_* variables",
        lists: true,
        backend: "remote-s3",
    },
    env_prefixes: &["AWS_"],
    parse: |url| parse_bucket(url, "s3"),
    url_of: |root, path| bucket_url(root, "s3", path),
    resolve: unchanged,
    build,
};

/// An S3 store; `Err` (outer) for a plain-http endpoint that was not allowed.
fn build(root: &Url, config: &StoreConfig, client: object_store::ClientOptions) -> Built {
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
        .with_bucket_name(root.host_str().unwrap_or_default())
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
    Ok(builder.build().map(|s| Arc::new(s) as Arc<dyn object_store::ObjectStore>))
}
