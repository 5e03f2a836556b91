//! Parsing `tensor_index.json` in two passes. The first, with the crate's JSON reader, validates
//! the document and measures it (entries, name bytes, dimensions) in O(1) memory; the second, a
//! serde visitor, reads each entry straight into typed, bounded fields, validates it as soon as it
//! is read, and stores it compactly in buffers sized exactly by the first pass: one string of all
//! names, one buffer of all dimensions, 40 bytes per entry. Names and overlaps are then checked
//! across entries with a name table (12 bytes per entry) and one sort of entry numbers. Nothing
//! grows by doubling and nothing is allocated per entry, so peak memory stays under 4× the index
//! bytes (measured in `tests/index_memory.rs`). When the first pass finds the JSON invalid, the
//! second runs without storing anything, so the error reported is the first in document order.

mod fields;

use serde::de::{self, Deserializer, MapAccess, Visitor};

use self::fields::{Dims, EntrySeed, NameSeed, Num, RawEntry};
use super::{IndexLayout, RANK_MAX, Record, SllmIndex};
use crate::json::{Kind, Reader};
use crate::names::NameTable;
use crate::{Dtype, ErrorKind};

/// A parse failure with the tensor it concerns, if any.
#[derive(Debug)]
pub(super) struct IndexError {
    pub kind: ErrorKind,
    pub tensor: Option<String>,
}

impl IndexError {
    fn new(kind: ErrorKind) -> IndexError {
        IndexError { kind, tensor: None }
    }
    fn at(name: &str, kind: ErrorKind) -> IndexError {
        IndexError { kind, tensor: Some(name.to_owned()) }
    }
}

/// What the first pass measures: exactly what the second stores for a valid index.
#[derive(Debug, Default)]
struct Sizes {
    entries: usize,
    name_bytes: usize,
    dims: usize,
}

/// Validate the document and measure it: the number of top-level members, their keys' raw bytes
/// (an upper bound of the decoded names), and the dimensions of elements 2 and 3 (shape and
/// stride) of every array value, at most [`RANK_MAX`] each (the most the second pass keeps).
fn measure(bytes: &[u8]) -> Result<Sizes, crate::json::JsonError> {
    let mut r = Reader::new(bytes)?;
    let mut sizes = Sizes::default();
    if r.peek()? != Kind::Object {
        r.skip()?;
        return r.finish().map(|()| sizes);
    }
    r.begin_object()?;
    while let Some(name) = r.next_key()? {
        sizes.entries += 1;
        sizes.name_bytes += name.raw_len();
        if r.peek()? != Kind::Array {
            r.skip()?;
            continue;
        }
        r.begin_array()?;
        let mut element = 0;
        while r.next_element()? {
            if (element == 2 || element == 3) && r.peek()? == Kind::Array {
                r.begin_array()?;
                let mut rank = 0;
                while r.next_element()? {
                    r.skip()?;
                    rank += 1;
                }
                sizes.dims += rank.min(RANK_MAX);
            } else {
                r.skip()?;
            }
            element += 1;
        }
    }
    r.finish().map(|()| sizes)
}

/// [`super::parse_index`], with the tensor a failure concerns.
pub(super) fn parse_index_inner(bytes: &[u8]) -> Result<SllmIndex, IndexError> {
    let measured = measure(bytes);
    let mut store = match &measured {
        Ok(sizes) => Store::sized(sizes),
        Err(_) => Store::validating(),
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = (&mut de).deserialize_map(ObjectVisitor { store: &mut store }).and_then(|()| de.end());
    if let Some(failure) = store.failure.take() {
        return Err(failure);
    }
    parsed.map_err(|e| {
        let message = e.to_string();
        let kind = match e.classify() {
            serde_json::error::Category::Data => ErrorKind::BadIndex {
                message: format!("tensor_index.json must be one JSON object: {message}"),
            },
            _ => ErrorKind::BadIndex { message: format!("tensor_index.json is not valid JSON: {message}") },
        };
        IndexError::new(kind)
    })?;
    if let Err(e) = measured {
        // serde_json accepted what the reader refused: strict JSON decides.
        let message = format!("tensor_index.json is not valid JSON: {e}");
        return Err(IndexError::new(ErrorKind::BadIndex { message }));
    }
    let Store { names, dims, records, layout, .. } = store;
    let index = SllmIndex { layout: layout.unwrap_or(IndexLayout::Upstream), names, dims, records };
    check_unique_names(&index)?;
    check_overlaps(&index)?;
    Ok(index)
}

/// Entries validated so far, in the index's buffers (or, when validating only, each entry's
/// name and dimensions until it is checked).
struct Store {
    keep: bool,
    names: String,
    dims: Vec<u64>,
    records: Vec<Record>,
    layout: Option<IndexLayout>,
    /// The typed error that stopped the parse (serde only carries a message).
    failure: Option<IndexError>,
}

impl Store {
    fn sized(sizes: &Sizes) -> Store {
        Store {
            keep: true,
            names: String::with_capacity(sizes.name_bytes),
            dims: Vec::with_capacity(sizes.dims),
            records: Vec::with_capacity(sizes.entries),
            layout: None,
            failure: None,
        }
    }

    fn validating() -> Store {
        Store { keep: false, ..Store::sized(&Sizes::default()) }
    }

    /// Check the entry whose name starts at `name_start` and keep it (or, when validating only,
    /// forget it).
    fn add(&mut self, name_start: usize, raw: RawEntry) -> Result<(), IndexError> {
        let name = &self.names[name_start..];
        if name.is_empty() {
            return Err(IndexError::at(name, ErrorKind::BadTensorName { reason: "empty name" }));
        }
        let entry = parse_entry(raw, &self.dims).map_err(|kind| IndexError::at(name, kind))?;
        let this_layout = if entry.partition.is_some() { IndexLayout::Legacy } else { IndexLayout::Upstream };
        match self.layout {
            None => self.layout = Some(this_layout),
            Some(l) if l != this_layout => {
                let message = "index mixes 5-element and 6-element entries".to_owned();
                return Err(IndexError::at(name, ErrorKind::BadSllmEntry { message }));
            }
            Some(_) => {}
        }
        if !self.keep {
            self.names.clear();
            self.dims.clear();
            return Ok(());
        }
        let too_large =
            || IndexError::at(name, ErrorKind::BadSllmEntry { message: "index too large".into() });
        self.records.push(Record {
            name_start: u32::try_from(name_start).map_err(|_| too_large())?,
            name_len: u32::try_from(name.len()).map_err(|_| too_large())?,
            ..entry
        });
        Ok(())
    }
}

/// Reads the top-level object in order, handing each entry to [`Store::add`].
struct ObjectVisitor<'s> {
    store: &'s mut Store,
}

impl<'de> Visitor<'de> for ObjectVisitor<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object keyed by tensor name")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name_start) = map.next_key_seed(NameSeed { names: &mut self.store.names })? {
            let raw = map.next_value_seed(EntrySeed { dims: &mut self.store.dims })?;
            if let Err(failure) = self.store.add(name_start, raw) {
                self.store.failure = Some(failure);
                return Err(de::Error::custom("invalid tensor_index.json entry"));
            }
        }
        Ok(())
    }
}

/// Names are unique (a JSON object with a repeated key is refused; the later entry is named).
fn check_unique_names(index: &SllmIndex) -> Result<(), IndexError> {
    let mut table = NameTable::with_capacity(index.records.len());
    for (i, r) in index.records.iter().enumerate() {
        let name = index.record_name(r);
        if table.insert(name, i as u32, |k| index.record_name(&index.records[k as usize])).is_some() {
            return Err(IndexError::at(name, ErrorKind::DuplicateTensor));
        }
    }
    Ok(())
}

fn bad_entry(message: impl Into<String>) -> ErrorKind {
    ErrorKind::BadSllmEntry { message: message.into() }
}

fn offset_field(value: Option<Num>, field: &str) -> Result<u64, ErrorKind> {
    match value.unwrap_or(Num::NotNumber).get() {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(bad_entry(format!("{field} must be an integer"))),
        Err(why) => Err(ErrorKind::BadOffsets { reason: format!("{field} {why}") }),
    }
}

/// `(first index in the dims buffer, rank)` of a shape or stride field.
fn dims_field(value: Option<Dims>, field: &str) -> Result<(usize, usize), ErrorKind> {
    match value.unwrap_or(Dims::NotArray) {
        Dims::Valid(start, rank) => Ok((start, rank)),
        Dims::Invalid(e) => Err(e),
        Dims::NotArray => Err(bad_entry(format!("{field} must be an array of integers"))),
    }
}

/// Validate one entry; the record it gives has no name yet. Its stride must follow its shape in
/// `dims` (they are read in that order).
fn parse_entry(raw: RawEntry, dims: &[u64]) -> Result<Record, ErrorKind> {
    let legacy = match raw.elements {
        None => return Err(bad_entry("value must be a 5- or 6-element array")),
        Some(5) => false,
        Some(6) => true,
        Some(n) => return Err(bad_entry(format!("value has {n} elements, expected 5 or 6"))),
    };
    let offset_bytes = offset_field(raw.offset, "offset")?;
    let size_bytes = offset_field(raw.size, "size")?;
    if offset_bytes.checked_add(size_bytes).is_none() {
        return Err(ErrorKind::BadOffsets { reason: "offset + size overflows u64".to_owned() });
    }
    let (shape_start, shape_rank) = dims_field(raw.shape, "shape")?;
    let (stride_start, stride_rank) = dims_field(raw.stride, "stride")?;
    let dtype = raw.dtype.unwrap_or(fields::DtypeField::NotString).resolve(legacy)?;
    let partition = if legacy {
        match raw.partition.unwrap_or(Num::NotNumber).get() {
            Ok(Some(p)) => Some(u32::try_from(p).map_err(|_| ErrorKind::BadOffsets {
                reason: format!("partition_id {p} does not fit in u32"),
            })?),
            Ok(None) => return Err(bad_entry("partition_id must be an integer")),
            Err(why) => return Err(ErrorKind::BadOffsets { reason: format!("partition_id {why}") }),
        }
    } else {
        None
    };
    if shape_rank != stride_rank {
        return Err(ErrorKind::StrideRankMismatch { shape_rank, stride_rank });
    }
    debug_assert_eq!(stride_start, shape_start + shape_rank);
    let shape = &dims[shape_start..shape_start + shape_rank];
    let strides = &dims[stride_start..stride_start + stride_rank];
    check_extent(dtype, shape, strides, size_bytes)?;
    Ok(Record {
        offset_bytes,
        size_bytes,
        name_start: 0,
        name_len: 0,
        dims_start: u32::try_from(shape_start).map_err(|_| bad_entry("index too large"))?,
        rank: shape_rank as u8, // <= RANK_MAX (64)
        dtype,
        partition,
    })
}

/// The highest element reachable through shape and stride must lie inside `size_bytes`, and the
/// dense `numel × itemsize` bytes (what digests cover) must too.
pub(super) fn check_extent(
    dtype: Dtype,
    shape: &[u64],
    strides: &[u64],
    size_bytes: u64,
) -> Result<(), ErrorKind> {
    let item_bytes = dtype.size_bytes().ok_or(ErrorKind::SizeOverflow)?;
    let numel = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).ok_or(ErrorKind::SizeOverflow)?;
    let needed_elems = if numel == 0 {
        0
    } else {
        shape
            .iter()
            .zip(strides)
            .try_fold(1u64, |acc, (&d, &s)| acc.checked_add((d - 1).checked_mul(s)?))
            .ok_or(ErrorKind::SizeOverflow)?
    };
    let needed_bytes = needed_elems.checked_mul(item_bytes).ok_or(ErrorKind::SizeOverflow)?;
    if needed_bytes > size_bytes {
        return Err(ErrorKind::StrideOutOfBounds { needed_bytes, size_bytes });
    }
    let dense_bytes = numel.checked_mul(item_bytes).ok_or(ErrorKind::SizeOverflow)?;
    if dense_bytes > size_bytes {
        return Err(ErrorKind::SizeMismatch { expected_bytes: dense_bytes, actual_bytes: size_bytes });
    }
    Ok(())
}

/// Entries must not overlap unless exactly tied (same partition, offset and size). Zero-size
/// entries cover no bytes and never overlap.
fn check_overlaps(index: &SllmIndex) -> Result<(), IndexError> {
    let records = &index.records;
    let mut order: Vec<u32> =
        (0..records.len() as u32).filter(|&i| records[i as usize].size_bytes > 0).collect();
    let key = |i: u32| {
        let r = &records[i as usize];
        (r.partition, r.offset_bytes, r.size_bytes)
    };
    order.sort_unstable_by_key(|&i| (key(i), i));
    // The entry (among those seen so far in this partition) whose range ends last.
    let mut reach: Option<&Record> = None;
    for &i in &order {
        let e = &records[i as usize];
        if let Some(prev) = reach
            && prev.partition == e.partition
            && e.offset_bytes < prev.offset_bytes + prev.size_bytes
        {
            let tied = prev.offset_bytes == e.offset_bytes && prev.size_bytes == e.size_bytes;
            if !tied {
                let other = index.record_name(prev).to_owned();
                return Err(IndexError::at(index.record_name(e), ErrorKind::SllmOverlap { other }));
            }
            continue;
        }
        reach = Some(e);
    }
    Ok(())
}
