//! The strict safetensors header parser.
//!
//! A safetensors file is `n` (little-endian u64), then `n` bytes of JSON header, then the data
//! section. [`read_header`] reads exactly `8 + n` bytes of a file and never the data;
//! [`parse_header`] does the same work on bytes the caller already has (e.g. fetched remotely).
//!
//! The JSON is parsed with `simd-json` onto a tape, in bounded chunks: the header object is cut at
//! top-level commas into runs of whole entries (about [`CHUNK_BYTES_TARGET`] bytes each), and each
//! run is parsed as a JSON object of its own. The header is then textually
//! `ws { X1 , X2 , … , Xk } ws`, and because each `{Xi}` is a valid, non-empty JSON object, so is
//! the whole, wherever the cuts fall. Cuts are first guessed at `},"` (how one entry ends and the
//! next begins); if any chunk fails, an exact string- and depth-aware scan recomputes the cuts and
//! the parse is redone, so errors are always reported by the exact path. This keeps working memory
//! small and independent of the header size, while simd-json does all JSON validation (UTF-8,
//! escapes, numbers, NaN, comments, trailing commas). Unknown fields are skipped on the tape in
//! O(1) without recursion, so their nesting depth does not matter. Names and shapes are stored in
//! two shared buffers, so a parse makes no allocation per tensor.
//!
//! ```
//! use tensora_format::safetensors::parse_header;
//! let json = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
//! let mut file = (json.len() as u64).to_le_bytes().to_vec();
//! file.extend_from_slice(json);
//! file.extend_from_slice(&[0u8; 8]);
//! let header = parse_header(&file, file.len() as u64).unwrap();
//! assert_eq!(header.tensors().len(), 1);
//! assert_eq!(header.tensor(0).unwrap().name(), "w");
//! assert_eq!(header.data_start_bytes(), 8 + json.len() as u64);
//! ```

mod chunks;
mod parser;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use simd_json::{Node, StaticNode};

use self::parser::Parser;
use crate::checkpoint::{Spans, Strided, Strings};
use crate::{Dtype, Error, ErrorKind, FileId, Result, TensorInfo};

/// The largest header length `n` accepted, in bytes. Checked before anything is allocated.
pub const HEADER_LEN_BYTES_MAX: u64 = 100_000_000;
/// The largest tensor rank accepted.
pub const RANK_MAX: usize = 64;
/// Target size of one parse chunk. A chunk holds whole top-level entries, so a single huge entry
/// makes a chunk as large as that entry (never larger than the header).
pub const CHUNK_BYTES_TARGET: usize = 16 * 1024;
/// The key that holds the optional string-to-string metadata.
pub const METADATA_KEY: &str = "__metadata__";

const MEMORY_PATH: &str = "<memory>";

/// One tensor entry, compact: its name and shape live in the [`Header`]'s shared buffers, so a
/// parse makes no allocation per tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    name_start: u32,
    name_len: u32,
    dims_start: u32,
    rank: u8,
    dtype: Dtype,
    start_bytes: u64,
    end_bytes: u64,
}

impl Entry {
    fn name<'a>(&self, names: &'a str) -> &'a str {
        let start = self.name_start as usize;
        &names[start..start + self.name_len as usize]
    }
}

/// One tensor entry of a parsed [`Header`], borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderTensor<'a> {
    name: &'a str,
    dtype: Dtype,
    shape: &'a [u64],
    start_bytes: u64,
    end_bytes: u64,
}

impl<'a> HeaderTensor<'a> {
    /// The tensor name (unescaped).
    pub fn name(&self) -> &'a str {
        self.name
    }
    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// Shape; `[]` is a scalar.
    pub fn shape(&self) -> &'a [u64] {
        self.shape
    }
    /// `data_offsets`: the byte range relative to the start of the data section.
    pub fn data_offsets(&self) -> (u64, u64) {
        (self.start_bytes, self.end_bytes)
    }
    /// Bytes of data (`end - start`).
    pub fn nbytes(&self) -> u64 {
        self.end_bytes - self.start_bytes
    }
}

/// A validated safetensors header. Tensors are sorted by data offset, and their ranges tile the
/// data section exactly (rules 1-10 of the format all hold).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    header_len_bytes: u64,
    file_len_bytes: u64,
    metadata: Option<BTreeMap<String, String>>,
    /// All tensor names, back to back.
    names: String,
    /// All shapes, back to back.
    dims: Vec<u64>,
    /// Sorted by data offset.
    entries: Vec<Entry>,
}

impl Header {
    /// `n`, the JSON header length from the 8-byte prefix.
    pub fn header_len_bytes(&self) -> u64 {
        self.header_len_bytes
    }
    /// The file size the header was validated against.
    pub fn file_len_bytes(&self) -> u64 {
        self.file_len_bytes
    }
    /// `8 + n`: the absolute offset of the data section.
    pub fn data_start_bytes(&self) -> u64 {
        8 + self.header_len_bytes
    }
    /// `file size - 8 - n`.
    pub fn data_len_bytes(&self) -> u64 {
        self.file_len_bytes - self.data_start_bytes()
    }
    /// `__metadata__`, or `None` when absent or `null`.
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()
    }
    /// Take `__metadata__` out of the header.
    pub fn take_metadata(&mut self) -> Option<BTreeMap<String, String>> {
        self.metadata.take()
    }
    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Whether the header has no tensors.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Tensor `i` in data-offset order, if there is one.
    pub fn tensor(&self, i: usize) -> Option<HeaderTensor<'_>> {
        self.entries.get(i).map(|e| self.view(e))
    }
    /// Tensors ordered by data offset (ties, which only zero-sized tensors can have, keep header
    /// order).
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = HeaderTensor<'_>> + DoubleEndedIterator + '_ {
        self.entries.iter().map(|e| self.view(e))
    }
    /// The tensors of this header as file `file` of a checkpoint, appended to `out` in
    /// data-offset order; they share the header's names and shapes (moved, not copied). Returns
    /// `__metadata__`.
    pub(crate) fn into_tensors(
        mut self,
        file: FileId,
        out: &mut Vec<TensorInfo>,
    ) -> Option<BTreeMap<String, String>> {
        let data_start = self.data_start_bytes();
        let metadata = self.metadata.take();
        let mut names = std::mem::take(&mut self.names);
        names.shrink_to_fit();
        let mut dims = std::mem::take(&mut self.dims);
        dims.shrink_to_fit();
        let strings = Arc::new(Strings { names, dims });
        out.reserve(self.entries.len());
        for e in &self.entries {
            let spans = Spans {
                name_start: e.name_start,
                name_len: e.name_len,
                dims_start: e.dims_start,
                rank: e.rank,
                strided: Strided::No,
            };
            let len_bytes = e.end_bytes - e.start_bytes;
            out.push(TensorInfo::new(&strings, spans, e.dtype, file, data_start + e.start_bytes, len_bytes));
        }
        metadata
    }
    fn view<'a>(&'a self, e: &Entry) -> HeaderTensor<'a> {
        let dims_start = e.dims_start as usize;
        HeaderTensor {
            name: e.name(&self.names),
            dtype: e.dtype,
            shape: &self.dims[dims_start..dims_start + usize::from(e.rank)],
            start_bytes: e.start_bytes,
            end_bytes: e.end_bytes,
        }
    }
}

/// Check rule 1 on the 8-byte prefix and return `8 + n`, the number of leading bytes of the file
/// that [`parse_header`] needs. `prefix` must hold at least the first 8 bytes of the file.
///
/// ```
/// let prefix = 16u64.to_le_bytes();
/// assert_eq!(tensora_format::safetensors::header_span_bytes(&prefix, 100).unwrap(), 24);
/// ```
pub fn header_span_bytes(prefix: &[u8], file_len_bytes: u64) -> Result<u64> {
    header_span_at(Path::new(MEMORY_PATH), prefix, file_len_bytes)
}

fn header_span_at(path: &Path, prefix: &[u8], file_len_bytes: u64) -> Result<u64> {
    if file_len_bytes < 8 {
        return Err(Error::new(path, ErrorKind::FileTooShort { len_bytes: file_len_bytes }));
    }
    let Some(first8) = prefix.get(..8) else {
        return Err(Error::new(
            path,
            ErrorKind::BytesTooShort { have_bytes: prefix.len() as u64, need_bytes: 8 },
        ));
    };
    let mut len = [0u8; 8];
    len.copy_from_slice(first8);
    let n = u64::from_le_bytes(len);
    if n == 0 {
        return Err(Error::new(path, ErrorKind::HeaderLenZero));
    }
    if n > HEADER_LEN_BYTES_MAX {
        return Err(Error::new(
            path,
            ErrorKind::HeaderTooLarge { header_len_bytes: n, limit_bytes: HEADER_LEN_BYTES_MAX },
        ));
    }
    match n.checked_add(8) {
        Some(span) if span <= file_len_bytes => Ok(span),
        _ => Err(Error::new(path, ErrorKind::HeaderBeyondFile { header_len_bytes: n, file_len_bytes })),
    }
}

/// Parse and validate a header from the first bytes of a safetensors file of `file_len_bytes`
/// bytes. `bytes` must hold at least `8 + n` bytes (see [`header_span_bytes`]); anything after
/// that is ignored. Errors name the file as `<memory>`; see [`parse_header_with_path`].
pub fn parse_header(bytes: &[u8], file_len_bytes: u64) -> Result<Header> {
    parse_header_with_path(bytes, file_len_bytes, Path::new(MEMORY_PATH))
}

/// [`parse_header`], with errors naming `path`.
pub fn parse_header_with_path(bytes: &[u8], file_len_bytes: u64, path: &Path) -> Result<Header> {
    parse_header_on(bytes, file_len_bytes, path, 1)
}

/// [`parse_header_with_path`] on up to `threads` threads (a header of a few MB and up, e.g.
/// 100,000 tensors in one file, is parsed in parts; the result and every error are the same).
pub(crate) fn parse_header_on(
    bytes: &[u8],
    file_len_bytes: u64,
    path: &Path,
    threads: usize,
) -> Result<Header> {
    parse_header_split(bytes, file_len_bytes, path, (threads, parser::PART_BYTES_MIN))
}

/// [`parse_header_on`] with parts of at least `part_bytes_min` bytes.
fn parse_header_split(
    bytes: &[u8],
    file_len_bytes: u64,
    path: &Path,
    (threads, part_bytes_min): (usize, usize),
) -> Result<Header> {
    let span = header_span_at(path, bytes, file_len_bytes)?;
    let Some(json) = usize::try_from(span).ok().and_then(|span| bytes.get(8..span)) else {
        return Err(Error::new(
            path,
            ErrorKind::BytesTooShort { have_bytes: bytes.len() as u64, need_bytes: span },
        ));
    };
    let header_len_bytes = span - 8;
    let data_len_bytes = file_len_bytes - span;
    let mut parser = Parser::new(path, json);
    parser.run(threads, part_bytes_min)?;
    let Parser { metadata, mut entries, names, dims, .. } = parser;
    check_tiling(path, &mut entries, &names, data_len_bytes)?;
    Ok(Header { header_len_bytes, file_len_bytes, metadata, names, dims, entries })
}

/// Read and validate the header of the safetensors file at `path`. Reads exactly `8 + n` bytes.
pub fn read_header(path: &Path) -> Result<Header> {
    let (header, _) = read_header_stamped(path, 1)?;
    Ok(header)
}

/// [`read_header`], also returning the file's metadata as seen through the same open handle.
/// Two positional reads: the 8-byte prefix, then exactly the `n` header bytes; parsed on up to
/// `threads` threads.
pub(crate) fn read_header_stamped(path: &Path, threads: usize) -> Result<(Header, std::fs::Metadata)> {
    let io = |e| Error::new(path, ErrorKind::Io(e));
    let (file, meta) = crate::open_regular(path)?;
    let file_len_bytes = meta.len();
    let mut prefix = [0u8; 8];
    let prefix_len = read_at_most(&file, &mut prefix, 0).map_err(io)?;
    let span = header_span_at(path, &prefix[..prefix_len], file_len_bytes)?;
    // `span` <= 8 + HEADER_LEN_BYTES_MAX and <= the file size: a bounded allocation.
    let span_usize = usize::try_from(span).map_err(|_| {
        Error::new(
            path,
            ErrorKind::HeaderTooLarge { header_len_bytes: span - 8, limit_bytes: HEADER_LEN_BYTES_MAX },
        )
    })?;
    let mut bytes = vec![0u8; span_usize];
    bytes[..8].copy_from_slice(&prefix);
    let got = read_in_parts(&file, &mut bytes[8..], 8, threads).map_err(io)?;
    if got != span_usize - 8 {
        // The file shrank under us.
        return Err(Error::new(
            path,
            ErrorKind::HeaderBeyondFile { header_len_bytes: span - 8, file_len_bytes: 8 + got as u64 },
        ));
    }
    let header = parse_header_on(&bytes, file_len_bytes, path, threads)?;
    Ok((header, meta))
}

/// [`read_at_most`] on up to `threads` scoped threads, each filling its own part of `buf` (a
/// header of several MB is mostly the faults of its fresh buffer, which then run side by side).
/// Returns the bytes read; short (the file shrank) if any part came back short.
fn read_in_parts(file: &File, buf: &mut [u8], offset: u64, threads: usize) -> std::io::Result<usize> {
    let parts = threads.clamp(1, parser::PARSE_THREADS_MAX).min(buf.len() / parser::PART_BYTES_MIN);
    if parts <= 1 {
        return read_at_most(file, buf, offset);
    }
    let part_len = buf.len().div_ceil(parts);
    std::thread::scope(|scope| {
        let mut pieces = buf.chunks_mut(part_len).enumerate();
        let (_, first) = pieces.next().unwrap_or((0, &mut []));
        let helpers: Vec<_> = pieces
            .map(|(k, piece)| scope.spawn(move || read_at_most(file, piece, offset + (k * part_len) as u64)))
            .collect();
        let mut done = read_at_most(file, first, offset);
        // Joined here, not left to the scope, so no read outlives the call.
        for helper in helpers {
            let got = helper.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            done = match (done, got) {
                (Ok(a), Ok(b)) => Ok(a + b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        done
    })
}

/// Read at `offset` until `buf` is full or EOF; returns the bytes read. Retries EINTR.
fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    #[cfg(unix)]
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        #[cfg(unix)]
        let read = file.read_at(&mut buf[done..], offset + done as u64);
        #[cfg(not(unix))]
        let read = {
            use std::io::{Read, Seek, SeekFrom};
            let mut f = file;
            f.seek(SeekFrom::Start(offset + done as u64)).and_then(|_| f.read(&mut buf[done..]))
        };
        match read {
            Ok(0) => break,
            Ok(k) => done += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Sort by start and check that the ranges tile `[0, data_len)` exactly (rule 9).
fn check_tiling(path: &Path, tensors: &mut [Entry], names: &str, data_len_bytes: u64) -> Result<()> {
    // Headers often list tensors in offset order: then checking that is the one pass. Otherwise an
    // in-place sort (no buffer) whose last key, the name's place in the header's name buffer,
    // keeps ties (zero-sized tensors) in header order, as a stable sort would.
    if !tensors.is_sorted_by_key(|t| (t.start_bytes, t.end_bytes)) {
        tensors.sort_unstable_by_key(|t| (t.start_bytes, t.end_bytes, t.name_start));
    }
    let mut expected = 0u64;
    for t in tensors.iter() {
        if t.start_bytes > expected {
            return Err(Error::new(path, ErrorKind::DataHole { start: t.start_bytes, expected })
                .with_tensor(t.name(names)));
        }
        if t.start_bytes < expected {
            return Err(Error::new(
                path,
                ErrorKind::DataOverlap { start: t.start_bytes, previous_end: expected },
            )
            .with_tensor(t.name(names)));
        }
        expected = t.end_bytes;
    }
    if expected != data_len_bytes {
        let err = Error::new(path, ErrorKind::DataLenMismatch { end: expected, data_len_bytes });
        return Err(match tensors.last() {
            Some(t) => err.with_tensor(t.name(names)),
            None => err,
        });
    }
    Ok(())
}

/// Whether `s` holds a control character (C0, DEL or C1); bytewise for ASCII.
pub(crate) fn has_control(s: &str) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Eight bytes at a time: any byte below 0x20, equal to 0x7f, or not ASCII sends the name to
    // the exact (char-wise) check; a run of plain ASCII needs no more.
    let mut words = s.as_bytes().chunks_exact(8);
    let suspicious = words.any(|w| {
        let w = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        let del = w ^ (ONES * 0x7f);
        ((w.wrapping_sub(ONES * 0x20) & !w) | (del.wrapping_sub(ONES) & !del) | w) & HIGHS != 0
    }) || words.remainder().iter().any(|&b| !(0x20..0x7f).contains(&b));
    suspicious && s.chars().any(char::is_control)
}

/// Number of tape nodes taken by the value starting at `at` (1 for scalars).
fn node_span(tape: &[Node<'_>], at: usize) -> usize {
    match tape.get(at) {
        Some(Node::Object { count, .. } | Node::Array { count, .. }) => 1 + count,
        _ => 1,
    }
}

/// The members of a JSON object on a simd-json tape, in order: each key with the tape nodes of
/// its value (one node for a scalar, the whole subtree for an object or array, skipped in O(1)
/// whatever its depth). The one walk over object members for every parser of this crate.
#[derive(Debug)]
pub(crate) struct Members<'t, 'n> {
    nodes: &'t [Node<'n>],
    /// Where the next key is.
    at: usize,
    /// Members not yet walked.
    left: usize,
}

impl<'t, 'n> Members<'t, 'n> {
    /// The members of `object`, whose first node is a `Node::Object` with `len` members.
    pub(crate) fn of(object: &'t [Node<'n>], len: usize) -> Members<'t, 'n> {
        Members { nodes: object, at: 1, left: len }
    }
}

impl<'t, 'n> Iterator for Members<'t, 'n> {
    /// `None` for a member whose key is not a string or whose value is missing (a malformed
    /// tape); the walk ends there.
    type Item = Option<(&'n str, &'t [Node<'n>])>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let value_at = self.at + 1;
        let value_end = value_at + node_span(self.nodes, value_at);
        let member = match (self.nodes.get(self.at), self.nodes.get(value_at..value_end)) {
            (Some(&Node::String(key)), Some(value)) => Some((key, value)),
            _ => {
                self.left = 0;
                None
            }
        };
        self.at = value_end;
        Some(member)
    }
}

/// A non-negative integer that fits u64; anything else is refused with a reason.
pub(crate) fn node_u64(node: &Node<'_>) -> std::result::Result<u64, String> {
    match node {
        Node::Static(StaticNode::U64(v)) => Ok(*v),
        Node::Static(StaticNode::I64(v)) => {
            Err(format!("{v} has a sign; only non-negative integers without a sign are allowed"))
        }
        Node::Static(StaticNode::F64(v)) => Err(format!("{v} is not an integer")),
        Node::String(s) => Err(format!("string {s:?} is not an integer")),
        Node::Static(StaticNode::Bool(_)) => Err("a boolean is not an integer".into()),
        Node::Static(StaticNode::Null) => Err("null is not an integer".into()),
        Node::Object { .. } | Node::Array { .. } => Err("a nested object or array is not an integer".into()),
        #[allow(unreachable_patterns)]
        _ => Err("not a non-negative integer".into()),
    }
}

#[cfg(test)]
pub(crate) mod tests;
