//! Where `load_file` puts the tensors: an owned hugepage arena (the default,
//! `residence="owned"`), or, opted into with `"auto"` or `"mapped"`, zero-copy views of private
//! copy-on-write mappings of the files.
//!
//! A warm owned load pays for fresh memory: every 2 MiB page of the arena is faulted in and
//! zeroed by the kernel before the copy lands in it (about 6.6 GB/s on the 2-core reference
//! machine, whatever the backend). Mapped views skip both the zeroing and the copy: when the
//! files sit in the page cache, a load is a page-table fill (`MADV_POPULATE_READ`, done here
//! before returning, so an I/O error or a file already truncated fails the load with a typed
//! error). That protects the load only: the views stay backed by the files, so truncating or
//! rewriting a file in place while its views live (`save_file(load_file(p), p)`) raises `SIGBUS`
//! on the next access to a page not yet written. That is why owned is the default. Under
//! `"auto"`, cold files and network or FUSE filesystems get the owned load: there the disk or
//! the network is the bound, and an owned copy is a snapshot that nothing outside can change.
//!
//! [`decide`] is the rule; [`populate`] the prefault.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tensora_format::Checkpoint;
use tensora_format::Selection;
use tensora_io::{BackendChoice, LoadError, ProgressHook, Residence};

/// Largest piece of a tensor one populate call covers (progress and cancel are checked between
/// pieces).
pub const POPULATE_PIECE_BYTES_MAX: usize = 8 << 20;
/// Populate threads at most.
pub const POPULATE_THREADS_MAX: usize = 8;
/// Retries of a populate call interrupted (`EINTR`) or refused for now (`EAGAIN`), per piece.
pub const POPULATE_RETRIES_MAX: u32 = 8;
/// Page size assumed for rounding a range's start down (the smallest page size of the targets
/// this crate builds for; a larger real page size only makes a rounded start less aligned, which
/// `madvise` refuses with `EINVAL`, and that is treated as "cannot prefault").
const PAGE_BYTES: usize = 4096;

/// What the caller asked for (`residence=` in Python).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Mapped when the data is local and warm and the backend is `auto`, owned otherwise.
    Auto,
    Owned,
    Mapped,
}

impl Placement {
    /// `"auto"`, `"owned"` or `"mapped"`.
    pub fn parse(s: &str) -> Result<Placement, String> {
        match s {
            "auto" => Ok(Placement::Auto),
            "owned" => Ok(Placement::Owned),
            "mapped" => Ok(Placement::Mapped),
            other => Err(format!("residence must be \"auto\", \"owned\" or \"mapped\", not {other:?}")),
        }
    }
}

/// The residence chosen, and one line saying why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub residence: Residence,
    pub reason: String,
}

/// The facts [`decide`] reads (gathered by [`facts`]; a pure function of them, so unit-tested).
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub placement: Placement,
    /// Whether the caller named a backend (anything but `auto`).
    pub backend_named: bool,
    /// Fraction of sampled pages of the selected ranges in the page cache; `None` when nothing
    /// was sampled (no bytes selected, or the sample failed).
    pub cached_fraction: Option<f64>,
    /// The first file's filesystem name and whether it is a network or FUSE one.
    pub filesystem: Option<(String, bool)>,
}

/// Read the facts for `selection` of `ckpt`: a `mincore` sample of the selected ranges and one
/// `statfs` (both bounded; see `tensora_io::auto::gather`). Skipped when the answer is fixed.
pub fn facts(
    ckpt: &Checkpoint,
    selection: &Selection,
    backend: &BackendChoice,
    placement: Placement,
) -> Result<Facts, LoadError> {
    if placement != Placement::Auto || !matches!(backend, BackendChoice::Auto) {
        return Ok(facts_for(ckpt, &[], backend, placement));
    }
    let matcher = selection.matcher().map_err(LoadError::Selection)?;
    let selected = matcher.select(ckpt.tensors().iter().map(|t| t.name())).map_err(LoadError::Selection)?;
    Ok(facts_for(ckpt, &selected, backend, placement))
}

/// [`facts`] for tensors already selected (indexes into `ckpt.tensors()`).
pub fn facts_for(
    ckpt: &Checkpoint,
    selected: &[usize],
    backend: &BackendChoice,
    placement: Placement,
) -> Facts {
    let backend_named = !matches!(backend, BackendChoice::Auto);
    let mut f = Facts { placement, backend_named, cached_fraction: None, filesystem: None };
    if placement != Placement::Auto || backend_named {
        return f;
    }
    // `mapped = true`: the O_DIRECT probe is skipped (it only matters to an owned cold load,
    // which gathers its own facts).
    let g = tensora_io::auto::gather(ckpt, selected, false, true);
    f.cached_fraction = (g.residency.sampled_pages > 0).then(|| g.residency.fraction());
    f.filesystem = g.filesystem.map(|fs| (fs.name, fs.remote));
    f
}

/// The rule: an explicit `residence` wins; a named backend means an owned load by it; a network
/// or FUSE filesystem, cold data (under `tensora_io::auto::WARM_FRACTION` of sampled pages
/// cached) or an empty sample means owned; warm local data means mapped.
///
/// ```
/// use tensora::place::{Facts, Placement, decide};
/// use tensora_io::Residence;
///
/// let warm_local = Facts {
///     placement: Placement::Auto,
///     backend_named: false,
///     cached_fraction: Some(1.0),
///     filesystem: Some(("ext4".to_owned(), false)),
/// };
/// assert_eq!(decide(&warm_local).residence, Residence::Mapped);
/// let nfs = Facts { filesystem: Some(("nfs".to_owned(), true)), ..warm_local.clone() };
/// assert_eq!(decide(&nfs).residence, Residence::Owned);
/// let cold = Facts { cached_fraction: Some(0.1), ..warm_local };
/// assert!(decide(&cold).reason.starts_with("owned: cold"));
/// ```
pub fn decide(f: &Facts) -> Decision {
    let owned = |reason: String| Decision { residence: Residence::Owned, reason };
    match f.placement {
        Placement::Owned => return owned("owned: residence=\"owned\" requested".to_owned()),
        Placement::Mapped => {
            return Decision {
                residence: Residence::Mapped,
                reason: "mapped: residence=\"mapped\" requested".to_owned(),
            };
        }
        Placement::Auto => {}
    }
    if f.backend_named {
        return owned("owned: a backend was named (it copies into the arena)".to_owned());
    }
    let fs = f.filesystem.as_ref().map_or("unknown fs", |(n, _)| n.as_str());
    if f.filesystem.as_ref().is_some_and(|(_, remote)| *remote) {
        return owned(format!("owned: {fs} is a network/FUSE filesystem (a snapshot, never lazy views)"));
    }
    match f.cached_fraction {
        Some(c) if c >= tensora_io::auto::WARM_FRACTION => Decision {
            residence: Residence::Mapped,
            reason: format!(
                "mapped: warm ({:.0}% of sampled pages cached) on local {fs}: zero-copy \
                 copy-on-write views, prefaulted at load",
                c * 100.0
            ),
        },
        Some(c) => owned(format!("owned: cold ({:.0}% of sampled pages cached) on {fs}", c * 100.0)),
        None => owned("owned: no page-cache sample (nothing selected to sample)".to_owned()),
    }
}

/// A byte range of mapped memory: `(address, len_bytes)`.
pub type Span = (usize, usize);

/// What [`populate`] is given besides the spans.
pub struct PopulateConfig<'a> {
    pub threads: usize,
    pub cancel: &'a AtomicBool,
    pub progress: Option<&'a ProgressHook>,
}

impl std::fmt::Debug for PopulateConfig<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PopulateConfig")
            .field("threads", &self.threads)
            .field("cancel", &self.cancel)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// Why [`populate`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum PopulateError {
    #[error("cancelled")]
    Cancelled,
    /// The span containing the failing piece (index into the spans given), the address and
    /// length of that piece (inside the span), and the OS error.
    #[error("reading in mapped pages failed: {source}")]
    Io { span: usize, piece_addr: usize, piece_len_bytes: usize, source: std::io::Error },
}

/// `MADV_POPULATE_READ` every span (split into pieces of at most [`POPULATE_PIECE_BYTES_MAX`]
/// spread over `threads` workers), reporting `(bytes_done, bytes_total)` to `progress` in
/// increasing order and stopping between pieces when `cancel` is set. A kernel without
/// `MADV_POPULATE_READ` (`EINVAL`) leaves pages to first touch and is not an error.
///
/// # Safety
/// Every span must lie inside one live mapping of this process that stays mapped for the call.
pub unsafe fn populate(spans: &[Span], cfg: &PopulateConfig<'_>) -> Result<u64, PopulateError> {
    let mut pieces: Vec<(usize, usize, usize)> = Vec::new(); // (span index, addr, len)
    for (i, &(addr, len)) in spans.iter().enumerate() {
        let mut off = 0;
        while off < len {
            let n = POPULATE_PIECE_BYTES_MAX.min(len - off);
            pieces.push((i, addr + off, n));
            off += n;
        }
    }
    let total: u64 = spans.iter().map(|s| s.1 as u64).sum();
    let next = AtomicUsize::new(0);
    let done = Mutex::new(0u64);
    let failed: Mutex<Option<PopulateError>> = Mutex::new(None);
    let unsupported = AtomicBool::new(false);
    let worker = || {
        loop {
            if cfg.cancel.load(Ordering::Acquire) || unsupported.load(Ordering::Relaxed) {
                return;
            }
            if failed.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                return;
            }
            let Some(&(span, addr, len)) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
            // SAFETY: the piece lies inside a live mapping (the caller's contract), and so does
            // the rounded-down start: mappings start on a page boundary.
            match unsafe { populate_one(addr, len) } {
                Ok(true) => {}
                Ok(false) => {
                    unsupported.store(true, Ordering::Relaxed);
                    return;
                }
                Err(source) => {
                    let mut slot = failed.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(PopulateError::Io {
                        span,
                        piece_addr: addr,
                        piece_len_bytes: len,
                        source,
                    });
                    return;
                }
            }
            let mut d = done.lock().unwrap_or_else(|e| e.into_inner());
            *d += len as u64;
            if let Some(p) = cfg.progress {
                p(*d, total);
            }
        }
    };
    let threads = cfg.threads.clamp(1, POPULATE_THREADS_MAX).min(pieces.len().max(1));
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(worker);
        }
        worker();
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    if cfg.cancel.load(Ordering::Acquire) {
        return Err(PopulateError::Cancelled);
    }
    if unsupported.load(Ordering::Relaxed)
        && let Some(p) = cfg.progress
    {
        p(total, total);
    }
    Ok(total)
}

/// One `madvise(MADV_POPULATE_READ)` over `addr .. addr + len` (start rounded down to a page).
/// `Ok(false)` when the kernel does not know the advice. `EFAULT` (pages past the end of a
/// truncated file) becomes `UnexpectedEof`.
///
/// # Safety
/// The range, from its rounded-down start, lies inside one live mapping of this process.
unsafe fn populate_one(addr: usize, len: usize) -> std::io::Result<bool> {
    let start = addr & !(PAGE_BYTES - 1);
    let len = len + (addr - start);
    let mut retries = 0;
    loop {
        // SAFETY: the caller guarantees the range is mapped; MADV_POPULATE_READ only faults
        // pages in for reading and changes no contents.
        let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
        if rc == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) => return Ok(false),
            Some(libc::EINTR | libc::EAGAIN) if retries < POPULATE_RETRIES_MAX => retries += 1,
            Some(libc::EFAULT) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file is shorter than when it was parsed (truncated while mapped)",
                ));
            }
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn auto(cached: Option<f64>, fs: Option<(&str, bool)>) -> Facts {
        Facts {
            placement: Placement::Auto,
            backend_named: false,
            cached_fraction: cached,
            filesystem: fs.map(|(n, r)| (n.to_owned(), r)),
        }
    }

    #[test]
    fn rules() {
        assert_eq!(decide(&auto(Some(1.0), Some(("ext4", false)))).residence, Residence::Mapped);
        assert_eq!(decide(&auto(Some(0.5), None)).residence, Residence::Mapped);
        assert_eq!(decide(&auto(Some(0.49), Some(("ext4", false)))).residence, Residence::Owned);
        assert_eq!(decide(&auto(None, Some(("ext4", false)))).residence, Residence::Owned);
        let nfs = decide(&auto(Some(1.0), Some(("nfs", true))));
        assert_eq!(nfs.residence, Residence::Owned);
        assert!(nfs.reason.contains("nfs"), "{}", nfs.reason);
        let named = Facts { backend_named: true, ..auto(Some(1.0), None) };
        assert_eq!(decide(&named).residence, Residence::Owned);
        let forced = Facts { placement: Placement::Mapped, ..auto(Some(0.0), Some(("nfs", true))) };
        assert_eq!(decide(&forced).residence, Residence::Mapped);
        let owned = Facts { placement: Placement::Owned, ..auto(Some(1.0), None) };
        assert_eq!(decide(&owned).residence, Residence::Owned);
        assert!(Placement::parse("lazy").is_err());
        assert_eq!(Placement::parse("mapped"), Ok(Placement::Mapped));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Mapped only when asked for, or when local, warm and auto; the reason names the choice.
        #[test]
        fn mapped_only_when_warm_local_and_auto(
            cached in proptest::option::of(0.0f64..=1.0),
            remote in any::<bool>(),
            named in any::<bool>(),
            placement in prop_oneof![Just(Placement::Auto), Just(Placement::Owned), Just(Placement::Mapped)],
        ) {
            let f = Facts {
                placement,
                backend_named: named,
                cached_fraction: cached,
                filesystem: Some(("fs".to_owned(), remote)),
            };
            let d = decide(&f);
            let warm = cached.is_some_and(|c| c >= tensora_io::auto::WARM_FRACTION);
            let want_mapped = match placement {
                Placement::Mapped => true,
                Placement::Owned => false,
                Placement::Auto => !named && !remote && warm,
            };
            prop_assert_eq!(d.residence == Residence::Mapped, want_mapped);
            let prefix = if want_mapped { "mapped:" } else { "owned:" };
            prop_assert!(d.reason.starts_with(prefix), "{}", d.reason);
        }

        /// Populating any sub-ranges of a live mapping succeeds, reports progress up to the
        /// total in increasing order, and leaves the bytes unchanged.
        #[test]
        fn populate_reports_progress_and_keeps_bytes(
            spans in proptest::collection::vec((0usize..(768 << 10), 0usize..(256 << 10)), 0..6),
            threads in 1usize..4,
        ) {
            let len = 1 << 20;
            let mut map = memmap2::MmapMut::map_anon(len).unwrap();
            for (i, b) in map.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let base = map.as_mut_ptr() as usize;
            let spans: Vec<Span> = spans.iter().map(|&(o, l)| (base + o, l)).collect();
            let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
            let s2 = std::sync::Arc::clone(&seen);
            let hook: ProgressHook = std::sync::Arc::new(move |d, t| s2.lock().unwrap().push((d, t)));
            let cancel = AtomicBool::new(false);
            let cfg = PopulateConfig { threads, cancel: &cancel, progress: Some(&hook) };
            // SAFETY: every span lies inside `map` (offset < 768 KiB, len < 256 KiB, map 1 MiB).
            let total = unsafe { populate(&spans, &cfg) }.unwrap();
            prop_assert_eq!(total, spans.iter().map(|s| s.1 as u64).sum::<u64>());
            let seen = seen.lock().unwrap();
            prop_assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0));
            if total > 0 {
                prop_assert_eq!(seen.last().copied(), Some((total, total)));
            }
            prop_assert!(map.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
    }

    #[test]
    fn cancel_stops_before_the_first_piece() {
        let mut map = memmap2::MmapMut::map_anon(1 << 20).unwrap();
        let base = map.as_mut_ptr() as usize;
        let cancel = AtomicBool::new(true);
        let cfg = PopulateConfig { threads: 2, cancel: &cancel, progress: None };
        // SAFETY: the span is the whole live mapping.
        let r = unsafe { populate(&[(base, 1 << 20)], &cfg) };
        assert!(matches!(r, Err(PopulateError::Cancelled)), "{r:?}");
    }

    #[test]
    fn populating_past_the_end_of_a_truncated_file_is_an_error() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![1u8; 64 << 10]).unwrap();
        // SAFETY: private mapping of a file only this test touches; truncated below on purpose,
        // and the truncated pages are never accessed, only populated (which reports EFAULT).
        let mut map = unsafe { memmap2::MmapOptions::new().len(64 << 10).map_copy(&f) }.unwrap();
        f.set_len(4096).unwrap();
        let base = map.as_mut_ptr() as usize;
        let cancel = AtomicBool::new(false);
        let cfg = PopulateConfig { threads: 1, cancel: &cancel, progress: None };
        // SAFETY: the span is the whole live mapping.
        let r = unsafe { populate(&[(base, 64 << 10)], &cfg) };
        match r {
            Err(PopulateError::Io { span: 0, piece_addr, source, .. }) => {
                assert_eq!(piece_addr, base);
                assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof)
            }
            other => panic!("expected an UnexpectedEof error, got {other:?}"),
        }
    }
}
