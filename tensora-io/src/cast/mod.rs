//! Element casts between floating-point dtypes, bit-exact with torch's CPU `.to()`: F32 ↔ BF16 ↔
//! F16 and FP8 (E4M3FN, E5M2) → F32 / BF16 / F16. The one home of every dtype conversion; a load
//! with [`LoadOptions::dtype`](crate::LoadOptions::dtype) runs them on each landed read.
//!
//! What torch 2.15 (CPU, AVX-512 build) writes, and so what these write:
//! - to F32: exact. BF16 NaNs keep their bits; F16 and E5M2 NaNs keep sign and payload and are
//!   made quiet (`vcvtph2ps`); an E4M3FN NaN becomes `sign | 0x7FF0_0000`.
//! - F32 → BF16 and F32 → F16: round to nearest even; overflow rounds to ±Inf, underflow through
//!   the subnormals to ±0 (no flush to zero); ±0 and ±Inf kept.
//! - NaN to F16: sign and the top 9 payload bits kept, made quiet (`vcvtps2ph`).
//! - NaN to BF16: from F32 always `0xFFFF` (torch's vectorised rounding; sign and payload lost);
//!   from F16 or FP8 always `0x7FC0` (c10's scalar rounding, which that path uses).
//! - BF16 ↔ F16 and FP8 → BF16/F16 go through F32, as torch's do.
//!
//! Torch itself is not consistent for F16 → F32 NaNs: the last `len % 8` elements of a tensor go
//! through its scalar tail, which writes `0x7FFF_FFFF` for every NaN; these kernels always write
//! what its vectorised loop writes (the quiet NaN above).
//!
//! SIMD: AVX-512F (16 lanes) or AVX2 with F16C (8 lanes), detected at run time ([`Simd`]), with
//! the scalar functions ([`scalar`]) as the fallback and for the tails; the tests check every
//! level against the scalar functions on every 16-bit and 8-bit input. AVX-512 BF16's
//! `vcvtneps2bf16` is not used: it flushes subnormals to zero, torch does not. F32 → BF16 outputs
//! of at least [`STREAMING_STORES_MIN_BYTES`] are written with streaming stores at AVX-512.

pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use tensora_format::Dtype;

/// The dtype a load delivers floating-point tensors in (see
/// [`LoadOptions::dtype`](crate::LoadOptions::dtype)). Integer and boolean tensors always keep
/// their stored dtype.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DtypeTarget {
    /// Every tensor as stored (no cast).
    #[default]
    Stored,
    /// Floating-point tensors as F32.
    F32,
    /// Floating-point tensors as BF16.
    BF16,
    /// Floating-point tensors as F16.
    F16,
}

/// A cast that is not supported, or buffers that do not hold the same number of elements.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CastError {
    /// No conversion from `from` to `to` (e.g. F64, FNUZ FP8, E8M0 or the sub-byte types).
    #[error("no cast from {from} to {to} (supported: F32, BF16, F16, F8_E4M3, F8_E5M2 to F32, BF16, F16)")]
    Unsupported {
        /// The stored dtype.
        from: Dtype,
        /// The dtype asked for.
        to: Dtype,
    },
    /// `src` is not a whole number of `from` elements, or `dst` is not as many `to` elements.
    #[error("{src_len_bytes} bytes of {from} do not convert into {dst_len_bytes} bytes of {to}")]
    Length {
        /// The source dtype.
        from: Dtype,
        /// The destination dtype.
        to: Dtype,
        /// Source bytes.
        src_len_bytes: usize,
        /// Destination bytes.
        dst_len_bytes: usize,
    },
}

impl DtypeTarget {
    /// The target dtype, `None` for [`DtypeTarget::Stored`].
    pub const fn dtype(self) -> Option<Dtype> {
        match self {
            DtypeTarget::Stored => None,
            DtypeTarget::F32 => Some(Dtype::F32),
            DtypeTarget::BF16 => Some(Dtype::BF16),
            DtypeTarget::F16 => Some(Dtype::F16),
        }
    }

    /// `"stored"`, `"f32"`, `"bf16"` or `"f16"` (the CLI's `--dtype` spelling).
    pub const fn as_str(self) -> &'static str {
        match self {
            DtypeTarget::Stored => "stored",
            DtypeTarget::F32 => "f32",
            DtypeTarget::BF16 => "bf16",
            DtypeTarget::F16 => "f16",
        }
    }

    /// What a tensor stored as `from` is delivered as: `Ok(None)` as stored (the target is
    /// `Stored` or `from` already, or `from` is not floating-point), `Ok(Some(to))` cast, or the
    /// typed error for a floating-point dtype with no cast.
    pub fn cast_of(self, from: Dtype) -> Result<Option<Dtype>, CastError> {
        let Some(to) = self.dtype() else { return Ok(None) };
        match from {
            _ if from == to => Ok(None),
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::U16 | Dtype::I16 => Ok(None),
            Dtype::U32 | Dtype::I32 | Dtype::U64 | Dtype::I64 => Ok(None),
            Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F8E4M3 | Dtype::F8E5M2 => Ok(Some(to)),
            _ => Err(CastError::Unsupported { from, to }),
        }
    }
}

/// The one parser of `--dtype` and `dtype=`: `stored`, `f32`/`float32`, `bf16`/`bfloat16`,
/// `f16`/`float16`/`half`, or the safetensors spellings `F32`, `BF16`, `F16`.
///
/// ```
/// use tensora_io::DtypeTarget;
/// assert_eq!("bf16".parse::<DtypeTarget>(), Ok(DtypeTarget::BF16));
/// assert_eq!("float32".parse::<DtypeTarget>(), Ok(DtypeTarget::F32));
/// assert!("f64".parse::<DtypeTarget>().unwrap_err().contains("bf16"));
/// ```
impl std::str::FromStr for DtypeTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<DtypeTarget, String> {
        match s {
            "stored" => Ok(DtypeTarget::Stored),
            "f32" | "float32" | "F32" => Ok(DtypeTarget::F32),
            "bf16" | "bfloat16" | "BF16" => Ok(DtypeTarget::BF16),
            "f16" | "float16" | "half" | "F16" => Ok(DtypeTarget::F16),
            other => Err(format!("dtype must be bf16, f16, f32 or stored, not {other:?}")),
        }
    }
}

/// The instruction set a kernel runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Simd {
    /// One element at a time (`cast/scalar.rs`).
    Scalar,
    /// AVX2 with F16C, 8 lanes.
    Avx2,
    /// AVX-512F, 16 lanes.
    Avx512,
}

impl Simd {
    /// The widest level this CPU has (detected once).
    pub fn detected() -> Simd {
        static LEVEL: OnceLock<Simd> = OnceLock::new();
        *LEVEL.get_or_init(|| Simd::available().last().copied().unwrap_or(Simd::Scalar))
    }

    /// Every level this CPU can run, narrowest first (`Scalar` always).
    pub fn available() -> Vec<Simd> {
        let mut levels = vec![Simd::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
                levels.push(Simd::Avx2);
            }
            if is_x86_feature_detected!("avx512f") {
                levels.push(Simd::Avx512);
            }
        }
        levels
    }

    /// `"scalar"`, `"avx2"` or `"avx512"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Simd::Scalar => "scalar",
            Simd::Avx2 => "avx2",
            Simd::Avx512 => "avx512",
        }
    }
}

/// Convert `src`, elements of `from`, into `dst`, as many elements of `to`, with the widest
/// SIMD this CPU has. Both are little-endian bytes at any alignment.
///
/// ```
/// use tensora_format::Dtype;
/// let src = [1.5f32, -0.0, f32::INFINITY].map(f32::to_le_bytes).concat();
/// let mut dst = [0u8; 6];
/// tensora_io::convert(Dtype::F32, Dtype::BF16, &src, &mut dst)?;
/// assert_eq!(dst, [0xC0, 0x3F, 0x00, 0x80, 0x80, 0x7F]);
/// # Ok::<(), tensora_io::CastError>(())
/// ```
pub fn convert(from: Dtype, to: Dtype, src: &[u8], dst: &mut [u8]) -> Result<(), CastError> {
    convert_with(Simd::detected(), from, to, src, dst)
}

/// [`convert`] with the level `simd` (clamped to what this CPU has: a level it lacks runs scalar).
pub fn convert_with(simd: Simd, from: Dtype, to: Dtype, src: &[u8], dst: &mut [u8]) -> Result<(), CastError> {
    let simd = if Simd::available().contains(&simd) { simd } else { Simd::Scalar };
    let unsupported = CastError::Unsupported { from, to };
    let (Some(from_size), Some(to_size)) = (from.size_bytes(), to.size_bytes()) else {
        return Err(unsupported);
    };
    let n = src.len() / from_size as usize;
    if !src.len().is_multiple_of(from_size as usize) || Some(dst.len()) != n.checked_mul(to_size as usize) {
        return Err(CastError::Length { from, to, src_len_bytes: src.len(), dst_len_bytes: dst.len() });
    }
    let k = Kernels { simd };
    match (from, to) {
        _ if from == to => dst.copy_from_slice(src),
        (Dtype::BF16, Dtype::F32) => k.bf16_to_f32(src, dst),
        (Dtype::F16, Dtype::F32) => k.f16_to_f32(src, dst),
        (Dtype::F32, Dtype::BF16) => k.f32_to_bf16(src, dst, scalar::BF16_NAN_FROM_F32),
        (Dtype::F32, Dtype::F16) => k.f32_to_f16(src, dst),
        (Dtype::F8E4M3, Dtype::F32) => fp8_to_f32(&scalar::E4M3FN_TO_F32, src, dst),
        (Dtype::F8E5M2, Dtype::F32) => fp8_to_f32(&scalar::E5M2_TO_F32, src, dst),
        (Dtype::BF16 | Dtype::F16 | Dtype::F8E4M3 | Dtype::F8E5M2, Dtype::BF16 | Dtype::F16) => {
            k.through_f32(from, to, from_size as usize, src, dst)
        }
        _ => return Err(unsupported),
    }
    Ok(())
}

/// The shortest F32 → BF16 output written with streaming stores (around the cache) at AVX-512:
/// longer ones are not read back while in cache. A warm 2.2 GB F32 → BF16 load converting from
/// buffers in L2 spent 0.29 s in the kernel with ordinary stores (each line read before written).
pub const STREAMING_STORES_MIN_BYTES: usize = 256 << 10;

/// Elements converted through an F32 block on the stack (BF16 ↔ F16, FP8 → BF16/F16).
const BLOCK_ELEMS: usize = 1024;

/// The slice kernels at one SIMD level: the vector part, then the scalar tail.
#[derive(Clone, Copy)]
struct Kernels {
    simd: Simd,
}

impl Kernels {
    fn bf16_to_f32(self, src: &[u8], dst: &mut [u8]) {
        let n = src.len() / 2;
        // SAFETY: the level is available (checked by `convert_with`) and `src` holds `n` BF16,
        // `dst` `n` F32 (checked lengths).
        let done = unsafe { self.vector(src, dst, n, Vector::Bf16ToF32) };
        widen(&src[2 * done..], &mut dst[4 * done..], scalar::bf16_to_f32);
    }

    fn f16_to_f32(self, src: &[u8], dst: &mut [u8]) {
        let n = src.len() / 2;
        // SAFETY: as in `bf16_to_f32`.
        let done = unsafe { self.vector(src, dst, n, Vector::F16ToF32) };
        widen(&src[2 * done..], &mut dst[4 * done..], scalar::f16_to_f32);
    }

    fn f32_to_bf16(self, src: &[u8], dst: &mut [u8], nan: u16) {
        let n = src.len() / 4;
        // An output of at least `STREAMING_STORES_MIN_BYTES` at AVX-512 is written around the
        // cache, from its first 32-byte aligned element on (the ones before it one at a time).
        let head = match self.simd {
            Simd::Avx512
                if dst.len() >= STREAMING_STORES_MIN_BYTES && (dst.as_ptr() as usize).is_multiple_of(2) =>
            {
                (dst.as_ptr().align_offset(32) / 2).min(n)
            }
            _ => n + 1,
        };
        if head > n {
            // SAFETY: the level is available and `src` holds `n` F32, `dst` `n` BF16.
            let done = unsafe { self.vector(src, dst, n, Vector::F32ToBf16(nan)) };
            narrow(&src[4 * done..], &mut dst[2 * done..], |x| scalar::f32_to_bf16(x, nan));
            return;
        }
        narrow(&src[..4 * head], &mut dst[..2 * head], |x| scalar::f32_to_bf16(x, nan));
        let (src, dst) = (&src[4 * head..], &mut dst[2 * head..]);
        // SAFETY: as above for the `n - head` elements after the head; `dst` now starts 32-byte
        // aligned (`align_offset`), as the streaming kernel needs.
        let done = unsafe { self.vector(src, dst, n - head, Vector::F32ToBf16Streaming(nan)) };
        narrow(&src[4 * done..], &mut dst[2 * done..], |x| scalar::f32_to_bf16(x, nan));
    }

    fn f32_to_f16(self, src: &[u8], dst: &mut [u8]) {
        let n = src.len() / 4;
        // SAFETY: as in `f32_to_bf16`.
        let done = unsafe { self.vector(src, dst, n, Vector::F32ToF16) };
        narrow(&src[4 * done..], &mut dst[2 * done..], scalar::f32_to_f16);
    }

    /// `from` (BF16, F16 or FP8, `from_size` bytes) → `to` (BF16 or F16) through F32 blocks.
    fn through_f32(self, from: Dtype, to: Dtype, from_size: usize, src: &[u8], dst: &mut [u8]) {
        let mut block = [0u8; 4 * BLOCK_ELEMS];
        for (s, d) in src.chunks(from_size * BLOCK_ELEMS).zip(dst.chunks_mut(2 * BLOCK_ELEMS)) {
            let wide = &mut block[..4 * (s.len() / from_size)];
            match from {
                Dtype::BF16 => self.bf16_to_f32(s, wide),
                Dtype::F16 => self.f16_to_f32(s, wide),
                Dtype::F8E4M3 => fp8_to_f32(&scalar::E4M3FN_TO_F32, s, wide),
                _ => fp8_to_f32(&scalar::E5M2_TO_F32, s, wide),
            }
            match to {
                Dtype::BF16 => self.f32_to_bf16(wide, d, scalar::BF16_NAN_FROM_NARROW),
                _ => self.f32_to_f16(wide, d),
            }
        }
    }

    /// The whole vectors of `n` elements at this level; returns how many were converted.
    ///
    /// # Safety
    /// `self.simd` is available on this CPU, `src` holds `n` source and `dst` `n` destination
    /// elements of `kind`.
    #[allow(unused_variables)]
    unsafe fn vector(self, src: &[u8], dst: &mut [u8], n: usize, kind: Vector) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
            // SAFETY: the caller's promise: the level's features exist and the buffers hold `n`.
            unsafe {
                match (self.simd, kind) {
                    (Simd::Scalar, _) => 0,
                    (Simd::Avx2, Vector::Bf16ToF32) => x86::bf16_to_f32_avx2(s, d, n),
                    (Simd::Avx2, Vector::F16ToF32) => x86::f16_to_f32_avx2(s, d, n),
                    (Simd::Avx2, Vector::F32ToBf16(nan) | Vector::F32ToBf16Streaming(nan)) => {
                        x86::f32_to_bf16_avx2(s, d, n, nan)
                    }
                    (Simd::Avx2, Vector::F32ToF16) => x86::f32_to_f16_avx2(s, d, n),
                    (Simd::Avx512, Vector::Bf16ToF32) => x86::bf16_to_f32_avx512(s, d, n),
                    (Simd::Avx512, Vector::F16ToF32) => x86::f16_to_f32_avx512(s, d, n),
                    (Simd::Avx512, Vector::F32ToBf16(nan)) => x86::f32_to_bf16_avx512(s, d, n, nan),
                    (Simd::Avx512, Vector::F32ToF16) => x86::f32_to_f16_avx512(s, d, n),
                    (Simd::Avx512, Vector::F32ToBf16Streaming(nan)) => {
                        x86::f32_to_bf16_avx512_streaming(s, d, n, nan)
                    }
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        0
    }
}

/// Which vector kernel.
#[derive(Clone, Copy)]
enum Vector {
    Bf16ToF32,
    F16ToF32,
    F32ToBf16(u16),
    /// Into a 32-byte aligned destination, with streaming stores where the level has them.
    F32ToBf16Streaming(u16),
    F32ToF16,
}

/// 16-bit elements to 32-bit ones, one at a time.
fn widen(src: &[u8], dst: &mut [u8], f: impl Fn(u16) -> u32) {
    for (s, d) in src.chunks_exact(2).zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&f(u16::from_le_bytes([s[0], s[1]])).to_le_bytes());
    }
}

/// 32-bit elements to 16-bit ones, one at a time.
fn narrow(src: &[u8], dst: &mut [u8], f: impl Fn(u32) -> u16) {
    for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f(u32::from_le_bytes([s[0], s[1], s[2], s[3]])).to_le_bytes());
    }
}

/// FP8 bytes to F32 through a 256-entry table.
fn fp8_to_f32(table: &[u32; 256], src: &[u8], dst: &mut [u8]) {
    for (&b, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&table[usize::from(b)].to_le_bytes());
    }
}
