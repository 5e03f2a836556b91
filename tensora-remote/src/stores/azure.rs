//! Azure Blob Storage: `az://container/blob` (or `azure://`), or `az://container@account/blob`
//! naming the storage account; the `AZURE_*` environment unless the options set a field, and
//! never another account's key or SAS token ([`RemoteError::AccountMismatch`]).

use std::sync::Arc;

use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::path::Path as ObjectPath;
use url::Url;

use super::{Built, Scheme, Store, no_retries, object_path, refuse_query};
use crate::RemoteError;
use crate::location::StoreConfig;
use crate::retry_after::RetryAfterConnector;

pub(super) static STORE: Store = Store {
    about: Scheme {
        store: "Azure Blob Storage",
        schemes: &["az", "azure"],
        example: "az://container/prefix/ or az://container@account/prefix/",
        endpoint: "the account URL (default: AZURE_STORAGE_ACCOUNT_NAME's; Azurite: \
                   http://127.0.0.1:10000/devstoreaccount1)",
        credentials: "AZURE_STORAGE_* variables (account name and key, SAS token, ...)",
        lists: true,
        backend: "remote-azure",
    },
    env_prefixes: &["AZURE_"],
    parse,
    url_of,
    resolve,
    build,
};

/// The root `az://container/`, or `az://container@account/` when the URL names the account
/// (`az://container@account/path`: the URL's user is the container).
fn parse(url: &Url) -> Result<(Url, ObjectPath), String> {
    refuse_query(url)?;
    let host = url.host_str().filter(|b| !b.is_empty()).ok_or("no bucket")?;
    if url.password().is_some() {
        return Err("an az:// URL names a container and an account, not a password".to_owned());
    }
    let root = match url.username() {
        "" => root_of(host, None),
        container => root_of(container, Some(host)),
    };
    Ok((root.map_err(|e| e.to_string())?, object_path(url)?))
}

fn root_of(container: &str, account: Option<&str>) -> Result<Url, url::ParseError> {
    match account {
        Some(account) => Url::parse(&format!("az://{container}@{account}/")),
        None => Url::parse(&format!("az://{container}/")),
    }
}

/// The container and the storage account (when named) of a root.
fn parts(root: &Url) -> (&str, Option<&str>) {
    let host = root.host_str().unwrap_or_default();
    match root.username() {
        "" => (host, None),
        container => (container, Some(host)),
    }
}

fn url_of(root: &Url, path: &ObjectPath) -> String {
    match parts(root) {
        (container, None) => format!("az://{container}/{path}"),
        (container, Some(account)) => format!("az://{container}@{account}/{path}"),
    }
}

/// The root with its storage account: the one the URL names, else the one the store is reached
/// in (`config`'s credentials, else `AZURE_STORAGE_ACCOUNT_NAME` and the other variables
/// object_store reads), so that the URLs (and the cache keys made of them) tell accounts apart.
fn resolve(root: &Url, config: &StoreConfig) -> Url {
    match (parts(root), azure_account(config)) {
        ((container, None), Some(account)) => {
            root_of(container, Some(&account)).unwrap_or_else(|_| root.clone())
        }
        _ => root.clone(),
    }
}

/// `credentials` is (account, access key), `endpoint` the account URL (Azurite:
/// `http://127.0.0.1:10000/devstoreaccount1`).
fn build(root: &Url, config: &StoreConfig, client: object_store::ClientOptions) -> Built {
    let (container, account) = parts(root);
    let env = object_store::azure::MicrosoftAzureBuilder::from_env();
    check_account(root, account, config, &env)?;
    let mut builder = env
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
    Ok(builder.build().map(|s| Arc::new(s) as Arc<dyn object_store::ObjectStore>))
}

/// Refuses a root naming storage account `account` (`az://container@account/`) when the
/// credential that would authorize its requests is another account's ([`credential_account`]):
/// the store would send that account's key signature or SAS token with every request for
/// `account`. `env` is what object_store read from the `AZURE_*` environment. The error names both
/// accounts and the kind of credential, never the credential.
fn check_account(
    root: &Url,
    account: Option<&str>,
    config: &StoreConfig,
    env: &MicrosoftAzureBuilder,
) -> Result<(), RemoteError> {
    match (account, credential_account(config, env)) {
        (Some(url_account), Some((credential_account, credential))) if url_account != credential_account => {
            Err(RemoteError::AccountMismatch {
                url: url_of(root, &ObjectPath::default()),
                url_account: url_account.to_owned(),
                credential,
                credential_account,
            })
        }
        _ => Ok(()),
    }
}

/// The storage account whose credential authorizes the store's requests, and what that
/// credential is: `config`'s credentials' (account, access key), else `AZURE_STORAGE_ACCOUNT_NAME`
/// when the environment holds an access key too, or a SAS token that object_store uses (the
/// account a SAS is given for is the one named beside it). `None` when no one account's
/// credential authorizes them (anonymous, a bearer token, or no account named beside it).
fn credential_account(config: &StoreConfig, env: &MicrosoftAzureBuilder) -> Option<(String, &'static str)> {
    if config.anonymous {
        return None;
    }
    if let Some((account, _)) = &config.credentials {
        return Some((account.clone(), ACCESS_KEY));
    }
    let set = |key: AzureConfigKey| env.get_config_value(&key).is_some();
    let account = || env.get_config_value(&AzureConfigKey::AccountName);
    if set(AzureConfigKey::AccessKey) {
        return account().map(|a| (a, ACCESS_KEY));
    }
    // A SAS names no account: it is the one named beside it. object_store prefers a bearer token,
    // a workload identity or a service principal to it (`MicrosoftAzureBuilder::build`).
    let preferred = set(AzureConfigKey::Token)
        || (set(AzureConfigKey::ClientId)
            && set(AzureConfigKey::AuthorityId)
            && (set(AzureConfigKey::FederatedTokenFile) || set(AzureConfigKey::ClientSecret)));
    if set(AzureConfigKey::SasKey) && !preferred {
        return account().map(|a| (a, SAS_TOKEN));
    }
    None
}

/// The credential kinds [`RemoteError::AccountMismatch`] names.
const ACCESS_KEY: &str = "access key";
const SAS_TOKEN: &str = "SAS token";

/// The storage account the store is reached in without one in the URL: `config`'s credentials
/// (account, key), else what object_store reads from the `AZURE_*` environment.
fn azure_account(config: &StoreConfig) -> Option<String> {
    if let Some((account, _)) = &config.credentials {
        return Some(account.clone());
    }
    MicrosoftAzureBuilder::from_env().get_config_value(&AzureConfigKey::AccountName)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::location::{ClientTimeouts, build_store};
    use crate::{Location, RemoteError, StoreConfig};

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
            Err(RemoteError::AccountMismatch { url, url_account, credential, credential_account }) => {
                assert_eq!(
                    (url_account.as_str(), credential, credential_account.as_str()),
                    ("other", "access key", "acct")
                );
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

    /// A SAS token from the environment (`AZURE_STORAGE_SAS_TOKEN`) carries no account name: it
    /// is the account's that `AZURE_STORAGE_ACCOUNT_NAME` names beside it, the one it was given
    /// for. Used with a URL naming another account it is refused, naming both accounts and not
    /// the token; with its own account, or an account-free URL, or beside an access key or a
    /// bearer token (which object_store prefers), it is not a mismatch.
    #[test]
    fn a_sas_token_for_another_account_than_the_url_is_refused() {
        use super::{AzureConfigKey as Key, MicrosoftAzureBuilder, check_account};
        let token = "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2030-01-01T00:00:00Z&sig=c2VjcmV0LXNpZ25hdHVyZQ%3D";
        let sas = MicrosoftAzureBuilder::new()
            .with_config(Key::AccountName, "acct")
            .with_config(Key::SasKey, token);
        let config = StoreConfig::default();
        let other = url::Url::parse("az://c@other/").unwrap();
        match check_account(&other, Some("other"), &config, &sas) {
            Err(RemoteError::AccountMismatch { url, url_account, credential, credential_account }) => {
                assert_eq!(
                    (url_account.as_str(), credential, credential_account.as_str()),
                    ("other", "SAS token", "acct")
                );
                assert_eq!(url, "az://c@other/");
            }
            Err(e) => panic!("not the account mismatch: {e}"),
            Ok(()) => panic!("acct's SAS token would go with every request for other"),
        }
        let message = check_account(&other, Some("other"), &config, &sas).err().map(|e| format!("{e} {e:?}"));
        let message = message.unwrap_or_default();
        assert!(message.contains("SAS token") && message.contains("\"acct\""), "{message}");
        assert!(!message.contains("c2VjcmV0") && !message.contains("sig="), "the token leaked: {message}");
        let own = url::Url::parse("az://c@acct/").unwrap();
        assert!(check_account(&own, Some("acct"), &config, &sas).is_ok());
        assert!(check_account(&url::Url::parse("az://c/").unwrap(), None, &config, &sas).is_ok());
        let anonymous = StoreConfig { anonymous: true, ..StoreConfig::default() };
        assert!(check_account(&other, Some("other"), &anonymous, &sas).is_ok(), "nothing is sent");
        let unnamed = MicrosoftAzureBuilder::new().with_config(Key::SasKey, token);
        assert!(check_account(&other, Some("other"), &config, &unnamed).is_ok(), "no account beside it");
        let bearer = MicrosoftAzureBuilder::new()
            .with_config(Key::AccountName, "acct")
            .with_config(Key::SasKey, token)
            .with_config(Key::Token, "bearer");
        assert!(check_account(&other, Some("other"), &config, &bearer).is_ok(), "the bearer token is used");
    }
}
