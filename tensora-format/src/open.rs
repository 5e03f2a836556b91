//! How a checkpoint is opened: [`OpenOptions`] (strict or lazy shards, header threads) and the
//! parallel, ordered worker pool the sharded openers share.
//!
//! Shard headers are read (positional reads, one open per shard), parsed and turned into tensors
//! by a bounded pool of threads, and handed to the caller's thread in shard order, which merges
//! them exactly as a sequential open would: the same checks in the same order, so the same first
//! error. Workers run at most [`LOOKAHEAD_PER_THREAD`] shards per thread ahead of the merge, so
//! little work is wasted when the merge stops at an error; a strict open of an indexed directory
//! lets them run further while the merge parses the index, up to a bound in header bytes
//! (`LISTED_AHEAD_BYTES` in `sharded.rs`). Until the merge first asks for a result, one worker
//! fewer runs: the merging thread is busy (parsing that index) and keeps a core for it.

use std::sync::{Condvar, Mutex, PoisonError};

use crate::{Result, Selection};

/// Upper bound on [`OpenOptions::header_threads`].
pub const HEADER_THREADS_MAX: usize = 64;
/// Default header threads: the machine's parallelism, at most this many.
pub const HEADER_THREADS_DEFAULT_MAX: usize = 8;
/// Shards a worker may parse ahead of the merge, per thread.
pub const LOOKAHEAD_PER_THREAD: usize = 2;

/// Which shards of an indexed checkpoint (`*.safetensors.index.json`) are opened and parsed.
#[derive(Debug, Clone, Default)]
pub enum Shards {
    /// Every shard: each header parsed and every tensor checked against the index (strict).
    #[default]
    All,
    /// Only the shards that the index's `weight_map` says hold a tensor `Selection` picks: the
    /// checkpoint then holds those shards' tensors (every tensor of a parsed shard, selected or
    /// not) and nothing else. What is skipped: the other shards are never opened (a missing or
    /// corrupt one goes unnoticed), their tensors are absent, the "every tensor where the index
    /// says, and only there" checks cover the parsed shards only, and `total_size` is not
    /// compared. The checkpoint says so in a [`crate::Warning`] on the index. Without an index
    /// (one file, a directory of shards, ServerlessLLM) every file is parsed, as with
    /// [`Shards::All`]. A selection that does not compile (a bad glob) also parses every shard;
    /// the load that uses it reports the pattern.
    Selected(Selection),
}

/// How to open a checkpoint ([`crate::open_with`]). Build with `..OpenOptions::default()`.
///
/// ```
/// use tensora_format::{OpenOptions, Selection, Shards};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let lazy = OpenOptions { shards: Shards::Selected(Selection::Glob(vec!["layers.0.*".into()])), ..OpenOptions::default() };
/// // No HF index here: every partition is read, exactly as a strict open.
/// assert_eq!(tensora_format::open_with(dir, &lazy)?.tensors(), tensora_format::open(dir)?.tensors());
/// # Ok::<(), tensora_format::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Which shards of an indexed checkpoint to parse (all, by default).
    pub shards: Shards,
    /// Threads reading and parsing shard headers at once, `1..=HEADER_THREADS_MAX` (clamped).
    pub header_threads: usize,
}

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        OpenOptions { shards: Shards::All, header_threads: cpus.clamp(1, HEADER_THREADS_DEFAULT_MAX) }
    }
}

impl OpenOptions {
    pub(crate) fn threads(&self) -> usize {
        self.header_threads.clamp(1, HEADER_THREADS_MAX)
    }
}

/// What the workers and the merging thread share.
#[derive(Debug)]
struct State<T> {
    /// The next shard a worker will take.
    next: usize,
    /// Shards handed to the merge so far.
    taken: usize,
    /// Results not yet taken, by shard, with their weight.
    ready: Vec<Option<(T, u64)>>,
    /// Weight of the results waiting in `ready`.
    held: u64,
    /// Set when the merge stops early: workers take no more shards.
    stop: bool,
    /// Set when the merge first asks for a result. Before that it is busy with work of its own
    /// (parsing an index), and the last worker waits, so that the merge keeps a core.
    merging: bool,
}

/// Which worker of a pool: the last of several starts only once the merge does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Any,
    Last,
}

/// Results of a pool of scoped threads, handed out in order by [`Ordered::next`].
#[derive(Debug)]
struct Ordered<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
    /// Items a worker may always be ahead of the merge.
    lookahead: usize,
    /// Past `lookahead`, a worker takes another item while the waiting results weigh less.
    ahead_bytes: u64,
}

impl<T> Ordered<T> {
    /// A pool's shared state for `count` items, letting workers run `threads ×
    /// LOOKAHEAD_PER_THREAD` items ahead of the merge, and further while the results waiting for
    /// it weigh under `ahead_bytes`.
    fn new(count: usize, threads: usize, ahead_bytes: u64) -> Ordered<T> {
        let ready = std::iter::repeat_with(|| None).take(count).collect();
        Ordered {
            state: Mutex::new(State { next: 0, taken: 0, ready, held: 0, stop: false, merging: false }),
            changed: Condvar::new(),
            lookahead: threads.saturating_mul(LOOKAHEAD_PER_THREAD).max(1),
            ahead_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Worker `role`'s loop: take the next item while the bounds allow, until none is left.
    fn work(&self, role: Role, work: &impl Fn(usize) -> T, weight: &impl Fn(&T) -> u64) {
        loop {
            let k = {
                let mut s = self.lock();
                while !s.stop
                    && s.next < s.ready.len()
                    && ((s.next >= s.taken + self.lookahead && s.held >= self.ahead_bytes)
                        || (role == Role::Last && !s.merging))
                {
                    s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
                }
                if s.stop || s.next >= s.ready.len() {
                    return;
                }
                s.next += 1;
                s.next - 1
            };
            let done = work(k);
            let w = weight(&done);
            let mut s = self.lock();
            s.ready[k] = Some((done, w));
            s.held = s.held.saturating_add(w);
            drop(s);
            self.changed.notify_all();
        }
    }

    /// The next item's result, in order (blocks until a worker has it); `None` after the last.
    fn next(&self) -> Option<T> {
        let mut s = self.lock();
        if !s.merging {
            s.merging = true;
            self.changed.notify_all(); // The last worker may start.
        }
        let k = s.taken;
        if k >= s.ready.len() {
            return None;
        }
        let parsed = loop {
            if let Some((parsed, w)) = s.ready[k].take() {
                s.held -= w;
                break parsed;
            }
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        };
        s.taken += 1;
        drop(s);
        self.changed.notify_all();
        Some(parsed)
    }

    /// Take no more items (the merge stopped early); workers finish the one they hold.
    fn stop(&self) {
        self.lock().stop = true;
        self.changed.notify_all();
    }
}

/// Run `work(k)` for every `k` in `0..count` on up to `threads` scoped threads, handing each
/// result to `merge` on this thread, in order; stops the workers as soon as `merge` returns.
pub(crate) fn ordered_parallel<T: Send, R>(
    count: usize,
    threads: usize,
    work: impl Fn(usize) -> T + Sync,
    merge: impl FnOnce(&mut dyn FnMut() -> Option<T>) -> Result<R>,
) -> Result<R> {
    ordered_parallel_ahead(count, threads, (0, |_: &T| 0), work, merge)
}

/// [`ordered_parallel`], whose workers also run past the lookahead while the results waiting for
/// the merge weigh (by `weight`) under `ahead_bytes`: for a merge that starts late (it parses an
/// index first), so that the workers keep busy meanwhile with a bounded amount of memory.
pub(crate) fn ordered_parallel_ahead<T: Send, R>(
    count: usize,
    threads: usize,
    (ahead_bytes, weight): (u64, impl Fn(&T) -> u64 + Sync),
    work: impl Fn(usize) -> T + Sync,
    merge: impl FnOnce(&mut dyn FnMut() -> Option<T>) -> Result<R>,
) -> Result<R> {
    let pool = Ordered::new(count, threads, ahead_bytes);
    std::thread::scope(|scope| {
        let spawned = threads.min(count);
        let workers: Vec<_> = (0..spawned)
            .map(|w| {
                let role = if w > 0 && w + 1 == spawned { Role::Last } else { Role::Any };
                let (pool, work, weight) = (&pool, &work, &weight);
                scope.spawn(move || pool.work(role, work, weight))
            })
            .collect();
        let result = merge(&mut || pool.next());
        pool.stop();
        // Joined, not left to the scope, so no header thread outlives the open.
        for w in workers {
            if let Err(payload) = w.join() {
                std::panic::resume_unwind(payload);
            }
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, ErrorKind};

    #[test]
    fn results_come_in_order_whatever_the_threads() {
        for threads in [1, 2, 3, 8, 64] {
            let out = ordered_parallel(
                40,
                threads,
                |k| {
                    // Later items finish first, as far as the lookahead lets them.
                    std::thread::sleep(std::time::Duration::from_micros(((40 - k) * 20) as u64));
                    k * k
                },
                |next| {
                    let mut out = Vec::new();
                    while let Some(v) = next() {
                        out.push(v);
                    }
                    Ok(out)
                },
            )
            .unwrap();
            assert_eq!(out, (0..40).map(|k| k * k).collect::<Vec<_>>(), "{threads} threads");
        }
    }

    #[test]
    fn an_early_stop_ends_the_workers_and_returns_the_merge_error() {
        let done = std::sync::atomic::AtomicUsize::new(0);
        let err = ordered_parallel(
            1000,
            4,
            |k| {
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if k == 3 { Err(Error::new("/x", ErrorKind::HeaderLenZero)) } else { Ok(k) }
            },
            |next| {
                while let Some(v) = next() {
                    v?;
                }
                Ok(())
            },
        )
        .unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::HeaderLenZero));
        // Workers stop within the lookahead of the failed item.
        let ran = done.load(std::sync::atomic::Ordering::Relaxed);
        assert!(ran <= 4 + 4 * LOOKAHEAD_PER_THREAD + 4, "{ran} items ran");
    }

    #[test]
    fn workers_run_ahead_of_a_late_merge_up_to_the_weight_bound() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let (done, merged) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let (threads, ahead_bytes, each) = (2, 30u64, 3u64);
        // Items the bounds allow ahead of the merge: those whose results wait (30 / 3) plus one
        // being worked on by each thread.
        let ahead_max = (ahead_bytes / each) as usize + threads;
        // Every item checks, when a worker takes it, how far it is ahead of what the merge has
        // taken (an order of events, not a time): `merged` trails the pool's own count by at most
        // the one item the merge is being handed.
        let too_far = Mutex::new(Vec::new());
        let out = ordered_parallel_ahead(
            100,
            threads,
            (ahead_bytes, |_: &usize| each),
            |k| {
                let behind = merged.load(SeqCst);
                if k > behind + ahead_max {
                    too_far.lock().unwrap().push((k, behind));
                }
                done.fetch_add(1, SeqCst);
                k
            },
            |next| {
                // A merge that starts late: the workers go past the lookahead (4) while what
                // waits weighs under 30 (10 items of 3) before the merge asks for anything.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while done.load(SeqCst) < 10 && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                assert!(done.load(SeqCst) >= 10, "the workers stopped at the lookahead");
                let mut out = Vec::new();
                while let Some(v) = next() {
                    out.push(v);
                    merged.fetch_add(1, SeqCst);
                }
                Ok(out)
            },
        )
        .unwrap();
        assert_eq!(out, (0..100).collect::<Vec<_>>());
        assert_eq!(*too_far.lock().unwrap(), [], "(item, items merged) taken past the weight bound");
    }

    #[test]
    fn a_busy_merge_keeps_a_core_until_it_first_asks() {
        let ran_on = Mutex::new(std::collections::HashSet::new());
        let done = std::sync::atomic::AtomicUsize::new(0);
        let items = 20;
        let out = ordered_parallel_ahead(
            items,
            2,
            (u64::MAX, |_: &usize| 1),
            |k| {
                ran_on.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(std::time::Duration::from_millis(1));
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                k
            },
            |next| {
                // Busy (as with an index) until every item has run: on one worker only.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while done.load(std::sync::atomic::Ordering::SeqCst) < items
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                assert_eq!(ran_on.lock().unwrap().len(), 1, "both workers ran before the merge asked");
                Ok(std::iter::from_fn(next).collect::<Vec<_>>())
            },
        )
        .unwrap();
        assert_eq!(out, (0..items).collect::<Vec<_>>());
    }
}
