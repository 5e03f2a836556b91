//! Sharded safetensors: the HF index (`*.safetensors.index.json`) and directories of shards.
//!
//! The index is `{"metadata": {...}, "weight_map": {tensor: shard file}}`. Metadata may hold any
//! keys; `total_size` is compared with the shards and a disagreement is a [`Warning`], not an
//! error. Everything else is strict: shard names must be plain file names, every listed shard
//! must exist, every tensor must be exactly where the map says and nowhere else.
//!
//! ```
//! let index = br#"{"metadata": {"total_size": 8}, "weight_map": {"w": "a.safetensors"}}"#;
//! let parsed = tensora_format::sharded::parse_index(index.to_vec()).unwrap();
//! assert_eq!(parsed.weight_map().collect::<Vec<_>>(), [("w", "a.safetensors")]);
//! assert_eq!(parsed.total_size_bytes(), Some(8));
//! ```
//!
//! [`Warning`]: crate::Warning

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::open::{ordered_parallel, ordered_parallel_ahead};
use crate::safetensors::{Header, read_header_stamped};
use crate::{Checkpoint, Error, ErrorKind, FileId, FileStamp, OpenOptions, Result, Shards};

mod index;
mod merge;

pub use index::{INDEX_BYTES_MAX, INDEX_METADATA_KEYS_MAX, ShardIndex, parse_index};
pub(crate) use merge::{ShardTensors, assemble_file, assemble_indexed, assemble_unindexed};

/// The most directory entries looked at when listing a checkpoint directory.
pub const DIR_ENTRIES_MAX: usize = 1_000_000;
/// Suffix of an HF index file.
pub const INDEX_SUFFIX: &str = ".safetensors.index.json";

/// A shard name must be a plain file name: no separator, not `.` or `..`, not absolute, no NUL.
pub fn check_shard_name(shard: &str) -> std::result::Result<(), ErrorKind> {
    let plain = !shard.is_empty()
        && shard != "."
        && shard != ".."
        && !shard.contains(['/', '\\', '\0'])
        && !Path::new(shard).is_absolute();
    if plain { Ok(()) } else { Err(ErrorKind::BadShardName { shard: shard.to_string() }) }
}

/// Read an index file with the [`INDEX_BYTES_MAX`] cap.
fn read_index_file(path: &Path) -> Result<Vec<u8>> {
    crate::read_capped(path, INDEX_BYTES_MAX)
}

/// Read and parse the header at `path` and build its tensors as file `file` (looked up in
/// `index` when there is one): the work of one header thread.
fn read_shard(path: &Path, file: FileId, index: Option<&ShardIndex>) -> Result<ShardTensors> {
    // One thread per header: the pool already runs headers side by side.
    let (header, meta) = read_header_stamped(path, 1)?;
    Ok(ShardTensors::new(path.to_path_buf(), FileStamp::from_metadata(&meta), header, file, index))
}

/// Open one `.safetensors` file, its header parsed on up to `options`' header threads.
pub(crate) fn open_file(path: &Path, options: &OpenOptions) -> Result<Checkpoint> {
    let (header, meta) = read_header_stamped(path, options.threads())?;
    Ok(assemble_file(path.to_path_buf(), FileStamp::from_metadata(&meta), header))
}

/// A shard as handed to the assembly functions: where it is, its stamp and its parsed header.
pub(crate) type ShardParts = (PathBuf, FileStamp, Header);

/// Open a sharded checkpoint through its index: every shard, or (lazily) those holding a
/// selected tensor, read on `options.header_threads` threads and merged in name order.
pub(crate) fn open_indexed(dir: &Path, index_path: &Path, options: &OpenOptions) -> Result<Checkpoint> {
    let bytes = read_index_file(index_path)?;
    let index = parse_index(bytes).map_err(|k| Error::new(index_path, k))?;
    let parse = shards_to_parse(&index, &options.shards);
    let paths: Vec<PathBuf> = parse.iter().map(|&k| dir.join(index.shard_name(k))).collect();
    let shared = &index;
    let work = |k: usize| read_shard(&paths[k], FileId(k as u32), Some(shared));
    ordered_parallel(paths.len(), options.threads(), work, |next| {
        assemble_indexed(dir, index_path, &index, &parse, |_, shard| {
            next()
                .unwrap_or_else(|| Err(missing_shard(index_path, shard)))
                .map_err(not_found_as_missing(index_path, shard))
        })
    })
}

/// At most this many header bytes of shards are parsed ahead of the merge while it parses the
/// index (a strict open of an indexed directory), and at most the index's length: the workers
/// keep busy meanwhile, and the open's peak heap stays under twice the header bytes (the index
/// parser reuses the index text for the names, so the text is all the index costs beyond 24
/// bytes per tensor). Measured: `tests/index_memory.rs` (7.5 MB of headers behind a 4.8 MB index)
/// 1.62-1.75x; the bench's DeepSeek-shaped checkpoint (11.3 MB of headers, 8.7 MB index)
/// 1.63-1.76x at 6 MiB, 1.76-1.90x at 8 MiB.
pub const LISTED_AHEAD_BYTES: u64 = 6 << 20;

/// A strict open of a directory with one index whose `listed` shard files (sorted) start being
/// read and parsed while this thread parses the index (as far as [`LISTED_AHEAD_BYTES`] of
/// headers goes, or the index's length), then merged as [`open_indexed`] merges them.
/// Listed files that the index does not name are read but dropped, errors and all; shards that
/// are not listed (hidden names) are read afterwards.
fn open_indexed_listed(
    dir: &Path,
    index_path: &Path,
    listed: &[PathBuf],
    options: &OpenOptions,
) -> Result<Checkpoint> {
    let index_cell: OnceLock<ShardIndex> = OnceLock::new();
    let work = |k: usize| read_shard(&listed[k], FileId(k as u32), index_cell.get());
    let weight = |parsed: &Result<ShardTensors>| parsed.as_ref().map_or(0, |s| s.file.data_start_bytes());
    let index_len_bytes = std::fs::metadata(index_path).map_or(0, |m| m.len());
    let ahead_bytes = index_len_bytes.min(LISTED_AHEAD_BYTES);
    ordered_parallel_ahead(listed.len(), options.threads(), (ahead_bytes, weight), work, |next| {
        let bytes = read_index_file(index_path)?;
        let index = parse_index(bytes).map_err(|k| Error::new(index_path, k))?;
        let index = index_cell.get_or_init(|| index);
        let all: Vec<u32> = (0..index.shard_names().len() as u32).collect();
        let mut at = 0; // The next listed file.
        assemble_indexed(dir, index_path, index, &all, |k, shard| {
            while let Some(path) = listed.get(at) {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if name > shard {
                    break;
                }
                at += 1;
                let parsed = next().unwrap_or_else(|| Err(missing_shard(index_path, shard)));
                if name == shard {
                    let mut parts = parsed.map_err(not_found_as_missing(index_path, shard))?;
                    parts.place(FileId(k as u32), index);
                    return Ok(parts);
                }
            }
            read_shard(&dir.join(shard), FileId(k as u32), Some(index))
                .map_err(not_found_as_missing(index_path, shard))
        })
    })
}

fn missing_shard(index_path: &Path, shard: &str) -> Error {
    Error::new(index_path, ErrorKind::MissingShard { shard: shard.to_string() })
}

/// A shard that cannot be opened because it does not exist is the index's [`ErrorKind::MissingShard`].
fn not_found_as_missing<'a>(index_path: &'a Path, shard: &'a str) -> impl FnOnce(Error) -> Error + 'a {
    move |e| match e.kind() {
        ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::NotFound => missing_shard(index_path, shard),
        _ => e,
    }
}

/// The ids (sorted) of the shards to parse: all, or those holding a tensor `shards` selects.
fn shards_to_parse(index: &ShardIndex, shards: &Shards) -> Vec<u32> {
    let count = index.shard_names().len() as u32;
    let matcher = match shards {
        Shards::All => None,
        Shards::Selected(selection) => selection.matcher().ok(),
    };
    let Some(matcher) = matcher else { return (0..count).collect() };
    let mut wanted = vec![false; count as usize];
    for i in 0..index.len() {
        let (name, shard) = index.entry(i);
        if !wanted[shard as usize] && matcher.matches(name) {
            wanted[shard as usize] = true;
        }
    }
    (0..count).filter(|&k| wanted[k as usize]).collect()
}

/// Open a directory of `.safetensors` files with no index (files in name order), headers read on
/// `options.header_threads` threads.
pub(crate) fn open_unindexed(
    dir: &Path,
    shard_paths: &[PathBuf],
    options: &OpenOptions,
) -> Result<Checkpoint> {
    let work = |k: usize| read_shard(&shard_paths[k], FileId(k as u32), None);
    ordered_parallel(shard_paths.len(), options.threads(), work, |next| {
        assemble_unindexed(dir, std::iter::from_fn(next))
    })
}

/// Open a directory: ServerlessLLM, indexed shards, or a plain directory of `.safetensors` files.
pub(crate) fn open_dir(dir: &Path, options: &OpenOptions) -> Result<Checkpoint> {
    if crate::sllm::looks_like_sllm_dir(dir) {
        return crate::sllm::open_dir(dir);
    }
    let io = |e| Error::new(dir, ErrorKind::Io(e));
    let mut indexes = Vec::new();
    let mut shards = Vec::new();
    for (seen, entry) in std::fs::read_dir(dir).map_err(io)?.enumerate() {
        if seen >= DIR_ENTRIES_MAX {
            return Err(Error::new(
                dir,
                ErrorKind::NotACheckpoint {
                    reason: format!("more than {DIR_ENTRIES_MAX} directory entries"),
                },
            ));
        }
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') {
            continue; // Hidden files, including our own in-progress temp files.
        }
        if name.ends_with(INDEX_SUFFIX) {
            indexes.push(entry.path());
        } else if name.ends_with(".safetensors") {
            // Whatever it is: a FIFO or a directory so named is refused when opened, not skipped.
            shards.push(entry.path());
        }
    }
    indexes.sort();
    shards.sort();
    match indexes.len() {
        1 => match options.shards {
            Shards::All => open_indexed_listed(dir, &indexes[0], &shards, options),
            Shards::Selected(_) => open_indexed(dir, &indexes[0], options),
        },
        0 if !shards.is_empty() => open_unindexed(dir, &shards, options),
        0 => Err(Error::new(
            dir,
            ErrorKind::NotACheckpoint {
                reason: "no tensor_index.json, *.safetensors.index.json or *.safetensors file".into(),
            },
        )),
        _ => Err(Error::new(
            dir,
            ErrorKind::NotACheckpoint {
                reason: format!(
                    "{} index files ({}); open one of them directly",
                    indexes.len(),
                    indexes
                        .iter()
                        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
        )),
    }
}

#[cfg(test)]
mod tests;
