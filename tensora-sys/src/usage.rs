//! What this process has used so far: page faults (`getrusage`) and its peak resident set
//! (`VmHWM`), the counters behind every load's and save's report.

/// Page-fault counters of this process (`getrusage(RUSAGE_SELF)`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Faults served without I/O.
    pub minor: u64,
    /// Faults that waited for I/O.
    pub major: u64,
}

impl Faults {
    /// Current counters; zeros if `getrusage` fails.
    ///
    /// ```
    /// let before = tensora_sys::Faults::now();
    /// let touched = vec![1u8; 1 << 20];
    /// assert_eq!(touched.len(), 1 << 20);
    /// let since = tensora_sys::Faults::now().since(before);
    /// assert!(since.minor >= since.major);
    /// ```
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
