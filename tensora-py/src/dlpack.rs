//! DLPack export (the legacy `DLManagedTensor`, which every consumer accepts) of a
//! [`TensorBytes`], plus the small consumer the tests use to read one back.
//!
//! The managed tensor holds an `Arc<Owner>`: memory stays alive until the consumer calls the
//! deleter (torch does so when the last tensor viewing it is freed).

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use tensora_format::Dtype;

use crate::owner::{Owner, TensorBytes};

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// The capsule name of an unconsumed legacy DLPack tensor.
pub const CAPSULE_NAME: &CStr = c"dltensor";
/// The name a consumer gives the capsule once it owns the tensor.
pub const CAPSULE_NAME_USED: &CStr = c"used_dltensor";

/// `DLDataTypeCode` values (dlpack.h).
pub mod code {
    /// Signed integers.
    pub const INT: u8 = 0;
    /// Unsigned integers.
    pub const UINT: u8 = 1;
    /// IEEE floats.
    pub const FLOAT: u8 = 2;
    /// bfloat16.
    pub const BFLOAT: u8 = 4;
    /// Complex (pairs of floats).
    pub const COMPLEX: u8 = 5;
    /// Booleans.
    pub const BOOL: u8 = 6;
    /// fp8 e4m3, finite only.
    pub const FLOAT8_E4M3FN: u8 = 10;
    /// fp8 e4m3, finite only, unsigned zero.
    pub const FLOAT8_E4M3FNUZ: u8 = 11;
    /// fp8 e5m2.
    pub const FLOAT8_E5M2: u8 = 12;
    /// fp8 e5m2, finite only, unsigned zero.
    pub const FLOAT8_E5M2FNUZ: u8 = 13;
    /// fp8 e8m0 (exponent only, unsigned), for block scales.
    pub const FLOAT8_E8M0FNU: u8 = 14;
}

/// `DLDevice` (dlpack.h): where the data lives.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// `kDLCPU` ([`DEVICE_CPU`]) for every tensor exported here.
    pub device_type: i32,
    /// The device index (0 on the CPU).
    pub device_id: i32,
}

/// `DLDataType` (dlpack.h): the element type.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// A [`code`] value.
    pub code: u8,
    /// Bits per element.
    pub bits: u8,
    /// Vector lanes (always 1 here).
    pub lanes: u16,
}

/// `DLTensor` (dlpack.h): a view of memory with shape and strides.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// The first byte.
    pub data: *mut c_void,
    /// Where `data` lives.
    pub device: DLDevice,
    /// Rank.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or null for row-major.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor` (dlpack.h): a [`DLTensor`] plus what keeps its memory alive.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The view.
    pub dl_tensor: DLTensor,
    /// The producer's context (here: the owner and the shape/strides arrays).
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done with the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What the managed tensor keeps alive: the owner and the shape/strides arrays it points into.
struct Context {
    _owner: Arc<Owner>,
    _shape: Box<[i64]>,
    _strides: Box<[i64]>,
}

/// Why a tensor cannot be exported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// The dtype has no DLPack element type (sub-byte formats).
    #[error("tensor {tensor:?}: dtype {dtype} has no DLPack equivalent a framework can import")]
    Dtype {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
    },
    /// The shape does not fit DLPack's `int64` fields.
    #[error("tensor {tensor:?}: rank {rank} or a dimension does not fit DLPack's int64 fields")]
    Shape {
        /// The tensor.
        tensor: String,
        /// Its rank.
        rank: usize,
    },
}

/// The DLPack element type of a dtype; `None` for sub-byte formats (F4, F6) that no framework
/// imports element-wise.
pub fn dl_dtype(dtype: Dtype) -> Option<DLDataType> {
    let (c, bits) = match dtype {
        Dtype::Bool => (code::BOOL, 8),
        Dtype::U8 => (code::UINT, 8),
        Dtype::I8 => (code::INT, 8),
        Dtype::U16 => (code::UINT, 16),
        Dtype::I16 => (code::INT, 16),
        Dtype::F16 => (code::FLOAT, 16),
        Dtype::BF16 => (code::BFLOAT, 16),
        Dtype::U32 => (code::UINT, 32),
        Dtype::I32 => (code::INT, 32),
        Dtype::F32 => (code::FLOAT, 32),
        Dtype::U64 => (code::UINT, 64),
        Dtype::I64 => (code::INT, 64),
        Dtype::F64 => (code::FLOAT, 64),
        Dtype::C64 => (code::COMPLEX, 64),
        Dtype::F8E5M2 => (code::FLOAT8_E5M2, 8),
        Dtype::F8E4M3 => (code::FLOAT8_E4M3FN, 8),
        Dtype::F8E8M0 => (code::FLOAT8_E8M0FNU, 8),
        Dtype::F8E4M3Fnuz => (code::FLOAT8_E4M3FNUZ, 8),
        Dtype::F8E5M2Fnuz => (code::FLOAT8_E5M2FNUZ, 8),
        Dtype::F4 | Dtype::F6E2M3 | Dtype::F6E3M2 => return None,
    };
    Some(DLDataType { code: c, bits, lanes: 1 })
}

/// Row-major strides (in elements) of `shape`, or `None` on overflow.
fn row_major_strides(shape: &[u64]) -> Option<Vec<u64>> {
    let mut strides = vec![0u64; shape.len()];
    let mut acc = 1u64;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.checked_mul(d.max(1))?;
    }
    Some(strides)
}

/// A managed tensor owned by Rust until handed out with [`ManagedTensor::into_raw`]; dropping it
/// runs the deleter.
#[derive(Debug)]
pub struct ManagedTensor(*mut DLManagedTensor);

impl ManagedTensor {
    /// Export `t` (zero copy: the data pointer is `t.addr`).
    pub fn new(t: &TensorBytes) -> Result<ManagedTensor, ExportError> {
        let dtype =
            dl_dtype(t.dtype).ok_or_else(|| ExportError::Dtype { tensor: t.name.clone(), dtype: t.dtype })?;
        let shape_err = || ExportError::Shape { tensor: t.name.clone(), rank: t.shape.len() };
        let strides = match &t.strides {
            Some(s) => s.clone(),
            None => row_major_strides(&t.shape).ok_or_else(shape_err)?,
        };
        let to_i64 = |v: &[u64]| v.iter().map(|&x| i64::try_from(x).ok()).collect::<Option<Box<[i64]>>>();
        let mut shape = to_i64(&t.shape).ok_or_else(shape_err)?;
        let mut strides = to_i64(&strides).ok_or_else(shape_err)?;
        let ndim = i32::try_from(shape.len()).map_err(|_| shape_err())?;
        let tensor = DLTensor {
            data: t.addr as *mut c_void,
            device: DLDevice { device_type: DEVICE_CPU, device_id: 0 },
            ndim,
            dtype,
            shape: shape.as_mut_ptr(),
            strides: strides.as_mut_ptr(),
            byte_offset: 0,
        };
        let ctx = Box::new(Context { _owner: Arc::clone(&t.owner), _shape: shape, _strides: strides });
        let managed = Box::new(DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: Box::into_raw(ctx).cast::<c_void>(),
            deleter: Some(delete_managed),
        });
        Ok(ManagedTensor(Box::into_raw(managed)))
    }

    /// The raw pointer, now owned by whoever calls its deleter.
    pub fn into_raw(self) -> *mut DLManagedTensor {
        let p = self.0;
        std::mem::forget(self);
        p
    }

    /// Read the tensor back as a consumer would.
    pub fn view(&self) -> Consumed {
        // SAFETY: `self.0` came from `Box::into_raw` in `new` and is freed only by the deleter,
        // which runs in `Drop` (after the last use of `&self`).
        unsafe { Consumed::read(self.0) }
    }
}

impl Drop for ManagedTensor {
    fn drop(&mut self) {
        // SAFETY: the tensor was never handed out (`into_raw` forgets `self`), so this is its
        // one and only deleter call.
        unsafe { delete_managed(self.0) }
    }
}

/// The deleter: frees the context (dropping its `Arc<Owner>`) and the managed tensor.
///
/// # Safety
/// `m` must come from [`ManagedTensor::new`] and not have been deleted yet.
unsafe extern "C" fn delete_managed(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: per the contract, `m` and its context are the boxes made in `new`, freed only here.
    unsafe {
        let managed = Box::from_raw(m);
        drop(Box::from_raw(managed.manager_ctx.cast::<Context>()));
    }
}

/// What a consumer reads from a `DLTensor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    /// The data address.
    pub data: usize,
    /// The device.
    pub device: DLDevice,
    /// The element type.
    pub dtype: DLDataType,
    /// The extents.
    pub shape: Vec<i64>,
    /// The strides in elements (row-major ones when the tensor gave none).
    pub strides: Vec<i64>,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

impl Consumed {
    /// Copy out the fields of a managed tensor.
    ///
    /// # Safety
    /// `m` must point to a live `DLManagedTensor` whose shape (and strides, when not null) hold
    /// `ndim` elements.
    pub unsafe fn read(m: *const DLManagedTensor) -> Consumed {
        // SAFETY: per the contract, `m` is live and its arrays hold `ndim` elements.
        unsafe {
            let t = &(*m).dl_tensor;
            let ndim = usize::try_from(t.ndim).unwrap_or(0);
            let shape = std::slice::from_raw_parts(t.shape, ndim).to_vec();
            let strides = if t.strides.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(t.strides, ndim).to_vec()
            };
            Consumed {
                data: t.data as usize,
                device: t.device,
                dtype: t.dtype,
                shape,
                strides,
                byte_offset: t.byte_offset,
            }
        }
    }
}

/// The capsule destructor: deletes the tensor unless a consumer took it (renamed the capsule).
///
/// # Safety
/// Called by Python with the GIL held on a capsule made by [`crate::owner`]'s `__dlpack__`.
pub unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: Python passes a live capsule; `PyCapsule_IsValid` checks the name before the
    // pointer is read, and an unconsumed capsule still owns the tensor made by `into_raw`.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let m = pyo3::ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr()).cast::<DLManagedTensor>();
            if let Some(deleter) = m.as_ref().and_then(|m| m.deleter) {
                deleter(m);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::{Storage, TEST_LOCK, owners_live};
    use proptest::prelude::*;

    fn tensor(dtype: Dtype, shape: &[u64], strides: Option<Vec<u64>>) -> TensorBytes {
        let mut words = vec![0u64; 4].into_boxed_slice();
        let addr = words.as_mut_ptr() as usize;
        TensorBytes {
            owner: Owner::new(Storage::Heap(words)),
            addr,
            len_bytes: 32,
            name: "t".into(),
            dtype,
            shape: shape.to_vec(),
            strides,
        }
    }

    #[test]
    fn bf16_and_fp8_keep_their_codes_and_shape() {
        let _serial = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let cases = [
            (Dtype::BF16, code::BFLOAT, 16),
            (Dtype::F8E4M3, code::FLOAT8_E4M3FN, 8),
            (Dtype::F8E5M2, code::FLOAT8_E5M2, 8),
            (Dtype::F8E4M3Fnuz, code::FLOAT8_E4M3FNUZ, 8),
            (Dtype::F8E5M2Fnuz, code::FLOAT8_E5M2FNUZ, 8),
            (Dtype::F8E8M0, code::FLOAT8_E8M0FNU, 8),
            (Dtype::F32, code::FLOAT, 32),
            (Dtype::Bool, code::BOOL, 8),
            (Dtype::C64, code::COMPLEX, 64),
        ];
        for (dtype, c, bits) in cases {
            let t = tensor(dtype, &[2, 3], None);
            let m = ManagedTensor::new(&t).expect("exportable");
            let v = m.view();
            assert_eq!(v.dtype, DLDataType { code: c, bits, lanes: 1 }, "{dtype}");
            assert_eq!(v.shape, vec![2, 3]);
            assert_eq!(v.strides, vec![3, 1]);
            assert_eq!(v.data, t.addr);
            assert_eq!(v.device, DLDevice { device_type: DEVICE_CPU, device_id: 0 });
            assert_eq!(v.byte_offset, 0);
        }
    }

    #[test]
    fn deleter_releases_the_owner() {
        let _serial = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let before = owners_live();
        let t = tensor(Dtype::BF16, &[4], None);
        let raw = ManagedTensor::new(&t).expect("exportable").into_raw();
        drop(t);
        assert_eq!(owners_live(), before + 1, "the managed tensor keeps the owner alive");
        // SAFETY: `raw` came from `into_raw` and is deleted exactly once, here.
        unsafe {
            let deleter = (*raw).deleter.expect("set");
            deleter(raw);
        }
        assert_eq!(owners_live(), before);
    }

    #[test]
    fn recorded_strides_pass_through_and_sub_byte_types_are_refused() {
        let _serial = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let t = tensor(Dtype::F16, &[2, 2], Some(vec![1, 2]));
        assert_eq!(ManagedTensor::new(&t).expect("ok").view().strides, vec![1, 2]);
        for d in [Dtype::F4, Dtype::F6E2M3, Dtype::F6E3M2] {
            let err = ManagedTensor::new(&tensor(d, &[2], None)).expect_err("sub-byte");
            assert!(matches!(err, ExportError::Dtype { .. }), "{err}");
        }
        let huge = tensor(Dtype::U8, &[u64::MAX], None);
        assert!(matches!(ManagedTensor::new(&huge), Err(ExportError::Shape { .. })));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn strides_are_row_major(shape in proptest::collection::vec(0u64..6, 0..5)) {
            let strides = row_major_strides(&shape).expect("small");
            for i in 0..shape.len() {
                let expect: u64 = shape[i + 1..].iter().map(|&d| d.max(1)).product();
                prop_assert_eq!(strides[i], expect);
            }
        }
    }
}
