//! The load report: which backend ran and why, and where the time went.

use serde::Serialize;
// The counters are OS facts (tensora-sys); the load paths reach them through the report they fill.
pub(crate) use tensora_sys::{Faults, peak_rss_bytes};

/// Seconds spent in each phase of a load.
///
/// - `open`: opening files, `fstat`, sparse checks and the facts `auto` reads;
/// - `parse`: reading headers (0 for [`crate::load()`], which is given a parsed checkpoint;
///   [`crate::load_path`] fills it);
/// - `plan`: resolving the selection and building the plan(s);
/// - `io`: allocating the arena and running the backend (including `on_tensor` hooks and, when
///   streaming, the callback);
/// - `finish`: the closing `fstat` checks and assembling the result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Phases {
    /// Seconds opening files and reading the facts `auto` decides from.
    pub open: f64,
    /// Seconds reading headers and indexes.
    pub parse: f64,
    /// Seconds selecting and planning.
    pub plan: f64,
    /// Seconds allocating and reading (hooks and callbacks included).
    pub io: f64,
    /// Seconds of the closing checks and assembling the result.
    pub finish: f64,
}

/// What one load did. Serialised by `tensora load --json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoadReport {
    /// The backend that ran (`"sync"`, `"mmap"`, `"io-uring"`, `"async"` or a custom name).
    pub backend: String,
    /// One line naming the facts that decided the residence and the backend.
    pub reason: String,
    /// Where the tensors live: `"owned"` (a hugepage arena) or `"mapped"` (views of the files).
    pub residence: String,
    /// `"buffered"`, `"direct"` or `"mapped"`.
    pub io_mode: String,
    /// Bytes of the selected tensors.
    pub bytes_selected: u64,
    /// Bytes actually read (coalesced gaps and alignment included).
    pub bytes_read: u64,
    /// Bytes of the gaps between reads that the device was asked to read along with them (a cold
    /// load through the page cache: the read-ahead helper advises a read from the end of the one
    /// before when the gap costs the device less than one more request, `Reading::ReadAhead`'s cost;
    /// a cold strided slice's rows then cost the device its covering range). Not in `bytes_read`,
    /// which counts what was copied; 0 for warm, direct and mapped loads and where no helper runs.
    /// What the helper advised: a read the workers reach before the helper is not advised, nor
    /// counted.
    pub bytes_advised_beyond_reads: u64,
    /// Wall time of the whole load (sum of the phases).
    pub seconds: f64,
    /// `bytes_selected / seconds / 1e9`.
    pub gbps: f64,
    /// Where the seconds went.
    pub phases: Phases,
    /// Highest bytes in flight at once, as measured by the backend.
    pub peak_inflight_bytes: u64,
    /// Transient errors retried.
    pub retries: u64,
    /// Reads that fell back from O_DIRECT to buffered.
    pub direct_fallbacks: u64,
    /// Minor page faults of this process during the load (`getrusage`).
    pub minor_faults: u64,
    /// Major page faults of this process during the load.
    pub major_faults: u64,
    /// Peak resident set of the process so far (`VmHWM`), in bytes; 0 if unknown.
    pub peak_rss_bytes: u64,
    /// Tensors delivered.
    pub tensors: usize,
    /// Files the selection touched.
    pub files: usize,
    /// Backend runs (1 for an owned load; one per window when streaming).
    pub windows: usize,
    /// How a sharded load read its slices (all zero for any other load).
    pub slices: SliceCounts,
    /// What a load with [`LoadOptions::dtype`](crate::LoadOptions::dtype) converted; `None`
    /// without a cast.
    pub cast: Option<CastReport>,
}

/// How many tensors of a sharded load ([`LoadOptions::shard`](crate::LoadOptions::shard)) were
/// read each way; `bytes_selected` counts the slices' bytes and `bytes_read` what was read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SliceCounts {
    /// Tensors read as one range: whole (replicated) or sliced along an outer dimension.
    pub contiguous: usize,
    /// Slices of an inner dimension read row run by row run.
    pub strided: usize,
    /// Slices of an inner dimension read as one covering range and packed in memory.
    pub covering: usize,
    /// Of `contiguous`, the slices of an inner dimension (zero-copy only when outer dims are 1).
    pub inner_contiguous: usize,
}

impl SliceCounts {
    /// Counts one tensor read as `kind`; `inner` when its slice is rows of an inner dimension.
    pub(crate) fn add(&mut self, kind: tensora_plan::SliceKind, inner: bool) {
        match kind {
            tensora_plan::SliceKind::Contiguous => {
                self.contiguous += 1;
                self.inner_contiguous += usize::from(inner);
            }
            tensora_plan::SliceKind::Strided => self.strided += 1,
            tensora_plan::SliceKind::Covering => self.covering += 1,
        }
    }
}

/// What a cast load converted, and the time it took (see [`convert`](crate::convert)).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CastReport {
    /// The dtype floating-point tensors were delivered in (`"BF16"`, ...).
    pub to: String,
    /// The instruction set the kernels ran with (`"avx512"`, `"avx2"` or `"scalar"`).
    pub simd: String,
    /// The tensors converted: name and stored dtype, in delivery order.
    pub tensors: Vec<CastTensor>,
    /// Tensors delivered as stored (integer or boolean, or stored in the target dtype already).
    pub kept: usize,
    /// Stored bytes of the converted tensors.
    pub bytes_in: u64,
    /// Bytes of the converted tensors at the target dtype.
    pub bytes_out: u64,
    /// Seconds the workers spent converting, summed over workers.
    pub seconds: f64,
    /// The bound on the staging window the stored bytes land in before conversion (a tensor
    /// larger than it gets a window of its own size).
    pub staging_bytes: u64,
}

/// One converted tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CastTensor {
    /// Its name.
    pub name: String,
    /// Its stored dtype (safetensors spelling).
    pub from: String,
}

impl LoadReport {
    /// Set `seconds` from the phases and `gbps` from `bytes_selected`.
    pub fn finalize(&mut self) {
        let p = self.phases;
        self.seconds = p.open + p.parse + p.plan + p.io + p.finish;
        self.gbps = if self.seconds > 0.0 { self.bytes_selected as f64 / self.seconds / 1e9 } else { 0.0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalize_sums_phases_and_rates() {
        let mut r = LoadReport { bytes_selected: 2_000_000_000, ..LoadReport::default() };
        r.phases = Phases { open: 0.25, parse: 0.25, plan: 0.0, io: 0.5, finish: 0.0 };
        r.finalize();
        assert_eq!(r.seconds, 1.0);
        assert_eq!(r.gbps, 2.0);
        let json = serde_json::to_value(&r).unwrap();
        for key in [
            "backend",
            "reason",
            "bytes_selected",
            "bytes_read",
            "bytes_advised_beyond_reads",
            "seconds",
            "gbps",
            "phases",
            "peak_inflight_bytes",
            "retries",
            "minor_faults",
            "major_faults",
            "peak_rss_bytes",
            "tensors",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
        let mut empty = LoadReport::default();
        empty.finalize();
        assert_eq!(empty.gbps, 0.0);
    }
}
