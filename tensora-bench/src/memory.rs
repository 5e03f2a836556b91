//! The memory state every child process starts in.
//!
//! On a VM that hands free memory back to its hypervisor (free page reporting), how fast a fresh
//! process faults memory in depends on what was freed a moment before: a 2 MiB block freed seconds
//! ago is still backed by the host, one that stayed free longer was given back and faults in at the
//! host's pace (docs/design.md has the figures). Left alone, each sample would inherit whatever its
//! predecessor freed, so the bench fixes the state ([`MemoryState`]):
//! - [`MemoryState::Relay`] (the default): the bench holds an arena of its own, faulted in with
//!   huge pages, and frees it right before each child that asks for huge pages starts (ours and the
//!   warm rooflines), taking it back once the child has exited (the child freed the same blocks, so
//!   that is quick). Every such child starts on 2 MiB blocks freed a moment ago: the state of a
//!   machine that does not hand memory back, and a reproducible one. The peers' memory comes from
//!   `malloc`, in base pages, which the allocator takes from smaller free fragments first whatever
//!   was freed, so the relay stays held while they run (freeing it for them would only make the
//!   bench fault it in again at the host's pace).
//! - [`MemoryState::Idle`]: the bench holds nothing and waits before each child, so the child
//!   starts on memory that stayed free, as a server does that starts on an idle VM.

use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tensora_io::{Arena, ArenaConfig, Prefault};

/// Bound on `--idle-seconds`.
pub const IDLE_SECONDS_MAX: u64 = 600;

/// The memory state a child starts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryState {
    /// Memory freed a moment ago: the bench's own arena, freed right before the child starts.
    Relay,
    /// Memory that stayed free: nothing held, a pause of `seconds` before each child.
    Idle {
        /// The pause before each child.
        seconds: u64,
    },
}

impl MemoryState {
    /// What the report says of it.
    pub fn describe(self) -> String {
        match self {
            MemoryState::Relay => {
                "each child process that asks for huge pages starts on 2 MiB blocks freed a moment ago (the \
                 bench frees a faulted arena a quarter larger than the fixture right before it starts)"
                    .to_owned()
            }
            MemoryState::Idle { seconds } => {
                format!("each child process starts after {seconds} s idle, on memory that stayed free")
            }
        }
    }
}

/// What memory a child asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wants {
    /// An arena that asks for huge pages (ours, the warm rooflines).
    HugePages,
    /// Heap memory in base pages (the peers).
    BasePages,
}

/// Bytes of the relay arena for a fixture of `data_len_bytes`: a quarter more than the data, for
/// the peers that hold a copy beside their buffers.
pub fn relay_bytes(data_len_bytes: u64) -> u64 {
    data_len_bytes.saturating_add(data_len_bytes / 4).next_multiple_of(Arena::ALIGN_BYTES)
}

/// Holds (or not) the memory handed to each child.
#[derive(Debug)]
pub struct Relay {
    state: MemoryState,
    bytes: u64,
    held: Option<Arena>,
}

impl Relay {
    /// A relay in `state` that holds nothing yet.
    pub fn new(state: MemoryState) -> Relay {
        Relay { state, bytes: 0, held: None }
    }

    /// The state it keeps.
    #[cfg(test)]
    pub fn state(&self) -> MemoryState {
        self.state
    }

    /// Before a child that `wants` memory of `bytes` starts: free the held memory for a child that
    /// asks for huge pages (after faulting in `bytes` of it if it held less), or wait.
    pub fn hand_over(&mut self, bytes: u64, wants: Wants) -> Result<()> {
        match self.state {
            MemoryState::Relay => {
                if self.held.is_none() || self.bytes < bytes {
                    self.bytes = self.bytes.max(bytes);
                    self.take_back()?;
                }
                if wants == Wants::HugePages {
                    drop(self.held.take());
                }
            }
            MemoryState::Idle { seconds } => std::thread::sleep(Duration::from_secs(seconds)),
        }
        Ok(())
    }

    /// After the child exited: take the memory back (fault it in again) if it was handed over.
    pub fn take_back(&mut self) -> Result<()> {
        if self.state == MemoryState::Relay && self.bytes > 0 && self.held.is_none() {
            let config = ArenaConfig { len_bytes: self.bytes, prefault: Prefault::PopulateWrite };
            self.held = Some(Arena::new(&config).context("map the memory handed to the children")?);
        }
        Ok(())
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn held_bytes(&self) -> u64 {
        self.held.as_ref().map_or(0, Arena::len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_frees_before_each_child_and_takes_back_after() {
        let mut r = Relay::new(MemoryState::Relay);
        assert_eq!(r.held_bytes(), 0);
        r.hand_over(4 << 20, Wants::HugePages).unwrap();
        assert_eq!(r.held_bytes(), 0, "freed for the child");
        r.take_back().unwrap();
        assert_eq!(r.held_bytes(), 4 << 20);
        // Kept while a child that takes base pages runs.
        r.hand_over(4 << 20, Wants::BasePages).unwrap();
        assert_eq!(r.held_bytes(), 4 << 20);
        r.take_back().unwrap();
        // A larger fixture grows it, a smaller one does not shrink it.
        r.hand_over(6 << 20, Wants::HugePages).unwrap();
        r.take_back().unwrap();
        assert_eq!(r.held_bytes(), 6 << 20);
        r.hand_over(2 << 20, Wants::BasePages).unwrap();
        assert_eq!(r.held_bytes(), 6 << 20);
        let mut idle = Relay::new(MemoryState::Idle { seconds: 0 });
        idle.hand_over(4 << 20, Wants::HugePages).unwrap();
        idle.take_back().unwrap();
        assert_eq!(idle.held_bytes(), 0, "idle holds nothing");
        assert_eq!(idle.state(), MemoryState::Idle { seconds: 0 });
        assert!(MemoryState::Idle { seconds: 8 }.describe().contains("8 s idle"));
    }

    #[test]
    fn relay_bytes_cover_the_data_and_a_copy_beside() {
        assert_eq!(relay_bytes(0), 0);
        assert_eq!(relay_bytes(8 << 20), 10 << 20);
        assert_eq!(relay_bytes(1) % Arena::ALIGN_BYTES, 0);
        assert!(relay_bytes(2_200_096_768) >= 2_750_000_000);
    }
}
