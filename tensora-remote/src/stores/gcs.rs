//! Google Cloud Storage: `gs://bucket/key`; the `GOOGLE_*` environment (service account,
//! application default credentials) unless the options set a field.

use std::sync::Arc;

use url::Url;

use super::{Built, Scheme, Store, bucket_url, no_retries, parse_bucket, unchanged};
use crate::location::StoreConfig;
use crate::retry_after::RetryAfterConnector;

pub(super) static STORE: Store = Store {
    about: Scheme {
        store: "Google Cloud Storage",
        schemes: &["gs"],
        example: "gs://bucket/prefix/",
        endpoint: "the base URL (an emulator's; default Google's)",
        credentials: "GOOGLE_* variables (service account, application default credentials)",
        lists: true,
        backend: "remote-gcs",
    },
    env_prefixes: &["GOOGLE_"],
    parse: |url| parse_bucket(url, "gs"),
    url_of: |root, path| bucket_url(root, "gs", path),
    resolve: unchanged,
    build,
};

/// `endpoint` is the base URL (an emulator's), and `anonymous` sends unsigned requests.
fn build(root: &Url, config: &StoreConfig, client: object_store::ClientOptions) -> Built {
    let client = client.with_allow_http(config.allow_http);
    let mut builder = object_store::gcp::GoogleCloudStorageBuilder::from_env()
        .with_http_connector(RetryAfterConnector)
        .with_bucket_name(root.host_str().unwrap_or_default())
        .with_retry(no_retries())
        .with_client_options(client);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_base_url(endpoint);
    }
    if config.anonymous {
        builder = builder.with_skip_signature(true);
    }
    Ok(builder.build().map(|s| Arc::new(s) as Arc<dyn object_store::ObjectStore>))
}
