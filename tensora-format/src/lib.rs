//! Strict parsers and writers for checkpoint layouts.
//!
//! `tensora-format` reads only headers and indexes, never tensor data, and never trusts a size it
//! has not checked against the file. A [`Checkpoint`] that escapes this crate is valid by
//! construction: every tensor's byte range lies inside its file, agrees with its dtype and shape,
//! and names are unique.
//!
//! - [`open`] accepts a `.safetensors` file, a directory with a `*.safetensors.index.json`, a
//!   directory of `.safetensors` files, or a ServerlessLLM directory (`tensor_index.json`).
//! - [`safetensors`] is the strict header parser ([`safetensors::parse_header`] works on bytes).
//! - [`sharded`] parses HF shard indexes.
//! - [`write`](mod@write) writes HF-compatible safetensors, single-file or sharded, atomically
//!   and streaming.
//! - [`sllm`] is the ServerlessLLM layout.
//! - [`assemble`] builds a [`Checkpoint`] from headers and indexes read elsewhere (remote objects).
//!
//! Those five modules are the format namespaces (`sllm::parse_index` and `sharded::parse_index`
//! differ); everything else is private and listed once, at the root.
//!
//! ```
//! use std::collections::BTreeMap;
//! use tensora_format::write::{write_safetensors, SafetensorsLayout, TensorSpec};
//! use tensora_format::{Dtype, Format};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("tiny.safetensors");
//! let specs = vec![TensorSpec { name: "w".into(), dtype: Dtype::F32, shape: vec![2, 3] }];
//! let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
//! let layout = SafetensorsLayout::new(specs, meta).unwrap();
//! write_safetensors(&path, &layout, |_, out| out.write_all(&[0u8; 24])).unwrap();
//!
//! let ckpt = tensora_format::open(&path).unwrap();
//! assert_eq!(ckpt.format(), Format::Safetensors);
//! let w = ckpt.tensor("w").unwrap();
//! assert_eq!((w.dtype(), w.shape(), w.len_bytes()), (Dtype::F32, &[2u64, 3][..], 24));
//! assert_eq!(ckpt.metadata()["format"], "pt");
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod assemble;
mod checkpoint;
mod dtype;
mod error;
mod fsutil;
mod inspect;
mod json;
mod names;
mod open;
pub mod safetensors;
mod select;
pub mod sharded;
pub mod slice;
pub mod sllm;
pub mod tp;
pub mod write;

use std::path::Path;

pub use checkpoint::{Checkpoint, FileChanged, FileEntry, FileId, FileStamp, Format, TensorInfo, Warning};
pub use dtype::Dtype;
pub use error::{Error, ErrorKind};
pub use fsutil::{NonRegular, open_regular, read_capped};
pub use inspect::{InspectedFile, InspectedTensor, InspectedWarning, Inspection};
pub use names::{NOT_FOUND, NameTable};
pub use open::{HEADER_THREADS_MAX, OpenOptions, Shards};
pub use select::{Matcher, Selection, SelectionError};
pub use slice::{Slice, SliceError, SliceLayout};
pub use tp::{Shard, Split, TensorParallel, TpError, TpRules};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Open a checkpoint and validate its headers and indexes (never its tensor data): strictly,
/// every shard parsed, on up to 8 threads ([`open_with`] and
/// [`OpenOptions::default`]).
///
/// - a directory with `tensor_index.json`: ServerlessLLM ([`sllm::open_dir`]);
/// - a directory with one `*.safetensors.index.json`: sharded through the index;
/// - a directory of `*.safetensors` files without an index: each file is a shard;
/// - a file named `*.safetensors.index.json`: that index, shards beside it;
/// - a file named `tensor_index.json`: the ServerlessLLM directory holding it;
/// - any other file: a single safetensors file.
///
/// ```
/// let err = tensora_format::open(std::path::Path::new("/nonexistent/x.safetensors")).unwrap_err();
/// assert!(matches!(err.kind(), tensora_format::ErrorKind::Io(_)));
/// ```
pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
    open_with(path, &OpenOptions::default())
}

/// [`open`], as `options` say: which shards of an indexed checkpoint to parse ([`Shards`]) and
/// on how many threads.
pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Checkpoint> {
    let path = path.as_ref();
    let meta = std::fs::metadata(path).map_err(|e| Error::new(path, ErrorKind::Io(e)))?;
    if meta.is_dir() {
        return sharded::open_dir(path, options);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if name.ends_with(sharded::INDEX_SUFFIX) {
        return sharded::open_indexed(parent, path, options);
    }
    if name == "tensor_index.json" {
        return sllm::open_dir(parent);
    }
    sharded::open_file(path, options)
}
