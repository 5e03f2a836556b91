//! Parsing `tensor_index.json`: a serde visitor that reads each entry straight into typed,
//! bounded fields (no JSON tree of the index), validates it as soon as it is read, then checks
//! names and overlaps across entries.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{IndexEntry, IndexLayout, RANK_MAX, SllmIndex, dtype_from_short, dtype_from_torch};
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

/// [`super::parse_index`], with the tensor a failure concerns.
pub(super) fn parse_index_inner(bytes: &[u8]) -> Result<SllmIndex, IndexError> {
    let mut collect = Collect { entries: Vec::new(), layout: None, failure: None };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = (&mut de).deserialize_map(ObjectVisitor { collect: &mut collect }).and_then(|()| de.end());
    if let Some(failure) = collect.failure.take() {
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
    let Collect { entries, layout, .. } = collect;
    check_unique_names(&entries)?;
    check_overlaps(&entries)?;
    Ok(SllmIndex { layout: layout.unwrap_or(IndexLayout::Upstream), entries })
}

/// Entries validated so far. Each entry is checked as soon as it is read, so only the compact
/// [`IndexEntry`] values are kept, never a JSON tree of the whole index.
struct Collect {
    entries: Vec<IndexEntry>,
    layout: Option<IndexLayout>,
    /// The typed error that stopped the parse (serde only carries a message).
    failure: Option<IndexError>,
}

impl Collect {
    fn add(&mut self, name: String, raw: RawEntry) -> Result<(), IndexError> {
        if name.is_empty() {
            return Err(IndexError::at(&name, ErrorKind::BadTensorName { reason: "empty name" }));
        }
        let entry = parse_entry(&name, raw).map_err(|kind| IndexError::at(&name, kind))?;
        let this_layout = if entry.partition.is_some() { IndexLayout::Legacy } else { IndexLayout::Upstream };
        match self.layout {
            None => self.layout = Some(this_layout),
            Some(l) if l != this_layout => {
                let message = "index mixes 5-element and 6-element entries".to_owned();
                return Err(IndexError::at(&name, ErrorKind::BadSllmEntry { message }));
            }
            Some(_) => {}
        }
        self.entries.push(entry);
        Ok(())
    }
}

/// Reads the top-level object in order, handing each entry to [`Collect::add`].
struct ObjectVisitor<'c> {
    collect: &'c mut Collect,
}

impl<'de> Visitor<'de> for ObjectVisitor<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object keyed by tensor name")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            let raw: RawEntry = map.next_value()?;
            if let Err(failure) = self.collect.add(name, raw) {
                self.collect.failure = Some(failure);
                return Err(de::Error::custom("invalid tensor_index.json entry"));
            }
        }
        Ok(())
    }
}

/// Skip the rest of a sequence without building any of it.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Skip the rest of a map without building any of it.
fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Implements the `visit_*` methods of a visitor for every JSON value other than those it
/// handles itself, each giving `$other` (arrays and objects are skipped, never built).
macro_rules! other_json_values {
    ($other:expr; $($skip:ident),*) => {
        $(other_json_values!(@one $skip, $other);)*
    };
    (@one bool, $other:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> { Ok($other) }
    };
    (@one number, $other:expr) => {
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> { Ok($other) }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> { Ok($other) }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> { Ok($other) }
    };
    (@one str, $other:expr) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> { Ok($other) }
    };
    (@one null, $other:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> { Ok($other) }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> { Ok($other) }
    };
    (@one seq, $other:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            drain_seq(seq)?;
            Ok($other)
        }
    };
    (@one map, $other:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            drain_map(map)?;
            Ok($other)
        }
    };
}

/// One integer field of an entry, as read (no JSON tree is built, whatever the value is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    U64(u64),
    Negative,
    /// A fraction, or an integer beyond u64 (serde_json reads those as floats).
    NotU64Integer,
    /// Not a number at all.
    NotNumber,
}

impl Num {
    /// `Ok(None)` when the value is not a number at all.
    fn get(self) -> Result<Option<u64>, &'static str> {
        match self {
            Num::U64(v) => Ok(Some(v)),
            Num::Negative => Err("is negative"),
            Num::NotU64Integer => Err("is not an integer that fits in u64"),
            Num::NotNumber => Ok(None),
        }
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Num, D::Error> {
        struct NumVisitor;
        impl<'de> Visitor<'de> for NumVisitor {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
                Ok(Num::U64(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
                Ok(u64::try_from(v).map_or(Num::Negative, Num::U64))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Num, E> {
                Ok(Num::NotU64Integer)
            }
            other_json_values!(Num::NotNumber; bool, str, null, seq, map);
        }
        d.deserialize_any(NumVisitor)
    }
}

/// The dtype field: a string, or anything else (skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
enum DtypeField {
    Str(String),
    NotString,
}

impl<'de> Deserialize<'de> for DtypeField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<DtypeField, D::Error> {
        struct DtypeVisitor;
        impl<'de> Visitor<'de> for DtypeVisitor {
            type Value = DtypeField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DtypeField, E> {
                Ok(DtypeField::Str(v.to_owned()))
            }
            other_json_values!(DtypeField::NotString; bool, number, null, seq, map);
        }
        d.deserialize_any(DtypeVisitor)
    }
}

/// Reads a shape or stride array, keeping at most [`RANK_MAX`] dimensions: a longer array is
/// counted to its end without storing anything, so an index of any size costs O(1) memory per
/// entry. The outcome is the same as validating a fully built array.
struct DimsSeed {
    field: &'static str,
}

/// A shape or stride field as read.
#[derive(Debug)]
enum Dims {
    Valid(Vec<u64>),
    Invalid(ErrorKind),
    /// Not an array at all.
    NotArray,
}

impl<'de> DeserializeSeed<'de> for DimsSeed {
    type Value = Dims;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DimsSeed {
    type Value = Dims;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let field = self.field;
        let mut dims: Vec<u64> = Vec::new();
        let mut first_error: Option<ErrorKind> = None;
        let mut rank = 0usize;
        while let Some(n) = seq.next_element::<Num>()? {
            if rank < RANK_MAX && first_error.is_none() {
                match n.get() {
                    Ok(Some(d)) => dims.push(d),
                    Ok(None) => first_error = Some(bad_entry(format!("{field}[{rank}] must be an integer"))),
                    Err(why) => {
                        first_error = Some(ErrorKind::BadShape { reason: format!("{field}[{rank}] {why}") })
                    }
                }
            }
            rank = rank.saturating_add(1);
        }
        Ok(if rank > RANK_MAX {
            Dims::Invalid(ErrorKind::RankTooLarge { rank, limit: RANK_MAX })
        } else if let Some(e) = first_error {
            Dims::Invalid(e)
        } else {
            Dims::Valid(dims)
        })
    }
    other_json_values!(Dims::NotArray; bool, number, str, null, map);
}

/// One entry as read, each field already reduced to what validation needs; the array's length is
/// counted (elements past the sixth are skipped unread).
#[derive(Debug, Default)]
struct RawEntry {
    /// Number of array elements; `None` when the value is not an array.
    elements: Option<usize>,
    offset: Option<Num>,
    size: Option<Num>,
    shape: Option<Dims>,
    stride: Option<Dims>,
    dtype: Option<DtypeField>,
    partition: Option<Num>,
}

impl<'de> Deserialize<'de> for RawEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawEntry, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = RawEntry;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawEntry, A::Error> {
                let mut raw = RawEntry::default();
                let mut len = 0usize;
                loop {
                    let more = match len {
                        0 => seq.next_element::<Num>()?.map(|v| raw.offset = Some(v)).is_some(),
                        1 => seq.next_element::<Num>()?.map(|v| raw.size = Some(v)).is_some(),
                        2 => seq
                            .next_element_seed(DimsSeed { field: "shape" })?
                            .map(|v| raw.shape = Some(v))
                            .is_some(),
                        3 => seq
                            .next_element_seed(DimsSeed { field: "stride" })?
                            .map(|v| raw.stride = Some(v))
                            .is_some(),
                        4 => seq.next_element::<DtypeField>()?.map(|v| raw.dtype = Some(v)).is_some(),
                        5 => seq.next_element::<Num>()?.map(|v| raw.partition = Some(v)).is_some(),
                        _ => seq.next_element::<IgnoredAny>()?.is_some(),
                    };
                    if !more {
                        break;
                    }
                    len = len.saturating_add(1);
                }
                raw.elements = Some(len);
                Ok(raw)
            }
            other_json_values!(RawEntry::default(); bool, number, str, null, map);
        }
        d.deserialize_any(EntryVisitor)
    }
}

/// Names are unique (a JSON object with a repeated key is refused; the later entry is named).
fn check_unique_names(entries: &[IndexEntry]) -> Result<(), IndexError> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[a].name.cmp(&entries[b].name).then(a.cmp(&b)));
    for pair in order.windows(2) {
        if entries[pair[0]].name == entries[pair[1]].name {
            return Err(IndexError::at(&entries[pair[1]].name, ErrorKind::DuplicateTensor));
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

fn dims_field(value: Option<Dims>, field: &str) -> Result<Vec<u64>, ErrorKind> {
    match value.unwrap_or(Dims::NotArray) {
        Dims::Valid(dims) => Ok(dims),
        Dims::Invalid(e) => Err(e),
        Dims::NotArray => Err(bad_entry(format!("{field} must be an array of integers"))),
    }
}

fn parse_entry(name: &str, raw: RawEntry) -> Result<IndexEntry, ErrorKind> {
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
    let shape = dims_field(raw.shape, "shape")?;
    let strides = dims_field(raw.stride, "stride")?;
    let Some(DtypeField::Str(dtype_name)) = raw.dtype else {
        return Err(bad_entry("dtype must be a string"));
    };
    let dtype = if legacy { dtype_from_short(&dtype_name) } else { dtype_from_torch(&dtype_name) }
        .ok_or_else(|| ErrorKind::UnknownTorchDtype { dtype: dtype_name.clone() })?;
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
    if shape.len() != strides.len() {
        return Err(ErrorKind::StrideRankMismatch { shape_rank: shape.len(), stride_rank: strides.len() });
    }
    check_extent(dtype, &shape, &strides, size_bytes)?;
    Ok(IndexEntry { name: name.to_owned(), offset_bytes, size_bytes, shape, strides, dtype, partition })
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
fn check_overlaps(entries: &[IndexEntry]) -> Result<(), IndexError> {
    let mut order: Vec<usize> = (0..entries.len()).filter(|&i| entries[i].size_bytes > 0).collect();
    let key = |i: usize| (entries[i].partition, entries[i].offset_bytes, entries[i].size_bytes);
    order.sort_by_key(|&i| key(i));
    // The entry (among those seen so far in this partition) whose range ends last.
    let mut reach: Option<usize> = None;
    for &i in &order {
        let e = &entries[i];
        if let Some(r) = reach {
            let prev = &entries[r];
            if prev.partition == e.partition && e.offset_bytes < prev.end_bytes() {
                let tied = prev.offset_bytes == e.offset_bytes && prev.size_bytes == e.size_bytes;
                if !tied {
                    return Err(IndexError::at(&e.name, ErrorKind::SllmOverlap { other: prev.name.clone() }));
                }
                continue;
            }
        }
        reach = Some(i);
    }
    Ok(())
}
