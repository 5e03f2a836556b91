//! [`Client`]: one object store and the async runtime that drives it, shared by opening a
//! checkpoint and every load of it (so connections are reused). Request counters are not the
//! client's: each operation (an open, a load) owns its [`Counters`] and passes them to
//! [`Client::fetcher`], so concurrent operations on one client never count each other's requests.

use std::sync::{Arc, Mutex};

use object_store::ObjectStore;

use crate::fetch::{Counters, Fetcher};
use crate::location::build_store;
use crate::{Location, RemoteError, RemoteOptions};

pub(crate) struct Client {
    pub store: Arc<dyn ObjectStore>,
    /// Always `Some` until dropped; taken in `Drop` to shut it down without blocking.
    runtime: Option<tokio::runtime::Runtime>,
    /// The options it was built with, `cache` always `None` ([`connection_options`]).
    pub opts: RemoteOptions,
}

impl Drop for Client {
    /// The last user of a client may be async code (a client dropped on a runtime thread):
    /// dropping a runtime there panics, so shut it down in the background instead.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Run `f` on this thread, or, when this thread is inside an async runtime (where blocking on
/// another runtime panics), on a scoped thread of its own, waiting for it.
pub(crate) fn off_runtime<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("store", &self.store.to_string()).field("opts", &self.opts).finish()
    }
}

/// One operation's request counters, read at its end.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CounterSnapshot {
    pub requests: u64,
    pub retries: u64,
    pub retry_nanos: u64,
}

/// Clients kept for later opens in this process (same store, same options but the cache):
/// building one costs milliseconds (the HTTP client loads the system's root certificates, the
/// runtime starts its threads), and a kept one keeps its connections open, past TCP's slow start.
pub const CLIENT_CACHE_MAX: usize = 8;

/// Most recently used last.
static CLIENTS: Mutex<Vec<(String, Arc<Client>)>> = Mutex::new(Vec::new());

/// What makes two clients interchangeable: the store (HTTP origin or bucket) and the environment
/// its builder reads ([`Location::client_key`]), and every option but the cache (each open's own,
/// see [`connection_options`]).
fn cache_key(location: &Location, opts: &RemoteOptions) -> String {
    // `Debug` of the options redacts the secret key and the endpoint's password and query; two
    // clients with different secrets differ. The key stays in this process's memory and is
    // never printed.
    let opts = connection_options(opts);
    format!("{} {opts:?} {:?} {:?}", location.client_key(), opts.store.endpoint, opts.store.credentials)
}

/// `opts` as a client keeps them: without the cache, which is not the client's but each open's
/// (`checkpoint::open` takes it, and the checkpoint keeps it for its loads). A process that loads
/// with one cache directory, another, or none shares one client, its connections and its
/// runtime: before, each new cache directory built a client of its own, and a cold-cache load
/// paid new connections, the runtime's start and fresh heaps (8 × 128 MiB from nginx: 0.88 s
/// against 0.69 s with the client kept, docs/design.md).
fn connection_options(opts: &RemoteOptions) -> RemoteOptions {
    RemoteOptions { cache: None, ..opts.clone() }
}

impl Client {
    /// A client for `location` with `opts` (validated here): a kept one when an earlier open in
    /// this process used the same store and options (the cache aside), else a new one (then
    /// kept, evicting the least recently used beyond [`CLIENT_CACHE_MAX`]).
    pub fn connect(location: &Location, opts: &RemoteOptions) -> Result<Arc<Client>, RemoteError> {
        opts.validate()?;
        let key = cache_key(location, opts);
        let mut cache = CLIENTS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
            let entry = cache.remove(i);
            let client = Arc::clone(&entry.1);
            cache.push(entry);
            return Ok(client);
        }
        let store = build_store(location, &opts.store, opts.timeouts())?;
        let client = Client::with_store(store, opts)?;
        cache.push((key, Arc::clone(&client)));
        if cache.len() > CLIENT_CACHE_MAX {
            let evicted = cache.remove(0);
            // Dropped outside the lock: a runtime shuts its threads down when the last user goes.
            drop(cache);
            drop(evicted);
        }
        Ok(client)
    }

    /// A client over an already built store (tests use an in-memory one).
    pub fn with_store(store: Arc<dyn ObjectStore>, opts: &RemoteOptions) -> Result<Arc<Client>, RemoteError> {
        opts.validate()?;
        let mut builder = if opts.runtime_threads == 0 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(opts.runtime_threads);
            b
        };
        let runtime = builder
            .thread_name("tensora-remote")
            .enable_all()
            .build()
            .map_err(|source| RemoteError::Resource { what: "cannot start the async runtime", source })?;
        Ok(Arc::new(Client { store, runtime: Some(runtime), opts: connection_options(opts) }))
    }

    /// The runtime driving this client's connections.
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        // Only `Drop` takes it.
        self.runtime.as_ref().unwrap_or_else(|| unreachable!("the runtime is taken only on drop"))
    }

    /// A fetcher counting into `counters` (the calling operation's own).
    pub fn fetcher<'a>(&'a self, counters: &'a Counters) -> Fetcher<'a> {
        Fetcher {
            store: &*self.store,
            policy: self.opts.retry,
            rate_min_bytes_per_s: self.opts.connection_rate_min_bytes_per_s(),
            request_overhead: self.opts.request_overhead,
            unversioned: self.opts.unversioned,
            counters,
            layer: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CacheOptions;

    fn with_cache(dir: &str) -> RemoteOptions {
        let cache = CacheOptions {
            dir: dir.into(),
            size_max_bytes: None,
            offline: false,
            writes: crate::CacheWrites::default(),
        };
        RemoteOptions { cache: Some(cache), ..RemoteOptions::default() }
    }

    /// One client (its connections, its runtime) for every cache directory and none; another
    /// for other options or another origin. A kept client holds no cache options.
    #[test]
    fn the_cache_does_not_make_another_client() {
        let here = Location::parse("http://127.0.0.1:9/m/").unwrap();
        let a = Client::connect(&here, &with_cache("/tmp/a")).unwrap();
        let b = Client::connect(&here, &with_cache("/tmp/b")).unwrap();
        let none = Client::connect(&here, &RemoteOptions::default()).unwrap();
        assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&a, &none));
        assert_eq!(a.opts.cache, None);
        let deeper = RemoteOptions { reads_inflight_max: 3, ..with_cache("/tmp/a") };
        assert!(!Arc::ptr_eq(&a, &Client::connect(&here, &deeper).unwrap()));
        let there = Location::parse("http://127.0.0.1:10/m/").unwrap();
        assert!(!Arc::ptr_eq(&a, &Client::connect(&there, &with_cache("/tmp/a")).unwrap()));
        let built = Client::with_store(Arc::clone(&a.store), &with_cache("/tmp/c")).unwrap();
        assert_eq!(built.opts.cache, None);
    }

    /// Endpoints that differ only in a secret (which `Debug` of the options redacts) are two
    /// clients, each sending its own.
    #[test]
    fn endpoints_that_differ_in_a_secret_are_two_clients() {
        let bucket = Location::parse("s3://b/m/").unwrap();
        let with_endpoint = |endpoint: &str| {
            let store = crate::StoreConfig {
                endpoint: Some(endpoint.into()),
                allow_http: true,
                anonymous: true,
                ..crate::StoreConfig::default()
            };
            RemoteOptions { store, ..RemoteOptions::default() }
        };
        let (one, two) =
            (with_endpoint("http://u:one@127.0.0.1:9"), with_endpoint("http://u:two@127.0.0.1:9"));
        assert_eq!(format!("{one:?}"), format!("{two:?}"));
        let a = Client::connect(&bucket, &one).unwrap();
        assert!(Arc::ptr_eq(&a, &Client::connect(&bucket, &one).unwrap()));
        assert!(!Arc::ptr_eq(&a, &Client::connect(&bucket, &two).unwrap()));
    }
}
