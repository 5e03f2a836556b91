//! The calling thread's CPU priority, for work that must not slow a load down: a cache written
//! behind a load, a background check.
//!
//! ```
//! // A thread that only runs on a core nothing else wants.
//! std::thread::spawn(|| {
//!     let _ = tensora_sys::idle_priority();
//!     // ... background work ...
//! })
//! .join()
//! .unwrap();
//! ```

use std::io;

/// Put the calling thread at `SCHED_IDLE`: it runs only when a core has nothing else to run (the
/// kernel still gives it a sliver now and then, so it never starves forever). An error (a system
/// that refuses it) leaves the thread's priority as it was.
pub fn idle_priority() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` for the call; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_at_idle_priority_reports_sched_idle() {
        let policy = std::thread::spawn(|| {
            super::idle_priority().unwrap();
            // SAFETY: querying the calling thread's policy.
            unsafe { libc::sched_getscheduler(0) }
        })
        .join()
        .unwrap();
        assert_eq!(policy, libc::SCHED_IDLE);
        // SAFETY: as above; this thread was not changed.
        assert_ne!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_IDLE);
    }
}
