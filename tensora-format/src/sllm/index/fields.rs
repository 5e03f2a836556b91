//! The serde side of `tensor_index.json`: each entry read straight into typed, bounded fields.
//! Names and dimensions go into the index's shared buffers; nothing is allocated per entry, and
//! every value that is not wanted is skipped unbuilt.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::super::{RANK_MAX, dtype_from_short, dtype_from_torch};
use crate::{Dtype, ErrorKind};

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
pub(super) enum Num {
    U64(u64),
    Negative,
    /// A fraction, or an integer beyond u64 (serde_json reads those as floats).
    NotU64Integer,
    /// Not a number at all.
    NotNumber,
}

impl Num {
    /// `Ok(None)` when the value is not a number at all.
    pub fn get(self) -> Result<Option<u64>, &'static str> {
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

/// The dtype field, already looked up in both spellings (which one applies depends on the
/// entry's length, known only at its end). Its text is kept only when neither knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DtypeField {
    Str { torch: Option<Dtype>, short: Option<Dtype>, unknown: Option<String> },
    NotString,
}

impl DtypeField {
    /// The dtype in the spelling of the entry's layout, or the name as written when unknown.
    pub fn resolve(self, legacy: bool) -> Result<Dtype, ErrorKind> {
        let DtypeField::Str { torch, short, unknown } = self else {
            return Err(ErrorKind::BadSllmEntry { message: "dtype must be a string".to_owned() });
        };
        let (found, other) = if legacy { (short, torch) } else { (torch, short) };
        found.ok_or_else(|| {
            // The name in the other spelling, rebuilt (both spellings map one to one).
            let dtype = match (other, unknown) {
                (_, Some(text)) => text,
                (Some(d), None) if legacy => super::super::dtype_to_torch(d).unwrap_or_default().to_owned(),
                (Some(d), None) => d.as_str().to_ascii_lowercase(),
                (None, None) => String::new(),
            };
            ErrorKind::UnknownTorchDtype { dtype }
        })
    }
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
                let (torch, short) = (dtype_from_torch(v), dtype_from_short(v));
                let unknown = (torch.is_none() && short.is_none()).then(|| v.to_owned());
                Ok(DtypeField::Str { torch, short, unknown })
            }
            other_json_values!(DtypeField::NotString; bool, number, null, seq, map);
        }
        d.deserialize_any(DtypeVisitor)
    }
}

/// Appends a key to the shared name buffer; its value is where it starts there.
pub(super) struct NameSeed<'b> {
    pub names: &'b mut String,
}

impl<'de> DeserializeSeed<'de> for NameSeed<'_> {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed<'_> {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tensor name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<usize, E> {
        let start = self.names.len();
        self.names.push_str(v);
        Ok(start)
    }
}

/// A shape or stride field as read: its dimensions appended to the shared buffer.
#[derive(Debug)]
pub(super) enum Dims {
    /// `(first index in the buffer, rank)`.
    Valid(usize, usize),
    Invalid(ErrorKind),
    /// Not an array at all.
    NotArray,
}

/// Reads a shape or stride array into the shared buffer, keeping at most [`RANK_MAX`]
/// dimensions: a longer array is counted to its end without storing anything, so an index of
/// any size costs O(1) memory per entry. The outcome is the same as validating a built array.
struct DimsSeed<'b> {
    field: &'static str,
    dims: &'b mut Vec<u64>,
}

impl<'de> DeserializeSeed<'de> for DimsSeed<'_> {
    type Value = Dims;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DimsSeed<'_> {
    type Value = Dims;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let field = self.field;
        let start = self.dims.len();
        let mut first_error: Option<ErrorKind> = None;
        let mut rank = 0usize;
        while let Some(n) = seq.next_element::<Num>()? {
            if rank < RANK_MAX && first_error.is_none() {
                match n.get() {
                    Ok(Some(d)) => self.dims.push(d),
                    Ok(None) => {
                        first_error = Some(ErrorKind::BadSllmEntry {
                            message: format!("{field}[{rank}] must be an integer"),
                        })
                    }
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
            Dims::Valid(start, rank)
        })
    }
    other_json_values!(Dims::NotArray; bool, number, str, null, map);
}

/// One entry as read, each field already reduced to what validation needs; the array's length is
/// counted (elements past the sixth are skipped unread).
#[derive(Debug, Default)]
pub(super) struct RawEntry {
    /// Number of array elements; `None` when the value is not an array.
    pub elements: Option<usize>,
    pub offset: Option<Num>,
    pub size: Option<Num>,
    pub shape: Option<Dims>,
    pub stride: Option<Dims>,
    pub dtype: Option<DtypeField>,
    pub partition: Option<Num>,
}

/// Reads one entry, its dimensions into the shared buffer.
pub(super) struct EntrySeed<'b> {
    pub dims: &'b mut Vec<u64>,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = RawEntry;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<RawEntry, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_> {
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
                    .next_element_seed(DimsSeed { field: "shape", dims: &mut *self.dims })?
                    .map(|v| raw.shape = Some(v))
                    .is_some(),
                3 => seq
                    .next_element_seed(DimsSeed { field: "stride", dims: &mut *self.dims })?
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
