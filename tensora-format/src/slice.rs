//! A slice of one tensor along one dimension ([`Slice`]), checked against the tensor at selection
//! time into its byte geometry ([`SliceLayout`]): parse, don't validate. A slice of dimension 0 (or
//! of any dimension whose outer dimensions are all 1) is one contiguous range of the file; a slice
//! of an inner dimension is `rows` ranges of `width_bytes`, `stride_bytes` apart.

use crate::TensorInfo;

/// Why a slice does not fit its tensor. Every variant names the tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SliceError {
    /// The dimension is not one of the tensor's (a scalar has none).
    #[error("tensor {tensor:?}: slice of dimension {dim}, but the tensor has {rank} dimensions")]
    Dim {
        /// The tensor's name.
        tensor: String,
        /// The dimension asked for.
        dim: usize,
        /// The tensor's rank.
        rank: usize,
    },
    /// `start + len` passes the dimension's size.
    #[error("tensor {tensor:?}: slice {start}..{start}+{len} of dimension {dim} passes its size {size}")]
    Range {
        /// The tensor's name.
        tensor: String,
        /// The dimension.
        dim: usize,
        /// First index of the slice.
        start: u64,
        /// Length of the slice.
        len: u64,
        /// The dimension's size.
        size: u64,
    },
    /// The tensor records strides (a ServerlessLLM view): only row-major tensors are sliced.
    #[error("tensor {tensor:?}: only contiguous row-major tensors can be sliced; this one has strides")]
    Strided {
        /// The tensor's name.
        tensor: String,
    },
    /// The slice's rows would not start or end on a byte (a sub-byte dtype such as F4).
    #[error("tensor {tensor:?}: a slice of dimension {dim} of {dtype} does not start and end on whole bytes")]
    SubByte {
        /// The tensor's name.
        tensor: String,
        /// The dimension.
        dim: usize,
        /// The dtype's safetensors name.
        dtype: &'static str,
    },
}

/// `len` indexes from `start` of dimension `dim`, as `torch.narrow(dim, start, len)` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slice {
    /// The dimension sliced (0 is the outermost).
    pub dim: usize,
    /// First index kept.
    pub start: u64,
    /// Indexes kept; 0 gives an empty tensor.
    pub len: u64,
}

/// Where a slice's bytes are in the file: `rows` ranges of `width_bytes`, the first at
/// `offset_bytes`, each `stride_bytes` after the previous. Landed one after another they are the
/// slice as a contiguous row-major tensor (`narrow(dim, start, len).contiguous()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceLayout {
    /// File offset of the slice's first byte.
    pub offset_bytes: u64,
    /// How many ranges (the product of the dimensions before the sliced one; 0 when the slice or
    /// the tensor is empty).
    pub rows: u64,
    /// Bytes of one range.
    pub width_bytes: u64,
    /// Distance between the starts of consecutive ranges (a whole row of the tensor at `dim`).
    pub stride_bytes: u64,
}

impl SliceLayout {
    /// The slice's bytes: `rows × width_bytes`.
    pub fn len_bytes(&self) -> u64 {
        // Cannot overflow: at most the tensor's checked length.
        self.rows * self.width_bytes
    }

    /// Whether the slice is one range of the file (one row, or rows that touch).
    pub fn is_contiguous(&self) -> bool {
        self.rows <= 1 || self.width_bytes == self.stride_bytes
    }

    /// The file range from the first byte of the first row to the last byte of the last row.
    pub fn covering(&self) -> std::ops::Range<u64> {
        if self.rows == 0 || self.width_bytes == 0 {
            return self.offset_bytes..self.offset_bytes;
        }
        // Cannot overflow: inside the tensor's checked file range.
        self.offset_bytes..self.offset_bytes + (self.rows - 1) * self.stride_bytes + self.width_bytes
    }
}

impl TensorInfo {
    /// The tensor narrowed by `slice`: its shape with `slice.len` at `slice.dim`, and where its
    /// bytes are. The returned info's `offset_bytes` is the slice's first byte and its `len_bytes`
    /// the slice's bytes; they are one range of the file only when the layout
    /// [is contiguous](SliceLayout::is_contiguous).
    ///
    /// ```
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.safetensors");
    /// let ckpt = tensora_format::open(path)?;
    /// let t = ckpt.tensors().iter().find(|t| t.shape().len() == 2).unwrap();
    /// let (rows, cols) = (t.shape()[0], t.shape()[1]);
    /// let slice = tensora_format::Slice { dim: 1, start: 1, len: cols - 1 };
    /// let (narrow, layout) = t.sliced(slice)?;
    /// assert_eq!(narrow.shape(), &[rows, cols - 1]);
    /// assert_eq!(layout.rows, rows);
    /// let past = tensora_format::Slice { dim: 0, start: rows, len: 1 };
    /// assert!(t.sliced(past).unwrap_err().to_string().contains(t.name()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sliced(&self, slice: Slice) -> Result<(TensorInfo, SliceLayout), SliceError> {
        let tensor = || self.name().to_owned();
        let shape = self.shape();
        let Slice { dim, start, len } = slice;
        let Some(&size) = shape.get(dim) else {
            return Err(SliceError::Dim { tensor: tensor(), dim, rank: shape.len() });
        };
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(SliceError::Range { tensor: tensor(), dim, start, len, size });
        }
        if self.strides().is_some() {
            return Err(SliceError::Strided { tensor: tensor() });
        }
        // Products of a checked shape's dimensions cannot overflow: numel × bits fits in u64.
        let outer: u64 = shape[..dim].iter().product();
        let inner_bits: u64 = shape[dim + 1..].iter().product::<u64>() * u64::from(self.dtype().bits());
        let (width_bits, start_bits, stride_bits) = (len * inner_bits, start * inner_bits, size * inner_bits);
        if !(width_bits.is_multiple_of(8) && start_bits.is_multiple_of(8) && stride_bits.is_multiple_of(8)) {
            return Err(SliceError::SubByte { tensor: tensor(), dim, dtype: self.dtype().as_str() });
        }
        let rows = if width_bits == 0 { 0 } else { outer };
        let layout = SliceLayout {
            offset_bytes: self.offset_bytes() + start_bits / 8,
            rows,
            width_bytes: width_bits / 8,
            stride_bytes: stride_bits / 8,
        };
        let mut dims = shape.to_vec();
        dims[dim] = len;
        let range = (self.file(), layout.offset_bytes, layout.len_bytes());
        let info = TensorInfo::owned(self.name(), self.dtype(), &dims, None, range);
        Ok((info, layout))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{Dtype, FileId};

    fn tensor(shape: &[u64], dtype: Dtype, offset_bytes: u64) -> TensorInfo {
        let numel: u64 = shape.iter().product();
        let len = numel * u64::from(dtype.bits()) / 8;
        TensorInfo::owned("w", dtype, shape, None, (FileId(0), offset_bytes, len))
    }

    #[test]
    fn out_of_range_slices_are_typed_errors_naming_the_tensor() {
        let t = tensor(&[4, 6], Dtype::F16, 0);
        let e = t.sliced(Slice { dim: 2, start: 0, len: 1 }).unwrap_err();
        assert_eq!(e, SliceError::Dim { tensor: "w".into(), dim: 2, rank: 2 });
        let e = t.sliced(Slice { dim: 1, start: 5, len: 2 }).unwrap_err();
        assert_eq!(e, SliceError::Range { tensor: "w".into(), dim: 1, start: 5, len: 2, size: 6 });
        let e = t.sliced(Slice { dim: 0, start: u64::MAX, len: 2 }).unwrap_err();
        assert!(matches!(e, SliceError::Range { .. }), "{e}");
        let scalar = tensor(&[], Dtype::F32, 0);
        assert!(matches!(scalar.sliced(Slice { dim: 0, start: 0, len: 0 }), Err(SliceError::Dim { .. })));
        let f4 = tensor(&[4, 3], Dtype::F4, 0);
        assert!(matches!(f4.sliced(Slice { dim: 1, start: 0, len: 1 }), Err(SliceError::SubByte { .. })));
        assert!(f4.sliced(Slice { dim: 0, start: 2, len: 2 }).is_ok());
        let strided = TensorInfo::owned("v", Dtype::F32, &[2, 2], Some(&[1, 2]), (FileId(0), 0, 16));
        assert!(matches!(
            strided.sliced(Slice { dim: 0, start: 0, len: 1 }),
            Err(SliceError::Strided { .. })
        ));
    }

    #[test]
    fn dim_zero_is_one_range_and_inner_dims_are_strided() {
        let t = tensor(&[4, 6], Dtype::F16, 100);
        let (n, l) = t.sliced(Slice { dim: 0, start: 1, len: 2 }).unwrap();
        assert_eq!((n.shape(), n.offset_bytes(), n.len_bytes()), (&[2u64, 6][..], 112, 24));
        assert!(l.is_contiguous());
        assert_eq!(l.covering(), 112..136);
        let (n, l) = t.sliced(Slice { dim: 1, start: 2, len: 3 }).unwrap();
        assert_eq!(n.shape(), &[4, 3]);
        assert_eq!(l, SliceLayout { offset_bytes: 104, rows: 4, width_bytes: 6, stride_bytes: 12 });
        assert!(!l.is_contiguous());
        assert_eq!(l.covering(), 104..146);
        let (_, l) = t.sliced(Slice { dim: 1, start: 2, len: 0 }).unwrap();
        assert_eq!((l.rows, l.len_bytes(), l.covering()), (0, 0, 104..104));
    }

    proptest! {
        /// The layout's ranges are exactly the bytes of the elements `narrow` keeps, in order.
        #[test]
        fn layout_ranges_are_the_narrowed_elements(
            shape in prop::collection::vec(0u64..5, 1..4),
            elem_bytes in prop::sample::select(vec![1u64, 2, 4, 8]),
            pick in any::<(prop::sample::Index, u64, u64)>(),
        ) {
            let dtype = match elem_bytes { 1 => Dtype::U8, 2 => Dtype::BF16, 4 => Dtype::F32, _ => Dtype::F64 };
            let dim = pick.0.index(shape.len());
            let size = shape[dim];
            let start = pick.1 % (size + 1);
            let len = pick.2 % (size - start + 1);
            let t = tensor(&shape, dtype, 64);
            let (narrow, layout) = t.sliced(Slice { dim, start, len }).unwrap();
            // Element byte offsets kept by narrow, by brute force over every index.
            let numel: u64 = shape.iter().product();
            let mut expect = Vec::new();
            for flat in 0..numel {
                let mut rest = flat;
                let mut index = vec![0u64; shape.len()];
                for d in (0..shape.len()).rev() {
                    index[d] = rest % shape[d];
                    rest /= shape[d];
                }
                if (start..start + len).contains(&index[dim]) {
                    expect.extend((0..elem_bytes).map(|b| 64 + flat * elem_bytes + b));
                }
            }
            let got: Vec<u64> = (0..layout.rows)
                .flat_map(|r| {
                    let first = layout.offset_bytes + r * layout.stride_bytes;
                    first..first + layout.width_bytes
                })
                .collect();
            prop_assert_eq!(&got, &expect);
            prop_assert_eq!(narrow.len_bytes(), expect.len() as u64);
            prop_assert_eq!(narrow.nbytes(), expect.len() as u64);
            let cover = layout.covering();
            prop_assert!(expect.iter().all(|b| cover.contains(b)));
        }
    }
}
