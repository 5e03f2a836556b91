//! Dev-only support for Tensora's tests, examples and benchmarks. No library depends on it; it
//! holds what measuring needs and users never call:
//!
//! - [`alloc::CountingAlloc`]: a global allocator that reports the peak heap of a closure;
//! - [`cache`]: evict one file from the page cache, or drop every clean page (cold runs);
//! - [`roofline`]: the `O_DIRECT` io_uring read of whole files that cold loads are measured against.
//!
//! It may use `unsafe` (a `GlobalAlloc`, `posix_fadvise`, a raw [`tensora_io::Job`]); each block
//! says why it is sound.
#![warn(missing_docs)]

pub mod alloc;
pub mod cache;
pub mod require;
pub mod roofline;
