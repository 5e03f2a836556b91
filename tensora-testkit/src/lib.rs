//! Dev-only support for Tensora's tests, examples and benchmarks. No library depends on it; it
//! holds what measuring needs and users never call:
//!
//! - [`CountingAlloc`]: a global allocator that reports the peak heap of a closure;
//! - what a test may skip ([`io_uring_or_skip`], [`direct_io_or_skip`], [`small_tmpfs_or_skip`]):
//!   only what `TENSORA_TEST_REQUIRE` does not list ([`verdict`]);
//! - [`direct_read_roofline`]: the `O_DIRECT` io_uring read of whole files that cold loads are
//!   measured against;
//! - [`pread_only`]: what crossing some files' page cache costs alone (the cast pairs' memory
//!   bound).
//!
//! Page-cache control (evict one file, drop every clean page) is an OS fact: `tensora_sys`.
//!
//! It may use `unsafe` (a `GlobalAlloc`, a raw [`tensora_io::Job`]); each block says why it is
//! sound.
#![warn(missing_docs)]

mod alloc;
mod pread_only;
mod require;
mod roofline;

pub use alloc::CountingAlloc;
pub use pread_only::{PreadOnly, pread_only};
pub use require::{
    Capability, REQUIRE_VAR, SmallTmpfs, Verdict, check, direct_io_or_skip, io_uring_or_skip, listed,
    small_tmpfs_or_skip, verdict,
};
pub use roofline::{DirectRooflineConfig, direct_read_roofline, direct_roofline_arena_bytes};
