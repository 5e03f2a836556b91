//! Object locks that belong to the process that took them.
//!
//! A lock is a `flock` on the object's lock file (exclusive to write a copy, shared to read a
//! complete one). Such a lock belongs to the open file description, and a `fork` shares that
//! with the child: a child forked while a load (or its write-behind) holds a lock (a Python data
//! loader worker, say) would keep the object locked for its whole life after the parent let go,
//! and every other process would wait [`super::LOCK_WAIT_MAX`] for it. Linux's OFD locks
//! (`F_OFD_SETLK`) would not help: they too belong to the open file description the child
//! shares. So every descriptor holding a lock is registered here, and a `pthread_atfork` child
//! handler points each of them at `/dev/null` in the child (`dup3`, async-signal-safe): the
//! child's copy no longer refers to the lock, the descriptor number stays valid for the child's
//! own `File` to close, and the parent's lock ends when the parent lets go. Lock files are opened
//! `O_CLOEXEC` (no `exec`ed program inherits one) and `O_NOFOLLOW`.

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::Path;
use std::sync::Once;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

use super::files::{Open, open};

/// Locks one process may hold at once (every object of a load is locked for the load).
pub const LOCKS_HELD_MAX: usize = super::RECORD_OBJECTS_MAX;

/// An unused slot of the registry (a used one holds its descriptor plus one, so that the table
/// starts zeroed).
const FREE: i32 = 0;

/// The descriptors holding a lock, for the fork handler (a fixed table of atomics: the handler
/// runs in a child that may have been forked while another thread was changing it, so it takes
/// no lock and allocates nothing).
static HELD: [AtomicI32; LOCKS_HELD_MAX] = [const { AtomicI32::new(FREE) }; LOCKS_HELD_MAX];
static HANDLER: Once = Once::new();

/// In a forked child: let go of every registered descriptor's lock (see the module docs).
extern "C" fn release_in_child() {
    // Only async-signal-safe calls: open, dup3, close.
    #[allow(unsafe_code)]
    // SAFETY: the path is a NUL-terminated static string; `open` reads only it.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if null < 0 {
        return;
    }
    for slot in &HELD {
        let fd = slot.load(Ordering::Relaxed) - 1;
        if fd >= 0 {
            #[allow(unsafe_code)]
            // SAFETY: `dup3` only replaces what descriptor `fd` refers to (`fd` is the child's
            // copy of a lock file's descriptor, still open: it is registered only while its
            // `File` lives); no memory is touched.
            unsafe {
                libc::dup3(null, fd, libc::O_CLOEXEC);
            }
        }
    }
    #[allow(unsafe_code)]
    // SAFETY: `null` was opened above and is closed once.
    unsafe {
        libc::close(null);
    }
}

fn install_handler() {
    HANDLER.call_once(|| {
        #[allow(unsafe_code)]
        // SAFETY: registers a child handler that only makes async-signal-safe calls and reads
        // atomics; no prepare or parent handler.
        unsafe {
            libc::pthread_atfork(None, None, Some(release_in_child));
        }
    });
}

/// The mode of a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Many readers of a complete copy.
    Shared,
    /// One writer.
    Exclusive,
}

/// An open lock file, unlocked until [`ObjectLock::try_take`] or [`ObjectLock::wait`] takes it;
/// the lock ends when this is dropped.
#[derive(Debug)]
pub struct ObjectLock {
    file: File,
    /// The registry slot while a lock is held.
    slot: Option<usize>,
}

impl ObjectLock {
    /// Open (create) the lock file at `path`.
    pub fn open(path: &Path) -> std::io::Result<ObjectLock> {
        install_handler();
        Ok(ObjectLock { file: open(path, Open::Create)?, slot: None })
    }

    fn register(&mut self) -> std::io::Result<()> {
        if self.slot.is_some() {
            return Ok(());
        }
        let fd = self.file.as_raw_fd() + 1;
        for (i, slot) in HELD.iter().enumerate() {
            if slot.compare_exchange(FREE, fd, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                self.slot = Some(i);
                return Ok(());
            }
        }
        Err(std::io::Error::other(format!("this process holds {LOCKS_HELD_MAX} cache locks already")))
    }

    /// Take the lock in `mode` if nobody holds it in a conflicting one (a held lock is converted):
    /// whether it was taken.
    pub fn try_take(&mut self, mode: Mode) -> std::io::Result<bool> {
        // Registered before the lock exists: a fork in between leaves the child nothing.
        self.register()?;
        let attempt = match mode {
            Mode::Shared => self.file.try_lock_shared(),
            Mode::Exclusive => self.file.try_lock(),
        };
        match attempt {
            Ok(()) => Ok(true),
            Err(std::fs::TryLockError::WouldBlock) => Ok(false),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// Take the lock in `mode`, trying every [`super::LOCK_POLL_INTERVAL`] until `deadline`:
    /// whether it was taken.
    pub fn wait(&mut self, mode: Mode, deadline: Instant) -> std::io::Result<bool> {
        loop {
            if self.try_take(mode)? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(super::LOCK_POLL_INTERVAL);
        }
    }
}

impl Drop for ObjectLock {
    /// Unregisters, then the file closes. A child forked between the two keeps the lock until it
    /// exits (or execs: the descriptor is `O_CLOEXEC`); the other order could point an unrelated
    /// descriptor that reused the number at `/dev/null` in the child.
    fn drop(&mut self) {
        if let Some(i) = self.slot.take() {
            HELD[i].store(FREE, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finding 4 (issue 39): a child forked while this process holds an object's lock (and lives
    /// on) does not keep it: once the parent lets go, another opener takes it at once. The lock
    /// file is close-on-exec.
    #[test]
    fn finding_4_a_forked_child_does_not_keep_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let mut held = ObjectLock::open(&path).unwrap();
        assert!(held.try_take(Mode::Exclusive).unwrap());
        let mut ready = [0i32; 2];
        #[allow(unsafe_code)]
        // SAFETY: `pipe` writes two descriptors into the array it is given.
        let piped = unsafe { libc::pipe(ready.as_mut_ptr()) };
        assert_eq!(piped, 0);
        #[allow(unsafe_code)]
        // SAFETY: the child only writes a byte, sleeps and exits (`_exit`): async-signal-safe.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            #[allow(unsafe_code)]
            // SAFETY: async-signal-safe calls only, in the forked child; the byte is ours.
            unsafe {
                libc::write(ready[1], [1u8].as_ptr().cast(), 1);
                libc::sleep(30);
                libc::_exit(0);
            }
        }
        // The child's fork has returned (its handlers have run) once it wrote.
        let mut byte = [0u8];
        #[allow(unsafe_code)]
        // SAFETY: reads one byte into `byte`, then closes the pipe's two descriptors.
        unsafe {
            assert_eq!(libc::read(ready[0], byte.as_mut_ptr().cast(), 1), 1);
            libc::close(ready[0]);
            libc::close(ready[1]);
        }
        #[allow(unsafe_code)]
        // SAFETY: F_GETFD on a descriptor this test owns.
        let flags = unsafe { libc::fcntl(held.file.as_raw_fd(), libc::F_GETFD) };
        let mut other = ObjectLock::open(&path).unwrap();
        assert!(!other.try_take(Mode::Exclusive).unwrap(), "held by this process");
        drop(held);
        let taken = other.try_take(Mode::Exclusive).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: signals and reaps the child forked above.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert!(taken, "the forked child still held the lock");
        assert!(flags & libc::FD_CLOEXEC != 0, "lock files are close-on-exec");
    }
}
