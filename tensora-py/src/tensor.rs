//! [`TensorData`]: one tensor's memory handed to Python, through the buffer protocol (writable)
//! and DLPack, zero copy.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::dlpack;
use crate::exc::{DtypeError, LoadError};
use crate::owner::{Placement, TensorBytes};

/// One tensor's memory, exported to Python through the buffer protocol (writable) and DLPack.
/// Its address is always a multiple of its dtype's alignment ([`TensorData::export`]).
#[pyclass(module = "tensora._native", frozen)]
#[derive(Debug)]
pub struct TensorData {
    pub(crate) t: TensorBytes,
    placement: Placement,
}

impl TensorData {
    /// The one way to hand a tensor to Python: zero copy when its address suits its dtype,
    /// else an aligned copy ([`TensorBytes::into_aligned`]); a copy that finds no memory is a
    /// `tensora.LoadError`.
    pub fn export(t: TensorBytes) -> PyResult<TensorData> {
        let (t, placement) = t.into_aligned().map_err(|e| LoadError::new_err(e.to_string()))?;
        Ok(TensorData { t, placement })
    }

    /// Where the bytes are: in the load's memory, or an aligned copy.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The exported bytes.
    pub fn into_bytes(self) -> TensorBytes {
        self.t
    }
}

/// How many exported tensors were aligned copies ([`Placement::AlignedCopy`]) and their bytes;
/// shared by the threads of one load or stream.
#[derive(Debug, Default)]
pub struct CopyTally {
    tensors: AtomicU64,
    bytes: AtomicU64,
}

impl CopyTally {
    /// Count `d` if it is an aligned copy.
    pub fn note(&self, d: &TensorData) {
        if d.placement == Placement::AlignedCopy {
            self.tensors.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(d.t.len_bytes as u64, Ordering::Relaxed);
        }
    }

    /// `(tensors, bytes)` copied so far.
    pub fn get(&self) -> (u64, u64) {
        (self.tensors.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed))
    }

    /// The report field: `{"tensors": n, "bytes": b}`.
    pub fn to_json(&self) -> serde_json::Value {
        let (tensors, bytes) = self.get();
        serde_json::json!({ "tensors": tensors, "bytes": bytes })
    }
}

#[pymethods]
impl TensorData {
    #[getter]
    fn name(&self) -> &str {
        &self.t.name
    }
    /// The safetensors dtype name (`"F16"`, `"BF16"`, `"F8_E4M3"`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.t.dtype.as_str()
    }
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.t.shape.clone()
    }
    /// Strides in elements when the format records them (ServerlessLLM), else `None`.
    #[getter]
    fn strides(&self) -> Option<Vec<u64>> {
        self.t.strides.clone()
    }
    #[getter]
    fn nbytes(&self) -> usize {
        self.t.len_bytes
    }
    /// Whether the bytes were copied into aligned memory (the tensor's file offset is not a
    /// multiple of its element size) instead of being a zero-copy view.
    #[getter]
    fn aligned_copy(&self) -> bool {
        self.placement == Placement::AlignedCopy
    }

    /// # Safety
    /// Called by Python with a valid `view`.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let t = &slf.get().t;
        let len = isize::try_from(t.len_bytes).map_err(|_| PyValueError::new_err("tensor too large"))?;
        // SAFETY: `view` is valid (the caller's contract). The range `addr .. addr + len` lies in
        // memory kept alive by `t.owner`, which `view.obj` (a new reference to `slf`, set by
        // `PyBuffer_FillInfo`) keeps alive until the buffer is released. The memory is writable
        // and the address was derived from a mutable pointer (`Loaded::tensor_mut_ptr`, a
        // copy-on-write `MmapMut`, or a heap box): an anonymous arena or a MAP_PRIVATE mapping,
        // which Rust never reads through a live reference while Python holds the buffer.
        let rc = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), t.addr as *mut c_void, len, 0, flags) };
        if rc != 0 { Err(PyErr::fetch(slf.py())) } else { Ok(()) }
    }

    /// DLPack export (legacy, unversioned capsule: accepted by every consumer). CPU only.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        if dl_device.is_some_and(|d| d.0 != dlpack::DEVICE_CPU) {
            return Err(pyo3::exceptions::PyBufferError::new_err("tensora tensors live on the CPU"));
        }
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "copy=True is not supported; copy after import",
            ));
        }
        let managed = dlpack::ManagedTensor::new(&self.t).map_err(|e| DtypeError::new_err(e.to_string()))?;
        let raw = managed.into_raw();
        // SAFETY: `raw` is a live managed tensor; on success the capsule owns it and its destructor
        // deletes it unless a consumer renamed the capsule (took ownership).
        let capsule = unsafe {
            ffi::PyCapsule_New(
                raw.cast::<c_void>(),
                dlpack::CAPSULE_NAME.as_ptr(),
                Some(dlpack::capsule_destructor),
            )
        };
        if capsule.is_null() {
            // SAFETY: the capsule was not created, so `raw` is still ours to delete, once.
            unsafe { drop_managed(raw) };
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `capsule` is a new, non-null reference.
        Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::DEVICE_CPU, 0)
    }

    fn __repr__(&self) -> String {
        format!("TensorData(name={:?}, dtype={}, shape={:?})", self.t.name, self.t.dtype, self.t.shape)
    }
}

/// Delete a managed tensor that was never handed to a capsule.
///
/// # Safety
/// `raw` must come from `ManagedTensor::into_raw` and not have been deleted.
unsafe fn drop_managed(raw: *mut dlpack::DLManagedTensor) {
    // SAFETY: per the contract.
    unsafe {
        if let Some(d) = (*raw).deleter {
            d(raw);
        }
    }
}
