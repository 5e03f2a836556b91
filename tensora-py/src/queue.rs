//! A bounded hand-off queue between the streaming load thread and the Python iterator.
//!
//! Bounded twice: at most `items_max` entries and at most `bytes_max` queued bytes (one entry
//! larger than `bytes_max` is still admitted when the queue is empty, so a huge tensor cannot
//! deadlock). Closing wakes both sides: the producer's `push` fails, the consumer drains what is
//! left and then sees the end.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What `pop_timeout` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Pop<T> {
    /// The oldest item.
    Item(T),
    /// Closed and drained.
    Closed,
    /// Nothing arrived within the timeout.
    Empty,
}

#[derive(Debug)]
struct State<T> {
    items: VecDeque<(T, u64)>,
    bytes_queued: u64,
    closed: bool,
}

/// The queue. Share it in an `Arc`.
#[derive(Debug)]
pub struct Bounded<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
    items_max: usize,
    bytes_max: u64,
}

impl<T> Bounded<T> {
    /// `items_max` is raised to 1.
    pub fn new(items_max: usize, bytes_max: u64) -> Bounded<T> {
        Bounded {
            state: Mutex::new(State { items: VecDeque::new(), bytes_queued: 0, closed: false }),
            changed: Condvar::new(),
            items_max: items_max.max(1),
            bytes_max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Block until there is room, then enqueue. Returns the item back if the queue was closed.
    pub fn push(&self, item: T, len_bytes: u64) -> Result<(), T> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return Err(item);
            }
            let room = s.items.is_empty()
                || (s.items.len() < self.items_max
                    && s.bytes_queued.saturating_add(len_bytes) <= self.bytes_max);
            if room {
                break;
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.bytes_queued += len_bytes;
        s.items.push_back((item, len_bytes));
        self.changed.notify_all();
        Ok(())
    }

    /// Take the oldest entry, waiting at most `timeout`.
    pub fn pop_timeout(&self, timeout: Duration) -> Pop<T> {
        let mut s = self.lock();
        if s.items.is_empty() && !s.closed {
            s = self.changed.wait_timeout(s, timeout).unwrap_or_else(|e| e.into_inner()).0;
        }
        match s.items.pop_front() {
            Some((item, len)) => {
                s.bytes_queued -= len;
                self.changed.notify_all();
                Pop::Item(item)
            }
            None if s.closed => Pop::Closed,
            None => Pop::Empty,
        }
    }

    /// No more pushes; entries already queued can still be popped.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// Close and drop every queued entry (the consumer went away).
    pub fn close_and_clear(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.items.clear();
        s.bytes_queued = 0;
        self.changed.notify_all();
    }

    /// `(entries, bytes)` queued now.
    pub fn len(&self) -> (usize, u64) {
        let s = self.lock();
        (s.items.len(), s.bytes_queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    const WAIT: Duration = Duration::from_secs(5);

    #[test]
    fn close_fails_push_and_drains_then_ends() {
        let q = Bounded::new(4, 100);
        q.push(1, 10).expect("open");
        q.close();
        assert_eq!(q.push(2, 10), Err(2));
        assert_eq!(q.pop_timeout(WAIT), Pop::Item(1));
        assert_eq!(q.pop_timeout(WAIT), Pop::Closed);
    }

    #[test]
    fn empty_times_out_and_oversized_enters_an_empty_queue() {
        let q = Bounded::new(4, 100);
        assert_eq!(q.pop_timeout(Duration::from_millis(1)), Pop::Empty);
        q.push(7, 1000).expect("oversized admitted when empty");
        assert_eq!(q.len(), (1, 1000));
    }

    #[test]
    fn close_and_clear_wakes_a_blocked_producer() {
        let q = Arc::new(Bounded::new(1, 100));
        q.push(1, 1).expect("open");
        let q2 = Arc::clone(&q);
        let producer = std::thread::spawn(move || q2.push(2, 1));
        std::thread::sleep(Duration::from_millis(20));
        q.close_and_clear();
        assert_eq!(producer.join().expect("no panic"), Err(2));
        assert_eq!(q.len(), (0, 0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the sizes, order is kept and the bounds hold at every push.
        #[test]
        fn bounds_hold_and_order_is_kept(
            sizes in proptest::collection::vec(0u64..300, 0..40),
            items_max in 1usize..5,
            bytes_max in 1u64..500,
        ) {
            let q = Arc::new(Bounded::new(items_max, bytes_max));
            let peak_items = Arc::new(AtomicU64::new(0));
            let violation = Arc::new(AtomicU64::new(0));
            let (q2, sizes2, pi, vi) = (Arc::clone(&q), sizes.clone(), Arc::clone(&peak_items), Arc::clone(&violation));
            let producer = std::thread::spawn(move || {
                for (i, &len) in sizes2.iter().enumerate() {
                    q2.push(i, len).expect("open");
                    let (n, bytes) = q2.len();
                    pi.fetch_max(n as u64, Ordering::SeqCst);
                    if n > items_max || (n > 1 && bytes > bytes_max) {
                        vi.fetch_add(1, Ordering::SeqCst);
                    }
                }
                q2.close();
            });
            let mut got = Vec::new();
            loop {
                match q.pop_timeout(WAIT) {
                    Pop::Item(i) => got.push(i),
                    Pop::Closed => break,
                    Pop::Empty => {}
                }
            }
            producer.join().expect("no panic");
            prop_assert_eq!(got, (0..sizes.len()).collect::<Vec<_>>());
            prop_assert_eq!(violation.load(Ordering::SeqCst), 0);
            prop_assert!(peak_items.load(Ordering::SeqCst) <= items_max as u64);
        }
    }
}
