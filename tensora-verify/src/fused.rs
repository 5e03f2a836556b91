//! Digests fused into a load: computed by the `tensora_io` worker that completed each tensor, while
//! its bytes are still hot in cache, in parallel across tensors, with no second pass over memory.
//!
//! [`DigestCollector::hook`] is a [`TensorHook`] for [`LoadOptions::on_tensor`]; each call digests
//! one tensor's first `nbytes` bytes and stores the result in that tensor's slot. Slots are
//! write-once ([`OnceLock`]), so workers never contend on a lock.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use tensora_format::Checkpoint;
use tensora_io::{BackendChoice, LoadOptions, LoadReport, TensorHook, TensorRef};

use crate::check::BackendDigests;
use crate::digest::{Algo, Digest};
use crate::hash::HashError;

/// Collects one digest per tensor from load workers.
#[derive(Debug)]
pub struct DigestCollector {
    algo: Algo,
    index: HashMap<String, usize>,
    slots: Vec<OnceLock<Digest>>,
}

impl DigestCollector {
    /// A collector for every tensor of `ckpt`.
    pub fn new(ckpt: &Checkpoint, algo: Algo) -> Arc<DigestCollector> {
        let index = ckpt.tensors().iter().enumerate().map(|(i, t)| (t.name().to_owned(), i)).collect();
        let slots = (0..ckpt.tensors().len()).map(|_| OnceLock::new()).collect();
        Arc::new(DigestCollector { algo, index, slots })
    }

    pub fn algo(&self) -> Algo {
        self.algo
    }

    /// Digest one completed tensor: its first `nbytes` bytes (a ServerlessLLM tensor's storage may
    /// be longer). With strides that are not row-major some elements lie past those bytes; the
    /// digest keeps this definition and `verify` warns about such tensors
    /// ([`crate::check::FindingKind::Strided`]). Errors if the tensor is unknown or arrives twice
    /// with a different digest.
    pub fn record(&self, t: &TensorRef<'_>) -> Result<(), tensora_io::BoxError> {
        let i = *self
            .index
            .get(t.name())
            .ok_or_else(|| format!("tensor {:?} is not in the checkpoint", t.name()))?;
        let nbytes =
            usize::try_from(t.info().nbytes()).map_err(|_| "tensor larger than the address space")?;
        let bytes = t.bytes();
        let data = bytes.get(..nbytes).ok_or_else(|| {
            format!("tensor {:?}: {} bytes delivered, {nbytes} needed", t.name(), bytes.len())
        })?;
        let d = self.algo.digest(data);
        match self.slots[i].set(d) {
            Ok(()) => Ok(()),
            Err(_) if self.slots[i].get() == Some(&d) => Ok(()),
            Err(_) => Err(format!("tensor {:?} delivered twice with different bytes", t.name()).into()),
        }
    }

    /// A hook for [`LoadOptions::on_tensor`] that calls [`DigestCollector::record`].
    pub fn hook(self: &Arc<Self>) -> TensorHook {
        let me = Arc::clone(self);
        Arc::new(move |t: &TensorRef<'_>| me.record(t))
    }

    /// The digests so far, in [`Checkpoint::tensors`] order (`None` for tensors not yet seen).
    pub fn digests(&self) -> Vec<Option<Digest>> {
        self.slots.iter().map(|s| s.get().copied()).collect()
    }

    /// Every digest, or the first tensor that has none.
    pub fn finish(&self, ckpt: &Checkpoint) -> Result<Vec<Digest>, HashError> {
        ckpt.tensors()
            .iter()
            .zip(&self.slots)
            .map(|(t, s)| {
                s.get().copied().ok_or_else(|| HashError::Incomplete {
                    tensor: t.name().to_owned(),
                    reason: "the load never delivered it".into(),
                })
            })
            .collect()
    }
}

/// Load `ckpt` with `opts` (its `on_tensor` replaced by a digest hook, chained after any hook
/// already there) through [`tensora_io::load_streaming`], so arena space is recycled and memory
/// stays within the load's budget. Returns one digest per tensor and the load report.
pub fn hash_with_load(
    ckpt: &Checkpoint,
    algo: Algo,
    opts: &LoadOptions,
) -> Result<(Vec<Digest>, LoadReport), HashError> {
    let collector = DigestCollector::new(ckpt, algo);
    let digest_hook = collector.hook();
    let hook: TensorHook = match opts.on_tensor.clone() {
        None => digest_hook,
        Some(user) => Arc::new(move |t: &TensorRef<'_>| {
            digest_hook(t)?;
            user(t)
        }),
    };
    let opts = LoadOptions { on_tensor: Some(hook), ..opts.clone() };
    let report = tensora_io::load_streaming(ckpt, &opts, |_| Ok(()))?;
    Ok((collector.finish(ckpt)?, report))
}

/// Load `ckpt` once with every backend of [`tensora_io::registry`] and collect each one's digests
/// (for [`crate::check::VerifyOptions::cross_check`]). A backend that cannot run here is marked
/// unavailable, with its probe's reason.
pub fn cross_check(ckpt: &Checkpoint, algo: Algo) -> Vec<BackendDigests> {
    tensora_io::registry::backends()
        .into_iter()
        .map(|backend| {
            let name = backend.name().to_owned();
            if let Err(reason) = backend.available() {
                return BackendDigests { backend: name, result: Err(reason), unavailable: true };
            }
            let opts = LoadOptions { backend: BackendChoice::Named(name.clone()), ..LoadOptions::default() };
            let result = hash_with_load(ckpt, algo, &opts).map(|(d, _)| d).map_err(|e| e.to_string());
            BackendDigests { backend: name, result, unavailable: false }
        })
        .collect()
}
