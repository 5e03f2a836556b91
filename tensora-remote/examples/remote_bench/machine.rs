//! What the machine did during one measured run, so that a slow run in a cell says why: where
//! the memory it faulted in came from, how the CPUs spent the run, and how many TCP segments were
//! sent again.
//!
//! On the 2-core reference VM a cell's runs differ by up to 3× (the `runs (s)` column), for
//! reasons outside the loader that these counters tell apart: an arena whose huge pages faulted
//! in slowly gives them up for base pages (hundreds of thousands of 4 KiB faults instead of one
//! per 2 MiB); a run whose memory the host had taken back spends its time in the kernel (system
//! time two to three times a fast run's, for the same bytes); and on loopback, a receiver that
//! falls behind makes the sender probe and resend (TCP loss probes answered by duplicate
//! acknowledgements), which costs both sides copies.
//!
//! All counters are machine-wide (`/proc/vmstat`, `/proc/stat`, `/proc/net/snmp`): nginx's work
//! counts too, as it competes for the same two cores. Zero where a file is missing.

/// Counter readings at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    /// Page faults that got a 2 MiB page (`thp_fault_alloc`).
    huge_faults: u64,
    /// All page faults (`pgfault`), huge ones included.
    faults: u64,
    /// CPU time of every core, in clock ticks: all states, kernel (system, irq, softirq), idle.
    cpu_ticks: u64,
    kernel_ticks: u64,
    idle_ticks: u64,
    /// TCP segments sent again (`RetransSegs`).
    retransmitted: u64,
}

impl Counters {
    pub fn now() -> Counters {
        let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        let vm = |name: &str| {
            vmstat
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
                .unwrap_or(0)
        };
        // The first line of /proc/stat: "cpu user nice system idle iowait irq softirq steal ...".
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("cpu "))
            .map(|l| l.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect())
            .unwrap_or_default();
        let tick = |i: usize| ticks.get(i).copied().unwrap_or(0);
        Counters {
            huge_faults: vm("thp_fault_alloc"),
            faults: vm("pgfault"),
            // user, nice, system, idle, iowait, irq, softirq, steal (guest time is within user).
            cpu_ticks: (0..8).map(tick).sum(),
            kernel_ticks: tick(2) + tick(5) + tick(6),
            idle_ticks: tick(3) + tick(4),
            retransmitted: snmp("Tcp:", "RetransSegs"),
        }
    }

    /// What happened since `earlier`, as a note for the report.
    pub fn since(&self, earlier: &Counters) -> String {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        let huge = d(self.huge_faults, earlier.huge_faults);
        let faults = d(self.faults, earlier.faults);
        let cpu = d(self.cpu_ticks, earlier.cpu_ticks).max(1) as f64;
        let share = |now: u64, then: u64| d(now, then) as f64 / cpu * 100.0;
        format!(
            "{huge} 2 MiB and {} other page faults, CPU {:.0} % kernel and {:.0} % idle, {} TCP segments resent",
            faults.saturating_sub(huge),
            share(self.kernel_ticks, earlier.kernel_ticks),
            share(self.idle_ticks, earlier.idle_ticks),
            d(self.retransmitted, earlier.retransmitted)
        )
    }
}

/// One counter of `/proc/net/snmp`, whose lines come in pairs: `Tcp: Name ...` then `Tcp: 1 ...`.
fn snmp(prefix: &str, name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else { return 0 };
    let at = names.split_whitespace().position(|n| n == name);
    at.and_then(|i| values.split_whitespace().nth(i)?.parse().ok()).unwrap_or(0)
}
