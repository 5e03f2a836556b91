//! A bounded hand-off queue between the streaming load thread and the Python iterator.
//!
//! Bounded twice: at most `items_max` entries and at most `bytes_max` queued bytes (one entry
//! larger than `bytes_max` is still admitted when the queue is empty, so a huge tensor cannot
//! deadlock). Closing wakes both sides: the producer's `push` fails, the consumer drains what is
//! left and then sees the end. [`Bounded::hand_off`] and [`Bounded::wait_taken`] also wait until
//! an item is taken, for a producer that must not load more while the consumer has not moved on.

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
    /// Producers blocked in `push`, waiting for room.
    producers_waiting: usize,
    /// Items ever enqueued and ever taken (a hand-off waits for its item's number to be taken).
    pushed_total: u64,
    popped_total: u64,
}

/// The queue was closed before the item was taken.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed;

/// The place of a pushed item in the order of every push (see [`Bounded::wait_taken`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

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
            state: Mutex::new(State {
                items: VecDeque::new(),
                bytes_queued: 0,
                closed: false,
                producers_waiting: 0,
                pushed_total: 0,
                popped_total: 0,
            }),
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
        self.push_ticket(item, len_bytes).map(|_| ())
    }

    /// [`Bounded::push`], returning the item's [`Ticket`] for [`Bounded::wait_taken`].
    pub fn push_ticket(&self, item: T, len_bytes: u64) -> Result<Ticket, T> {
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
            s.producers_waiting += 1;
            // Tell anyone watching `producers_waiting` (it changed).
            self.changed.notify_all();
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            s.producers_waiting -= 1;
        }
        s.bytes_queued += len_bytes;
        s.items.push_back((item, len_bytes));
        s.pushed_total += 1;
        self.changed.notify_all();
        Ok(Ticket(s.pushed_total))
    }

    /// Block until the consumer has taken the item of `ticket` (and so every item before it).
    /// `Err(Closed)` when the queue was closed before that (the item was then dropped, or is
    /// still there to drain).
    pub fn wait_taken(&self, ticket: Ticket) -> Result<(), Closed> {
        let mut s = self.lock();
        while s.popped_total < ticket.0 {
            if s.closed {
                return Err(Closed);
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    /// [`Bounded::push`], then block until the consumer has taken the item: a producer that
    /// hands off this way holds at most one item the consumer has not taken, and starts on the
    /// next only when the consumer has moved past the previous one.
    pub fn hand_off(&self, item: T, len_bytes: u64) -> Result<(), Closed> {
        let ticket = self.push_ticket(item, len_bytes).map_err(|_| Closed)?;
        self.wait_taken(ticket)
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
                s.popped_total += 1;
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

    /// How many producers are blocked in [`Bounded::push`] now, waiting for room.
    pub fn producers_waiting(&self) -> usize {
        self.lock().producers_waiting
    }

    /// Wait until at least `n` producers are blocked in [`Bounded::push`]; `false` if that has
    /// not happened within `timeout` (lets a test force the order "producer blocked, then
    /// close" instead of hoping for it).
    pub fn wait_for_producers_waiting(&self, n: usize, timeout: Duration) -> bool {
        let s = self.lock();
        let (s, _) = self
            .changed
            .wait_timeout_while(s, timeout, |s| s.producers_waiting < n)
            .unwrap_or_else(|e| e.into_inner());
        s.producers_waiting >= n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, mpsc};

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

    /// A producer blocked on a full queue (forced: the test waits until it is), on its own
    /// thread reporting back over a channel, so a wake-up that never comes fails the test after
    /// `WAIT` instead of hanging it.
    fn blocked_producer(q: &Arc<Bounded<i32>>, item: i32) -> mpsc::Receiver<Result<(), i32>> {
        let (tx, rx) = mpsc::channel();
        let q2 = Arc::clone(q);
        std::thread::spawn(move || {
            let _ = tx.send(q2.push(item, 1));
        });
        assert!(q.wait_for_producers_waiting(1, WAIT), "the producer never blocked");
        rx
    }

    #[test]
    fn close_and_clear_wakes_a_blocked_producer() {
        let q = Arc::new(Bounded::new(1, 100));
        q.push(1, 1).expect("open");
        let woken = blocked_producer(&q, 2);
        q.close_and_clear();
        assert_eq!(woken.recv_timeout(WAIT), Ok(Err(2)), "the blocked producer was not woken");
        assert_eq!(q.len(), (0, 0));
        assert_eq!(q.producers_waiting(), 0);
    }

    #[test]
    fn close_wakes_a_blocked_producer_and_keeps_the_queue() {
        let q = Arc::new(Bounded::new(1, 100));
        q.push(1, 1).expect("open");
        let woken = blocked_producer(&q, 2);
        q.close();
        assert_eq!(woken.recv_timeout(WAIT), Ok(Err(2)), "the blocked producer was not woken");
        assert_eq!(q.pop_timeout(WAIT), Pop::Item(1));
        assert_eq!(q.pop_timeout(WAIT), Pop::Closed);
    }

    #[test]
    fn a_pop_makes_room_for_a_blocked_producer() {
        let q = Arc::new(Bounded::new(1, 100));
        q.push(1, 1).expect("open");
        let woken = blocked_producer(&q, 2);
        assert_eq!(q.pop_timeout(WAIT), Pop::Item(1));
        assert_eq!(woken.recv_timeout(WAIT), Ok(Ok(())), "the pop did not wake the producer");
        assert_eq!(q.pop_timeout(WAIT), Pop::Item(2));
    }

    #[test]
    fn a_hand_off_returns_once_taken_and_a_close_ends_it() {
        let q = Arc::new(Bounded::new(1, 100));
        let (tx, rx) = mpsc::channel();
        let q2 = Arc::clone(&q);
        std::thread::spawn(move || {
            let _ = tx.send(q2.hand_off(3, 1));
            let _ = tx.send(q2.hand_off(4, 1));
        });
        // Queued but not taken: the hand-off has not returned.
        assert_eq!(rx.recv_timeout(Duration::from_millis(50)), Err(mpsc::RecvTimeoutError::Timeout));
        assert_eq!(q.pop_timeout(WAIT), Pop::Item(3));
        assert_eq!(rx.recv_timeout(WAIT), Ok(Ok(())), "taking the item did not end the hand-off");
        // The second item is queued (waited for, at most `WAIT`) and never taken: closing ends
        // its hand-off.
        let deadline = std::time::Instant::now() + WAIT;
        while q.len().0 == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(q.len().0, 1, "the second item was never queued");
        q.close_and_clear();
        assert_eq!(rx.recv_timeout(WAIT), Ok(Err(Closed)), "closing did not end the hand-off");
    }

    #[test]
    fn a_push_wakes_a_waiting_consumer() {
        let q = Arc::new(Bounded::new(1, 100));
        let (tx, rx) = mpsc::channel();
        let q2 = Arc::clone(&q);
        // A consumer that would wait far longer than the test does: only a wake-up ends it in time.
        std::thread::spawn(move || {
            let _ = tx.send(q2.pop_timeout(WAIT * 100));
        });
        q.push(5, 1).expect("open");
        assert_eq!(rx.recv_timeout(WAIT), Ok(Pop::Item(5)), "the consumer was not woken");
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
