//! Writing the upstream ServerlessLLM layout, byte for byte.
//!
//! Facts this follows (from sllm-store's `TensorWriter` and `save_dict`):
//! - each distinct storage is one record; a record is followed by zero padding up to a multiple of
//!   [`RECORD_ALIGN_BYTES`] (the padding counts towards the partition's size);
//! - a new partition starts before a record when the current partition's written bytes plus the
//!   record's unpadded size would pass the cap (a record bigger than the cap gets a partition of
//!   its own); offsets in the index are global: the byte offset in the concatenation of all
//!   partitions;
//! - tied tensors (several names on one storage) are written once and all point at that record;
//! - `tensor_index.json` is Python's `json.dump` of a dict of tuples: `{"name": [offset, size,
//!   [shape], [stride], "torch.dtype"], ...}` with `", "` and `": "` separators, ASCII-only
//!   escaping, and no trailing newline.
//!
//! Unlike upstream (which writes with `O_DIRECT` and may round the last block of a partition up to
//! 4 KiB), partitions here end exactly after the last record's padding, so global offsets are also
//! the file-size prefix sums that every loader uses.

use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::{
    INDEX_FILE_NAME, IndexEntry, PARTITION_BYTES_MAX_DEFAULT, PARTITIONS_MAX, RECORD_ALIGN_BYTES,
    check_extent, dtype_to_torch, partition_path,
};
use crate::{Dtype, Error, ErrorKind};

/// One tensor to write, in state-dict order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SllmTensorSpec {
    /// The tensor's name, the key of its `tensor_index.json` entry.
    pub name: String,
    /// Element type; written as its torch name, so sub-byte types are refused.
    pub dtype: Dtype,
    /// Shape; `[]` is a scalar.
    pub shape: Vec<u64>,
    /// Strides in elements; `None` means contiguous row-major.
    pub strides: Option<Vec<u64>>,
    /// Bytes of storage to write for this tensor.
    pub size_bytes: u64,
    /// `Some(i)`: this tensor shares the storage of spec `i` (an earlier one, same `size_bytes`)
    /// and is not written again.
    pub tied_to: Option<usize>,
}

impl SllmTensorSpec {
    /// A dense, untied tensor: `size_bytes = numel × itemsize`, contiguous strides. `None` when the
    /// size overflows or the dtype is sub-byte.
    pub fn dense(name: impl Into<String>, dtype: Dtype, shape: Vec<u64>) -> Option<SllmTensorSpec> {
        let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        let size_bytes = numel.checked_mul(dtype.size_bytes()?)?;
        Some(SllmTensorSpec { name: name.into(), dtype, shape, strides: None, size_bytes, tied_to: None })
    }
}

/// Row-major strides in elements for `shape` (the last dimension has stride 1).
pub fn contiguous_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![0u64; shape.len()];
    let mut acc = 1u64;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

/// Layout options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SllmLayoutConfig {
    /// Partition cap in bytes (upstream: 10 GiB). Must be at least 1.
    pub partition_bytes_max: u64,
}

impl Default for SllmLayoutConfig {
    fn default() -> Self {
        SllmLayoutConfig { partition_bytes_max: PARTITION_BYTES_MAX_DEFAULT }
    }
}

/// One stored record: a distinct storage written into a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SllmRecord {
    /// The spec (index into the specs given to [`SllmLayout::new`]) whose bytes this record holds.
    pub spec: usize,
    /// The partition file the record is written to (`tensor.data_N`).
    pub partition: u32,
    /// Where the record starts in its partition (a multiple of [`RECORD_ALIGN_BYTES`]).
    pub offset_in_partition_bytes: u64,
    /// Bytes of storage written: the spec's `size_bytes`.
    pub size_bytes: u64,
    /// Zero bytes written after the record.
    pub padding_bytes: u64,
}

/// Where every tensor of a ServerlessLLM checkpoint goes, before any byte is written.
///
/// ```
/// use tensora_format::Dtype;
/// use tensora_format::sllm::write::{SllmLayout, SllmLayoutConfig, SllmTensorSpec};
/// let specs = vec![
///     SllmTensorSpec::dense("a", Dtype::F16, vec![3]).unwrap(),
///     SllmTensorSpec::dense("b", Dtype::F32, vec![2]).unwrap(),
/// ];
/// let layout = SllmLayout::new(specs, &SllmLayoutConfig::default()).unwrap();
/// assert_eq!(layout.entries()[1].offset_bytes, 8); // 6 bytes + 2 of padding
/// assert_eq!(
///     layout.index_json(),
///     r#"{"a": [0, 6, [3], [1], "torch.float16"], "b": [8, 8, [2], [1], "torch.float32"]}"#
/// );
/// ```
#[derive(Debug, Clone)]
pub struct SllmLayout {
    specs: Vec<SllmTensorSpec>,
    entries: Vec<IndexEntry>,
    records: Vec<SllmRecord>,
    partition_lens_bytes: Vec<u64>,
}

/// Index entries, records and partition sizes, as computed by [`SllmLayout::new`].
type Placement = (Vec<IndexEntry>, Vec<SllmRecord>, Vec<u64>);

fn write_err(reason: impl Into<String>) -> ErrorKind {
    ErrorKind::Write { reason: reason.into() }
}

impl SllmLayout {
    /// Validate the specs and place every record. Errors are [`ErrorKind::Write`] for layout
    /// problems (bad tie, dtype torch cannot hold, zero cap) and the reader's kinds for shapes and
    /// strides that do not fit their storage; they name the tensor.
    pub fn new(specs: Vec<SllmTensorSpec>, config: &SllmLayoutConfig) -> crate::Result<SllmLayout> {
        let mut at = None;
        match Self::place(&specs, config, &mut at) {
            Ok((entries, records, partition_lens_bytes)) => {
                Ok(SllmLayout { specs, entries, records, partition_lens_bytes })
            }
            Err(kind) => {
                let err = Error::new("<layout>", kind);
                Err(match at {
                    Some(i) => err.with_tensor(specs[i].name.clone()),
                    None => err,
                })
            }
        }
    }

    /// The placement behind [`SllmLayout::new`]; `at` is the spec being placed when it fails.
    fn place(
        specs: &[SllmTensorSpec],
        config: &SllmLayoutConfig,
        at: &mut Option<usize>,
    ) -> Result<Placement, ErrorKind> {
        if config.partition_bytes_max == 0 {
            return Err(write_err("partition_bytes_max must be at least 1"));
        }
        let cap = config.partition_bytes_max;
        let mut names = std::collections::HashSet::with_capacity(specs.len());
        let mut records: Vec<SllmRecord> = Vec::new();
        // For each spec, the record holding its bytes.
        let mut record_of: Vec<usize> = Vec::with_capacity(specs.len());
        let mut partition_lens_bytes: Vec<u64> = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            *at = Some(i);
            if spec.name.is_empty() {
                return Err(ErrorKind::BadTensorName { reason: "empty name" });
            }
            if !names.insert(spec.name.as_str()) {
                return Err(ErrorKind::DuplicateTensor);
            }
            if dtype_to_torch(spec.dtype).is_none() {
                return Err(write_err(format!("dtype {} has no torch equivalent", spec.dtype)));
            }
            let strides = spec.strides.clone().unwrap_or_else(|| contiguous_strides(&spec.shape));
            if strides.len() != spec.shape.len() {
                return Err(ErrorKind::StrideRankMismatch {
                    shape_rank: spec.shape.len(),
                    stride_rank: strides.len(),
                });
            }
            check_extent(spec.dtype, &spec.shape, &strides, spec.size_bytes)?;
            if let Some(t) = spec.tied_to {
                if t >= i || specs[t].size_bytes != spec.size_bytes {
                    return Err(write_err(format!(
                        "tensor {:?} is tied to spec {t}, which is not an earlier tensor of the same size",
                        spec.name
                    )));
                }
                record_of.push(record_of[t]);
                continue;
            }
            let padding_bytes = padding_for(spec.size_bytes);
            let current = partition_lens_bytes.last().copied();
            let new_partition = match current {
                None => true,
                Some(len) => len.checked_add(spec.size_bytes).is_none_or(|end| end > cap),
            };
            if new_partition {
                if partition_lens_bytes.len() >= PARTITIONS_MAX as usize {
                    return Err(write_err(format!("more than {PARTITIONS_MAX} partitions")));
                }
                partition_lens_bytes.push(0);
            }
            let p = partition_lens_bytes.len() - 1;
            let offset_in_partition_bytes = partition_lens_bytes[p];
            partition_lens_bytes[p] = offset_in_partition_bytes
                .checked_add(spec.size_bytes)
                .and_then(|v| v.checked_add(padding_bytes))
                .ok_or(ErrorKind::SizeOverflow)?;
            record_of.push(records.len());
            records.push(SllmRecord {
                spec: i,
                partition: p as u32,
                offset_in_partition_bytes,
                size_bytes: spec.size_bytes,
                padding_bytes,
            });
        }
        *at = None;
        if partition_lens_bytes.is_empty() {
            // Upstream writes no partition for an empty model; one empty partition keeps the
            // directory readable.
            partition_lens_bytes.push(0);
        }
        let mut starts = Vec::with_capacity(partition_lens_bytes.len());
        let mut acc = 0u64;
        for &len in &partition_lens_bytes {
            starts.push(acc);
            acc = acc.checked_add(len).ok_or(ErrorKind::SizeOverflow)?;
        }
        let entries = specs
            .iter()
            .zip(&record_of)
            .map(|(spec, &r)| {
                let rec = &records[r];
                IndexEntry {
                    name: spec.name.clone(),
                    offset_bytes: starts[rec.partition as usize] + rec.offset_in_partition_bytes,
                    size_bytes: spec.size_bytes,
                    shape: spec.shape.clone(),
                    strides: spec.strides.clone().unwrap_or_else(|| contiguous_strides(&spec.shape)),
                    dtype: spec.dtype,
                    partition: None,
                }
            })
            .collect();
        Ok((entries, records, partition_lens_bytes))
    }

    /// The specs, as given.
    pub fn specs(&self) -> &[SllmTensorSpec] {
        &self.specs
    }
    /// One index entry per spec (global offsets), in spec order.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }
    /// The records to write, in file order (partition by partition).
    pub fn records(&self) -> &[SllmRecord] {
        &self.records
    }
    /// Final size of each partition file.
    pub fn partition_lens_bytes(&self) -> &[u64] {
        &self.partition_lens_bytes
    }
    /// Sum of all partition sizes.
    pub fn total_bytes(&self) -> u64 {
        self.partition_lens_bytes.iter().sum()
    }
    /// `tensor_index.json`, exactly as upstream's `json.dump` writes it.
    pub fn index_json(&self) -> String {
        index_json(&self.entries)
    }
}

/// Bytes of zero padding after a record of `size_bytes`.
pub fn padding_for(size_bytes: u64) -> u64 {
    (RECORD_ALIGN_BYTES - size_bytes % RECORD_ALIGN_BYTES) % RECORD_ALIGN_BYTES
}

/// Serialise index entries the way Python's `json.dump(dict_of_tuples, f)` does. Legacy entries
/// (with a partition) get the sixth field and the short dtype spelling.
pub fn index_json(entries: &[IndexEntry]) -> String {
    let mut out = String::with_capacity(entries.len() * 96 + 2);
    out.push('{');
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_py_string(&mut out, &e.name);
        // Writing into a String cannot fail.
        let _ = write!(out, ": [{}, {}, ", e.offset_bytes, e.size_bytes);
        push_dims(&mut out, &e.shape);
        out.push_str(", ");
        push_dims(&mut out, &e.strides);
        out.push_str(", ");
        match e.partition {
            None => push_py_string(&mut out, dtype_to_torch(e.dtype).unwrap_or(e.dtype.as_str())),
            Some(p) => {
                push_py_string(&mut out, &e.dtype.as_str().to_ascii_lowercase());
                let _ = write!(out, ", {p}");
            }
        }
        out.push(']');
    }
    out.push('}');
    out
}

fn push_dims(out: &mut String, dims: &[u64]) {
    out.push('[');
    for (i, d) in dims.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{d}");
    }
    out.push(']');
}

/// Python's `json` string encoding with `ensure_ascii=True`: everything outside `' '..='~'` is
/// escaped, non-BMP characters as surrogate pairs, hex digits in lower case.
fn push_py_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
        }
    }
    out.push('"');
}

/// A writer that refuses to take more than `remaining` bytes.
struct Bounded<'a, W: Write> {
    inner: &'a mut W,
    remaining: u64,
}

impl<W: Write> Write for Bounded<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() as u64 > self.remaining {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "fill wrote more bytes than the record holds",
            ));
        }
        let n = self.inner.write(buf)?;
        self.remaining -= n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Bytes of buffering between a fill callback and a partition file.
pub const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// Write the partitions and `tensor_index.json` of `layout` into the existing directory `dir`,
/// fsyncing every file. `fill(record_index, out)` must write exactly the record's `size_bytes`;
/// the padding is added here. Not atomic by itself: write into a temporary directory and rename
/// it (as `tensora_convert` does) for an all-or-nothing result.
///
/// ```
/// use tensora_format::Dtype;
/// use tensora_format::sllm::write::{write_dir, SllmLayout, SllmLayoutConfig, SllmTensorSpec};
/// let mut tied = SllmTensorSpec::dense("lm_head", Dtype::BF16, vec![2, 3]).unwrap();
/// tied.tied_to = Some(0);
/// let specs = vec![SllmTensorSpec::dense("embed", Dtype::BF16, vec![2, 3]).unwrap(), tied];
/// let layout = SllmLayout::new(specs, &SllmLayoutConfig::default()).unwrap();
/// let dir = tempfile::tempdir().unwrap();
/// write_dir(dir.path(), &layout, |_record, out| out.write_all(&[7u8; 12])).unwrap();
/// let ckpt = tensora_format::sllm::open_dir(dir.path()).unwrap();
/// assert_eq!(ckpt.tensor("embed").unwrap().range(), ckpt.tensor("lm_head").unwrap().range());
/// assert_eq!(ckpt.files()[0].len_bytes(), 16); // stored once, padded to 8
/// ```
pub fn write_dir(
    dir: &Path,
    layout: &SllmLayout,
    mut fill: impl FnMut(usize, &mut dyn Write) -> io::Result<()>,
) -> crate::Result<()> {
    let zeros = [0u8; RECORD_ALIGN_BYTES as usize];
    let mut next_record = 0usize;
    for (p, &len_bytes) in layout.partition_lens_bytes.iter().enumerate() {
        let path = partition_path(dir, p as u32);
        let io_err = |e: io::Error| Error::new(&path, ErrorKind::Io(e));
        let file = fs::OpenOptions::new().write(true).create_new(true).open(&path).map_err(io_err)?;
        let mut out = io::BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
        let mut written_bytes = 0u64;
        while let Some(rec) = layout.records.get(next_record).filter(|r| r.partition as usize == p) {
            let mut bounded = Bounded { inner: &mut out, remaining: rec.size_bytes };
            fill(next_record, &mut bounded)
                .map_err(|e| io_err(e).with_tensor(layout.specs[rec.spec].name.clone()))?;
            if bounded.remaining != 0 {
                return Err(Error::new(
                    &path,
                    write_err(format!(
                        "fill wrote {} of {} bytes",
                        rec.size_bytes - bounded.remaining,
                        rec.size_bytes
                    )),
                )
                .with_tensor(layout.specs[rec.spec].name.clone()));
            }
            out.write_all(&zeros[..rec.padding_bytes as usize]).map_err(io_err)?;
            written_bytes += rec.size_bytes + rec.padding_bytes;
            next_record += 1;
        }
        debug_assert_eq!(written_bytes, len_bytes);
        let file = out.into_inner().map_err(|e| io_err(e.into_error()))?;
        file.sync_all().map_err(io_err)?;
    }
    let index_path = dir.join(INDEX_FILE_NAME);
    let mut index = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&index_path)
        .map_err(|e| Error::new(&index_path, ErrorKind::Io(e)))?;
    index
        .write_all(layout.index_json().as_bytes())
        .and_then(|()| index.sync_all())
        .map_err(|e| Error::new(&index_path, ErrorKind::Io(e)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sllm::{open_dir, parse_index};

    fn spec(name: &str, dtype: Dtype, shape: &[u64]) -> SllmTensorSpec {
        SllmTensorSpec::dense(name, dtype, shape.to_vec()).unwrap()
    }

    #[test]
    fn reproduces_the_tiny_fixture_index_byte_for_byte() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
        let original = fs::read(Path::new(dir).join(INDEX_FILE_NAME)).unwrap();
        let parsed = parse_index(&original).unwrap().to_entries();
        // Rebuild the specs in index order; lm_head is tied to embed.
        let mut specs: Vec<SllmTensorSpec> = Vec::new();
        for e in &parsed {
            let tied_to =
                parsed.iter().position(|o| o.offset_bytes == e.offset_bytes && o.size_bytes == e.size_bytes);
            let tied_to = tied_to.filter(|&t| parsed[t].name != e.name);
            specs.push(SllmTensorSpec {
                name: e.name.clone(),
                dtype: e.dtype,
                shape: e.shape.clone(),
                strides: Some(e.strides.clone()),
                size_bytes: e.size_bytes,
                tied_to,
            });
        }
        // The fixture's partition sizes are 37376, 33032 and 8640: any cap in 37376..41224 reproduces them.
        let layout = SllmLayout::new(specs, &SllmLayoutConfig { partition_bytes_max: 40_000 }).unwrap();
        assert_eq!(layout.partition_lens_bytes(), [37376, 33032, 8640]);
        assert_eq!(layout.index_json().as_bytes(), &original[..]);
        assert_eq!(layout.records().len(), parsed.len() - 1, "tied weight stored once");
    }

    #[test]
    fn pads_every_record_to_eight_bytes() {
        let specs =
            vec![spec("a", Dtype::I8, &[3]), spec("b", Dtype::F16, &[5]), spec("c", Dtype::F64, &[1])];
        let layout = SllmLayout::new(specs, &SllmLayoutConfig::default()).unwrap();
        let offsets: Vec<u64> = layout.entries().iter().map(|e| e.offset_bytes).collect();
        assert_eq!(offsets, [0, 8, 24]);
        assert_eq!(layout.partition_lens_bytes(), [32]);
        assert_eq!(padding_for(0), 0);
        assert_eq!(padding_for(9), 7);
    }

    #[test]
    fn starts_a_partition_when_the_cap_would_be_passed() {
        // Cap 16: a(8) fits; b(8) makes 16, not past the cap; c(1) would pass it.
        let specs = vec![
            spec("a", Dtype::U8, &[8]),
            spec("b", Dtype::U8, &[8]),
            spec("c", Dtype::U8, &[1]),
            spec("big", Dtype::U8, &[40]),
            spec("d", Dtype::U8, &[2]),
        ];
        let layout = SllmLayout::new(specs, &SllmLayoutConfig { partition_bytes_max: 16 }).unwrap();
        let parts: Vec<u32> = layout.records().iter().map(|r| r.partition).collect();
        assert_eq!(parts, [0, 0, 1, 2, 3]);
        assert_eq!(layout.partition_lens_bytes(), [16, 8, 40, 8]);
        let offsets: Vec<u64> = layout.entries().iter().map(|e| e.offset_bytes).collect();
        assert_eq!(offsets, [0, 8, 16, 24, 64]);
    }

    #[test]
    fn the_padding_counts_towards_the_partition_size() {
        // a(5) is written as 8 bytes; 8 + 9 > 16 starts a new partition although 5 + 9 <= 16.
        let specs = vec![spec("a", Dtype::U8, &[5]), spec("b", Dtype::U8, &[9])];
        let layout = SllmLayout::new(specs, &SllmLayoutConfig { partition_bytes_max: 16 }).unwrap();
        assert_eq!(layout.partition_lens_bytes(), [8, 16]);
    }

    #[test]
    fn refuses_bad_specs() {
        let cfg = SllmLayoutConfig::default();
        let dup = vec![spec("a", Dtype::U8, &[1]), spec("a", Dtype::U8, &[1])];
        let err = SllmLayout::new(dup, &cfg).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::DuplicateTensor));
        assert_eq!(err.tensor(), Some("a"));
        let mut tie_fwd = vec![spec("a", Dtype::U8, &[1]), spec("b", Dtype::U8, &[1])];
        tie_fwd[0].tied_to = Some(1);
        assert!(matches!(SllmLayout::new(tie_fwd, &cfg).unwrap_err().kind(), ErrorKind::Write { .. }));
        let mut tie_size = vec![spec("a", Dtype::U8, &[1]), spec("b", Dtype::U8, &[2])];
        tie_size[1].tied_to = Some(0);
        assert!(matches!(SllmLayout::new(tie_size, &cfg).unwrap_err().kind(), ErrorKind::Write { .. }));
        let f4 = vec![SllmTensorSpec {
            name: "q".into(),
            dtype: Dtype::F4,
            shape: vec![2],
            strides: None,
            size_bytes: 1,
            tied_to: None,
        }];
        assert!(matches!(SllmLayout::new(f4, &cfg).unwrap_err().kind(), ErrorKind::Write { .. }));
        let zero = SllmLayoutConfig { partition_bytes_max: 0 };
        assert!(matches!(SllmLayout::new(vec![], &zero).unwrap_err().kind(), ErrorKind::Write { .. }));
        let mut short = spec("s", Dtype::F32, &[4]);
        short.size_bytes = 8;
        assert!(matches!(
            SllmLayout::new(vec![short], &cfg).unwrap_err().kind(),
            ErrorKind::StrideOutOfBounds { .. }
        ));
    }

    #[test]
    fn escapes_names_like_python_json() {
        let mut out = String::new();
        push_py_string(&mut out, "a\"\\\n\t\u{1}\u{7f}é😀~ ");
        assert_eq!(out, r#""a\"\\\n\t\u0001\u007f\u00e9\ud83d\ude00~ ""#);
    }

    #[test]
    fn written_directory_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut tied = spec("tied", Dtype::F32, &[3]);
        tied.tied_to = Some(0);
        let specs =
            vec![spec("w", Dtype::F32, &[3]), spec("b", Dtype::U8, &[5]), tied, spec("e", Dtype::F16, &[0])];
        let layout = SllmLayout::new(specs, &SllmLayoutConfig { partition_bytes_max: 12 }).unwrap();
        write_dir(dir.path(), &layout, |r, out| {
            let rec = layout.records()[r];
            out.write_all(&vec![r as u8 + 1; rec.size_bytes as usize])
        })
        .unwrap();
        let ckpt = open_dir(dir.path()).unwrap();
        assert_eq!(ckpt.files().len(), 2);
        assert_eq!(ckpt.tensor("w").unwrap().range(), ckpt.tensor("tied").unwrap().range());
        let part1 = fs::read(partition_path(dir.path(), 1)).unwrap();
        assert_eq!(part1, [2, 2, 2, 2, 2, 0, 0, 0]);
    }

    #[test]
    fn write_dir_refuses_a_short_or_long_fill() {
        let layout =
            SllmLayout::new(vec![spec("w", Dtype::F32, &[2])], &SllmLayoutConfig::default()).unwrap();
        let short = tempfile::tempdir().unwrap();
        let err = write_dir(short.path(), &layout, |_, out| out.write_all(&[0; 4])).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Write { .. }));
        assert_eq!(err.tensor(), Some("w"));
        let long = tempfile::tempdir().unwrap();
        let err = write_dir(long.path(), &layout, |_, out| out.write_all(&[0; 9])).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Io(_)));
    }
}
