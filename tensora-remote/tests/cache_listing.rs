//! What a cached open of a prefix resolves to, against real servers on 127.0.0.1 (issue 39,
//! finding 6): an object added under the prefix after the location was recorded is seen (the
//! open lists the prefix again: one request) unless offline, and an `az://` location's record and
//! copies are the storage account's own.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use tensora_format::Dtype;
use tensora_format::write::{SafetensorsLayout, TensorSpec, write_safetensors};
use tensora_io::LoadOptions;
use tensora_remote::{CacheOptions, Location, RemoteError, RemoteOptions, StoreConfig, open_remote};

fn started<T>(server: Result<T, String>) -> T {
    server.unwrap_or_else(|e| panic!("test server unavailable: {e}"))
}

fn opts(store: StoreConfig, cache: &Path, offline: bool) -> RemoteOptions {
    RemoteOptions {
        store,
        cache: Some(CacheOptions {
            dir: cache.to_path_buf(),
            size_max_bytes: None,
            offline,
            writes: tensora_remote::CacheWrites::default(),
        }),
        ..RemoteOptions::default()
    }
}

/// `dir/file` holding one F32 tensor `name` of 1,024 values, each `value`.
fn one_tensor_file(dir: &Path, file: &str, name: &str, value: f32) {
    let spec = TensorSpec { name: name.to_owned(), dtype: Dtype::F32, shape: vec![1024] };
    let layout = SafetensorsLayout::new(vec![spec], BTreeMap::new()).unwrap();
    let bytes: Vec<u8> = std::iter::repeat_n(value.to_le_bytes(), 1024).flatten().collect();
    write_safetensors(&dir.join(file), &layout, |_, out: &mut dyn Write| out.write_all(&bytes)).unwrap();
}

/// The names of the tensors a load of `location` gives, and the open's request count.
fn names_and_requests(location: &Location, opts: &RemoteOptions) -> (Vec<String>, u64) {
    let ckpt = open_remote(location, opts).unwrap_or_else(|e| panic!("{location}: {e}"));
    let loaded = ckpt.load(&LoadOptions::default()).unwrap_or_else(|e| panic!("{location}: {e}"));
    let mut names: Vec<String> = loaded.tensors().map(|t| t.name().to_owned()).collect();
    names.sort();
    (names, ckpt.open_requests())
}

#[test]
fn a_cached_open_of_a_prefix_sees_a_shard_added_later_unless_offline() {
    let s3 = started(support::S3rver::start());
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    one_tensor_file(first.path(), "part-a.safetensors", "a", 1.0);
    one_tensor_file(second.path(), "part-b.safetensors", "b", 2.0);
    s3.upload_dir(first.path(), "m").unwrap();
    let location = Location::parse(&format!("s3://{}/m/", support::BUCKET)).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let online = opts(s3.store_config(), cache.path(), false);

    assert_eq!(names_and_requests(&location, &online).0, ["a"]);
    // Recorded and unchanged: one HEAD for the shard and one listing.
    assert_eq!(names_and_requests(&location, &online), (vec!["a".to_owned()], 2));

    // A shard added under the prefix: the listing shows it, so the open goes to the store.
    s3.upload_dir(second.path(), "m").unwrap();
    assert_eq!(names_and_requests(&location, &online).0, ["a", "b"]);
    // That open recorded both: two HEADs and the listing.
    assert_eq!(names_and_requests(&location, &online), (vec!["a".to_owned(), "b".to_owned()], 3));

    // Offline, nothing is asked: the record answers, with both shards.
    let offline = opts(s3.store_config(), cache.path(), true);
    assert_eq!(names_and_requests(&location, &offline), (vec!["a".to_owned(), "b".to_owned()], 0));
}

#[test]
fn an_azure_location_is_cached_per_storage_account() {
    let azurite = started(support::Azurite::start());
    let src = tempfile::tempdir().unwrap();
    one_tensor_file(src.path(), "model.safetensors", "w", 3.0);
    azurite.upload_dir(src.path(), "m").unwrap();
    let cache = tempfile::tempdir().unwrap();
    let location = Location::parse(&format!("az://{}/m/", support::BUCKET)).unwrap();

    // The account the credentials name is part of every URL, and so of every cache key.
    let ckpt = open_remote(&location, &opts(azurite.store_config(), cache.path(), false)).unwrap();
    let account = support::AZURITE_ACCOUNT.0;
    assert_eq!(ckpt.url(), format!("az://{}@{account}/m", support::BUCKET));
    assert!(ckpt.objects().iter().all(|o| o.url.contains(&format!("@{account}/"))), "{:?}", ckpt.objects());
    ckpt.load(&LoadOptions::default()).unwrap();

    // The same container and path in another account was never cached: refused offline rather
    // than answered with the first account's copies.
    let other = StoreConfig {
        credentials: Some(("otheraccount".to_owned(), support::AZURITE_ACCOUNT.1.to_owned())),
        ..azurite.store_config()
    };
    let err = open_remote(&location, &opts(other, cache.path(), true)).unwrap_err();
    assert!(matches!(err, RemoteError::NotCached { .. }), "{err}");
    assert!(err.to_string().contains("@otheraccount/"), "{err}");

    // Named in the URL, the account is the one reached, and the one cached.
    let named = Location::parse(&format!("az://{}@{account}/m/", support::BUCKET)).unwrap();
    let offline = opts(azurite.store_config(), cache.path(), true);
    assert_eq!(names_and_requests(&named, &offline), (vec!["w".to_owned()], 0));
}
