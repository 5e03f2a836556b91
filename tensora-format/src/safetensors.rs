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

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::io::Read;
use std::path::Path;

use simd_json::{Buffers, Node, StaticNode, Tape};

use crate::{Dtype, Error, ErrorKind, Result};

/// The largest header length `n` accepted, in bytes. Checked before anything is allocated.
pub const HEADER_LEN_BYTES_MAX: u64 = 100_000_000;
/// The largest tensor rank accepted.
pub const RANK_MAX: usize = 64;
/// Target size of one parse chunk. A chunk holds whole top-level entries, so a single huge entry
/// makes a chunk as large as that entry (never larger than the header).
pub const CHUNK_BYTES_TARGET: usize = 64 * 1024;
/// The key that holds the optional string-to-string metadata.
pub const METADATA_KEY: &str = "__metadata__";

const MEMORY_PATH: &str = "<memory>";

/// The shortest possible tensor entry plus its comma,
/// `"a":{"dtype":"U8","shape":[],"data_offsets":[0,0]},`, is 50 bytes: a header of `n` bytes holds
/// at most `n / 49 + 1` entries. Used only to cap preallocation on hostile input.
const ENTRY_BYTES_MIN: usize = 49;

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
    parser.run()?;
    let Parser { metadata, mut entries, names, dims, .. } = parser;
    check_tiling(path, &mut entries, &names, data_len_bytes)?;
    Ok(Header { header_len_bytes, file_len_bytes, metadata, names, dims, entries })
}

/// Read and validate the header of the safetensors file at `path`. Reads exactly `8 + n` bytes.
pub fn read_header(path: &Path) -> Result<Header> {
    let (header, _) = read_header_stamped(path)?;
    Ok(header)
}

/// [`read_header`], also returning the file's metadata as seen through the same open handle.
pub(crate) fn read_header_stamped(path: &Path) -> Result<(Header, std::fs::Metadata)> {
    let io = |e| Error::new(path, ErrorKind::Io(e));
    let (mut file, meta) = crate::open_regular(path)?;
    let file_len_bytes = meta.len();
    let mut prefix = [0u8; 8];
    let prefix_len = read_up_to(&mut file, &mut prefix).map_err(io)?;
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
    let got = read_up_to(&mut file, &mut bytes[8..]).map_err(io)?;
    if got != span_usize - 8 {
        // The file shrank under us.
        return Err(Error::new(
            path,
            ErrorKind::HeaderBeyondFile { header_len_bytes: span - 8, file_len_bytes: 8 + got as u64 },
        ));
    }
    let header = parse_header_with_path(&bytes, file_len_bytes, path)?;
    Ok((header, meta))
}

/// Read until `buf` is full or EOF; returns the bytes read. Retries EINTR.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(k) => done += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Where the top-level object ends, and the chunk boundaries.
#[derive(Debug)]
struct TopLevel {
    /// Index of the closing `}`.
    close: usize,
    /// Runs of whole members, split at top-level commas (which are excluded), about
    /// [`CHUNK_BYTES_TARGET`] bytes each. At least one, possibly empty.
    segments: Vec<std::ops::Range<usize>>,
}

/// Chunk boundaries guessed without scanning: from about every [`CHUNK_BYTES_TARGET`] bytes, the
/// next `},"` (how one tensor entry ends and the next begins), splitting at its comma. `None` when
/// the header does not end in `}` (the exact path then reports the error). The guesses may be wrong
/// (e.g. inside a string); the caller falls back to [`scan_top_level`] if any chunk fails.
fn speculative_segments(json: &[u8], open: usize) -> Option<Vec<std::ops::Range<usize>>> {
    let close = json.iter().rposition(|&b| !is_json_ws(b))?;
    if json[close] != b'}' || close <= open {
        return None;
    }
    let mut segments = Vec::with_capacity(json.len() / CHUNK_BYTES_TARGET + 1);
    let mut start = open + 1;
    loop {
        let from = start + CHUNK_BYTES_TARGET;
        let split = json
            .get(from..close)
            .and_then(|tail| tail.windows(3).position(|w| w == b"},\""))
            .map(|k| from + k + 1);
        match split {
            Some(comma) => {
                segments.push(start..comma);
                start = comma + 1;
            }
            None => {
                segments.push(start..close);
                return Some(segments);
            }
        }
    }
}

/// Byte classes for [`scan_top_level`]: 0 for bytes it does not care about.
const CLASS_QUOTE: u8 = 1;
const CLASS_OPEN: u8 = 2;
const CLASS_CLOSE: u8 = 3;
const CLASS_COMMA: u8 = 4;
const CLASS_BACKSLASH: u8 = 5;

const fn byte_classes() -> [u8; 256] {
    let mut t = [0u8; 256];
    t[b'"' as usize] = CLASS_QUOTE;
    t[b'{' as usize] = CLASS_OPEN;
    t[b'[' as usize] = CLASS_OPEN;
    t[b'}' as usize] = CLASS_CLOSE;
    t[b']' as usize] = CLASS_CLOSE;
    t[b',' as usize] = CLASS_COMMA;
    t[b'\\' as usize] = CLASS_BACKSLASH;
    t
}
static BYTE_CLASS: [u8; 256] = byte_classes();

/// Linear scan of the object starting at `json[open] == b'{'`: tracks strings and nesting depth
/// (iteratively, so depth costs nothing) to find the closing brace and the top-level commas. It
/// validates nothing else; simd-json validates every chunk.
fn scan_top_level(json: &[u8], open: usize) -> std::result::Result<TopLevel, String> {
    let len = json.len();
    let mut segments = Vec::with_capacity(len / CHUNK_BYTES_TARGET + 1);
    let mut depth: usize = 1;
    let mut content_start = open + 1;
    let mut i = open + 1;
    loop {
        // Skip uninteresting bytes (digits, letters, whitespace, ':').
        while i < len && BYTE_CLASS[usize::from(json[i])] == 0 {
            i += 1;
        }
        if i >= len {
            return Err("unterminated object (header ends inside the JSON)".into());
        }
        let b = json[i];
        match BYTE_CLASS[usize::from(b)] {
            CLASS_QUOTE => {
                // Skip the string, stepping over escapes.
                i += 1;
                loop {
                    while i < len && json[i] != b'"' && json[i] != b'\\' {
                        i += 1;
                    }
                    match json.get(i) {
                        None => return Err("unterminated string".into()),
                        Some(b'"') => break,
                        _ => i += 2,
                    }
                }
            }
            CLASS_OPEN => depth += 1,
            CLASS_CLOSE => {
                depth -= 1;
                if depth == 0 {
                    if b != b'}' {
                        return Err(format!("mismatched ']' at byte {i}"));
                    }
                    segments.push(content_start..i);
                    return Ok(TopLevel { close: i, segments });
                }
            }
            CLASS_COMMA if depth == 1 && i - content_start >= CHUNK_BYTES_TARGET => {
                segments.push(content_start..i);
                content_start = i + 1;
            }
            _ => {} // A comma below the top level, or a backslash outside a string (invalid JSON, left to simd-json).
        }
        i += 1;
    }
}

fn is_json_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Sort by start and check that the ranges tile `[0, data_len)` exactly (rule 9).
fn check_tiling(path: &Path, tensors: &mut [Entry], names: &str, data_len_bytes: u64) -> Result<()> {
    tensors.sort_by_key(|t| (t.start_bytes, t.end_bytes));
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

/// A pass-through hasher for keys that are already 64-bit hashes.
#[derive(Debug, Default)]
struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(b) ^ (self.0 >> 56);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A fast seeded 64-bit hash of a name: 8-byte words folded by multiply-xor, then a murmur3-style
/// finaliser. Only used by [`NameSet`], which stays correct (and O(1)) even when two names collide.
fn name_hash(seed: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = seed ^ (bytes.len() as u64).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        h = (h ^ v).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Detects duplicate tensor names with one 64-bit hash per name (keyed per parse), falling back
/// to a set of owned names for the rare names whose hash collides with a different name.
#[derive(Debug)]
struct NameSet {
    seed: u64,
    first_by_hash: HashMap<u64, u32, BuildHasherDefault<PrehashedHasher>>,
    collided: HashSet<String>,
}

impl NameSet {
    fn new() -> NameSet {
        // A per-parse secret seed, so bucket positions cannot be predicted from the names.
        let seed = RandomState::new().hash_one(0x0074_656e_736f_7261_u64);
        NameSet { seed, first_by_hash: HashMap::default(), collided: HashSet::new() }
    }
    /// Forget every name (keeps the allocation).
    fn clear(&mut self) {
        self.first_by_hash.clear();
        self.collided.clear();
    }
    /// Insert `name` (the tensor at `index`); returns false if the name was already present.
    fn insert(&mut self, name: &str, index: u32, entries: &[Entry], names: &str) -> bool {
        let hash = name_hash(self.seed, name.as_bytes());
        match self.first_by_hash.entry(hash) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(index);
                true
            }
            std::collections::hash_map::Entry::Occupied(o) => {
                if entries[*o.get() as usize].name(names) == name {
                    false
                } else {
                    self.collided.insert(name.to_string())
                }
            }
        }
    }
}

/// Buffers reused across chunks.
struct Scratch {
    buffers: Buffers,
    chunk: Vec<u8>,
    tape: Tape<'static>,
}

struct Parser<'a> {
    path: &'a Path,
    json: &'a [u8],
    metadata: Option<BTreeMap<String, String>>,
    metadata_seen: bool,
    entries: Vec<Entry>,
    names: String,
    dims: Vec<u64>,
    seen: NameSet,
}

impl<'a> Parser<'a> {
    fn new(path: &'a Path, json: &'a [u8]) -> Parser<'a> {
        Parser {
            path,
            json,
            metadata: None,
            metadata_seen: false,
            entries: Vec::new(),
            names: String::new(),
            dims: Vec::new(),
            seen: NameSet::new(),
        }
    }

    fn err(&self, kind: ErrorKind) -> Error {
        Error::new(self.path, kind)
    }

    /// Find the object, split it into chunks at top-level commas, and parse each chunk.
    fn run(&mut self) -> Result<()> {
        let json = self.json;
        let Some(open) = json.iter().position(|&b| !is_json_ws(b)) else {
            return Err(self.err(ErrorKind::HeaderNotJson { message: "header is only whitespace".into() }));
        };
        if json[open] != b'{' {
            return Err(self.err(ErrorKind::HeaderNotObject {
                message: format!("first non-whitespace byte is 0x{:02x} at {open}, not '{{'", json[open]),
            }));
        }
        // Every tensor entry's value is an object, so it holds at least one '}' outside strings:
        // the count of '}' bytes bounds the number of tensors. Preallocating that (capped by what
        // the header could hold at its densest) avoids growth peaks.
        let braces = json.iter().filter(|&&b| b == b'}').count();
        let capacity = braces.min(json.len() / ENTRY_BYTES_MIN + 1);
        self.entries.reserve_exact(capacity);
        self.seen.first_by_hash.reserve(capacity);
        // Names and dims grow if these guesses are short: names are usually under a third of a
        // header, and a dimension takes at least two bytes of JSON.
        self.names.reserve(json.len() / 3);
        self.dims.reserve((2 * capacity).min(json.len() / 2));
        let mut scratch = Scratch {
            buffers: Buffers::with_max_depth(CHUNK_BYTES_TARGET + 2, json.len() + 2),
            chunk: Vec::with_capacity(CHUNK_BYTES_TARGET + 2 + simd_json::INPUT_PADDING),
            tape: Tape::null(),
        };

        // Fast path: split at likely entry boundaries without scanning every byte. Sound whatever
        // the split points: if every chunk is a valid non-empty object, so is the whole header.
        // Any failure (a split inside a string, or a genuine error) reruns the exact path below,
        // which alone decides which error to report.
        if let Some(segments) = speculative_segments(json, open) {
            if self.parse_segments(&segments, &mut scratch).is_ok() {
                return Ok(());
            }
            self.entries.clear();
            self.names.clear();
            self.dims.clear();
            self.seen.clear();
            self.metadata = None;
            self.metadata_seen = false;
        }

        let scan =
            scan_top_level(json, open).map_err(|message| self.err(ErrorKind::HeaderNotJson { message }))?;
        if let Some(off) = json[scan.close + 1..].iter().position(|&b| !is_json_ws(b)) {
            return Err(self.err(ErrorKind::TrailingBytes { at: scan.close + 1 + off }));
        }
        self.parse_segments(&scan.segments, &mut scratch)
    }

    fn parse_segments(&mut self, segments: &[std::ops::Range<usize>], scratch: &mut Scratch) -> Result<()> {
        let several = segments.len() > 1;
        for segment in segments {
            self.parse_chunk(
                segment.start,
                segment.end,
                &mut scratch.chunk,
                &mut scratch.buffers,
                &mut scratch.tape,
                several,
            )?;
        }
        Ok(())
    }

    /// Parse `{` + json[start..end] + `}` and take its entries.
    fn parse_chunk(
        &mut self,
        start: usize,
        end: usize,
        chunk: &mut Vec<u8>,
        buffers: &mut Buffers,
        tape_store: &mut Tape<'static>,
        must_be_non_empty: bool,
    ) -> Result<()> {
        let body = &self.json[start..end];
        chunk.clear();
        chunk.reserve(body.len() + 2 + simd_json::INPUT_PADDING);
        chunk.push(b'{');
        chunk.extend_from_slice(body);
        chunk.push(b'}');
        let doc_len = chunk.len();
        chunk.resize(doc_len + simd_json::INPUT_PADDING, b' ');
        let mut tape: Tape<'_> = std::mem::replace(tape_store, Tape::null()).reset();
        if let Err(e) = simd_json::fill_tape_padded(chunk, doc_len, buffers, &mut tape) {
            return Err(self.json_error(&e, start));
        }
        let result = self.take_entries(&tape.0, must_be_non_empty);
        *tape_store = tape.reset();
        result
    }

    fn json_error(&self, e: &simd_json::Error, chunk_start: usize) -> Error {
        // The chunk has one extra leading byte ('{') before json[chunk_start].
        let at = (chunk_start + e.index()).saturating_sub(1).min(self.json.len());
        match e.error() {
            simd_json::ErrorType::InvalidUtf8 => {
                let valid_up_to = match std::str::from_utf8(self.json) {
                    Ok(_) => at,
                    Err(u) => u.valid_up_to(),
                };
                self.err(ErrorKind::HeaderNotUtf8 { valid_up_to })
            }
            simd_json::ErrorType::InvalidNumber if self.is_big_integer_near(at) => {
                self.err(ErrorKind::IntegerOutOfRange { at })
            }
            other => self.err(ErrorKind::HeaderNotJson { message: format!("{other:?} near byte {at}") }),
        }
    }

    /// Whether the number token around `at` is a plain run of digits (so simd-json rejected it
    /// only for not fitting in 64 bits).
    fn is_big_integer_near(&self, at: usize) -> bool {
        let json = self.json;
        let mut s = at.min(json.len());
        while s > 0 && json[s - 1].is_ascii_digit() {
            s -= 1;
        }
        let mut e = s;
        while e < json.len() && json[e].is_ascii_digit() {
            e += 1;
        }
        let digits = e - s;
        let prev_ok = s == 0 || !matches!(json[s - 1], b'-' | b'.' | b'e' | b'E' | b'+');
        let next_ok = e == json.len() || !matches!(json[e], b'.' | b'e' | b'E');
        digits >= 20 && prev_ok && next_ok
    }

    /// Walk a chunk's tape: root object, then key/value pairs.
    fn take_entries(&mut self, tape: &[Node<'_>], must_be_non_empty: bool) -> Result<()> {
        let Some(&Node::Object { len, .. }) = tape.first() else {
            return Err(self.err(ErrorKind::HeaderNotObject { message: "not an object".into() }));
        };
        if len == 0 && must_be_non_empty {
            return Err(self.err(ErrorKind::HeaderNotJson { message: "empty member (stray comma)".into() }));
        }
        let mut i = 1usize;
        for _ in 0..len {
            let Some(Node::String(key)) = tape.get(i) else {
                return Err(
                    self.err(ErrorKind::HeaderNotJson { message: "object key is not a string".into() })
                );
            };
            let value_at = i + 1;
            let value_end = value_at + node_span(tape, value_at);
            let value = &tape[value_at..value_end];
            if *key == METADATA_KEY {
                self.take_metadata(value)?;
            } else {
                self.take_tensor(key, value)?;
            }
            i = value_end;
        }
        Ok(())
    }

    fn take_metadata(&mut self, value: &[Node<'_>]) -> Result<()> {
        if self.metadata_seen {
            return Err(self.err(ErrorKind::BadMetadata { message: "__metadata__ appears twice".into() }));
        }
        self.metadata_seen = true;
        match value.first() {
            Some(Node::Static(StaticNode::Null)) => Ok(()),
            Some(&Node::Object { len, .. }) => {
                let mut map = BTreeMap::new();
                let mut i = 1;
                for _ in 0..len {
                    let (Some(Node::String(k)), Some(v)) = (value.get(i), value.get(i + 1)) else {
                        return Err(self.err(ErrorKind::BadMetadata { message: "malformed object".into() }));
                    };
                    let Node::String(v) = v else {
                        return Err(self.err(ErrorKind::BadMetadata {
                            message: format!("value of key {k:?} is not a string"),
                        }));
                    };
                    if map.insert((*k).to_string(), (*v).to_string()).is_some() {
                        return Err(self.err(ErrorKind::DuplicateMetadataKey { key: (*k).to_string() }));
                    }
                    i += 2;
                }
                self.metadata = Some(map);
                Ok(())
            }
            _ => Err(self.err(ErrorKind::BadMetadata { message: "not an object or null".into() })),
        }
    }

    fn take_tensor(&mut self, name: &str, value: &[Node<'_>]) -> Result<()> {
        let tensor_err = |kind: ErrorKind| Error::new(self.path, kind).with_tensor(name);
        if name.is_empty() {
            return Err(tensor_err(ErrorKind::BadTensorName { reason: "empty" }));
        }
        if has_control(name) {
            return Err(tensor_err(ErrorKind::BadTensorName {
                reason: "contains a NUL or control character",
            }));
        }
        let Some(&Node::Object { len, .. }) = value.first() else {
            return Err(tensor_err(ErrorKind::BadTensorEntry { message: "value is not an object".into() }));
        };
        let mut dtype: Option<Dtype> = None;
        // (first index in self.dims, rank)
        let mut shape: Option<(usize, usize)> = None;
        let mut offsets: Option<(u64, u64)> = None;
        let mut i = 1;
        for _ in 0..len {
            let Some(Node::String(field)) = value.get(i) else {
                return Err(tensor_err(ErrorKind::BadTensorEntry { message: "malformed object".into() }));
            };
            let v_at = i + 1;
            let v_end = v_at + node_span(value, v_at);
            let v = &value[v_at..v_end];
            match *field {
                "dtype" => {
                    if dtype.is_some() {
                        return Err(tensor_err(ErrorKind::DuplicateField { field: "dtype" }));
                    }
                    let Some(Node::String(s)) = v.first() else {
                        return Err(tensor_err(ErrorKind::BadTensorEntry {
                            message: "dtype must be a string".into(),
                        }));
                    };
                    dtype =
                        Some(Dtype::from_safetensors(s).ok_or_else(|| {
                            tensor_err(ErrorKind::UnknownDtype { dtype: (*s).to_string() })
                        })?);
                }
                "shape" => {
                    if shape.is_some() {
                        return Err(tensor_err(ErrorKind::DuplicateField { field: "shape" }));
                    }
                    let Some(&Node::Array { len: rank, .. }) = v.first() else {
                        return Err(tensor_err(ErrorKind::BadShape { reason: "not an array".into() }));
                    };
                    if rank > RANK_MAX {
                        return Err(tensor_err(ErrorKind::RankTooLarge { rank, limit: RANK_MAX }));
                    }
                    let dims_start = self.dims.len();
                    for node in &v[1..] {
                        let d =
                            node_u64(node).map_err(|reason| tensor_err(ErrorKind::BadShape { reason }))?;
                        self.dims.push(d);
                    }
                    shape = Some((dims_start, rank));
                }
                "data_offsets" => {
                    if offsets.is_some() {
                        return Err(tensor_err(ErrorKind::DuplicateField { field: "data_offsets" }));
                    }
                    let Some(&Node::Array { len: 2, count: 2 }) = v.first() else {
                        return Err(tensor_err(ErrorKind::BadOffsets {
                            reason: "not an array of exactly two integers".into(),
                        }));
                    };
                    let bad = |reason| tensor_err(ErrorKind::BadOffsets { reason });
                    let start = node_u64(&v[1]).map_err(bad)?;
                    let end = node_u64(&v[2]).map_err(bad)?;
                    if end < start {
                        return Err(tensor_err(ErrorKind::BadOffsets {
                            reason: format!("end {end} is before start {start}"),
                        }));
                    }
                    offsets = Some((start, end));
                }
                _ => {} // Unknown field: skipped on the tape, whatever its depth.
            }
            i = v_end;
        }
        let dtype = dtype.ok_or_else(|| tensor_err(ErrorKind::MissingField { field: "dtype" }))?;
        let (dims_start, rank) =
            shape.ok_or_else(|| tensor_err(ErrorKind::MissingField { field: "shape" }))?;
        let (start, end) =
            offsets.ok_or_else(|| tensor_err(ErrorKind::MissingField { field: "data_offsets" }))?;
        let numel = self.dims[dims_start..dims_start + rank]
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| tensor_err(ErrorKind::SizeOverflow))?;
        let bits =
            numel.checked_mul(u64::from(dtype.bits())).ok_or_else(|| tensor_err(ErrorKind::SizeOverflow))?;
        if !bits.is_multiple_of(8) {
            return Err(tensor_err(ErrorKind::PartialByte { numel, dtype }));
        }
        let expected_bytes = bits / 8;
        if expected_bytes != end - start {
            return Err(tensor_err(ErrorKind::SizeMismatch { expected_bytes, actual_bytes: end - start }));
        }
        // All three fit u32: the header is at most 100 MB, and each tensor, name byte and
        // dimension takes at least one byte of it.
        let too_many =
            || tensor_err(ErrorKind::BadTensorEntry { message: "header too large to index".into() });
        let index = u32::try_from(self.entries.len()).map_err(|_| too_many())?;
        let name_start = u32::try_from(self.names.len()).map_err(|_| too_many())?;
        let name_len = u32::try_from(name.len()).map_err(|_| too_many())?;
        let dims_start = u32::try_from(dims_start).map_err(|_| too_many())?;
        if !self.seen.insert(name, index, &self.entries, &self.names) {
            return Err(tensor_err(ErrorKind::DuplicateTensor));
        }
        self.names.push_str(name);
        self.entries.push(Entry {
            name_start,
            name_len,
            dims_start,
            rank: rank as u8, // rank <= RANK_MAX (64)
            dtype,
            start_bytes: start,
            end_bytes: end,
        });
        Ok(())
    }
}

/// Whether `s` holds a control character (C0, DEL or C1); bytewise for ASCII.
pub(crate) fn has_control(s: &str) -> bool {
    if s.is_ascii() { s.bytes().any(|b| b < 0x20 || b == 0x7f) } else { s.chars().any(char::is_control) }
}

/// Number of tape nodes taken by the value starting at `at` (1 for scalars).
pub(crate) fn node_span(tape: &[Node<'_>], at: usize) -> usize {
    match tape.get(at) {
        Some(Node::Object { count, .. } | Node::Array { count, .. }) => 1 + count,
        _ => 1,
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
mod tests;
