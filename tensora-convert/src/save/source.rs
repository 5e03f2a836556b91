//! Where the bytes of a save come from: a [`SaveSource`] names its tensors ([`SourceTensor`]) and
//! hands out their storage, from memory ([`MemoryTensors`]: borrowed slices, or a
//! `tensora_io::Loaded`) or read on demand ([`crate::sources::CheckpointSource`], or your own
//! implementation), so a streamed save holds no more than the writer's staging buffers.
//!
//! A tensor's *storage* is the bytes its elements live in; its *dense* bytes are its elements in
//! row-major order (what safetensors stores). For a contiguous tensor the dense bytes are the
//! storage's first `nbytes`; a strided one ([`StorageLayout::Strided`]) is gathered element by
//! element ([`gather`]).

use tensora_format::Dtype;
use tensora_format::TensorInfo;
use tensora_format::sllm::write::contiguous_strides;

use crate::ConvertError;

/// How a tensor's elements lie in its storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageLayout {
    /// Row-major from the storage's first byte: the dense bytes are its first `nbytes`.
    Contiguous,
    /// Element `index` starts at byte `start_bytes + Σ index[d] × strides_bytes[d]` of the
    /// storage (a stride may be negative or zero, as numpy's); written in row-major order.
    Strided {
        /// Where element `[0, 0, …]` starts.
        start_bytes: u64,
        /// Bytes between neighbours along each dimension.
        strides_bytes: Vec<i64>,
    },
}

/// One tensor of a save: name, dtype, shape, and the layout and size of its storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTensor {
    /// The name written.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape; `[]` is a scalar.
    pub shape: Vec<u64>,
    /// Where the elements are in the storage.
    pub layout: StorageLayout,
    /// Bytes of storage ([`SaveSource::storage`] or [`SaveSource::read_storage`] hands them out).
    pub storage_len_bytes: u64,
}

impl SourceTensor {
    /// A row-major tensor whose storage is exactly its data.
    pub fn dense(
        name: impl Into<String>,
        dtype: Dtype,
        shape: Vec<u64>,
    ) -> Result<SourceTensor, ConvertError> {
        let name = name.into();
        let storage_len_bytes = dense_len(&name, dtype, &shape)?;
        Ok(SourceTensor { name, dtype, shape, layout: StorageLayout::Contiguous, storage_len_bytes })
    }

    /// The tensor as a checkpoint describes it (ServerlessLLM strides are in elements, from the
    /// storage's start).
    pub fn from_info(t: &TensorInfo) -> SourceTensor {
        let layout = match t.strides() {
            Some(strides) if !is_row_major(t.shape(), strides) => {
                let item = t.dtype().size_bytes().unwrap_or(1);
                StorageLayout::Strided {
                    start_bytes: 0,
                    strides_bytes: strides.iter().map(|&s| (s.saturating_mul(item)) as i64).collect(),
                }
            }
            _ => StorageLayout::Contiguous,
        };
        SourceTensor {
            name: t.name().to_owned(),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            layout,
            storage_len_bytes: t.len_bytes(),
        }
    }

    /// Bytes of row-major data (`numel × itemsize`, or the packed bytes of a sub-byte dtype).
    pub fn nbytes(&self) -> u64 {
        // Checked by `check` before a save uses the tensor.
        dense_len(&self.name, self.dtype, &self.shape).unwrap_or(u64::MAX)
    }

    /// Whether the dense bytes are a prefix of the storage.
    pub fn is_contiguous(&self) -> bool {
        self.layout == StorageLayout::Contiguous
    }

    /// Refuse a tensor whose elements do not all lie inside its storage, a size that overflows,
    /// a strided sub-byte dtype or a stride list of the wrong rank.
    pub fn check(&self) -> Result<(), ConvertError> {
        let bad = |reason: String| Err(ConvertError::InvalidTensor { tensor: self.name.clone(), reason });
        let nbytes = dense_len(&self.name, self.dtype, &self.shape)?;
        match &self.layout {
            StorageLayout::Contiguous if self.storage_len_bytes < nbytes => {
                bad(format!("{nbytes} bytes of data, but {} bytes of storage", self.storage_len_bytes))
            }
            StorageLayout::Contiguous => Ok(()),
            StorageLayout::Strided { start_bytes, strides_bytes } => {
                let Some(item) = self.dtype.size_bytes() else {
                    return bad(format!("a strided {} tensor (sub-byte elements)", self.dtype));
                };
                if strides_bytes.len() != self.shape.len() {
                    return bad(format!("{} strides for rank {}", strides_bytes.len(), self.shape.len()));
                }
                if nbytes == 0 {
                    return Ok(());
                }
                let (low, high) = extent(*start_bytes, &self.shape, strides_bytes)
                    .ok_or_else(|| self.invalid("strides overflow"))?;
                let end =
                    high.checked_add(i128::from(item)).ok_or_else(|| self.invalid("strides overflow"))?;
                if low < 0 || end > i128::from(self.storage_len_bytes) {
                    return bad(format!(
                        "elements reach bytes {low}..{end}, outside its {} bytes of storage",
                        self.storage_len_bytes
                    ));
                }
                Ok(())
            }
        }
    }

    fn invalid(&self, reason: &str) -> ConvertError {
        ConvertError::InvalidTensor { tensor: self.name.clone(), reason: reason.to_owned() }
    }
}

/// Row-major bytes of `shape` in `dtype`, or a typed error naming the tensor.
fn dense_len(name: &str, dtype: Dtype, shape: &[u64]) -> Result<u64, ConvertError> {
    let numel = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    numel.and_then(|n| dtype.bytes_for(n)).ok_or_else(|| ConvertError::InvalidTensor {
        tensor: name.to_owned(),
        reason: format!("shape {shape:?} of {dtype} overflows or ends in a partial byte"),
    })
}

/// Lowest and highest starting byte of any element (the tensor has at least one element).
fn extent(start: u64, shape: &[u64], strides: &[i64]) -> Option<(i128, i128)> {
    let (mut low, mut high) = (i128::from(start), i128::from(start));
    for (&d, &s) in shape.iter().zip(strides) {
        let reach = i128::from(s).checked_mul(i128::from(d.checked_sub(1)?))?;
        if reach < 0 { low += reach } else { high += reach }
    }
    Some((low, high))
}

/// Row-major contiguous (dimensions of size 1 may have any stride; empty tensors always are).
pub(crate) fn is_row_major(shape: &[u64], strides: &[u64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let expected = contiguous_strides(shape);
    strides.len() == shape.len()
        && shape.iter().zip(strides.iter().zip(&expected)).all(|(&d, (&s, &e))| d == 1 || s == e)
}

/// Where a save's tensors come from. Implementations must hand out the same bytes for the same
/// range every time (a save may ask for a range once per output it appears in).
pub trait SaveSource: Sync {
    /// The tensors, in the order given; names are unique (the layout refuses duplicates).
    fn tensors(&self) -> &[SourceTensor];

    /// Tensor `i`'s whole storage when it lies in memory (written from directly, without a
    /// staging copy where the write mode allows; strided tensors are gathered from it).
    fn storage(&self, i: usize) -> Option<&[u8]>;

    /// Copy tensor `i`'s storage bytes `offset_bytes .. offset_bytes + dst.len()` into `dst`
    /// (called from the writer's threads, for sources not in memory).
    fn read_storage(&self, i: usize, offset_bytes: u64, dst: &mut [u8]) -> Result<(), ConvertError>;
}

/// Tensors in memory: borrowed slices (`push`), or every tensor of a `tensora_io::Loaded`
/// ([`MemoryTensors::from_loaded`]).
///
/// ```
/// use tensora_convert::{MemoryTensors, SourceTensor};
/// use tensora_format::Dtype;
///
/// let w = [1u8, 2, 3, 4, 5, 6, 7, 8];
/// let mut tensors = MemoryTensors::new();
/// tensors.push(SourceTensor::dense("w", Dtype::F32, vec![2])?, &w)?;
/// assert_eq!(tensors.len(), 1);
/// # Ok::<(), tensora_convert::ConvertError>(())
/// ```
#[derive(Debug, Default)]
pub struct MemoryTensors<'a> {
    tensors: Vec<SourceTensor>,
    storage: Vec<&'a [u8]>,
}

impl<'a> MemoryTensors<'a> {
    /// No tensors yet.
    pub fn new() -> MemoryTensors<'a> {
        MemoryTensors::default()
    }

    /// Add a tensor whose storage is `storage` (checked: every element inside it).
    pub fn push(&mut self, tensor: SourceTensor, storage: &'a [u8]) -> Result<(), ConvertError> {
        if tensor.storage_len_bytes != storage.len() as u64 {
            return Err(ConvertError::InvalidTensor {
                reason: format!(
                    "{} bytes of storage given, {} described",
                    storage.len(),
                    tensor.storage_len_bytes
                ),
                tensor: tensor.name,
            });
        }
        tensor.check()?;
        self.tensors.push(tensor);
        self.storage.push(storage);
        Ok(())
    }

    /// Every tensor of a load, in the checkpoint's order, without a copy.
    pub fn from_loaded(loaded: &'a tensora_io::Loaded) -> Result<MemoryTensors<'a>, ConvertError> {
        let mut out = MemoryTensors::new();
        for t in loaded.tensors() {
            out.push(SourceTensor::from_info(t.info()), t.bytes())?;
        }
        Ok(out)
    }

    /// How many tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

impl SaveSource for MemoryTensors<'_> {
    fn tensors(&self) -> &[SourceTensor] {
        &self.tensors
    }

    fn storage(&self, i: usize) -> Option<&[u8]> {
        self.storage.get(i).copied()
    }

    fn read_storage(&self, i: usize, offset_bytes: u64, dst: &mut [u8]) -> Result<(), ConvertError> {
        let bytes = self.storage(i).and_then(|s| slice(s, offset_bytes, dst.len()));
        let bytes = bytes.ok_or_else(|| out_of_range(&self.tensors, i, offset_bytes, dst.len()))?;
        dst.copy_from_slice(bytes);
        Ok(())
    }
}

/// `len` bytes of `s` from `offset`, when inside it.
pub(crate) fn slice(s: &[u8], offset: u64, len: usize) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    s.get(start..start.checked_add(len)?)
}

pub(crate) fn out_of_range(
    tensors: &[SourceTensor],
    i: usize,
    offset_bytes: u64,
    len: usize,
) -> ConvertError {
    ConvertError::InvalidTensor {
        tensor: tensors.get(i).map_or_else(|| format!("#{i}"), |t| t.name.clone()),
        reason: format!("bytes {offset_bytes}..+{len} asked for, outside its storage"),
    }
}

/// Write the dense (row-major) bytes `from_bytes .. from_bytes + dst.len()` of a strided tensor
/// into `dst`, from its whole `storage`. Rows whose innermost stride is the element size are
/// copied as runs, anything else element by element. Errors (never panics) on a range past the
/// tensor or elements outside the storage; [`SourceTensor::check`] rules those out beforehand.
pub fn gather(t: &SourceTensor, storage: &[u8], from_bytes: u64, dst: &mut [u8]) -> Result<(), ConvertError> {
    let StorageLayout::Strided { start_bytes, strides_bytes } = &t.layout else {
        let src =
            slice(storage, from_bytes, dst.len()).ok_or_else(|| t.invalid("range outside its storage"))?;
        dst.copy_from_slice(src);
        return Ok(());
    };
    let item = t.dtype.size_bytes().ok_or_else(|| t.invalid("a strided sub-byte tensor"))?;
    let end = from_bytes.checked_add(dst.len() as u64).filter(|&e| e <= t.nbytes());
    end.ok_or_else(|| t.invalid("range past the tensor's data"))?;
    if dst.is_empty() {
        return Ok(());
    }
    let shape: Vec<u64> = if t.shape.is_empty() { vec![1] } else { t.shape.clone() };
    let strides: Vec<i64> = if t.shape.is_empty() { vec![item as i64] } else { strides_bytes.clone() };
    let inner = shape.len() - 1;
    // Unravel the first element into an index, and its byte offset in the storage.
    let mut index = vec![0u64; shape.len()];
    let mut rest = from_bytes / item;
    for d in (0..shape.len()).rev() {
        index[d] = rest % shape[d];
        rest /= shape[d];
    }
    let mut offset = i128::from(*start_bytes)
        + index.iter().zip(&strides).map(|(&i, &s)| i128::from(i) * i128::from(s)).sum::<i128>();
    let mut skip = (from_bytes % item) as usize;
    let contiguous_rows = strides[inner] == item as i64;
    let mut out = 0usize;
    while out < dst.len() {
        // Elements copied in one step: the rest of the row when rows are contiguous, else one.
        let run = if contiguous_rows { shape[inner] - index[inner] } else { 1 };
        let run_bytes = usize::try_from(run * item).map_err(|_| t.invalid("row larger than memory"))? - skip;
        let take = run_bytes.min(dst.len() - out);
        let at = usize::try_from(offset).ok().and_then(|o| o.checked_add(skip));
        let src = at
            .and_then(|a| storage.get(a..a + take))
            .ok_or_else(|| t.invalid("element outside its storage"))?;
        dst[out..out + take].copy_from_slice(src);
        out += take;
        skip = 0;
        // Advance the index by `run` elements along the innermost dimension, carrying outwards.
        index[inner] += run;
        offset += i128::from(run) * i128::from(strides[inner]);
        let mut d = inner;
        while d > 0 && index[d] == shape[d] {
            offset -= i128::from(shape[d]) * i128::from(strides[d]);
            index[d] = 0;
            d -= 1;
            index[d] += 1;
            offset += i128::from(strides[d]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn strided(
        shape: Vec<u64>,
        start_bytes: u64,
        strides_bytes: Vec<i64>,
        dtype: Dtype,
        len: u64,
    ) -> SourceTensor {
        SourceTensor {
            name: "t".into(),
            dtype,
            shape,
            layout: StorageLayout::Strided { start_bytes, strides_bytes },
            storage_len_bytes: len,
        }
    }

    /// The reference: every element's bytes at its index, in row-major order.
    fn dense_reference(t: &SourceTensor, storage: &[u8]) -> Vec<u8> {
        let StorageLayout::Strided { start_bytes, strides_bytes } = &t.layout else { unreachable!() };
        let item = t.dtype.size_bytes().unwrap() as usize;
        let numel: u64 = t.shape.iter().product();
        let mut out = Vec::new();
        for flat in 0..numel {
            let mut rest = flat;
            let mut at = *start_bytes as i64;
            for d in (0..t.shape.len()).rev() {
                at += (rest % t.shape[d]) as i64 * strides_bytes[d];
                rest /= t.shape[d];
            }
            out.extend_from_slice(&storage[at as usize..at as usize + item]);
        }
        out
    }

    #[test]
    fn a_transpose_a_reversed_row_and_a_scalar_are_gathered_in_row_major_order() {
        let storage: Vec<u8> = (0..6).collect();
        // [2, 3] u8 stored as its [3, 2] transpose.
        let t = strided(vec![2, 3], 0, vec![1, 2], Dtype::U8, 6);
        t.check().unwrap();
        let mut dst = [0u8; 6];
        gather(&t, &storage, 0, &mut dst).unwrap();
        assert_eq!(dst, [0, 2, 4, 1, 3, 5]);
        // A reversed view (numpy's a[::-1]): starts at the last element, stride -1.
        let r = strided(vec![6], 5, vec![-1], Dtype::U8, 6);
        r.check().unwrap();
        gather(&r, &storage, 2, &mut dst[..3]).unwrap();
        assert_eq!(&dst[..3], [3, 2, 1]);
        // A scalar at byte 2 of its storage.
        let s = strided(vec![], 2, vec![], Dtype::U16, 6);
        let mut two = [0u8; 2];
        gather(&s, &storage, 0, &mut two).unwrap();
        assert_eq!(two, [2, 3]);
    }

    #[test]
    fn elements_outside_the_storage_and_bad_ranges_are_typed_errors() {
        let outside = strided(vec![2, 3], 0, vec![1, 2], Dtype::U8, 5);
        assert!(matches!(outside.check(), Err(ConvertError::InvalidTensor { .. })));
        let negative = strided(vec![6], 0, vec![-1], Dtype::U8, 6);
        assert!(matches!(negative.check(), Err(ConvertError::InvalidTensor { .. })));
        let rank = strided(vec![6], 0, vec![1, 1], Dtype::U8, 6);
        assert!(matches!(rank.check(), Err(ConvertError::InvalidTensor { .. })));
        let sub_byte = strided(vec![2], 0, vec![1], Dtype::F4, 1);
        assert!(matches!(sub_byte.check(), Err(ConvertError::InvalidTensor { .. })));
        let overflow = strided(vec![u64::MAX, 2], 0, vec![i64::MAX, 1], Dtype::U8, 6);
        assert!(overflow.check().is_err());
        let ok = strided(vec![6], 0, vec![1], Dtype::U8, 6);
        let mut dst = [0u8; 4];
        assert!(gather(&ok, &[0; 6], 4, &mut dst).is_err(), "past the data");
        assert!(gather(&outside, &[0; 5], 0, &mut [0u8; 6]).is_err(), "an unchecked tensor errs, not panics");
        let mut loaded = MemoryTensors::new();
        let short = SourceTensor::dense("s", Dtype::F32, vec![2]).unwrap();
        assert!(matches!(loaded.push(short, &[0; 7]), Err(ConvertError::InvalidTensor { .. })));
        assert!(matches!(
            SourceTensor::dense("o", Dtype::F64, vec![u64::MAX, 4]),
            Err(ConvertError::InvalidTensor { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Any permutation of dimensions, with any signs, gathered from any byte range, equals the
        /// element-by-element reference.
        #[test]
        fn gather_equals_the_reference_for_any_view_and_range(
            dims in proptest::collection::vec(1u64..5, 0..4),
            flips in any::<u8>(),
            order_seed in any::<u64>(),
            item_pow in 0u32..4,
            a in any::<prop::sample::Index>(),
            b in any::<prop::sample::Index>(),
        ) {
            let item = 1u64 << item_pow;
            let dtype = [Dtype::U8, Dtype::I16, Dtype::F32, Dtype::F64][item_pow as usize];
            // A contiguous storage of the dims, viewed through a permutation of its axes, some flipped.
            let rank = dims.len();
            let base_strides: Vec<i64> = contiguous_strides(&dims).iter().map(|&s| (s * item) as i64).collect();
            let mut perm: Vec<usize> = (0..rank).collect();
            let mut state = order_seed;
            for k in (1..rank).rev() {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                perm.swap(k, (state >> 33) as usize % (k + 1));
            }
            let shape: Vec<u64> = perm.iter().map(|&p| dims[p]).collect();
            let mut strides: Vec<i64> = perm.iter().map(|&p| base_strides[p]).collect();
            let mut start = 0i64;
            for d in 0..rank {
                if flips >> d & 1 == 1 {
                    start += strides[d] * (shape[d] as i64 - 1);
                    strides[d] = -strides[d];
                }
            }
            let len = dims.iter().product::<u64>() * item;
            let storage: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let t = strided(shape, start as u64, strides, dtype, len);
            t.check().unwrap();
            let want = dense_reference(&t, &storage);
            let (x, y) = (a.index(want.len() + 1), b.index(want.len() + 1));
            let (from, to) = (x.min(y), x.max(y));
            let mut got = vec![0u8; to - from];
            gather(&t, &storage, from as u64, &mut got).unwrap();
            prop_assert_eq!(&got[..], &want[from..to]);
        }
    }
}
