//! Element types, in the safetensors spelling.

use std::fmt;

/// An element type. The spelling of [`Dtype::as_str`] is the safetensors one, and matching in
/// [`Dtype::from_safetensors`] is exact and case-sensitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// `BOOL`: one byte per element; bytes are never reinterpreted as Rust `bool`.
    Bool,
    /// `U8`
    U8,
    /// `I8`
    I8,
    /// `U16`
    U16,
    /// `I16`
    I16,
    /// `F16`: IEEE half precision.
    F16,
    /// `BF16`: bfloat16.
    BF16,
    /// `U32`
    U32,
    /// `I32`
    I32,
    /// `F32`
    F32,
    /// `U64`
    U64,
    /// `I64`
    I64,
    /// `F64`
    F64,
    /// `C64`: complex of two F32.
    C64,
    /// `F8_E5M2`
    F8E5M2,
    /// `F8_E4M3`
    F8E4M3,
    /// `F8_E8M0`
    F8E8M0,
    /// `F8_E4M3FNUZ`
    F8E4M3Fnuz,
    /// `F8_E5M2FNUZ`
    F8E5M2Fnuz,
    /// `F4`: 4 bits per element.
    F4,
    /// `F6_E2M3`: 6 bits per element.
    F6E2M3,
    /// `F6_E3M2`: 6 bits per element.
    F6E3M2,
}

impl Dtype {
    /// Every dtype, in declaration order.
    pub const ALL: [Dtype; 22] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::U16,
        Dtype::I16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::U32,
        Dtype::I32,
        Dtype::F32,
        Dtype::U64,
        Dtype::I64,
        Dtype::F64,
        Dtype::C64,
        Dtype::F8E5M2,
        Dtype::F8E4M3,
        Dtype::F8E8M0,
        Dtype::F8E4M3Fnuz,
        Dtype::F8E5M2Fnuz,
        Dtype::F4,
        Dtype::F6E2M3,
        Dtype::F6E3M2,
    ];

    /// Bits per element. F4 is 4 and the F6 types are 6; everything else is a whole number of bytes.
    pub const fn bits(self) -> u32 {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 8,
            Dtype::F8E5M2 | Dtype::F8E4M3 | Dtype::F8E8M0 => 8,
            Dtype::F8E4M3Fnuz | Dtype::F8E5M2Fnuz => 8,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 16,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 32,
            Dtype::U64 | Dtype::I64 | Dtype::F64 | Dtype::C64 => 64,
            Dtype::F4 => 4,
            Dtype::F6E2M3 | Dtype::F6E3M2 => 6,
        }
    }

    /// Bytes per element, or `None` for the sub-byte types (F4, F6_*).
    pub const fn size_bytes(self) -> Option<u64> {
        let bits = self.bits();
        if bits.is_multiple_of(8) { Some((bits / 8) as u64) } else { None }
    }

    /// The natural alignment of one element in bytes (1 for sub-byte types).
    pub const fn align_bytes(self) -> u64 {
        match self.size_bytes() {
            Some(n) => n,
            None => 1,
        }
    }

    /// The safetensors spelling, e.g. `"BF16"`, `"F8_E4M3"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::F32 => "F32",
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::F64 => "F64",
            Dtype::C64 => "C64",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::F8E4M3Fnuz => "F8_E4M3FNUZ",
            Dtype::F8E5M2Fnuz => "F8_E5M2FNUZ",
            Dtype::F4 => "F4",
            Dtype::F6E2M3 => "F6_E2M3",
            Dtype::F6E3M2 => "F6_E3M2",
        }
    }

    /// Parse the safetensors spelling. Exact and case-sensitive: `"f16"` is `None`.
    pub fn from_safetensors(s: &str) -> Option<Dtype> {
        Some(match s {
            "BOOL" => Dtype::Bool,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "U16" => Dtype::U16,
            "I16" => Dtype::I16,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "U32" => Dtype::U32,
            "I32" => Dtype::I32,
            "F32" => Dtype::F32,
            "U64" => Dtype::U64,
            "I64" => Dtype::I64,
            "F64" => Dtype::F64,
            "C64" => Dtype::C64,
            "F8_E5M2" => Dtype::F8E5M2,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E8M0" => Dtype::F8E8M0,
            "F8_E4M3FNUZ" => Dtype::F8E4M3Fnuz,
            "F8_E5M2FNUZ" => Dtype::F8E5M2Fnuz,
            "F4" => Dtype::F4,
            "F6_E2M3" => Dtype::F6E2M3,
            "F6_E3M2" => Dtype::F6E3M2,
            _ => return None,
        })
    }

    /// Number of bytes that `numel` elements occupy, or `None` on overflow or when the total bit
    /// count is not a multiple of 8.
    pub fn bytes_for(self, numel: u64) -> Option<u64> {
        let bits = numel.checked_mul(u64::from(self.bits()))?;
        if !bits.is_multiple_of(8) {
            return None;
        }
        Some(bits / 8)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spelling_round_trips_for_every_dtype() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_safetensors(d.as_str()), Some(d));
        }
    }

    #[test]
    fn matching_is_case_sensitive_and_exact() {
        assert_eq!(Dtype::from_safetensors("f16"), None);
        assert_eq!(Dtype::from_safetensors("F16 "), None);
        assert_eq!(Dtype::from_safetensors("F8_E4M3FN"), None);
        assert_eq!(Dtype::from_safetensors(""), None);
    }

    #[test]
    fn sub_byte_sizes() {
        assert_eq!(Dtype::F4.bytes_for(2), Some(1));
        assert_eq!(Dtype::F4.bytes_for(3), None);
        assert_eq!(Dtype::F6E2M3.bytes_for(4), Some(3));
        assert_eq!(Dtype::F6E3M2.bytes_for(5), None);
        assert_eq!(Dtype::F32.bytes_for(u64::MAX), None);
        assert_eq!(Dtype::F32.size_bytes(), Some(4));
        assert_eq!(Dtype::F4.size_bytes(), None);
    }
}
