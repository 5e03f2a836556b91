//! What `cold_fill` reads outside its variants' work: the files' pages in the page cache (how
//! many are resident, dropping them before each variant, the folio census) and the machine's
//! counters (CPU, interrupt time, compaction stalls, free page reporting). See `cold_fill.rs`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use super::{Mapping, PAGE_BYTES, Res, Src};

/// `POSIX_FADV_DONTNEED` passes before the probe drops every clean cache instead.
const EVICT_TRIES_MAX: u32 = 10;
const KPF_COMPOUND_HEAD: u64 = 1 << 15;
const KPF_COMPOUND_TAIL: u64 = 1 << 16;
/// Largest folio order counted apart (2 MiB with 4 KiB pages); larger ones land in the last bucket.
pub(super) const ORDER_MAX: usize = 9;

/// A value of the kernel's free page reporting (`/sys/module/page_reporting/parameters`: knobs
/// and counters of a VM whose balloon reports free blocks to its host); `None` where absent.
pub(super) fn reporting(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/module/page_reporting/parameters/{name}")).ok()?.trim().parse().ok()
}

/// The machine's interrupt and softirq time so far (`/proc/stat`, every CPU): where block I/O
/// completions run, charged to no process.
pub(super) fn irq_seconds() -> Res<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let cpu = stat.lines().next().ok_or("empty /proc/stat")?;
    let f: Vec<u64> = cpu.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>()?;
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((f.get(5).copied().unwrap_or(0) + f.get(6).copied().unwrap_or(0)) as f64 / hz)
}

/// The machine's direct-compaction stalls so far (`/proc/vmstat` `compact_stall`): an allocation
/// of a large folio that had to compact memory first.
pub(super) fn compact_stalls() -> Res<u64> {
    let vmstat = std::fs::read_to_string("/proc/vmstat")?;
    let line =
        vmstat.lines().find(|l| l.starts_with("compact_stall ")).ok_or("no compact_stall in /proc/vmstat")?;
    Ok(line["compact_stall ".len()..].trim().parse()?)
}

pub(super) fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Pages of `file` resident in the page cache (`mincore` over a fresh mapping).
pub(super) fn resident_pages(file: &File, len_bytes: u64) -> Res<u64> {
    let map = Mapping::new(file, len_bytes)?;
    let pages = len_bytes.div_ceil(PAGE_BYTES) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` covers `len_bytes`; `vec` has one byte per page.
    let rc = unsafe { libc::mincore(map.ptr.cast(), map.len_bytes, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(vec.iter().filter(|b| *b & 1 == 1).count() as u64)
}

/// Drops the files' pages; returns how many stayed cached (another process reading the files
/// meanwhile keeps some: the run is then marked).
///
/// Large folios just unmapped can survive a first `POSIX_FADV_DONTNEED` (seen after the
/// `MADV_HUGEPAGE` variants): it is retried [`EVICT_TRIES_MAX`] times, then the machine's clean
/// caches are dropped (`drop_caches`).
pub(super) fn evict(srcs: &[Src]) -> Res<u64> {
    let mut left = 0;
    for tries in 0..=EVICT_TRIES_MAX {
        if tries == EVICT_TRIES_MAX {
            tensora_sys::drop_caches_global()?;
        }
        left = 0;
        for s in srcs {
            let f = File::open(&s.path)?;
            tensora_sys::evict_file_cache(&f)?;
            left += resident_pages(&f, s.len_bytes)?;
        }
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(left)
}

/// Folio census of the cached files: counts of folios per order (0..=ORDER_MAX).
pub(super) fn folio_census(srcs: &[Src]) -> Res<[u64; ORDER_MAX + 1]> {
    let pagemap = File::open("/proc/self/pagemap")?;
    let kflags = File::open("/proc/kpageflags")?;
    let mut orders = [0u64; ORDER_MAX + 1];
    for s in srcs {
        let f = File::open(&s.path)?;
        let map = Mapping::new(&f, s.len_bytes)?;
        map.advise(0, s.len_bytes, libc::MADV_POPULATE_READ)?;
        let pages = s.len_bytes.div_ceil(PAGE_BYTES);
        let first = map.ptr as u64 / PAGE_BYTES;
        let mut entries = vec![0u8; pages as usize * 8];
        pagemap.read_exact_at(&mut entries, first * 8)?;
        let mut run = 0u64;
        let mut close = |run: u64| {
            if run > 0 {
                orders[(run.ilog2() as usize).min(ORDER_MAX)] += 1;
            }
        };
        for e in entries.chunks_exact(8) {
            let e = u64::from_le_bytes(e.try_into()?);
            if e >> 63 == 0 {
                // Not mapped (reclaimed meanwhile): counted as no folio.
                close(run);
                run = 0;
                continue;
            }
            let pfn = e & ((1 << 55) - 1);
            let mut fl = [0u8; 8];
            kflags.read_exact_at(&mut fl, pfn * 8)?;
            let fl = u64::from_le_bytes(fl);
            if fl & KPF_COMPOUND_TAIL != 0 && run > 0 {
                run += 1;
            } else {
                close(run);
                run = 1;
                if fl & KPF_COMPOUND_HEAD == 0 {
                    close(run);
                    run = 0;
                }
            }
        }
        close(run);
    }
    Ok(orders)
}
