//! [`Parser`]: the header JSON, chunk by chunk, onto a simd-json tape, and from the tape into
//! compact entries, metadata and the shared name and shape buffers.

use std::collections::BTreeMap;
use std::path::Path;

use simd_json::{Buffers, Node, StaticNode, Tape};

use super::chunks::{is_json_ws, scan_top_level, speculative_segments};
use super::{CHUNK_BYTES_TARGET, Entry, METADATA_KEY, Members, RANK_MAX, has_control, node_u64};
use crate::names::NameTable;
use crate::{Dtype, Error, ErrorKind, Result};

/// The shortest possible tensor entry plus its comma,
/// `"a":{"dtype":"U8","shape":[],"data_offsets":[0,0]},`, is 50 bytes: a header of `n` bytes holds
/// at most `n / 49 + 1` entries. Used only to cap preallocation on hostile input.
const ENTRY_BYTES_MIN: usize = 49;
/// A header is parsed in parts on several threads only when each part gets at least this many
/// bytes: below it, starting a thread costs more than the part's parse saves.
pub(super) const PART_BYTES_MIN: usize = 1 << 20;
/// At most this many threads parse one header.
pub(super) const PARSE_THREADS_MAX: usize = 8;

/// Buffers reused across chunks.
struct Scratch {
    buffers: Buffers,
    chunk: Vec<u8>,
    tape: Tape<'static>,
}

/// One header's parse: the JSON it reads, and what it has taken from it so far.
pub(super) struct Parser<'a> {
    path: &'a Path,
    json: &'a [u8],
    pub metadata: Option<BTreeMap<String, String>>,
    metadata_seen: bool,
    pub entries: Vec<Entry>,
    /// All tensor names, back to back.
    pub names: String,
    /// All shapes, back to back.
    pub dims: Vec<u64>,
    seen: NameTable,
}

impl<'a> Parser<'a> {
    pub fn new(path: &'a Path, json: &'a [u8]) -> Parser<'a> {
        Parser {
            path,
            json,
            metadata: None,
            metadata_seen: false,
            entries: Vec::new(),
            names: String::new(),
            dims: Vec::new(),
            seen: NameTable::with_capacity(0),
        }
    }

    fn err(&self, kind: ErrorKind) -> Error {
        Error::new(self.path, kind)
    }

    /// Find the object, split it into chunks at top-level commas, and parse each chunk: on up to
    /// `threads` threads when the header is large enough that each gets `part_bytes_min` bytes
    /// ([`PART_BYTES_MIN`] outside tests).
    pub fn run(&mut self, threads: usize, part_bytes_min: usize) -> Result<()> {
        let json = self.json;
        let Some(open) = json.iter().position(|&b| !is_json_ws(b)) else {
            return Err(self.err(ErrorKind::HeaderNotJson { message: "header is only whitespace".into() }));
        };
        if json[open] != b'{' {
            return Err(self.err(ErrorKind::HeaderNotObject {
                message: format!("first non-whitespace byte is 0x{:02x} at {open}, not '{{'", json[open]),
            }));
        }

        // Fast path: split at likely entry boundaries without scanning every byte. Sound whatever
        // the split points: if every chunk is a valid non-empty object, so is the whole header.
        // Any failure (a split inside a string, or a genuine error) reruns the exact path below,
        // on this thread, which alone decides which error to report.
        if let Some(segments) = speculative_segments(json, open) {
            let parts = threads
                .clamp(1, PARSE_THREADS_MAX)
                .min(json.len() / part_bytes_min.max(1))
                .min(segments.len());
            let parsed = if parts > 1 {
                self.parse_in_parts(&segments, parts)
            } else {
                self.parse_segments(&segments, segments.len() > 1)
            };
            if parsed.is_ok() {
                return Ok(());
            }
            *self = Parser::new(self.path, json);
        }

        let scan =
            scan_top_level(json, open).map_err(|message| self.err(ErrorKind::HeaderNotJson { message }))?;
        if let Some(off) = json[scan.close + 1..].iter().position(|&b| !is_json_ws(b)) {
            return Err(self.err(ErrorKind::TrailingBytes { at: scan.close + 1 + off }));
        }
        self.parse_segments(&scan.segments, scan.segments.len() > 1)
    }

    /// Reserve for the entries of `json[range]`. Every tensor entry's value is an object, so it
    /// holds at least one '}' outside strings: the count of '}' bytes bounds the number of
    /// tensors. Preallocating that (capped by what the bytes could hold at their densest) avoids
    /// growth peaks.
    fn reserve_for(&mut self, range: std::ops::Range<usize>) {
        let bytes = &self.json[range];
        let capacity = count_byte(bytes, b'}').min(bytes.len() / ENTRY_BYTES_MIN + 1);
        self.entries.reserve_exact(capacity);
        self.seen = NameTable::with_capacity(capacity);
        // Names and dims grow if these guesses are short: names are usually under half of a
        // header, and a dimension takes at least two bytes of JSON.
        self.names.reserve(bytes.len() / 2);
        self.dims.reserve((2 * capacity).min(bytes.len() / 2));
    }

    /// Parse `segments` (runs of whole members, in header order) on this thread. `several`: the
    /// header has more than one segment, so none may be empty (an empty one is a stray comma).
    fn parse_segments(&mut self, segments: &[std::ops::Range<usize>], several: bool) -> Result<()> {
        let (Some(first), Some(last)) = (segments.first(), segments.last()) else {
            return Ok(());
        };
        self.reserve_for(first.start..last.end);
        let mut scratch = Scratch {
            buffers: Buffers::with_max_depth(CHUNK_BYTES_TARGET + 2, self.json.len() + 2),
            chunk: Vec::with_capacity(CHUNK_BYTES_TARGET + 2 + simd_json::INPUT_PADDING),
            tape: Tape::null(),
        };
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

    /// Parse `segments` as `parts` runs of about equal length, each on its own scoped thread (the
    /// first on this one), then merge them in header order. A part's error, or what only the
    /// whole can see (a name in two parts, `__metadata__` in two parts), is an `Err` with no
    /// message of its own: the caller reruns the exact serial path, which reports it.
    fn parse_in_parts(&mut self, segments: &[std::ops::Range<usize>], parts: usize) -> Result<()> {
        let (path, json) = (self.path, self.json);
        let per_part = segments.len().div_ceil(parts);
        let mut groups = segments.chunks(per_part);
        let first = groups.next().unwrap_or(&[]);
        let parse = |group: &[std::ops::Range<usize>]| {
            let mut part = Parser::new(path, json);
            part.parse_segments(group, true).map(|()| part)
        };
        let mut parsed = Vec::with_capacity(parts);
        std::thread::scope(|scope| {
            let helpers: Vec<_> = groups.map(|group| scope.spawn(move || parse(group))).collect();
            parsed.push(parse(first));
            // Joined here, not left to the scope, so no parse thread outlives the parse.
            for helper in helpers {
                parsed.push(helper.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            }
        });
        let mut parts: Vec<Parser<'a>> = parsed.into_iter().collect::<Result<_>>()?;
        let mut rest = parts.split_off(1);
        *self = parts.pop().unwrap_or_else(|| Parser::new(path, json));
        // One reservation for the merged buffers, so appending moves nothing.
        self.names.reserve(rest.iter().map(|p| p.names.len()).sum());
        self.dims.reserve(rest.iter().map(|p| p.dims.len()).sum());
        self.entries.reserve(rest.iter().map(|p| p.entries.len()).sum());
        // Each part's own table, and where its entries start in the merged list: a later part's
        // names are looked up in every earlier part's table.
        let mut tables = vec![(std::mem::replace(&mut self.seen, NameTable::with_capacity(0)), 0usize)];
        for part in rest.drain(..) {
            self.absorb(part, &mut tables)?;
        }
        Ok(())
    }

    /// Append `part` (parsed from the members right after this parser's) to this one.
    fn absorb(&mut self, part: Parser<'a>, tables: &mut Vec<(NameTable, usize)>) -> Result<()> {
        let path = self.path;
        let conflict =
            move || Error::new(path, ErrorKind::HeaderNotJson { message: "parts disagree".into() });
        if part.metadata_seen {
            if self.metadata_seen {
                return Err(conflict());
            }
            self.metadata_seen = true;
            self.metadata = part.metadata;
        }
        let (entries, names) = (&self.entries, &self.names);
        for e in &part.entries {
            let name = e.name(&part.names);
            for (table, base) in tables.iter() {
                if table.get(name, |i| entries[base + i as usize].name(names)).is_some() {
                    return Err(conflict());
                }
            }
        }
        // All fit u32: the merged header is at most 100 MB, and each name byte and dimension
        // takes at least one byte of it.
        let (Ok(name_base), Ok(dims_base)) =
            (u32::try_from(self.names.len()), u32::try_from(self.dims.len()))
        else {
            return Err(conflict());
        };
        tables.push((part.seen, self.entries.len()));
        self.names.push_str(&part.names);
        self.dims.extend_from_slice(&part.dims);
        self.entries.extend(part.entries.into_iter().map(|e| Entry {
            name_start: e.name_start + name_base,
            dims_start: e.dims_start + dims_base,
            ..e
        }));
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
        for member in Members::of(tape, len) {
            let Some((key, value)) = member else {
                return Err(
                    self.err(ErrorKind::HeaderNotJson { message: "object key is not a string".into() })
                );
            };
            if key == METADATA_KEY {
                self.take_metadata(value)?;
            } else {
                self.take_tensor(key, value)?;
            }
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
                for member in Members::of(value, len) {
                    let Some((k, v)) = member else {
                        return Err(self.err(ErrorKind::BadMetadata { message: "malformed object".into() }));
                    };
                    let Some(Node::String(v)) = v.first() else {
                        return Err(self.err(ErrorKind::BadMetadata {
                            message: format!("value of key {k:?} is not a string"),
                        }));
                    };
                    if map.insert(k.to_string(), (*v).to_string()).is_some() {
                        return Err(self.err(ErrorKind::DuplicateMetadataKey { key: k.to_string() }));
                    }
                }
                self.metadata = Some(map);
                Ok(())
            }
            _ => Err(self.err(ErrorKind::BadMetadata { message: "not an object or null".into() })),
        }
    }

    /// Take one tensor entry: its name, its three fields (unknown ones skipped), a size that
    /// agrees with dtype and shape, then the compact entry.
    fn take_tensor(&mut self, name: &str, value: &[Node<'_>]) -> Result<()> {
        let path = self.path;
        let tensor_err = |kind: ErrorKind| Error::new(path, kind).with_tensor(name);
        check_tensor_name(name).map_err(tensor_err)?;
        let Some(&Node::Object { len, .. }) = value.first() else {
            return Err(tensor_err(ErrorKind::BadTensorEntry { message: "value is not an object".into() }));
        };
        let mut fields = EntryFields::default();
        for member in Members::of(value, len) {
            let Some((field, v)) = member else {
                return Err(tensor_err(ErrorKind::BadTensorEntry { message: "malformed object".into() }));
            };
            self.take_field(&mut fields, field, v).map_err(tensor_err)?;
        }
        let TensorFields { dtype, shape: (dims_start, rank), offsets } =
            fields.complete().map_err(tensor_err)?;
        check_size(dtype, &self.dims[dims_start..dims_start + rank], offsets).map_err(tensor_err)?;
        self.push_entry(name, dtype, (dims_start, rank), offsets).map_err(tensor_err)
    }

    /// Read one field of a tensor entry into `fields`. Unknown fields are skipped on the tape,
    /// whatever their depth.
    fn take_field(&mut self, fields: &mut EntryFields, field: &str, v: &[Node<'_>]) -> Result<(), ErrorKind> {
        match field {
            "dtype" => {
                if fields.dtype.is_some() {
                    return Err(ErrorKind::DuplicateField { field: "dtype" });
                }
                fields.dtype = Some(dtype_of(v)?);
            }
            "shape" => {
                if fields.shape.is_some() {
                    return Err(ErrorKind::DuplicateField { field: "shape" });
                }
                fields.shape = Some(self.take_shape(v)?);
            }
            "data_offsets" => {
                if fields.offsets.is_some() {
                    return Err(ErrorKind::DuplicateField { field: "data_offsets" });
                }
                fields.offsets = Some(offsets_of(v)?);
            }
            _ => {}
        }
        Ok(())
    }

    /// Append a shape's dimensions to the shared buffer: `(first index in it, rank)`.
    fn take_shape(&mut self, v: &[Node<'_>]) -> Result<(usize, usize), ErrorKind> {
        let Some(&Node::Array { len: rank, .. }) = v.first() else {
            return Err(ErrorKind::BadShape { reason: "not an array".into() });
        };
        if rank > RANK_MAX {
            return Err(ErrorKind::RankTooLarge { rank, limit: RANK_MAX });
        }
        let dims_start = self.dims.len();
        for node in &v[1..] {
            let d = node_u64(node).map_err(|reason| ErrorKind::BadShape { reason })?;
            self.dims.push(d);
        }
        Ok((dims_start, rank))
    }

    /// Record a validated tensor: its name (refused if already taken) and compact entry.
    fn push_entry(
        &mut self,
        name: &str,
        dtype: Dtype,
        (dims_start, rank): (usize, usize),
        (start, end): (u64, u64),
    ) -> Result<(), ErrorKind> {
        // All three fit u32: the header is at most 100 MB, and each tensor, name byte and
        // dimension takes at least one byte of it.
        let too_many = || ErrorKind::BadTensorEntry { message: "header too large to index".into() };
        let index = u32::try_from(self.entries.len()).map_err(|_| too_many())?;
        let name_start = u32::try_from(self.names.len()).map_err(|_| too_many())?;
        let name_len = u32::try_from(name.len()).map_err(|_| too_many())?;
        let dims_start = u32::try_from(dims_start).map_err(|_| too_many())?;
        let (entries, names) = (&self.entries, &self.names);
        if self.seen.insert(name, index, |i| entries[i as usize].name(names)).is_some() {
            return Err(ErrorKind::DuplicateTensor);
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

/// The three fields of a tensor entry, as far as they were read.
#[derive(Debug, Default)]
struct EntryFields {
    dtype: Option<Dtype>,
    /// `(first index in the parser's dims, rank)`.
    shape: Option<(usize, usize)>,
    /// `data_offsets`: start and end, relative to the data section.
    offsets: Option<(u64, u64)>,
}

/// The three fields of a tensor entry, all present.
#[derive(Debug)]
struct TensorFields {
    dtype: Dtype,
    /// `(first index in the parser's dims, rank)`.
    shape: (usize, usize),
    /// `data_offsets`: start and end, relative to the data section.
    offsets: (u64, u64),
}

impl EntryFields {
    /// All three fields, or the first one missing (in the order dtype, shape, data_offsets).
    fn complete(self) -> Result<TensorFields, ErrorKind> {
        let Some(dtype) = self.dtype else {
            return Err(ErrorKind::MissingField { field: "dtype" });
        };
        let Some(shape) = self.shape else {
            return Err(ErrorKind::MissingField { field: "shape" });
        };
        let Some(offsets) = self.offsets else {
            return Err(ErrorKind::MissingField { field: "data_offsets" });
        };
        Ok(TensorFields { dtype, shape, offsets })
    }
}

/// A tensor name must be non-empty and free of control characters.
fn check_tensor_name(name: &str) -> Result<(), ErrorKind> {
    if name.is_empty() {
        return Err(ErrorKind::BadTensorName { reason: "empty" });
    }
    if has_control(name) {
        return Err(ErrorKind::BadTensorName { reason: "contains a NUL or control character" });
    }
    Ok(())
}

/// The `dtype` field: a string naming a known safetensors dtype.
fn dtype_of(v: &[Node<'_>]) -> Result<Dtype, ErrorKind> {
    let Some(Node::String(s)) = v.first() else {
        return Err(ErrorKind::BadTensorEntry { message: "dtype must be a string".into() });
    };
    Dtype::from_safetensors(s).ok_or_else(|| ErrorKind::UnknownDtype { dtype: (*s).to_string() })
}

/// The `data_offsets` field: exactly two non-negative integers, the end not before the start.
fn offsets_of(v: &[Node<'_>]) -> Result<(u64, u64), ErrorKind> {
    let Some(&Node::Array { len: 2, count: 2 }) = v.first() else {
        return Err(ErrorKind::BadOffsets { reason: "not an array of exactly two integers".into() });
    };
    let bad = |reason| ErrorKind::BadOffsets { reason };
    let start = node_u64(&v[1]).map_err(bad)?;
    let end = node_u64(&v[2]).map_err(bad)?;
    if end < start {
        return Err(ErrorKind::BadOffsets { reason: format!("end {end} is before start {start}") });
    }
    Ok((start, end))
}

/// `data_offsets` must span exactly `numel × bits / 8` bytes, a whole number of bytes, computed
/// without overflow.
fn check_size(dtype: Dtype, dims: &[u64], (start, end): (u64, u64)) -> Result<(), ErrorKind> {
    let Some(numel) = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)) else {
        return Err(ErrorKind::SizeOverflow);
    };
    let Some(bits) = numel.checked_mul(u64::from(dtype.bits())) else {
        return Err(ErrorKind::SizeOverflow);
    };
    if !bits.is_multiple_of(8) {
        return Err(ErrorKind::PartialByte { numel, dtype });
    }
    let expected_bytes = bits / 8;
    if expected_bytes != end - start {
        return Err(ErrorKind::SizeMismatch { expected_bytes, actual_bytes: end - start });
    }
    Ok(())
}

/// How many times `needle` occurs in `bytes`: per run of 255 bytes into a `u8` (which the
/// compiler vectorises sixteen or more bytes at a time), then summed.
fn count_byte(bytes: &[u8], needle: u8) -> usize {
    bytes.chunks(255).map(|run| usize::from(run.iter().fold(0u8, |n, &b| n + u8::from(b == needle)))).sum()
}
