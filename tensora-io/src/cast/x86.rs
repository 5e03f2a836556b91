//! The x86-64 kernels: AVX-512F (16 lanes) and AVX2 with F16C (8 lanes). Each converts the whole
//! vectors of `n` elements and returns how many it did; the caller converts the tail with the
//! scalar functions. F32 → BF16 is integer arithmetic (the scalar rounding, lane-wise), not
//! AVX-512 BF16's `vcvtneps2bf16`, which flushes subnormal inputs and outputs to zero where torch
//! keeps them; F16 ↔ F32 is F16C's `vcvtph2ps` / `vcvtps2ph` (round to nearest even, exceptions
//! suppressed), which is what torch uses.
//!
//! Every function here is `unsafe`: the caller checks the CPU features named in its
//! `#[target_feature]` and that `src` holds `n` source elements and `dst` room for `n` results.

use std::arch::x86_64::*;

/// BF16 → F32, 16 lanes.
///
/// # Safety
/// AVX-512F is available; `src` has `2n` readable bytes and `dst` `4n` writable ones.
#[target_feature(enable = "avx512f")]
pub unsafe fn bf16_to_f32_avx512(src: *const u8, dst: *mut u8, n: usize) -> usize {
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`, so the 32 bytes read and 64 written lie inside the buffers.
        unsafe {
            let v = _mm256_loadu_si256(src.add(2 * i).cast());
            let w = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v));
            _mm512_storeu_si512(dst.add(4 * i).cast(), w);
        }
        i += 16;
    }
    i
}

/// F16 → F32, 16 lanes.
///
/// # Safety
/// As [`bf16_to_f32_avx512`].
#[target_feature(enable = "avx512f")]
pub unsafe fn f16_to_f32_avx512(src: *const u8, dst: *mut u8, n: usize) -> usize {
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`: inside both buffers.
        unsafe {
            let v = _mm256_loadu_si256(src.add(2 * i).cast());
            _mm512_storeu_ps(dst.add(4 * i).cast(), _mm512_cvtph_ps(v));
        }
        i += 16;
    }
    i
}

/// F32 → F16, 16 lanes.
///
/// # Safety
/// AVX-512F is available; `src` has `4n` readable bytes and `dst` `2n` writable ones.
#[target_feature(enable = "avx512f")]
pub unsafe fn f32_to_f16_avx512(src: *const u8, dst: *mut u8, n: usize) -> usize {
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`: inside both buffers.
        unsafe {
            let v = _mm512_loadu_ps(src.add(4 * i).cast());
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            _mm256_storeu_si256(dst.add(2 * i).cast(), h);
        }
        i += 16;
    }
    i
}

/// F32 → BF16, 16 lanes, every NaN written as `nan`.
///
/// # Safety
/// As [`f32_to_f16_avx512`].
#[target_feature(enable = "avx512f")]
pub unsafe fn f32_to_bf16_avx512(src: *const u8, dst: *mut u8, n: usize, nan: u16) -> usize {
    let nan = _mm512_set1_epi32(i32::from(nan));
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`: inside both buffers.
        unsafe {
            let x = _mm512_loadu_si512(src.add(4 * i).cast());
            _mm256_storeu_si256(dst.add(2 * i).cast(), round_bf16_avx512(x, nan));
        }
        i += 16;
    }
    i
}

/// F32 bits to BF16, 16 lanes: the scalar rounding, lane-wise; NaN lanes `nan`.
#[target_feature(enable = "avx512f")]
fn round_bf16_avx512(x: __m512i, nan: __m512i) -> __m256i {
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
    let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))));
    let xf = _mm512_castsi512_ps(x);
    let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(xf, xf);
    _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(ordered, nan, r))
}

/// F32 → BF16 as [`f32_to_bf16_avx512`], written with streaming (non-temporal) stores that go
/// around the cache: a long output is not read back soon, and a store that misses the cache then
/// costs no read of the line first. Ends with a store fence.
///
/// # Safety
/// As [`f32_to_f16_avx512`], and `dst` is 32-byte aligned.
#[target_feature(enable = "avx512f")]
pub unsafe fn f32_to_bf16_avx512_streaming(src: *const u8, dst: *mut u8, n: usize, nan: u16) -> usize {
    let nan = _mm512_set1_epi32(i32::from(nan));
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`: inside both buffers; `dst + 2i` is 32-byte aligned (`dst` is,
        // and `i` is a multiple of 16).
        unsafe {
            let x = _mm512_loadu_si512(src.add(4 * i).cast());
            _mm256_stream_si256(dst.add(2 * i).cast(), round_bf16_avx512(x, nan));
        }
        i += 16;
    }
    _mm_sfence();
    i
}

/// BF16 → F32, 8 lanes.
///
/// # Safety
/// AVX2 is available; buffers as [`bf16_to_f32_avx512`].
#[target_feature(enable = "avx2")]
pub unsafe fn bf16_to_f32_avx2(src: *const u8, dst: *mut u8, n: usize) -> usize {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`: inside both buffers.
        unsafe {
            let v = _mm_loadu_si128(src.add(2 * i).cast());
            let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v));
            _mm256_storeu_si256(dst.add(4 * i).cast(), w);
        }
        i += 8;
    }
    i
}

/// F16 → F32, 8 lanes.
///
/// # Safety
/// AVX2 and F16C are available; buffers as [`bf16_to_f32_avx512`].
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn f16_to_f32_avx2(src: *const u8, dst: *mut u8, n: usize) -> usize {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`: inside both buffers.
        unsafe {
            let v = _mm_loadu_si128(src.add(2 * i).cast());
            _mm256_storeu_ps(dst.add(4 * i).cast(), _mm256_cvtph_ps(v));
        }
        i += 8;
    }
    i
}

/// F32 → F16, 8 lanes.
///
/// # Safety
/// AVX2 and F16C are available; buffers as [`f32_to_f16_avx512`].
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn f32_to_f16_avx2(src: *const u8, dst: *mut u8, n: usize) -> usize {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`: inside both buffers.
        unsafe {
            let v = _mm256_loadu_ps(src.add(4 * i).cast());
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(dst.add(2 * i).cast(), h);
        }
        i += 8;
    }
    i
}

/// F32 → BF16, 16 elements a step (two 8-lane vectors packed), every NaN written as `nan`.
///
/// # Safety
/// AVX2 is available; buffers as [`f32_to_f16_avx512`].
#[target_feature(enable = "avx2")]
pub unsafe fn f32_to_bf16_avx2(src: *const u8, dst: *mut u8, n: usize, nan: u16) -> usize {
    let nan = _mm256_set1_epi32(i32::from(nan));
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`: the 64 bytes read and 32 written are inside the buffers.
        unsafe {
            let a = round_bf16_avx2(_mm256_loadu_si256(src.add(4 * i).cast()), nan);
            let b = round_bf16_avx2(_mm256_loadu_si256(src.add(4 * i + 32).cast()), nan);
            // Every lane is at most 0xFFFF, so the unsigned saturating pack is exact; it packs per
            // 128-bit half (a0-3 b0-3 a4-7 b4-7), and the permute puts the quarters in order.
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b));
            _mm256_storeu_si256(dst.add(2 * i).cast(), packed);
        }
        i += 16;
    }
    i
}

/// F32 bits to BF16 in the low half of each lane: the scalar rounding, lane-wise; NaN lanes `nan`.
#[target_feature(enable = "avx2")]
fn round_bf16_avx2(x: __m256i, nan: __m256i) -> __m256i {
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
    let r = _mm256_srli_epi32::<16>(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))));
    let xf = _mm256_castsi256_ps(x);
    let unordered = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(xf, xf));
    _mm256_blendv_epi8(r, nan, unordered)
}
