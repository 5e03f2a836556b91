//! The scalar conversions, one element at a time, bit-exact with torch 2.15's CPU `.to()` (what
//! its vectorised loop produces; see the [module docs](super) for the NaN rules). They are the
//! reference the SIMD kernels are tested against and the kernels' tails.

/// The BF16 NaN torch writes for any F32 NaN (its vectorised F32 → BF16: sign and payload lost).
pub const BF16_NAN_FROM_F32: u16 = 0xFFFF;
/// The BF16 NaN torch writes for a NaN reaching BF16 from F16 or FP8 (c10's scalar rounding).
pub const BF16_NAN_FROM_NARROW: u16 = 0x7FC0;

/// BF16 → F32: exact (the high half of the F32), NaN payloads kept.
#[inline]
pub const fn bf16_to_f32(h: u16) -> u32 {
    (h as u32) << 16
}

/// F16 → F32: exact; a NaN keeps sign and payload and is made quiet (as `vcvtph2ps`).
#[inline]
pub const fn f16_to_f32(h: u16) -> u32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let mant = (h & 0x3FF) as u32;
    match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: m × 2^-24. Normalise on the highest set bit `p` (0..=9).
            let p = 31 - m.leading_zeros();
            sign | ((p + 103) << 23) | ((m << (23 - p)) & 0x7F_FFFF)
        }
        (0x1F, 0) => sign | 0x7F80_0000,
        (0x1F, m) => sign | 0x7FC0_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    }
}

/// F32 → BF16, rounding to nearest even; any NaN becomes `nan` (torch writes
/// [`BF16_NAN_FROM_F32`] or [`BF16_NAN_FROM_NARROW`] depending on the source dtype).
#[inline]
pub const fn f32_to_bf16(x: u32, nan: u16) -> u16 {
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        return nan;
    }
    let bias = ((x >> 16) & 1) + 0x7FFF;
    // Cannot overflow: the largest non-NaN pattern is 0xFF80_0000 and the bias is below 2^16.
    ((x + bias) >> 16) as u16
}

/// F32 → F16, rounding to nearest even (overflow to ±Inf, underflow through the subnormals to
/// ±0); a NaN keeps its sign and the top 9 payload bits and is made quiet (as `vcvtps2ph`).
#[inline]
pub const fn f32_to_f16(x: u32) -> u16 {
    let sign = ((x >> 16) & 0x8000) as u16;
    let abs = x & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        return sign | 0x7E00 | ((abs >> 13) & 0x3FF) as u16;
    }
    if abs >= 0x477F_F000 {
        // 65520 and above (Inf included) round to Inf.
        return sign | 0x7C00;
    }
    if abs >= 0x3880_0000 {
        // Normal in F16 (2^-14 and above): rebias the exponent by 127 - 15 and round off 13 bits.
        let v = abs - (112 << 23);
        return sign | ((v + 0xFFF + ((v >> 13) & 1)) >> 13) as u16;
    }
    if abs <= 0x3300_0000 {
        // At most 2^-25, half the smallest subnormal: a tie or below rounds to zero.
        return sign;
    }
    // Subnormal in F16: k × 2^-24 with k = m × 2^(e - 126), rounded to nearest even.
    let e = abs >> 23;
    let m = (abs & 0x7F_FFFF) | 0x80_0000;
    let shift = 126 - e; // 14..=24 here
    let k = m >> shift;
    let rem = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = (rem > half || (rem == half && k & 1 == 1)) as u32;
    sign | (k + up) as u16
}

/// FP8 E4M3FN (safetensors `F8_E4M3`: no infinities, NaN is `S.1111.111`) → F32, exact; a NaN
/// becomes `sign | 0x7FF0_0000` as torch's `fp8e4m3fn_to_fp32_value`.
#[inline]
pub const fn e4m3fn_to_f32(b: u8) -> u32 {
    let sign = ((b & 0x80) as u32) << 24;
    let exp = ((b >> 3) & 0xF) as u32;
    let mant = (b & 0x7) as u32;
    match (exp, mant) {
        (0xF, 0x7) => sign | 0x7FF0_0000,
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: m × 2^-9.
            let p = 31 - m.leading_zeros();
            sign | ((p + 118) << 23) | ((m << (23 - p)) & 0x7F_FFFF)
        }
        (e, m) => sign | ((e + 120) << 23) | (m << 20),
    }
}

/// FP8 E5M2 (the high byte of an F16) → F32, exact, as [`f16_to_f32`].
#[inline]
pub const fn e5m2_to_f32(b: u8) -> u32 {
    f16_to_f32((b as u16) << 8)
}

/// FP8 E4M3FN → F32 bits, every byte.
pub static E4M3FN_TO_F32: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3fn_to_f32(i as u8);
        i += 1;
    }
    t
};

/// FP8 E5M2 → F32 bits, every byte.
pub static E5M2_TO_F32: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e5m2_to_f32(i as u8);
        i += 1;
    }
    t
};
