//! Strict parsers and writers for checkpoint layouts.
//!
//! `tensora-format` reads only headers and indexes, never tensor data, and never trusts a size it
//! has not checked against the file. A [`Checkpoint`] that escapes this crate is valid by
//! construction: every tensor's byte range lies inside its file, agrees with its dtype and shape,
//! and names are unique.
#![forbid(unsafe_code)]

mod checkpoint;
mod dtype;
mod error;
pub mod sllm;

pub use checkpoint::{Checkpoint, FileEntry, FileId, FileStamp, Format, TensorInfo, Warning};
pub use dtype::Dtype;
pub use error::{Error, ErrorKind};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
