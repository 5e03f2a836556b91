use proptest::prelude::*;

use super::scalar::*;
use super::*;

fn le16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn le32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn un16(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}
fn un32(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// `src` converted at `simd`, starting `skew` bytes into a buffer (so unaligned and with tails).
fn run(simd: Simd, from: Dtype, to: Dtype, src: &[u8], skew: usize) -> Vec<u8> {
    let n = src.len() / from.size_bytes().unwrap() as usize;
    let mut s = vec![0u8; skew];
    s.extend_from_slice(src);
    let mut d = vec![0u8; skew + n * to.size_bytes().unwrap() as usize];
    convert_with(simd, from, to, &s[skew..], &mut d[skew..]).unwrap();
    d.split_off(skew)
}

fn is_nan32(x: u32) -> bool {
    x & 0x7FFF_FFFF > 0x7F80_0000
}

/// Every 16-bit input, at every level: equal to the scalar functions; the scalar ones equal the
/// `half` crate's exact widening on everything but NaN, and NaNs follow torch's rules.
#[test]
fn every_16_bit_input_widens_exactly_at_every_level() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let src = le16(&all);
    for (from, f) in [(Dtype::BF16, bf16_to_f32 as fn(u16) -> u32), (Dtype::F16, f16_to_f32)] {
        let want: Vec<u32> = all.iter().map(|&h| f(h)).collect();
        for simd in Simd::available() {
            for skew in [0, 1, 3] {
                assert_eq!(
                    un32(&run(simd, from, Dtype::F32, &src, skew)),
                    want,
                    "{from} {simd:?} skew {skew}"
                );
            }
        }
        for (&h, &w) in all.iter().zip(&want) {
            let reference = match from {
                Dtype::BF16 => half::bf16::from_bits(h).to_f32().to_bits(),
                _ => half::f16::from_bits(h).to_f32().to_bits(),
            };
            if is_nan32(reference) {
                assert!(is_nan32(w), "{from} {h:#06x}");
            } else {
                assert_eq!(w, reference, "{from} {h:#06x}");
            }
        }
    }
    // NaN payloads: BF16 kept bit for bit; F16 kept with the quiet bit set (torch's vcvtph2ps).
    assert_eq!(bf16_to_f32(0xFF81), 0xFF81_0000);
    assert_eq!(f16_to_f32(0x7C01), 0x7FC0_2000);
    assert_eq!(f16_to_f32(0xFC01), 0xFFC0_2000);
    assert_eq!(f16_to_f32(0x7D55), 0x7FEA_A000);
    assert_eq!(f16_to_f32(0x0001), 0x3380_0000);
    assert_eq!(f16_to_f32(0x83FF), 0xB87F_C000);
}

/// What torch 2.15 wrote for these F32 patterns (`x.to(torch.bfloat16)` / `torch.float16`, on
/// tensors of 1 and 64 elements alike).
#[test]
fn f32_narrowing_matches_values_observed_from_torch() {
    let cases: [(u32, u16, u16); 19] = [
        (0x7FC0_0000, 0xFFFF, 0x7E00),
        (0x7F80_0001, 0xFFFF, 0x7E00),
        (0xFFC0_0001, 0xFFFF, 0xFE00),
        (0x7FBF_FFFF, 0xFFFF, 0x7FFF),
        (0x7FFF_FFFF, 0xFFFF, 0x7FFF),
        (0xFF80_0001, 0xFFFF, 0xFE00),
        (0x7F80_0000, 0x7F80, 0x7C00),
        (0xFF80_0000, 0xFF80, 0xFC00),
        (0x8000_0000, 0x8000, 0x8000),
        (0x0000_0001, 0x0000, 0x0000),
        (0x0040_0000, 0x0040, 0x0000),
        (0x387F_E000, 0x3880, 0x0400),
        (0x3300_0000, 0x3300, 0x0000),
        (0x3300_0001, 0x3300, 0x0001),
        (0x477F_F000, 0x4780, 0x7C00),
        (0x477F_EFFF, 0x4780, 0x7BFF),
        (0x7F7F_FFFF, 0x7F80, 0x7C00),
        (0x3F80_8000, 0x3F80, 0x3C04),
        (0x3F81_8000, 0x3F82, 0x3C0C),
    ];
    for simd in Simd::available() {
        for n in [1, 17, 64] {
            for &(x, bf, h) in &cases {
                let src = le32(&vec![x; n]);
                assert_eq!(
                    un16(&run(simd, Dtype::F32, Dtype::BF16, &src, 0)),
                    vec![bf; n],
                    "{x:#x} {simd:?}"
                );
                assert_eq!(un16(&run(simd, Dtype::F32, Dtype::F16, &src, 0)), vec![h; n], "{x:#x} {simd:?}");
            }
        }
    }
}

/// Every byte of both FP8 types: exact against the value computed in f64, NaNs as torch writes
/// them, and to BF16/F16 the same as through F32.
#[test]
fn every_fp8_input_converts_as_torch() {
    for b in 0..=u8::MAX {
        let sign = if b & 0x80 != 0 { -1.0f64 } else { 1.0 };
        let (e, m) = (i32::from((b >> 3) & 0xF), f64::from(b & 7));
        let want =
            if e == 0 { sign * m / 8.0 * 2f64.powi(-6) } else { sign * (1.0 + m / 8.0) * 2f64.powi(e - 7) };
        match b & 0x7F {
            0x7F => assert_eq!(e4m3fn_to_f32(b), u32::from(b & 0x80) << 24 | 0x7FF0_0000),
            _ => assert_eq!(f32::from_bits(e4m3fn_to_f32(b)) as f64, want, "e4m3 {b:#04x}"),
        }
        let h = half::f16::from_bits(u16::from(b) << 8).to_f32();
        if h.is_nan() {
            assert!(is_nan32(e5m2_to_f32(b)));
        } else {
            assert_eq!(e5m2_to_f32(b), h.to_bits(), "e5m2 {b:#04x}");
        }
    }
    // Observed from torch: E4M3 NaN to BF16 is 0x7FC0 (sign lost), to F16 quiet with sign.
    let all: Vec<u8> = (0..=u8::MAX).collect();
    for (from, table) in [(Dtype::F8E4M3, &E4M3FN_TO_F32), (Dtype::F8E5M2, &E5M2_TO_F32)] {
        for simd in Simd::available() {
            assert_eq!(un32(&run(simd, from, Dtype::F32, &all, 1)), table.to_vec());
            let bf: Vec<u16> = table.iter().map(|&x| f32_to_bf16(x, BF16_NAN_FROM_NARROW)).collect();
            assert_eq!(un16(&run(simd, from, Dtype::BF16, &all, 1)), bf);
            let h: Vec<u16> = table.iter().map(|&x| f32_to_f16(x)).collect();
            assert_eq!(un16(&run(simd, from, Dtype::F16, &all, 1)), h);
        }
    }
    assert_eq!(f32_to_bf16(e4m3fn_to_f32(0xFF), BF16_NAN_FROM_NARROW), 0x7FC0);
    assert_eq!(f32_to_f16(e4m3fn_to_f32(0xFF)), 0xFF80);
    assert_eq!(e4m3fn_to_f32(0x7E), 0x43E0_0000);
    assert_eq!(e5m2_to_f32(0x7D), 0x7FE0_0000);
}

/// BF16 ↔ F16 for every 16-bit input: through F32 (torch's path), equal at every level.
#[test]
fn every_16_bit_input_crosses_between_bf16_and_f16_through_f32() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let src = le16(&all);
    let to_f16: Vec<u16> = all.iter().map(|&h| f32_to_f16(bf16_to_f32(h))).collect();
    let to_bf16: Vec<u16> = all.iter().map(|&h| f32_to_bf16(f16_to_f32(h), BF16_NAN_FROM_NARROW)).collect();
    for simd in Simd::available() {
        assert_eq!(un16(&run(simd, Dtype::BF16, Dtype::F16, &src, 1)), to_f16, "{simd:?}");
        assert_eq!(un16(&run(simd, Dtype::F16, Dtype::BF16, &src, 2)), to_bf16, "{simd:?}");
    }
    assert_eq!(to_bf16[0x7C01], 0x7FC0);
    assert_eq!(to_f16[0x7F81], 0x7E08);
}

/// An F32 pattern from one of the classes where rounding can go wrong.
fn f32_pattern() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        // Ties and near-ties for BF16 (16 dropped bits) and F16 (13).
        (any::<u32>(), prop_oneof![Just(0x8000u32), Just(0x7FFF), Just(0x8001), Just(0x1000), Just(0x0FFF)])
            .prop_map(|(x, low)| (x & !0xFFFF) | low),
        // F16's subnormal and overflow edges, NaN payloads, zeros and infinities.
        (0x3280_0000u32..0x3900_0000, any::<bool>()).prop_map(|(x, s)| x | (u32::from(s) << 31)),
        (0x4770_0000u32..0x4790_0000, any::<bool>()).prop_map(|(x, s)| x | (u32::from(s) << 31)),
        (1u32..0x80_0000, any::<bool>()).prop_map(|(p, s)| 0x7F80_0000 | p | (u32::from(s) << 31)),
        prop_oneof![Just(0u32), Just(0x8000_0000), Just(0x7F80_0000), Just(0xFF80_0000)],
        // F32 subnormals.
        (1u32..0x80_0000, any::<bool>()).prop_map(|(p, s)| p | (u32::from(s) << 31)),
    ]
}

proptest! {
    /// F32 → BF16 / F16 at every level equals the scalar functions, which equal the `half`
    /// crate's round-to-nearest-even on everything but NaN (where torch's rules hold).
    #[test]
    fn f32_narrowing_is_the_same_at_every_level_and_rounds_to_nearest_even(
        xs in proptest::collection::vec(f32_pattern(), 0..80),
        skew in 0usize..4,
    ) {
        let src = le32(&xs);
        let bf: Vec<u16> = xs.iter().map(|&x| f32_to_bf16(x, BF16_NAN_FROM_F32)).collect();
        let h: Vec<u16> = xs.iter().map(|&x| f32_to_f16(x)).collect();
        for simd in Simd::available() {
            prop_assert_eq!(&un16(&run(simd, Dtype::F32, Dtype::BF16, &src, skew)), &bf, "{:?}", simd);
            prop_assert_eq!(&un16(&run(simd, Dtype::F32, Dtype::F16, &src, skew)), &h, "{:?}", simd);
        }
        for ((&x, &b), &hh) in xs.iter().zip(&bf).zip(&h) {
            let f = f32::from_bits(x);
            if f.is_nan() {
                prop_assert_eq!(b, 0xFFFF);
                prop_assert_eq!(hh, ((x >> 16) & 0x8000) as u16 | 0x7E00 | ((x >> 13) & 0x3FF) as u16);
            } else {
                prop_assert_eq!(b, half::bf16::from_f32(f).to_bits(), "{:#x}", x);
                prop_assert_eq!(hh, half::f16::from_f32(f).to_bits(), "{:#x}", x);
            }
        }
    }
}

/// A sweep over the whole F32 range (every 65521st pattern) against `half`'s rounding.
#[test]
fn an_f32_sweep_rounds_as_the_reference() {
    let xs: Vec<u32> = (0..=u32::MAX).step_by(65_521).collect();
    let src = le32(&xs);
    let bf = un16(&run(Simd::detected(), Dtype::F32, Dtype::BF16, &src, 0));
    let h = un16(&run(Simd::detected(), Dtype::F32, Dtype::F16, &src, 0));
    for ((&x, &b), &hh) in xs.iter().zip(&bf).zip(&h) {
        let f = f32::from_bits(x);
        if !f.is_nan() {
            assert_eq!(b, half::bf16::from_f32(f).to_bits(), "{x:#x}");
            assert_eq!(hh, half::f16::from_f32(f).to_bits(), "{x:#x}");
        }
    }
}

#[test]
fn unsupported_casts_and_mismatched_lengths_are_typed_errors() {
    let mut d = [0u8; 8];
    assert_eq!(
        convert(Dtype::F64, Dtype::F32, &[0; 8], &mut d[..4]),
        Err(CastError::Unsupported { from: Dtype::F64, to: Dtype::F32 })
    );
    assert!(matches!(convert(Dtype::F32, Dtype::BF16, &[0; 6], &mut d[..2]), Err(CastError::Length { .. })));
    assert!(matches!(convert(Dtype::F32, Dtype::BF16, &[0; 8], &mut d[..2]), Err(CastError::Length { .. })));
    assert!(matches!(
        convert(Dtype::F4, Dtype::BF16, &[0; 1], &mut d[..4]),
        Err(CastError::Unsupported { .. })
    ));
    assert_eq!(DtypeTarget::BF16.cast_of(Dtype::F32), Ok(Some(Dtype::BF16)));
    assert_eq!(DtypeTarget::BF16.cast_of(Dtype::BF16), Ok(None));
    assert_eq!(DtypeTarget::BF16.cast_of(Dtype::I64), Ok(None));
    assert_eq!(DtypeTarget::Stored.cast_of(Dtype::F64), Ok(None));
    assert_eq!(DtypeTarget::F32.cast_of(Dtype::F8E4M3), Ok(Some(Dtype::F32)));
    assert_eq!(
        DtypeTarget::F16.cast_of(Dtype::F8E4M3Fnuz),
        Err(CastError::Unsupported { from: Dtype::F8E4M3Fnuz, to: Dtype::F16 })
    );
}

/// Outputs of at least `STREAMING_STORES_MIN_BYTES` go through the streaming-store kernel (from
/// the first 32-byte aligned element, the head and tail one at a time): every level, every skew
/// of the destination, equal to the scalar rounding on ties, NaNs, infinities and subnormals.
#[test]
fn long_f32_to_bf16_outputs_written_around_the_cache_round_as_the_scalar_function() {
    let n = STREAMING_STORES_MIN_BYTES / 2 + 1001;
    let specials =
        [0x3F80_8000u32, 0x3F81_8000, 0x7F7F_FFFF, 0x0000_0001, 0x8000_8000, 0x7FC0_0000, 0xFF80_0001];
    let xs: Vec<u32> = (0..n as u32)
        .map(|i| {
            if i % 5 == 0 {
                specials[(i / 5) as usize % specials.len()]
            } else {
                i.wrapping_mul(2_654_435_761)
            }
        })
        .collect();
    let want: Vec<u16> = xs.iter().map(|&x| f32_to_bf16(x, BF16_NAN_FROM_F32)).collect();
    let src = le32(&xs);
    for simd in Simd::available() {
        for skew in 0..6 {
            assert!(un16(&run(simd, Dtype::F32, Dtype::BF16, &src, skew)) == want, "{simd:?} skew {skew}");
        }
    }
}
