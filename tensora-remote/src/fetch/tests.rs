//! Fetcher tests: against `test_store`'s in-memory stores that break, hang or refuse.

use super::*;
use proptest::prelude::*;

use object_store::ObjectStoreExt;

use crate::test_store::BreakingStore;

/// How long a test's response may send nothing before it counts as silent: long enough that a
/// healthy in-memory response delayed by a busy machine (two cores shared by parallel builds) is
/// not taken for a silent one, short enough to keep the silent cases' waits small.
const SILENCE_BOUND: Duration = Duration::from_secs(1);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn fast_policy(retries: u32) -> RetryPolicy {
    RetryPolicy {
        retries_per_range_max: retries,
        retry_time_max: Duration::from_secs(10),
        backoff_initial: Duration::ZERO,
        backoff_max: Duration::ZERO,
    }
}

/// Store `data` at `x`, and return the store and the object as seen "at open".
fn setup(rt: &tokio::runtime::Runtime, data: &[u8]) -> (BreakingStore, RemoteObject) {
    let store = BreakingStore::default();
    let path = ObjectPath::from("x");
    rt.block_on(store.inner.put(&path, data.to_vec().into())).unwrap();
    let meta = rt.block_on(store.inner.head(&path)).unwrap();
    (store, RemoteObject { url: "mem://x".into(), meta })
}

fn fetcher<'a>(store: &'a BreakingStore, counters: &'a Counters, retries: u32) -> Fetcher<'a> {
    Fetcher {
        store,
        policy: fast_policy(retries),
        rate_min_bytes_per_s: 1 << 30,
        request_overhead: Duration::from_secs(5),
        unversioned: Unversioned::Refuse,
        counters,
        layer: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    /// However bodies break (within the retry bound), the range lands exactly, each retry
    /// resumes where the last attempt stopped, and retries are counted.
    #[test]
    fn broken_bodies_resume_to_exact_bytes(
        len in 1usize..20_000,
        start_frac in 0.0f64..1.0,
        breaks in proptest::collection::vec(0usize..8_000, 0..6),
    ) {
        let rt = rt();
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let (store, object) = setup(&rt, &data);
        store.breaks.lock().unwrap().extend(breaks.iter().copied());
        let counters = Counters::default();
        let f = fetcher(&store, &counters, breaks.len() as u32);
        let offset = ((len - 1) as f64 * start_frac) as usize;
        let mut dest = vec![0u8; len - offset];
        rt.block_on(f.fetch(&object, offset as u64, &mut dest)).unwrap();
        prop_assert_eq!(&dest[..], &data[offset..]);
        let retries = counters.retries.load(Ordering::Relaxed);
        prop_assert!(retries <= breaks.len() as u64);
        prop_assert_eq!(counters.requests.load(Ordering::Relaxed), retries + 1);
        prop_assert_eq!(counters.bytes.load(Ordering::Relaxed), dest.len() as u64);
    }
}

#[test]
fn too_many_breaks_exhaust_the_retries() {
    let rt = rt();
    let data = vec![7u8; 10_000];
    let (store, object) = setup(&rt, &data);
    store.breaks.lock().unwrap().extend([0, 100, 0, 5]);
    let counters = Counters::default();
    let mut dest = vec![0u8; 10_000];
    let err = rt.block_on(fetcher(&store, &counters, 3).fetch(&object, 0, &mut dest)).unwrap_err();
    assert!(matches!(err, RemoteError::RetriesExhausted { attempts: 4, .. }), "{err}");
    assert_eq!(counters.retries.load(Ordering::Relaxed), 3);
    // The error names the first byte that did not land (100 + 5 did), not the range start.
    let RemoteError::RetriesExhausted { offset_bytes, len_bytes, .. } = err else { unreachable!() };
    assert_eq!((offset_bytes, len_bytes), (105, 10_000 - 105));
}

/// A GET that answers nothing is retried after `request_overhead`, long before the
/// attempt's allowance for its bytes (here 10^4 s) runs out.
#[test]
fn a_silent_response_is_retried_after_the_request_overhead() {
    let rt = rt();
    let data = vec![9u8; 10_000];
    let (store, object) = setup(&rt, &data);
    store.hang_next.store(1, Ordering::Relaxed);
    let counters = Counters::default();
    let f =
        Fetcher { rate_min_bytes_per_s: 1, request_overhead: SILENCE_BOUND, ..fetcher(&store, &counters, 1) };
    assert!(f.attempt_timeout(10_000) > Duration::from_secs(9_000));
    let mut dest = vec![0u8; 10_000];
    rt.block_on(f.fetch(&object, 0, &mut dest)).unwrap();
    assert_eq!(dest, data);
    assert_eq!(counters.retries.load(Ordering::Relaxed), 1);
    let hangs = &store.hangs;
    assert_eq!((hangs.started.load(Ordering::Acquire), hangs.dropped.load(Ordering::Acquire)), (1, 1));
    // With no retry left, the silence is the error, named.
    store.hang_next.store(1, Ordering::Relaxed);
    let f = Fetcher { policy: fast_policy(0), ..f };
    let err = rt.block_on(f.fetch(&object, 0, &mut dest)).unwrap_err();
    assert!(matches!(err, RemoteError::RetriesExhausted { attempts: 1, .. }), "{err}");
    assert!(err.to_string().contains("no byte for 1.0 s"), "{err}");
}

/// A range whose attempts each move at least [`HEADWAY_BYTES_MIN`] before they break (a
/// slow, lossy link) is not failed by a retry bound that counts one episode: with one retry
/// allowed, three breaks after 1.5 MiB each still load it. Breaks after less than that are
/// one episode, and the second exhausts the retry.
#[test]
fn attempts_that_make_headway_start_a_new_failure_episode() {
    let rt = rt();
    let data: Vec<u8> = (0..6u32 << 20).map(|i| (i % 251) as u8).collect();
    let (store, object) = setup(&rt, &data);
    let step = HEADWAY_BYTES_MIN * 3 / 2;
    store.breaks.lock().unwrap().extend([step, step, step]);
    let counters = Counters::default();
    let f = Fetcher { rate_min_bytes_per_s: 1, ..fetcher(&store, &counters, 1) };
    let mut dest = vec![0u8; data.len()];
    rt.block_on(f.fetch(&object, 0, &mut dest)).unwrap();
    assert!(dest == data);
    assert_eq!(counters.retries.load(Ordering::Relaxed), 3);
    // Short of the headway: the two breaks are one episode, and one retry is not enough.
    store.breaks.lock().unwrap().extend([HEADWAY_BYTES_MIN / 2, HEADWAY_BYTES_MIN / 2]);
    let err = rt.block_on(f.fetch(&object, 0, &mut dest)).unwrap_err();
    assert!(matches!(err, RemoteError::RetriesExhausted { attempts: 2, .. }), "{err}");
    // At the headway's size but slower than the link's share: one episode too.
    store.breaks.lock().unwrap().extend([step, step]);
    let slow = Fetcher { rate_min_bytes_per_s: u64::MAX, ..f };
    let err = rt.block_on(slow.fetch(&object, 0, &mut dest)).unwrap_err();
    assert!(matches!(err, RemoteError::RetriesExhausted { attempts: 2, .. }), "{err}");
}

/// A connection that goes silent while the load's other ranges keep the link moving (a
/// crowded slow link) starts a new failure episode: two silences with one retry allowed
/// still load the range. Two silences on a link where nothing else moved exhaust it.
#[test]
fn a_silence_on_a_moving_link_starts_a_new_failure_episode() {
    let rt = rt();
    let data = vec![3u8; 10_000];
    let (store, object) = setup(&rt, &data);
    let counters = Counters::default();
    let f = Fetcher { request_overhead: SILENCE_BOUND, ..fetcher(&store, &counters, 1) };
    let mut dest = vec![0u8; data.len()];
    store.hang_next.store(2, Ordering::Relaxed);
    std::thread::scope(|s| {
        // The other ranges: a mebibyte arrives while each silent attempt hangs.
        s.spawn(|| {
            for n in 1..=2 {
                store.hangs.wait_started(n);
                counters.bytes.fetch_add(HEADWAY_BYTES_MIN as u64, Ordering::Relaxed);
            }
        });
        rt.block_on(f.fetch(&object, 0, &mut dest)).unwrap();
    });
    assert_eq!(dest, data);
    assert_eq!(counters.retries.load(Ordering::Relaxed), 2);
    store.hang_next.store(2, Ordering::Relaxed);
    let err = rt.block_on(f.fetch(&object, 0, &mut dest)).unwrap_err();
    assert!(matches!(err, RemoteError::RetriesExhausted { attempts: 2, .. }), "{err}");
    assert!(err.to_string().contains("no byte for 1.0 s"), "{err}");
}

#[test]
fn a_replaced_object_is_changed_not_retried() {
    let rt = rt();
    let (store, object) = setup(&rt, &[1u8; 5000]);
    rt.block_on(store.inner.put(object.path(), vec![2u8; 5000].into())).unwrap();
    let counters = Counters::default();
    let mut dest = vec![0u8; 5000];
    let err = rt.block_on(fetcher(&store, &counters, 5).fetch(&object, 0, &mut dest)).unwrap_err();
    assert!(err.is_changed(), "{err}");
    assert_eq!(counters.retries.load(Ordering::Relaxed), 0);
    // Replaced between two attempts of one range: the resumed request is refused too.
    let (store, object) = setup(&rt, &[1u8; 5000]);
    store.breaks.lock().unwrap().push_back(2000);
    let path = object.path().clone();
    let counters = Counters::default();
    let fetch = async {
        let mut f = fetcher(&store, &counters, 5);
        f.policy.backoff_initial = Duration::from_millis(20);
        f.policy.backoff_max = Duration::from_millis(20);
        let mut dest = vec![0u8; 5000];
        f.fetch(&object, 0, &mut dest).await
    };
    // The first attempt breaks after 2000 bytes and counts its retry before the backoff: replace
    // the object then, before the resumed request (ordered by the counter, not by scheduling).
    let replace = async {
        for _ in 0..YIELDS_MAX {
            if counters.retries.load(Ordering::Relaxed) > 0 {
                store.inner.put(&path, vec![3u8; 5000].into()).await.unwrap();
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the first attempt never broke");
    };
    let (result, ()) = rt.block_on(async { futures::future::join(fetch, replace).await });
    assert!(result.unwrap_err().is_changed());
    assert_eq!(counters.retries.load(Ordering::Relaxed), 1, "the resumed request ran, and was refused");
}

/// Yields [`a_replaced_object_is_changed_not_retried`] waits for a range's first attempt to
/// break (it breaks within a few polls; its backoff sleeps 20 ms).
const YIELDS_MAX: u32 = 1_000_000;

/// Finding 7 of issue 14: a body of an object with no version that breaks is not resumed
/// (the second request may read another version) unless allowed.
#[test]
fn a_resumed_range_of_an_object_with_no_version_is_refused_unless_allowed() {
    let rt = rt();
    let data = vec![5u8; 10_000];
    let (store, mut object) = setup(&rt, &data);
    object.meta.e_tag = None;
    object.meta.last_modified = Default::default();
    let versionless =
        crate::test_store::VersionlessStore { inner: store, drop_last_modified: true, ..Default::default() };
    let counters = Counters::default();
    for (allowed, ok) in [(Unversioned::Refuse, false), (Unversioned::Allow, true)] {
        versionless.inner.breaks.lock().unwrap().push_back(3000);
        let mut f = fetcher(&versionless.inner, &counters, 3);
        f.store = &versionless;
        f.unversioned = allowed;
        let mut dest = vec![0u8; 10_000];
        let result = rt.block_on(f.fetch(&object, 0, &mut dest));
        match result {
            Ok(()) => assert!(ok && dest == data),
            Err(e) => {
                assert!(!ok && matches!(e, RemoteError::Unversioned { what: "a resumed range", .. }), "{e}")
            }
        }
    }
}

#[test]
fn backoff_doubles_to_the_cap() {
    let p = RetryPolicy::default();
    assert_eq!(p.backoff(1), Duration::from_millis(100));
    assert_eq!(p.backoff(2), Duration::from_millis(200));
    assert_eq!(p.backoff(5), Duration::from_millis(1600));
    assert_eq!(p.backoff(6), Duration::from_secs(2));
    assert_eq!(p.backoff(u32::MAX), Duration::from_secs(2));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// Backoff never decreases and never passes its cap.
    #[test]
    fn backoff_monotone_and_capped(init_ms in 0u64..5000, max_ms in 0u64..60_000, k in 1u32..64) {
        let p = RetryPolicy {
            backoff_initial: Duration::from_millis(init_ms),
            backoff_max: Duration::from_millis(max_ms),
            ..RetryPolicy::default()
        };
        prop_assert!(p.backoff(k) <= p.backoff(k + 1));
        prop_assert!(p.backoff(k) <= p.backoff_max);
    }
}
