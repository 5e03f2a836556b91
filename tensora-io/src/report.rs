//! The load report: which backend ran and why, and where the time went.

use serde::Serialize;

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
    /// What a load with [`LoadOptions::dtype`](crate::LoadOptions::dtype) converted; `None`
    /// without a cast.
    pub cast: Option<CastReport>,
}

/// What a cast load converted, and the time it took (see [`crate::cast`]).
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

/// Page-fault counters of this process (`getrusage(RUSAGE_SELF)`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Faults {
    /// Faults served without I/O.
    pub minor: u64,
    /// Faults that waited for I/O.
    pub major: u64,
}

impl Faults {
    /// Current counters; zeros if `getrusage` fails.
    pub fn now() -> Faults {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `ru` is a valid out-pointer for a `rusage`.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
        if rc != 0 {
            return Faults::default();
        }
        // SAFETY: getrusage succeeded and filled the (zeroed) struct.
        let ru = unsafe { ru.assume_init() };
        Faults { minor: ru.ru_minflt.max(0) as u64, major: ru.ru_majflt.max(0) as u64 }
    }

    /// Counters accumulated since `earlier`.
    pub fn since(self, earlier: Faults) -> Faults {
        Faults {
            minor: self.minor.saturating_sub(earlier.minor),
            major: self.major.saturating_sub(earlier.major),
        }
    }
}

/// `VmHWM` of this process in bytes (0 where `/proc` is unavailable).
pub fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    parse_vm_hwm(&status).unwrap_or(0)
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
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

    #[test]
    fn vm_hwm_parses_and_faults_move_forward() {
        assert_eq!(parse_vm_hwm("Name:\tx\nVmHWM:\t  1234 kB\nVmRSS: 1 kB\n"), Some(1234 * 1024));
        assert_eq!(parse_vm_hwm("VmRSS: 1 kB\n"), None);
        assert!(peak_rss_bytes() > 0);
        let before = Faults::now();
        let v = vec![1u8; 8 << 20];
        assert_eq!(v.iter().map(|&b| u64::from(b)).sum::<u64>(), 8 << 20);
        assert!(Faults::now().since(before).minor > 0, "touching 8 MiB of fresh memory faults");
        assert_eq!(
            Faults { minor: 1, major: 1 }.since(Faults { minor: 5, major: 0 }),
            Faults { minor: 0, major: 1 }
        );
    }
}
