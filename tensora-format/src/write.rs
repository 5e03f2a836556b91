//! Writing HF-compatible safetensors, single-file and sharded, atomically and streaming.
//!
//! A [`SafetensorsLayout`] fixes every byte position before any data is written: the header is
//! padded with spaces to a multiple of 8 bytes (so the data section starts 8-aligned), and tensors
//! are laid out in order of decreasing element alignment (8, 4, 2, then 1-byte and sub-byte
//! types; spec order within a class). Every tensor's size is a multiple of its element size, so
//! each tensor starts aligned to its element size with no padding between tensors, and the ranges
//! tile the data section exactly as the parser requires.
//!
//! Data is streamed in through a callback, tensor by tensor, so a writer never needs the whole
//! model in memory. Files are written atomically through [`AtomicFile`].
//!
//! ```
//! use std::collections::BTreeMap;
//! use tensora_format::Dtype;
//! use tensora_format::write::{write_safetensors, SafetensorsLayout, TensorSpec};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("model.safetensors");
//! let specs = vec![
//!     TensorSpec { name: "a".into(), dtype: Dtype::U8, shape: vec![3] },
//!     TensorSpec { name: "b".into(), dtype: Dtype::F32, shape: vec![2] },
//! ];
//! let layout = SafetensorsLayout::new(specs, BTreeMap::new()).unwrap();
//! write_safetensors(&path, &layout, |i, out| match i {
//!     0 => out.write_all(&[1, 2, 3]),
//!     _ => out.write_all(&[0u8; 8]),
//! })
//! .unwrap();
//! let ckpt = tensora_format::open(&path).unwrap();
//! assert_eq!(ckpt.tensor("b").unwrap().offset_bytes() % 4, 0);
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::safetensors::{HEADER_LEN_BYTES_MAX, METADATA_KEY, RANK_MAX};
use crate::{Dtype, Error, ErrorKind, Result};

/// Buffer size of the streaming writer.
pub const WRITE_BUFFER_BYTES: usize = 1 << 20;
/// How many temp-file names [`AtomicFile::create`] tries before giving up.
const TEMP_NAME_ATTEMPTS_MAX: u32 = 64;

/// One tensor to write: its name, dtype and shape. The data comes later, from the fill callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Tensor name: non-empty, no control characters, not `__metadata__`, unique in a layout.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape; `[]` is a scalar, a zero dimension means no data.
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// Bytes of data, or `None` on overflow or a partial final byte.
    pub fn nbytes(&self) -> Option<u64> {
        let numel = self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        self.dtype.bytes_for(numel)
    }
}

/// The complete byte layout of one safetensors file, computed before any data is written.
#[derive(Debug, Clone)]
pub struct SafetensorsLayout {
    specs: Vec<TensorSpec>,
    metadata: BTreeMap<String, String>,
    /// The 8-byte length prefix plus the padded JSON header.
    header: Vec<u8>,
    /// Absolute file range of each spec, indexed like `specs`.
    ranges: Vec<Range<u64>>,
    /// Spec indices in file order.
    file_order: Vec<usize>,
    file_len_bytes: u64,
}

impl SafetensorsLayout {
    /// Lay out `specs` with `metadata` as `__metadata__` (omitted when empty). Rejects duplicate
    /// or invalid names, ranks above 64, sizes that overflow or end in a partial byte, and headers
    /// over the parser's limit.
    pub fn new(specs: Vec<TensorSpec>, metadata: BTreeMap<String, String>) -> Result<SafetensorsLayout> {
        let path = Path::new("<layout>");
        let mut seen = HashSet::with_capacity(specs.len());
        let mut sizes = Vec::with_capacity(specs.len());
        for s in &specs {
            let err = |kind| Error::new(path, kind).with_tensor(s.name.clone());
            if s.name.is_empty() {
                return Err(err(ErrorKind::BadTensorName { reason: "empty" }));
            }
            if crate::safetensors::has_control(&s.name) {
                return Err(err(ErrorKind::BadTensorName { reason: "contains a NUL or control character" }));
            }
            if s.name == METADATA_KEY {
                return Err(err(ErrorKind::BadTensorName { reason: "reserved for metadata" }));
            }
            if !seen.insert(s.name.as_str()) {
                return Err(err(ErrorKind::DuplicateTensor));
            }
            if s.shape.len() > RANK_MAX {
                return Err(err(ErrorKind::RankTooLarge { rank: s.shape.len(), limit: RANK_MAX }));
            }
            let numel = s
                .shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| err(ErrorKind::SizeOverflow))?;
            let bits =
                numel.checked_mul(u64::from(s.dtype.bits())).ok_or_else(|| err(ErrorKind::SizeOverflow))?;
            if !bits.is_multiple_of(8) {
                return Err(err(ErrorKind::PartialByte { numel, dtype: s.dtype }));
            }
            sizes.push(bits / 8);
        }
        let mut file_order: Vec<usize> = (0..specs.len()).collect();
        // Stable: spec order within each alignment class. Sub-byte types align to 1.
        file_order.sort_by_key(|&i| std::cmp::Reverse(specs[i].dtype.align_bytes()));
        let mut rel = vec![0u64..0u64; specs.len()];
        let mut cursor = 0u64;
        for &i in &file_order {
            let end = cursor.checked_add(sizes[i]).ok_or_else(|| {
                Error::new(path, ErrorKind::SizeOverflow).with_tensor(specs[i].name.clone())
            })?;
            rel[i] = cursor..end;
            cursor = end;
        }
        let data_len = cursor;

        let mut json = Vec::with_capacity(64 + specs.len() * 96);
        json.push(b'{');
        let mut first = true;
        if !metadata.is_empty() {
            first = false;
            json_string(&mut json, METADATA_KEY);
            json.extend_from_slice(b":{");
            for (k, (key, value)) in metadata.iter().enumerate() {
                if k > 0 {
                    json.push(b',');
                }
                json_string(&mut json, key);
                json.push(b':');
                json_string(&mut json, value);
            }
            json.push(b'}');
        }
        for &i in &file_order {
            let s = &specs[i];
            if !first {
                json.push(b',');
            }
            first = false;
            json_string(&mut json, &s.name);
            json.extend_from_slice(b":{\"dtype\":\"");
            json.extend_from_slice(s.dtype.as_str().as_bytes());
            json.extend_from_slice(b"\",\"shape\":[");
            for (k, d) in s.shape.iter().enumerate() {
                if k > 0 {
                    json.push(b',');
                }
                json.extend_from_slice(d.to_string().as_bytes());
            }
            json.extend_from_slice(
                format!("],\"data_offsets\":[{},{}]}}", rel[i].start, rel[i].end).as_bytes(),
            );
        }
        json.push(b'}');
        while !json.len().is_multiple_of(8) {
            json.push(b' ');
        }
        let n = json.len() as u64;
        if n > HEADER_LEN_BYTES_MAX {
            return Err(Error::new(
                path,
                ErrorKind::HeaderTooLarge { header_len_bytes: n, limit_bytes: HEADER_LEN_BYTES_MAX },
            ));
        }
        let data_start = 8 + n;
        let file_len_bytes =
            data_start.checked_add(data_len).ok_or_else(|| Error::new(path, ErrorKind::SizeOverflow))?;
        let mut header = Vec::with_capacity(json.len() + 8);
        header.extend_from_slice(&n.to_le_bytes());
        header.extend_from_slice(&json);
        let ranges = rel.into_iter().map(|r| r.start + data_start..r.end + data_start).collect();
        Ok(SafetensorsLayout { specs, metadata, header, ranges, file_order, file_len_bytes })
    }

    /// Everything before the data section: the 8-byte little-endian length and the JSON header,
    /// space-padded to a multiple of 8.
    pub fn header_bytes(&self) -> &[u8] {
        &self.header
    }
    /// Absolute byte range in the file of spec `i` (as passed to [`SafetensorsLayout::new`]).
    ///
    /// # Panics
    /// If `i` is not a spec index.
    pub fn tensor_range(&self, i: usize) -> Range<u64> {
        self.ranges[i].clone()
    }
    /// Total file size in bytes.
    pub fn file_len_bytes(&self) -> u64 {
        self.file_len_bytes
    }
    /// The specs, in the order given.
    pub fn specs(&self) -> &[TensorSpec] {
        &self.specs
    }
    /// The metadata written as `__metadata__`.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
    /// Spec indices in the order their data appears in the file (the order the fill callback
    /// is called in).
    pub fn file_order(&self) -> &[usize] {
        &self.file_order
    }
}

/// Append `s` as a JSON string literal.
pub(crate) fn json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A file written under a temporary name in the destination's directory and renamed into place
/// by [`AtomicFile::commit`] (fsync file, rename, fsync directory). Dropped without a commit, the
/// temporary file is removed, so readers only ever see the old file or the complete new one.
#[derive(Debug)]
pub struct AtomicFile {
    file: Option<File>,
    temp_path: PathBuf,
    final_path: PathBuf,
}

impl AtomicFile {
    /// Create a new temporary file next to `path` (`.NAME.tmp-PID-N`).
    pub fn create(path: &Path) -> io::Result<AtomicFile> {
        let file_name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "destination has no file name"))?;
        let dir = parent_dir(path);
        for _ in 0..TEMP_NAME_ATTEMPTS_MAX {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let mut temp_name = std::ffi::OsString::from(".");
            temp_name.push(file_name);
            temp_name.push(format!(".tmp-{}-{n}", std::process::id()));
            let temp_path = dir.join(temp_name);
            match OpenOptions::new().write(true).create_new(true).open(&temp_path) {
                Ok(file) => {
                    return Ok(AtomicFile { file: Some(file), temp_path, final_path: path.to_path_buf() });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary file name"))
    }

    /// The open temporary file.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("AtomicFile holds its file until commit")
    }

    /// Path of the temporary file.
    pub fn temp_path(&self) -> &Path {
        &self.temp_path
    }

    /// Final path, valid once committed.
    pub fn final_path(&self) -> &Path {
        &self.final_path
    }

    /// fsync the file, rename it over the final path, then fsync the directory.
    pub fn commit(mut self) -> io::Result<()> {
        let file = self.file.take().expect("AtomicFile holds its file until commit");
        file.sync_all()?;
        drop(file);
        std::fs::rename(&self.temp_path, &self.final_path)?;
        // The rename happened: nothing left to clean up, even if the directory fsync fails.
        self.temp_path = PathBuf::new();
        File::open(parent_dir(&self.final_path))?.sync_all()
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.temp_path.as_os_str().is_empty() {
            self.file = None;
            let _ = std::fs::remove_file(&self.temp_path);
        }
    }
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Passes writes through while refusing to go past `limit_bytes`.
struct Bounded<'w, W: Write> {
    inner: &'w mut W,
    written_bytes: u64,
    limit_bytes: u64,
}

impl<W: Write> Write for Bounded<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = self.limit_bytes - self.written_bytes;
        if buf.len() as u64 > room {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("fill wrote more than the tensor's {} bytes", self.limit_bytes),
            ));
        }
        let k = self.inner.write(buf)?;
        self.written_bytes += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Write one safetensors file atomically. `fill(i, out)` is called once per tensor in file order
/// (see [`SafetensorsLayout::file_order`]) with the spec index `i`, and must write exactly that
/// tensor's bytes to `out`; writing more or fewer is an error, and the destination is left
/// untouched.
pub fn write_safetensors<F>(path: &Path, layout: &SafetensorsLayout, mut fill: F) -> Result<()>
where
    F: FnMut(usize, &mut dyn Write) -> io::Result<()>,
{
    let io_err = |e: io::Error| Error::new(path, ErrorKind::Io(e));
    let mut atomic = AtomicFile::create(path).map_err(io_err)?;
    {
        let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, atomic.file());
        out.write_all(&layout.header).map_err(io_err)?;
        for &i in &layout.file_order {
            let want = layout.ranges[i].end - layout.ranges[i].start;
            let mut bounded = Bounded { inner: &mut out, written_bytes: 0, limit_bytes: want };
            fill(i, &mut bounded).map_err(|e| io_err(e).with_tensor(layout.specs[i].name.clone()))?;
            if bounded.written_bytes != want {
                return Err(Error::new(
                    path,
                    ErrorKind::Write {
                        reason: format!("fill wrote {} bytes, the tensor has {want}", bounded.written_bytes),
                    },
                )
                .with_tensor(layout.specs[i].name.clone()));
            }
        }
        out.flush().map_err(io_err)?;
    }
    atomic.commit().map_err(io_err)
}

/// Name of the index file that [`write_sharded`] writes.
pub const SHARD_INDEX_FILE_NAME: &str = "model.safetensors.index.json";

/// One output shard of a [`ShardedLayout`].
#[derive(Debug, Clone)]
pub struct Shard {
    /// File name inside the output directory, `model-0000K-of-0000N.safetensors`.
    pub file_name: String,
    /// The shard's own layout; its spec `j` is the global spec `spec_indices[j]`.
    pub layout: SafetensorsLayout,
    /// Global spec indices held by this shard, in the shard's spec order.
    pub spec_indices: Vec<usize>,
}

/// A checkpoint split into shards of at most `shard_bytes_max` data bytes each (a tensor larger
/// than the cap gets a shard of its own), plus the HF-style index that maps tensors to shards.
#[derive(Debug, Clone)]
pub struct ShardedLayout {
    shards: Vec<Shard>,
    index_json: Vec<u8>,
    total_size_bytes: u64,
}

impl ShardedLayout {
    /// Assign `specs` greedily, in order, to shards whose tensor data stays within
    /// `shard_bytes_max`. Every shard carries `metadata` as its `__metadata__`; the index's
    /// `metadata` holds `total_size` (sum of tensor bytes) and the same entries.
    pub fn new(
        specs: Vec<TensorSpec>,
        metadata: BTreeMap<String, String>,
        shard_bytes_max: u64,
    ) -> Result<ShardedLayout> {
        let path = Path::new("<layout>");
        if shard_bytes_max == 0 {
            return Err(Error::new(path, ErrorKind::Write { reason: "shard_bytes_max is 0".into() }));
        }
        // Validate all specs together first (names unique across shards, sizes computable).
        let whole = SafetensorsLayout::new(specs, BTreeMap::new())?;
        let specs = whole.specs;
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut current_bytes = 0u64;
        let mut total_size_bytes = 0u64;
        for i in 0..specs.len() {
            let nbytes = whole.ranges[i].end - whole.ranges[i].start;
            total_size_bytes += nbytes;
            match groups.last_mut() {
                Some(g) if current_bytes.saturating_add(nbytes) <= shard_bytes_max => {
                    g.push(i);
                    current_bytes += nbytes;
                }
                _ => {
                    groups.push(vec![i]);
                    current_bytes = nbytes;
                }
            }
        }
        if groups.is_empty() {
            groups.push(Vec::new());
        }
        let count = groups.len();
        let file_names: Vec<String> =
            (0..count).map(|k| format!("model-{:05}-of-{:05}.safetensors", k + 1, count)).collect();
        // The index first, checked against the limits its reader applies, so a layout whose
        // index could not be read back is refused before any shard is laid out or written.
        let index = index_json(&specs, &groups, &file_names, &metadata, total_size_bytes)?;
        let mut shards = Vec::with_capacity(count);
        for (spec_indices, file_name) in groups.into_iter().zip(file_names) {
            let shard_specs = spec_indices.iter().map(|&i| specs[i].clone()).collect();
            let layout = SafetensorsLayout::new(shard_specs, metadata.clone())?;
            shards.push(Shard { file_name, layout, spec_indices });
        }
        Ok(ShardedLayout { shards, index_json: index, total_size_bytes })
    }

    /// The shards, in file-name order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }
    /// The bytes of `model.safetensors.index.json`.
    pub fn index_json(&self) -> &[u8] {
        &self.index_json
    }
    /// Sum of all tensors' data bytes (the index's `total_size`).
    pub fn total_size_bytes(&self) -> u64 {
        self.total_size_bytes
    }
}

/// `model.safetensors.index.json` for `specs` cut into `groups` (spec indices per shard, named
/// `file_names`): `metadata` (with `total_size`) and the weight map sorted by name. Refused, as
/// [`ErrorKind::IndexTooLarge`] or a write error, where the index's reader
/// ([`parse_index`](crate::sharded::parse_index)) would refuse it: over
/// [`INDEX_BYTES_MAX`](crate::sharded::INDEX_BYTES_MAX) bytes, or more metadata keys than
/// [`INDEX_METADATA_KEYS_MAX`](crate::sharded::INDEX_METADATA_KEYS_MAX).
fn index_json(
    specs: &[TensorSpec],
    groups: &[Vec<usize>],
    file_names: &[String],
    metadata: &BTreeMap<String, String>,
    total_size_bytes: u64,
) -> Result<Vec<u8>> {
    use crate::sharded::{INDEX_BYTES_MAX, INDEX_METADATA_KEYS_MAX};
    let path = Path::new(SHARD_INDEX_FILE_NAME);
    // `total_size` is one of the keys the reader counts.
    let keys = metadata.keys().filter(|k| *k != "total_size").count() + 1;
    if keys > INDEX_METADATA_KEYS_MAX {
        return Err(Error::new(
            path,
            ErrorKind::Write {
                reason: format!(
                    "the index's metadata would have {keys} keys, more than the {INDEX_METADATA_KEYS_MAX} its reader accepts"
                ),
            },
        ));
    }
    let mut index = Vec::with_capacity(64 + specs.len() * 64);
    index.extend_from_slice(
        format!("{{\n  \"metadata\": {{\n    \"total_size\": {total_size_bytes}").as_bytes(),
    );
    for (key, value) in metadata {
        if key == "total_size" {
            continue;
        }
        index.extend_from_slice(b",\n    ");
        json_string(&mut index, key);
        index.extend_from_slice(b": ");
        json_string(&mut index, value);
    }
    index.extend_from_slice(b"\n  },\n  \"weight_map\": {");
    let mut entries: Vec<(&str, &str)> = Vec::with_capacity(specs.len());
    for (group, file_name) in groups.iter().zip(file_names) {
        for &i in group {
            entries.push((&specs[i].name, file_name));
        }
    }
    entries.sort_unstable();
    for (k, (name, file)) in entries.iter().enumerate() {
        index.extend_from_slice(if k == 0 { b"\n    " } else { b",\n    " });
        json_string(&mut index, name);
        index.extend_from_slice(b": ");
        json_string(&mut index, file);
    }
    index.extend_from_slice(b"\n  }\n}\n");
    let len_bytes = index.len() as u64;
    if len_bytes > INDEX_BYTES_MAX {
        return Err(Error::new(path, ErrorKind::IndexTooLarge { len_bytes, limit_bytes: INDEX_BYTES_MAX }));
    }
    Ok(index)
}

/// Write every shard of `layout` into `dir` (which must exist), then the index, each atomically.
/// `fill(i, out)` gets the global spec index `i`, as passed to [`ShardedLayout::new`].
///
/// Nothing is mixed and nothing is left half-written: if any shard or the index already exists in
/// `dir`, this refuses before writing anything; if writing fails part-way, the shards already
/// written are removed again, so `dir` holds either the whole checkpoint (index last) or none of it.
pub fn write_sharded<F>(dir: &Path, layout: &ShardedLayout, mut fill: F) -> Result<()>
where
    F: FnMut(usize, &mut dyn Write) -> io::Result<()>,
{
    let index_path = dir.join(SHARD_INDEX_FILE_NAME);
    let targets: Vec<std::path::PathBuf> =
        layout.shards.iter().map(|s| dir.join(&s.file_name)).chain([index_path.clone()]).collect();
    if let Some(existing) = targets.iter().find(|p| p.symlink_metadata().is_ok()) {
        return Err(Error::new(
            existing,
            ErrorKind::Write { reason: "already exists; refusing to mix shards of two checkpoints".into() },
        ));
    }
    let mut written: Vec<&Path> = Vec::with_capacity(targets.len());
    let result = (|| {
        for (shard, path) in layout.shards.iter().zip(&targets) {
            write_safetensors(path, &shard.layout, |j, out| fill(shard.spec_indices[j], out))?;
            written.push(path);
        }
        let io_err = |e: io::Error| Error::new(&index_path, ErrorKind::Io(e));
        let mut atomic = AtomicFile::create(&index_path).map_err(io_err)?;
        atomic.write_all(&layout.index_json).map_err(io_err)?;
        atomic.commit().map_err(io_err)
    })();
    if result.is_err() {
        for path in written {
            let _ = std::fs::remove_file(path);
        }
    }
    result
}

#[cfg(test)]
mod tests;
