//! The in-flight byte budget: a FIFO byte semaphore with blocking, async and non-blocking forms.
//!
//! Rules:
//! - The bytes held by outstanding [`Permit`]s never exceed [`Budget::capacity_bytes`].
//! - Requests are granted strictly in arrival order (FIFO tickets), whichever form they use, so a
//!   large request is never starved by a stream of small ones. [`Budget::try_acquire`] never jumps
//!   the queue: it fails while anyone is waiting.
//! - A request larger than the capacity is **clamped** to the whole capacity: it waits until the
//!   budget is idle, then holds all of it. That keeps one oversized read deadlock-free and still
//!   alone in flight. [`Permit::bytes`] says what was actually granted.
//! - A zero-byte request is granted at once (it holds nothing).
//! - A capacity of 0 is raised to 1 byte, so the bound stays meaningful.

use std::collections::VecDeque;
#[cfg(feature = "async")]
use std::future::Future;
#[cfg(feature = "async")]
use std::pin::pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(feature = "async")]
use tokio::sync::Notify;

/// A clonable handle to one shared in-flight byte budget.
///
/// ```
/// use tensora_io::Budget;
/// let budget = Budget::new(100);
/// let a = budget.acquire(60);
/// assert!(budget.try_acquire(50).is_none()); // 60 + 50 > 100
/// let worker = {
///     let budget = budget.clone();
///     // Larger than the budget: clamped to all 100 bytes, granted once `a` is dropped.
///     std::thread::spawn(move || budget.acquire(1_000).bytes())
/// };
/// drop(a);
/// assert_eq!(worker.join().unwrap(), 100);
/// assert_eq!(budget.in_use_bytes(), 0);
/// assert_eq!(budget.peak_bytes(), 100);
/// ```
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

struct Inner {
    capacity_bytes: u64,
    state: Mutex<State>,
    /// Wakes blocked threads.
    cond: Condvar,
    /// Wakes async waiters.
    #[cfg(feature = "async")]
    notify: Notify,
}

#[derive(Default)]
struct State {
    in_use_bytes: u64,
    peak_bytes: u64,
    /// Tickets waiting, oldest first. Only the front may be granted.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

/// Bytes of a [`Budget`], given back when dropped. Owns an `Arc`, so it is `'static` and can move
/// to another thread or task.
pub struct Permit {
    inner: Arc<Inner>,
    bytes: u64,
}

impl Budget {
    /// A budget of `budget_bytes` (at least 1).
    pub fn new(budget_bytes: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                capacity_bytes: budget_bytes.max(1),
                state: Mutex::new(State::default()),
                cond: Condvar::new(),
                #[cfg(feature = "async")]
                notify: Notify::new(),
            }),
        }
    }

    /// The capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes
    }

    /// Bytes held by outstanding permits now.
    pub fn in_use_bytes(&self) -> u64 {
        self.inner.lock().in_use_bytes
    }

    /// The highest `in_use_bytes` seen since the budget was made.
    pub fn peak_bytes(&self) -> u64 {
        self.inner.lock().peak_bytes
    }

    /// Requests waiting now (blocking and async together).
    pub fn waiters(&self) -> usize {
        self.inner.lock().queue.len()
    }

    /// What a request of `bytes` is granted: `min(bytes, capacity_bytes)`.
    pub fn clamp(&self, bytes: u64) -> u64 {
        bytes.min(self.inner.capacity_bytes)
    }

    /// Blocks the calling thread until `bytes` (clamped to the capacity) are free and every earlier
    /// request has been granted. Do not call it from an async task; use [`Budget::acquire_async`].
    pub fn acquire(&self, bytes: u64) -> Permit {
        let bytes = self.clamp(bytes);
        if bytes == 0 {
            return self.permit(0);
        }
        let mut state = self.inner.lock();
        let ticket = state.enqueue();
        loop {
            if self.inner.try_grant(&mut state, ticket, bytes) {
                return self.permit(bytes);
            }
            state = self.inner.cond.wait(state).unwrap_or_else(|poison| poison.into_inner());
        }
    }

    /// The async form of [`Budget::acquire`], for tokio (or any executor). FIFO with blocking
    /// callers. Cancel-safe: dropping the future before it completes leaves the queue. Needs the
    /// `async` feature.
    #[cfg(feature = "async")]
    pub fn acquire_async(&self, bytes: u64) -> impl Future<Output = Permit> + Send + 'static {
        let budget = self.clone();
        async move {
            let bytes = budget.clamp(bytes);
            if bytes == 0 {
                return budget.permit(0);
            }
            let ticket = budget.inner.lock().enqueue();
            // Leaves the queue if this future is dropped while waiting.
            let mut waiting = Waiting { inner: &budget.inner, ticket, granted: false };
            loop {
                let mut notified = pin!(budget.inner.notify.notified());
                {
                    let mut state = budget.inner.lock();
                    if budget.inner.try_grant(&mut state, ticket, bytes) {
                        waiting.granted = true;
                        return budget.permit(bytes);
                    }
                    // Registered under the lock: a release after this point wakes us.
                    notified.as_mut().enable();
                }
                notified.await;
            }
        }
    }

    /// Grants `bytes` (clamped) at once if they are free and nobody is waiting; never blocks.
    pub fn try_acquire(&self, bytes: u64) -> Option<Permit> {
        let bytes = self.clamp(bytes);
        if bytes == 0 {
            return Some(self.permit(0));
        }
        let mut state = self.inner.lock();
        if !state.queue.is_empty() || !state.fits(bytes, self.inner.capacity_bytes) {
            return None;
        }
        state.take(bytes);
        Some(self.permit(bytes))
    }

    fn permit(&self, bytes: u64) -> Permit {
        Permit { inner: Arc::clone(&self.inner), bytes }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a few integers updated atomically under the lock; a panic elsewhere cannot
        // leave it half-written, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Grants `bytes` to `ticket` if it is at the front and they fit; wakes the next waiter.
    fn try_grant(&self, state: &mut State, ticket: u64, bytes: u64) -> bool {
        if state.queue.front() != Some(&ticket) || !state.fits(bytes, self.capacity_bytes) {
            return false;
        }
        state.queue.pop_front();
        state.take(bytes);
        // The new front may fit too.
        self.wake_all();
        true
    }

    fn wake_all(&self) {
        self.cond.notify_all();
        #[cfg(feature = "async")]
        self.notify.notify_waiters();
    }
}

impl State {
    fn enqueue(&mut self) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.queue.push_back(ticket);
        ticket
    }

    /// Whether `bytes` more fit under `capacity_bytes`. Written without `in_use + bytes`, which
    /// overflows for capacities above `u64::MAX / 2` (`in_use <= capacity` always holds).
    fn fits(&self, bytes: u64, capacity_bytes: u64) -> bool {
        bytes <= capacity_bytes - self.in_use_bytes
    }

    fn take(&mut self, bytes: u64) {
        self.in_use_bytes += bytes;
        self.peak_bytes = self.peak_bytes.max(self.in_use_bytes);
    }
}

/// An async waiter's place in the queue; removed on drop unless granted.
#[cfg(feature = "async")]
struct Waiting<'a> {
    inner: &'a Inner,
    ticket: u64,
    granted: bool,
}

#[cfg(feature = "async")]
impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let mut state = self.inner.lock();
        if let Some(pos) = state.queue.iter().position(|&t| t == self.ticket) {
            state.queue.remove(pos);
            if pos == 0 {
                // The next request may now be grantable.
                self.inner.wake_all();
            }
        }
    }
}

impl Permit {
    /// Bytes this permit holds (the request, clamped to the capacity).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut state = self.inner.lock();
        state.in_use_bytes -= self.bytes;
        self.inner.wake_all();
    }
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("Budget")
            .field("capacity_bytes", &self.inner.capacity_bytes)
            .field("in_use_bytes", &state.in_use_bytes)
            .field("peak_bytes", &state.peak_bytes)
            .field("waiters", &state.queue.len())
            .finish()
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("bytes", &self.bytes).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc;
    use std::task::Poll;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    /// How long a test waits for something that must happen (generous for a loaded CI machine).
    const WAIT_MAX: Duration = Duration::from_secs(10);
    /// Poll interval while waiting for another thread to queue up.
    const POLL: Duration = Duration::from_millis(1);

    fn wait_for_waiters(budget: &Budget, n: usize) {
        let deadline = std::time::Instant::now() + WAIT_MAX;
        while budget.waiters() != n {
            assert!(std::time::Instant::now() < deadline, "waiters stuck at {}", budget.waiters());
            std::thread::sleep(POLL);
        }
    }

    #[test]
    fn permits_release_on_drop_and_peak_is_tracked() {
        let budget = Budget::new(100);
        let a = budget.acquire(30);
        let b = budget.try_acquire(70).unwrap();
        assert_eq!(budget.in_use_bytes(), 100);
        assert!(budget.try_acquire(1).is_none());
        drop(a);
        assert_eq!(budget.in_use_bytes(), 70);
        drop(b);
        assert_eq!((budget.in_use_bytes(), budget.peak_bytes()), (0, 100));
    }

    #[test]
    fn a_capacity_near_u64_max_never_overflows() {
        let budget = Budget::new(u64::MAX);
        let a = budget.acquire(u64::MAX - 10);
        // `in_use + bytes` would overflow here (a panic in debug builds, a wrap-around grant in
        // release builds).
        assert!(budget.try_acquire(11).is_none());
        assert!(budget.try_acquire(u64::MAX).is_none());
        let b = budget.try_acquire(10).unwrap();
        assert_eq!(budget.in_use_bytes(), u64::MAX);
        drop(a);
        let c = budget.acquire(u64::MAX - 10);
        assert_eq!(c.bytes(), u64::MAX - 10);
        drop((b, c));
        assert_eq!((budget.in_use_bytes(), budget.peak_bytes()), (0, u64::MAX));
    }

    #[test]
    fn oversized_requests_are_clamped_to_the_whole_budget() {
        let budget = Budget::new(64);
        let p = budget.acquire(1 << 40);
        assert_eq!(p.bytes(), 64);
        assert_eq!(budget.in_use_bytes(), 64);
        assert!(budget.try_acquire(u64::MAX).is_none());
        drop(p);
        assert_eq!(budget.try_acquire(u64::MAX).unwrap().bytes(), 64);
        assert_eq!(budget.in_use_bytes(), 0);
        // Zero-byte requests never wait, and a zero capacity is raised to 1 byte.
        let _full = budget.acquire(64);
        assert_eq!(budget.acquire(0).bytes(), 0);
        assert_eq!(Budget::new(0).capacity_bytes(), 1);
    }

    #[test]
    fn grants_are_fifo_so_a_large_request_is_not_starved() {
        let budget = Budget::new(10);
        let first = budget.acquire(5);
        let (tx, rx) = mpsc::channel::<&'static str>();
        let big = {
            let (budget, tx) = (budget.clone(), tx.clone());
            std::thread::spawn(move || {
                let p = budget.acquire(10);
                tx.send("big").unwrap();
                p
            })
        };
        wait_for_waiters(&budget, 1);
        // 5 bytes are free, but the big request came first: a small one must wait behind it,
        // and try_acquire must not jump the queue.
        assert!(budget.try_acquire(1).is_none());
        let small = {
            let (budget, tx) = (budget.clone(), tx.clone());
            std::thread::spawn(move || {
                let p = budget.acquire(1);
                tx.send("small").unwrap();
                p
            })
        };
        wait_for_waiters(&budget, 2);
        assert!(rx.try_recv().is_err(), "someone was granted out of order");
        drop(first);
        assert_eq!(rx.recv_timeout(WAIT_MAX).unwrap(), "big");
        let big_permit = big.join().unwrap();
        assert!(rx.try_recv().is_err(), "small granted while big holds everything");
        drop(big_permit);
        assert_eq!(rx.recv_timeout(WAIT_MAX).unwrap(), "small");
        drop(small.join().unwrap());
        assert_eq!(budget.in_use_bytes(), 0);
    }

    /// Threads acquiring random sizes, checking the bound while they hold their permits.
    #[test]
    fn contention_never_exceeds_the_capacity() {
        const THREADS: u64 = 16;
        const ROUNDS: u64 = 300;
        const CAPACITY: u64 = 1000;
        let budget = Budget::new(CAPACITY);
        let held = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (budget, held) = (budget.clone(), Arc::clone(&held));
                std::thread::spawn(move || {
                    let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    for _ in 0..ROUNDS {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let want = x % (CAPACITY + 200); // some requests exceed the capacity
                        let permit = if x % 5 == 0 {
                            match budget.try_acquire(want) {
                                Some(p) => p,
                                None => continue,
                            }
                        } else {
                            budget.acquire(want)
                        };
                        let now = held.fetch_add(permit.bytes(), Ordering::SeqCst) + permit.bytes();
                        assert!(now <= CAPACITY, "{now} bytes held");
                        assert!(budget.in_use_bytes() <= CAPACITY);
                        std::thread::yield_now();
                        held.fetch_sub(permit.bytes(), Ordering::SeqCst);
                        drop(permit);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(budget.in_use_bytes(), 0);
        assert_eq!(budget.waiters(), 0);
        assert!(budget.peak_bytes() <= CAPACITY && budget.peak_bytes() > 0);
    }

    #[cfg(feature = "async")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_acquire_waits_fifo_with_blocking_callers() {
        let budget = Budget::new(8);
        let first = budget.acquire_async(8).await;
        let waiter = tokio::spawn(budget.acquire_async(6));
        let b2 = budget.clone();
        tokio::task::spawn_blocking(move || wait_for_waiters(&b2, 1)).await.unwrap();
        let blocking = {
            let budget = budget.clone();
            tokio::task::spawn_blocking(move || budget.acquire(4).bytes())
        };
        let b2 = budget.clone();
        tokio::task::spawn_blocking(move || wait_for_waiters(&b2, 2)).await.unwrap();
        drop(first);
        let p = tokio::time::timeout(WAIT_MAX, waiter).await.unwrap().unwrap();
        assert_eq!(p.bytes(), 6);
        // The blocking caller (4 bytes) cannot fit beside 6 until the async permit goes.
        assert!(!blocking.is_finished());
        drop(p);
        assert_eq!(blocking.await.unwrap(), 4);
        assert_eq!(budget.in_use_bytes(), 0);
    }

    #[cfg(feature = "async")]
    #[tokio::test]
    async fn a_dropped_async_waiter_leaves_the_queue() {
        let budget = Budget::new(8);
        let held = budget.acquire(8);
        let mut pending = Box::pin(budget.acquire_async(8));
        // Poll once so it queues.
        let polled = std::future::poll_fn(|cx| Poll::Ready(pending.as_mut().poll(cx).is_ready())).await;
        assert!(!polled);
        assert_eq!(budget.waiters(), 1);
        drop(pending);
        assert_eq!(budget.waiters(), 0);
        drop(held);
        assert_eq!(budget.try_acquire(8).unwrap().bytes(), 8);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Any sequence of try_acquire/release keeps `in_use <= capacity` and matches a model.
        #[test]
        fn try_acquire_matches_a_model(
            capacity in 1u64..1000,
            ops in prop::collection::vec((any::<bool>(), 0u64..1500), 0..64),
        ) {
            let budget = Budget::new(capacity);
            let mut held: Vec<Permit> = Vec::new();
            let mut model: u64 = 0;
            for (take, bytes) in ops {
                if take {
                    let want = bytes.min(capacity);
                    match budget.try_acquire(bytes) {
                        Some(p) => {
                            prop_assert!(model + want <= capacity);
                            prop_assert_eq!(p.bytes(), want);
                            model += want;
                            held.push(p);
                        }
                        None => prop_assert!(model + want > capacity),
                    }
                } else if !held.is_empty() {
                    let p = held.swap_remove(bytes as usize % held.len());
                    model -= p.bytes();
                }
                prop_assert_eq!(budget.in_use_bytes(), model);
                prop_assert!(model <= capacity);
            }
        }
    }
}
