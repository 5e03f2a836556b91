//! The ServerlessLLM (sllm-store) layout: `tensor_index.json` plus `tensor.data_N` partitions.
//!
//! A ServerlessLLM checkpoint is a directory. `tensor_index.json` is one JSON object keyed by tensor
//! name (state-dict order); each value is `[offset, size, shape, stride, dtype]` where `offset` is a
//! byte offset into the concatenation of `tensor.data_0`, `tensor.data_1`, … (in order), `size` is
//! the byte size of the tensor's storage, strides are in elements and `dtype` is a torch name such
//! as `"torch.bfloat16"`. Tensora's older variant has a sixth field, the partition number, with
//! offsets local to that partition and short dtype names (`"bf16"`).
//!
//! [`open_dir`] validates all of it and yields the same [`Checkpoint`] as the safetensors parsers;
//! [`parse_index`] is the file-free part (used by the fuzz target). The writer side lives in
//! [`write`].

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::checkpoint::{FileEntry, FileId, FileStamp, Format, TensorInfo, Warning};
use crate::{Checkpoint, Dtype, Error, ErrorKind};

pub mod write;

/// Name of the index file inside a ServerlessLLM directory.
pub const INDEX_FILE_NAME: &str = "tensor_index.json";
/// Partition files are `tensor.data_0`, `tensor.data_1`, … (decimal, no zero padding).
pub const PARTITION_PREFIX: &str = "tensor.data_";
/// The largest `tensor_index.json` this crate reads (256 MiB). A bigger index is refused with
/// [`ErrorKind::IndexTooLarge`] before any of it is read.
pub const INDEX_LEN_BYTES_MAX: u64 = 256 << 20;
/// Partition probing stops with an error after this many partitions (at 10 GiB each, 640 TiB).
pub const PARTITIONS_MAX: u32 = 65_536;
/// Highest tensor rank accepted in an index.
pub const RANK_MAX: usize = 64;
/// Every record in a partition starts at a multiple of this many bytes (upstream pads with 0..8
/// bytes after each record; the padding content is undefined).
pub const RECORD_ALIGN_BYTES: u64 = 8;
/// Upstream's partition cap: a new partition starts when the current one plus the next record
/// would pass 10 GiB.
pub const PARTITION_BYTES_MAX_DEFAULT: u64 = 10 << 30;

/// Which flavour of `tensor_index.json` an index is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexLayout {
    /// Upstream sllm-store: `[offset, size, shape, stride, dtype]`, global offsets, torch dtype
    /// names.
    Upstream,
    /// Tensora's older layout: `[offset, size, shape, stride, dtype, partition_id]`, offsets local
    /// to the partition, short dtype names (`f16`, `bf16`, `f32`, …).
    Legacy,
}

/// One validated entry of `tensor_index.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    /// Global offset ([`IndexLayout::Upstream`]) or offset within `partition` (legacy).
    pub offset_bytes: u64,
    /// Byte size of the tensor's storage.
    pub size_bytes: u64,
    pub shape: Vec<u64>,
    /// Strides in elements, same rank as `shape`.
    pub strides: Vec<u64>,
    pub dtype: Dtype,
    /// The partition number (legacy layout only).
    pub partition: Option<u32>,
}

impl IndexEntry {
    /// `offset_bytes + size_bytes` (checked by the parser not to overflow).
    pub fn end_bytes(&self) -> u64 {
        self.offset_bytes + self.size_bytes
    }
}

/// A parsed and validated `tensor_index.json`, entries in file (state-dict) order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SllmIndex {
    pub layout: IndexLayout,
    pub entries: Vec<IndexEntry>,
}

/// A parse failure with the tensor it concerns, if any.
#[derive(Debug)]
struct IndexError {
    kind: ErrorKind,
    tensor: Option<String>,
}

impl IndexError {
    fn new(kind: ErrorKind) -> IndexError {
        IndexError { kind, tensor: None }
    }
    fn at(name: &str, kind: ErrorKind) -> IndexError {
        IndexError { kind, tensor: Some(name.to_owned()) }
    }
}

/// Parse and validate the bytes of a `tensor_index.json`, without touching any file.
///
/// Checks everything that does not need the partitions: the JSON shape, the field types, that
/// offsets and sizes fit in `u64`, known dtypes, shape/stride ranks, that the highest element
/// reachable through shape and stride fits inside `size`, unique names, and that two entries either
/// do not overlap or are exactly tied (same offset and size; same partition for the legacy layout).
///
/// ```
/// use tensora_format::sllm::{parse_index, IndexLayout};
/// let index = br#"{"w": [0, 8, [2], [1], "torch.float32"], "tied": [0, 8, [2], [1], "torch.float32"]}"#;
/// let parsed = parse_index(index).unwrap();
/// assert_eq!(parsed.layout, IndexLayout::Upstream);
/// assert_eq!(parsed.entries.len(), 2);
/// assert!(parse_index(br#"{"w": [0, 4, [2], [1], "torch.float32"]}"#).is_err());
/// ```
pub fn parse_index(bytes: &[u8]) -> Result<SllmIndex, ErrorKind> {
    parse_index_inner(bytes).map_err(|e| e.kind)
}

fn parse_index_inner(bytes: &[u8]) -> Result<SllmIndex, IndexError> {
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
fn check_extent(dtype: Dtype, shape: &[u64], strides: &[u64], size_bytes: u64) -> Result<(), ErrorKind> {
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

/// Map a torch dtype name (`str(tensor.dtype)`) to the safetensors dtype.
pub fn dtype_from_torch(name: &str) -> Option<Dtype> {
    Some(match name {
        "torch.float16" => Dtype::F16,
        "torch.bfloat16" => Dtype::BF16,
        "torch.float32" => Dtype::F32,
        "torch.float64" => Dtype::F64,
        "torch.int8" => Dtype::I8,
        "torch.int16" => Dtype::I16,
        "torch.int32" => Dtype::I32,
        "torch.int64" => Dtype::I64,
        "torch.uint8" => Dtype::U8,
        "torch.uint16" => Dtype::U16,
        "torch.uint32" => Dtype::U32,
        "torch.uint64" => Dtype::U64,
        "torch.bool" => Dtype::Bool,
        "torch.complex64" => Dtype::C64,
        "torch.float8_e4m3fn" => Dtype::F8E4M3,
        "torch.float8_e5m2" => Dtype::F8E5M2,
        "torch.float8_e4m3fnuz" => Dtype::F8E4M3Fnuz,
        "torch.float8_e5m2fnuz" => Dtype::F8E5M2Fnuz,
        "torch.float8_e8m0fnu" => Dtype::F8E8M0,
        _ => return None,
    })
}

/// The torch name of a dtype, or `None` for dtypes torch cannot hold (the sub-byte types).
pub fn dtype_to_torch(dtype: Dtype) -> Option<&'static str> {
    Some(match dtype {
        Dtype::F16 => "torch.float16",
        Dtype::BF16 => "torch.bfloat16",
        Dtype::F32 => "torch.float32",
        Dtype::F64 => "torch.float64",
        Dtype::I8 => "torch.int8",
        Dtype::I16 => "torch.int16",
        Dtype::I32 => "torch.int32",
        Dtype::I64 => "torch.int64",
        Dtype::U8 => "torch.uint8",
        Dtype::U16 => "torch.uint16",
        Dtype::U32 => "torch.uint32",
        Dtype::U64 => "torch.uint64",
        Dtype::Bool => "torch.bool",
        Dtype::C64 => "torch.complex64",
        Dtype::F8E4M3 => "torch.float8_e4m3fn",
        Dtype::F8E5M2 => "torch.float8_e5m2",
        Dtype::F8E4M3Fnuz => "torch.float8_e4m3fnuz",
        Dtype::F8E5M2Fnuz => "torch.float8_e5m2fnuz",
        Dtype::F8E8M0 => "torch.float8_e8m0fnu",
        Dtype::F4 | Dtype::F6E2M3 | Dtype::F6E3M2 => return None,
    })
}

/// The legacy layout's short names: the safetensors spelling in lower case (`f16`, `bf16`,
/// `f8_e4m3`, `bool`, …). Sub-byte types are refused (torch cannot hold them).
pub fn dtype_from_short(name: &str) -> Option<Dtype> {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    Dtype::from_safetensors(&name.to_ascii_uppercase()).filter(|d| d.size_bytes().is_some())
}

/// `true` when `dir` holds a `tensor_index.json` (cheap; does not validate).
pub fn looks_like_sllm_dir(dir: &Path) -> bool {
    dir.join(INDEX_FILE_NAME).is_file()
}

/// Read a file of at most `limit_bytes`, refusing bigger ones before reading (and never reading
/// more than `limit_bytes + 1` even if the file grows meanwhile).
fn read_capped(path: &Path, limit_bytes: u64) -> Result<Vec<u8>, ErrorKind> {
    let file = fs::File::open(path)?;
    let len_bytes = file.metadata()?.len();
    if len_bytes > limit_bytes {
        return Err(ErrorKind::IndexTooLarge { len_bytes, limit_bytes });
    }
    let mut buf = Vec::with_capacity(usize::try_from(len_bytes).unwrap_or(0));
    file.take(limit_bytes + 1).read_to_end(&mut buf)?;
    let read_bytes = buf.len() as u64;
    if read_bytes > limit_bytes {
        return Err(ErrorKind::IndexTooLarge { len_bytes: read_bytes, limit_bytes });
    }
    Ok(buf)
}

/// The path of partition `index` inside `dir`.
pub fn partition_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(format!("{PARTITION_PREFIX}{index}"))
}

/// Probe `tensor.data_0`, `tensor.data_1`, … until one is missing.
fn probe_partitions(dir: &Path) -> crate::Result<Vec<FileEntry>> {
    let mut files = Vec::new();
    for index in 0..=PARTITIONS_MAX {
        let path = partition_path(dir, index);
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(e) => return Err(Error::new(path, ErrorKind::Io(e))),
        };
        if index == PARTITIONS_MAX {
            return Err(Error::new(
                path,
                ErrorKind::NotACheckpoint { reason: format!("more than {PARTITIONS_MAX} partitions") },
            ));
        }
        if !meta.is_file() {
            return Err(Error::new(
                &path,
                ErrorKind::NotACheckpoint { reason: "partition is not a regular file".to_owned() },
            ));
        }
        files.push(FileEntry { path, stamp: FileStamp::from_metadata(&meta), data_start_bytes: 0 });
    }
    if files.is_empty() {
        return Err(Error::new(partition_path(dir, 0), ErrorKind::NoPartitions));
    }
    Ok(files)
}

/// Find the partition holding `offset .. offset + size` of the concatenation, and the offset
/// within it. `starts[p]` is the global offset of partition `p`.
fn locate_global(starts: &[u64], lens: &[u64], offset: u64, size: u64) -> Option<(usize, u64)> {
    let after = starts.partition_point(|&s| s <= offset);
    let p = after.checked_sub(1)?;
    let local = offset - starts[p];
    (local.checked_add(size)? <= lens[p]).then_some((p, local))
}

/// The lowest offset of a non-empty tensor in each partition (`None` for a partition without one).
fn first_record_offsets(tensors: &[TensorInfo], partitions: usize) -> Vec<Option<u64>> {
    let mut first: Vec<Option<u64>> = vec![None; partitions];
    for t in tensors.iter().filter(|t| t.len_bytes > 0) {
        let slot = &mut first[t.file.index()];
        *slot = Some(slot.map_or(t.offset_bytes, |o| o.min(t.offset_bytes)));
    }
    first
}

/// A partition shorter than the index needs (see [`partition_shortfalls`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionShortfall {
    pub path: PathBuf,
    /// The end of the last tensor the index places in this partition.
    pub expected_len_bytes: u64,
    /// The partition's size now.
    pub actual_len_bytes: u64,
}

/// The partitions of `dir` that are shorter than its `tensor_index.json` needs: what a
/// `tensora verify` reports as truncation after [`open_dir`] failed with
/// [`ErrorKind::OutsidePartition`].
///
/// Each tensor is placed as [`open_dir`] places it: by its partition number (legacy layout), or
/// in the partition where its global offset starts given the current file sizes (upstream). A
/// truncated last partition is thus named exactly; a shortened middle one shifts the global
/// offsets of the partitions after it, so the shortfall may show on a later partition too.
///
/// ```
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let short = tensora_format::sllm::partition_shortfalls(std::path::Path::new(dir)).unwrap();
/// assert!(short.is_empty());
/// ```
pub fn partition_shortfalls(dir: &Path) -> crate::Result<Vec<PartitionShortfall>> {
    let index_path = dir.join(INDEX_FILE_NAME);
    let bytes = read_capped(&index_path, INDEX_LEN_BYTES_MAX).map_err(|k| Error::new(&index_path, k))?;
    let index = parse_index_inner(&bytes).map_err(|e| Error::new(&index_path, e.kind))?;
    drop(bytes);
    let files = probe_partitions(dir)?;
    let lens: Vec<u64> = files.iter().map(|f| f.stamp.len_bytes).collect();
    let mut starts = Vec::with_capacity(lens.len());
    let mut total_bytes = 0u64;
    for &len in &lens {
        starts.push(total_bytes);
        total_bytes = total_bytes.saturating_add(len);
    }
    let mut needed: Vec<u64> = vec![0; lens.len()];
    for e in &index.entries {
        let (p, local_end) = match e.partition {
            None => {
                let p = starts.partition_point(|&s| s <= e.offset_bytes).saturating_sub(1);
                (p, e.end_bytes() - starts[p])
            }
            Some(p) => (p as usize, e.end_bytes()),
        };
        if let Some(slot) = needed.get_mut(p) {
            *slot = (*slot).max(local_end);
        }
    }
    Ok(files
        .into_iter()
        .zip(needed)
        .filter(|(f, need)| *need > f.stamp.len_bytes)
        .map(|(f, need)| PartitionShortfall {
            expected_len_bytes: need,
            actual_len_bytes: f.stamp.len_bytes,
            path: f.path,
        })
        .collect())
}

/// Open a ServerlessLLM directory: read and validate `tensor_index.json` (at most
/// [`INDEX_LEN_BYTES_MAX`]), probe the partitions, and map every tensor to its partition and
/// local offset. Tied weights (several names on the same storage) become several tensors with the
/// same file and range.
///
/// ```
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir)).unwrap();
/// assert_eq!(ckpt.format(), tensora_format::Format::ServerlessLlm);
/// let embed = ckpt.tensor("embed.weight").unwrap();
/// let head = ckpt.tensor("lm_head.weight").unwrap();
/// assert_eq!((embed.file(), embed.range()), (head.file(), head.range()));
/// ```
pub fn open_dir(dir: &Path) -> crate::Result<Checkpoint> {
    let index_path = dir.join(INDEX_FILE_NAME);
    let bytes = read_capped(&index_path, INDEX_LEN_BYTES_MAX).map_err(|k| Error::new(&index_path, k))?;
    let index = parse_index_inner(&bytes).map_err(|e| {
        let err = Error::new(&index_path, e.kind);
        match e.tensor {
            Some(t) => err.with_tensor(t),
            None => err,
        }
    })?;
    drop(bytes);
    let files = probe_partitions(dir)?;
    assemble(dir, index_path, index, files)
}

/// The checks of [`open_dir`] after the partitions were found: every tensor mapped to its
/// partition and local offset (and refused when it lies outside one), the warnings added.
pub(crate) fn assemble(
    dir: &Path,
    index_path: PathBuf,
    index: SllmIndex,
    files: Vec<FileEntry>,
) -> crate::Result<Checkpoint> {
    let lens: Vec<u64> = files.iter().map(|f| f.stamp.len_bytes).collect();
    let mut starts = Vec::with_capacity(lens.len());
    let mut total_bytes = 0u64;
    for &len in &lens {
        starts.push(total_bytes);
        total_bytes = total_bytes.checked_add(len).ok_or_else(|| {
            Error::new(dir, ErrorKind::NotACheckpoint { reason: "partition sizes overflow u64".to_owned() })
        })?;
    }

    let mut tensors = Vec::with_capacity(index.entries.len());
    for e in index.entries {
        let located = match e.partition {
            None => locate_global(&starts, &lens, e.offset_bytes, e.size_bytes),
            Some(p) => {
                let p = p as usize;
                (p < lens.len() && e.end_bytes() <= lens[p]).then_some((p, e.offset_bytes))
            }
        };
        let Some((p, local)) = located else {
            // Name the partition the tensor starts in (most often a truncated one); the range is
            // the index's own (global for the upstream layout, local for the legacy one).
            let p = match e.partition {
                None => starts.partition_point(|&s| s <= e.offset_bytes).saturating_sub(1) as u32,
                Some(p) => p,
            };
            return Err(Error::new(
                partition_path(dir, p),
                ErrorKind::OutsidePartition { offset: e.offset_bytes, end: e.end_bytes() },
            )
            .with_tensor(e.name));
        };
        tensors.push(TensorInfo {
            name: e.name,
            dtype: e.dtype,
            shape: e.shape,
            file: FileId(p as u32),
            offset_bytes: local,
            len_bytes: e.size_bytes,
            strides: Some(e.strides),
        });
    }
    tensors.sort_by_key(|t| (t.file, t.offset_bytes));

    let mut warnings = Vec::new();
    if index.layout == IndexLayout::Upstream {
        // A writer fills each partition from its first byte. A partition whose first stored record
        // starts later suggests offsets that do not follow the file sizes (e.g. partitions rounded
        // up by an O_DIRECT writer), so the mapping deserves a look.
        for (p, first) in first_record_offsets(&tensors, files.len()).into_iter().enumerate() {
            if let Some(first) = first.filter(|&o| o != 0) {
                warnings.push(Warning {
                    path: files[p].path.clone(),
                    message: format!(
                        "first tensor of this partition starts at byte {first}, not 0: global offsets may not \
                         follow the partition file sizes"
                    ),
                });
            }
        }
    }
    if index.layout == IndexLayout::Legacy {
        warnings.push(Warning {
            path: index_path,
            message: "older Tensora 6-field tensor_index.json layout; convert to upgrade".to_owned(),
        });
    }
    Ok(Checkpoint::from_parts(
        Format::ServerlessLlm,
        dir.to_path_buf(),
        files,
        tensors,
        BTreeMap::new(),
        warnings,
    ))
}

#[cfg(test)]
mod tests;
