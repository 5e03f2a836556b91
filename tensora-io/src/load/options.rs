//! What a load is asked to do: [`LoadOptions`] and the enums and hooks it is built from.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tensora_format::{Selection, Shard, TensorInfo};

use super::TensorRef;
use super::ahead::Memory;
use crate::arena::Arena;
use crate::cast::DtypeTarget;
use crate::error::BoxError;
use crate::seam::{Access, IoBackend};

/// Which backend runs the load.
#[derive(Clone, Default)]
pub enum BackendChoice {
    /// Decide from measured facts (see `crate::auto`).
    #[default]
    Auto,
    /// A registered backend by name (see [`crate::registry::names`]).
    Named(String),
    /// A backend that is not in the registry (a test double, an out-of-tree backend).
    Custom(Arc<dyn IoBackend>),
}

/// A backend name that is neither `auto` nor registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend {name:?}; expected auto, {}", crate::registry::names().join(", "))]
pub struct UnknownBackend {
    /// The name as given.
    pub name: String,
}

impl std::str::FromStr for BackendChoice {
    type Err = UnknownBackend;

    /// `"auto"` or a registered backend name (see [`crate::registry::names`]): the one parser of
    /// `--backend` and `backend=` for the CLI and the bindings.
    ///
    /// ```
    /// use tensora_io::BackendChoice;
    /// assert!(matches!("auto".parse::<BackendChoice>(), Ok(BackendChoice::Auto)));
    /// assert!(matches!("sync".parse::<BackendChoice>(), Ok(BackendChoice::Named(n)) if n == "sync"));
    /// let e = "fast".parse::<BackendChoice>().unwrap_err();
    /// assert!(e.to_string().contains("expected auto, sync"), "{e}");
    /// ```
    fn from_str(s: &str) -> Result<BackendChoice, UnknownBackend> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            name if crate::registry::names().contains(&name) => Ok(BackendChoice::Named(name.to_owned())),
            name => Err(UnknownBackend { name: name.to_owned() }),
        }
    }
}

impl BackendChoice {
    /// The name to report: `auto`, the registered name, or the custom backend's own name.
    pub fn name(&self) -> &str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Named(n) => n,
            BackendChoice::Custom(b) => b.name(),
        }
    }
}

impl std::fmt::Debug for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendChoice::Auto => f.write_str("Auto"),
            BackendChoice::Named(n) => write!(f, "Named({n:?})"),
            BackendChoice::Custom(b) => write!(f, "Custom({:?})", b.name()),
        }
    }
}

/// Buffered (page cache) or direct (`O_DIRECT`) reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IoMode {
    /// Decided by `auto` from the facts (buffered when warm).
    #[default]
    Auto,
    /// Through the page cache.
    Buffered,
    /// `O_DIRECT` where the filesystem supports it; buffered fallback per file/read otherwise.
    Direct,
}

/// Where tensor bytes live after the load.
///
/// Mapped views are backed by the files: another process that writes a mapped file in place is
/// seen through them, and one that truncates it makes the next access to a missing page raise
/// `SIGBUS`, killing the process. As `memmap2` does for its maps, asking for views over files that
/// others may change is therefore `unsafe`: [`Residence::Mapped`] and [`Residence::Auto`] carry a
/// [`FilesUnchanged`] promise, made with an `unsafe` call.
///
/// ```
/// use tensora_io::{FilesUnchanged, LoadOptions, Residence};
/// // SAFETY: nothing modifies or truncates the fixture files while the views live.
/// let promise = unsafe { FilesUnchanged::promise() };
/// let opts = LoadOptions { residence: Residence::Auto(promise), ..LoadOptions::default() };
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let loaded = tensora_io::load_path(std::path::Path::new(dir), &opts)?;
/// assert!(["owned", "mapped"].contains(&loaded.report().residence.as_str()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Residence {
    /// Copied into an owned hugepage arena: a snapshot nothing outside the process can change.
    #[default]
    Owned,
    /// Zero-copy views into a private copy-on-write mapping of each file (see `crate::map`):
    /// writes through [`Loaded::tensor_mut_ptr`](crate::Loaded::tensor_mut_ptr) copy the page and
    /// never reach the file. Every selected page is read in (`MADV_POPULATE_READ`) before the load
    /// returns, so an I/O error or an already truncated file fails the load with a typed error
    /// naming file, offset and tensor. The bytes are **live views of the page cache, not a
    /// snapshot**: see the type's docs and [`FilesUnchanged`].
    Mapped(FilesUnchanged),
    /// Decided by `crate::auto` from measured facts: mapped when the backend is `auto` and the
    /// selection is warm on a local filesystem (a load is then a page-table fill), owned otherwise.
    /// The report's `reason` says which and why.
    Auto(FilesUnchanged),
}

/// The caller's promise that lets a load hand out views of the files (see [`Residence`]): made
/// only by the `unsafe` [`FilesUnchanged::promise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilesUnchanged(());

impl FilesUnchanged {
    /// Promise that the checkpoint's files stay as they are while views of them live.
    ///
    /// # Safety
    ///
    /// For as long as any tensor of a load made with this promise is alive (the `Loaded`, a run of
    /// `load_runs`, a tensor handed to a `load_streaming` callback), no process truncates a file of
    /// the checkpoint, and none writes one in place unless the caller accepts seeing those writes
    /// in the tensors. Replacing a file by renaming a new one over it is fine: the views keep the
    /// old file. Truncation makes the next access to a page not yet copied raise `SIGBUS`.
    pub unsafe fn promise() -> FilesUnchanged {
        FilesUnchanged(())
    }
}

impl Residence {
    /// `"owned"`, `"mapped"` or `"auto"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Residence::Owned => "owned",
            Residence::Mapped(_) => "mapped",
            Residence::Auto(_) => "auto",
        }
    }

    /// The residence named `name` (`"owned"`, `"mapped"` or `"auto"`; the one parser of
    /// `residence=` and `--residence`), the views under `promise`.
    pub fn from_name(name: &str, promise: FilesUnchanged) -> Result<Residence, String> {
        match name {
            "owned" => Ok(Residence::Owned),
            "mapped" => Ok(Residence::Mapped(promise)),
            "auto" => Ok(Residence::Auto(promise)),
            other => Err(format!("residence must be \"auto\", \"owned\" or \"mapped\", not {other:?}")),
        }
    }

    /// Whether the tensors are views of the files.
    pub const fn is_mapped(self) -> bool {
        matches!(self, Residence::Mapped(_))
    }
}

/// Called on the worker thread that completed a tensor's last read.
pub type TensorHook = Arc<dyn Fn(&TensorRef<'_>) -> Result<(), BoxError> + Send + Sync>;
/// Called on the worker that fills a read, once per piece (one tensor's bytes inside that read)
/// as soon as the piece's bytes have landed, while they are hot in that core's cache. A backend
/// that fills reads in steps (`sync`, see [`ON_READ_STEP_BYTES`]) hands a piece over as in-order,
/// non-overlapping sub-pieces that together tile it, the first ones before the rest of the read has
/// landed (so a hook may see bytes of a read that then fails; the load then fails as a whole).
/// Pieces of one tensor may arrive in any order and on different threads; every piece of a tensor
/// is reported before its [`LoadOptions::on_tensor`] hook runs. With [`Residence::Mapped`] it is called once
/// per tensor, with the whole tensor at offset 0. An error stops the load like an `on_tensor`
/// error ([`LoadError::Callback`](crate::LoadError::Callback), naming the tensor).
pub type ReadHook = Arc<dyn Fn(&PieceRef<'_>) -> Result<(), BoxError> + Send + Sync>;

/// Part of one tensor's bytes, landed by one read (see [`ReadHook`]).
#[derive(Debug, Clone, Copy)]
pub struct PieceRef<'a> {
    /// The tensor.
    pub info: &'a TensorInfo,
    /// Index of the tensor in `Checkpoint::tensors`.
    pub tensor_index: usize,
    /// Where `bytes` start inside the tensor's storage (`0..=info.len_bytes()`).
    pub offset_in_tensor_bytes: u64,
    /// The piece's bytes, landed.
    pub bytes: &'a [u8],
}

/// Called with `(bytes_done, bytes_total)` of selected tensor bytes as reads complete.
pub type ProgressHook = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// With an [`LoadOptions::on_read`] hook, backends that can (`sync`) fill each read in steps of
/// this many bytes and hand each landed step to the hook at once, while it is in that core's L2.
pub const ON_READ_STEP_BYTES: u64 = 1 << 20;
/// Default in-flight budget.
pub const BUDGET_DEFAULT_BYTES: u64 = 1 << 30;
/// Default read size.
pub const CHUNK_DEFAULT_BYTES: u64 = 8 << 20;
/// Default bound on files open at once.
pub const FILES_OPEN_DEFAULT_MAX: usize = 256;
/// Default bound on retries of a transient error, per read.
pub const RETRIES_DEFAULT_MAX: u32 = 8;
/// Default worker threads: the CPU count, at most this.
pub const THREADS_DEFAULT_MAX: usize = 8;
/// A file with fewer allocated bytes than `len / SPARSE_RATIO` is sparse.
pub const SPARSE_RATIO: u64 = 2;
/// Files smaller than this are never called sparse (tiny files may live inline in metadata).
pub const SPARSE_MIN_LEN_BYTES: u64 = 1 << 20;

/// How to load. Build with `..LoadOptions::default()`.
#[derive(Clone)]
pub struct LoadOptions {
    /// Which backend runs the load (`auto`: decided from measured facts).
    pub backend: BackendChoice,
    /// Which tensors to load (all by default).
    pub selection: Selection,
    /// Tensor names to deliver first, most urgent first; the rest follow in file order.
    pub priority: Option<Vec<String>>,
    /// Bytes in flight at once; when streaming, also the bound on arena memory (see
    /// [`load_streaming`](crate::load_streaming)).
    pub budget_bytes: u64,
    /// Target size of one read.
    pub chunk_bytes: u64,
    /// Worker threads (or rings). At least 1.
    pub threads: usize,
    /// Reads kept in flight per worker (io_uring queue depth).
    pub queue_depth: u32,
    /// Buffered or `O_DIRECT` reads (`auto`: decided from measured facts).
    pub io_mode: IoMode,
    /// Where the tensors live: owned (the default), mapped views, or decided by `auto`.
    pub residence: Residence,
    /// Retries of a transient error per read.
    pub retries_max: u32,
    /// Load files whose allocated blocks are far below their size.
    pub allow_sparse: bool,
    /// Called once per tensor, on the worker that completed it, before it is handed out.
    pub on_tensor: Option<TensorHook>,
    /// Per-read hook, for work that wants each read's bytes while they are hot in cache (fused
    /// digests). See [`ReadHook`].
    pub on_read: Option<ReadHook>,
    /// Called with `(bytes_done, bytes_total)` as reads complete (and as mapped pages are read in).
    pub progress: Option<ProgressHook>,
    /// Bound on checkpoint files open at once.
    pub files_open_max: usize,
    /// Set to stop the load early; it fails with [`LoadError::Cancelled`].
    ///
    /// [`LoadError::Cancelled`]: crate::LoadError::Cancelled
    pub cancel: Option<Arc<AtomicBool>>,
    /// Whether the destination arena is fresh memory (the default: what a cold start pays) or the
    /// arena parked by an earlier load in this process (see `crate::arena`, "Recycling").
    pub arena_reuse: ArenaReuse,
    /// Load only part of each tensor: one rank's tensor-parallel share
    /// (`Shard::TensorParallel(TensorParallel { rank, world, rules })`) or named slices. Only
    /// [`load`](crate::load()) takes it (an owned arena, each slice contiguous; no hooks); see
    /// `docs/tensor-parallel.md`.
    pub shard: Option<Shard>,
    /// The dtype floating-point tensors are delivered in ([`DtypeTarget::Stored`]: as stored).
    /// A cast load ([`load`](crate::load())) allocates its arena once at the target dtype and
    /// converts each read as it lands, from a bounded staging window
    /// (256 MiB by default); its tensors
    /// are always an owned copy, whatever [`LoadOptions::residence`] asks (views of the files
    /// cannot change dtype); under [`Residence::Mapped`] the workers convert straight from the
    /// mapped files (read in first) instead. `on_read` and `on_tensor` hooks see the stored bytes. Integer and
    /// boolean tensors keep their dtype; a floating-point dtype with no cast fails the load
    /// before any read ([`LoadError::Cast`](crate::LoadError::Cast)).
    pub dtype: DtypeTarget,
}

/// The first kernel on which an `O_DIRECT` read into a page released with `MADV_FREE` keeps the
/// page (see [`ArenaReuse::Recycle`]).
pub const LAZY_FREE_DMA_SAFE_KERNEL: (u32, u32) = (5, 18);

/// Where a load's arena memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ArenaReuse {
    /// Map fresh memory for every load and unmap it when the `Loaded` drops. Memory goes back to
    /// the system at once, and the load pays its page faults, as a process's first load does.
    #[default]
    Fresh,
    /// Reuse the arena parked by an earlier load (no page faults when it fits), and park this
    /// load's arena when it drops. For processes that load and drop models repeatedly (model
    /// swapping); the parked arena stays in RSS until reused or [`crate::arena::drop_recycled`].
    /// Direct (`O_DIRECT`) loads on kernels before 5.18 (`LAZY_FREE_DMA_SAFE_KERNEL`) get fresh
    /// memory anyway: there a lazily freed page filled by DMA can be dropped afterwards.
    Recycle,
}

impl ArenaReuse {
    /// An arena of `len_bytes` for reads through `access`, and which memory it is: the parked
    /// arena under [`ArenaReuse::Recycle`] when one fits, otherwise fresh memory (also under
    /// `Recycle` when nothing fitting is parked, so that load gets the populate-ahead helpers).
    /// A recycled arena's pages were released with `MADV_FREE`; before Linux 5.18 the kernel may
    /// drop such a page after an `O_DIRECT` read filled it (the DMA does not mark the page dirty),
    /// leaving zeros where the bytes landed. So a direct load on those kernels gets fresh memory
    /// even under [`ArenaReuse::Recycle`].
    pub(super) fn arena(self, len_bytes: u64, access: Access) -> std::io::Result<(Arena, Memory)> {
        let parked = match self.effective(access, crate::auto::probe::kernel_version()) {
            ArenaReuse::Fresh => None,
            ArenaReuse::Recycle => Arena::take_recycled(len_bytes),
        };
        parked_or_fresh(parked, len_bytes)
    }

    /// `self`, unless recycling is unsafe for `access` on a kernel of version `kernel` (`None`:
    /// unknown, so unsafe).
    pub(super) fn effective(self, access: Access, kernel: Option<(u32, u32)>) -> ArenaReuse {
        let lazy_free_keeps_dma = kernel.is_some_and(|v| v >= LAZY_FREE_DMA_SAFE_KERNEL);
        match (self, access) {
            (ArenaReuse::Recycle, Access::Direct) if !lazy_free_keeps_dma => ArenaReuse::Fresh,
            (reuse, _) => reuse,
        }
    }

    pub(super) fn release(self, arena: Arena) {
        match self {
            ArenaReuse::Fresh => drop(arena),
            ArenaReuse::Recycle => arena.recycle(),
        }
    }
}

/// `parked` as recycled memory, or a fresh arena of `len_bytes` when there is none.
fn parked_or_fresh(parked: Option<Arena>, len_bytes: u64) -> std::io::Result<(Arena, Memory)> {
    match parked {
        Some(arena) => Ok((arena, Memory::FaultedIn)),
        None => Ok((Arena::with_len(len_bytes)?, Memory::Fresh)),
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            backend: BackendChoice::Auto,
            selection: Selection::All,
            priority: None,
            budget_bytes: BUDGET_DEFAULT_BYTES,
            chunk_bytes: CHUNK_DEFAULT_BYTES,
            threads: crate::auto::probe::cpu_count().clamp(1, THREADS_DEFAULT_MAX),
            queue_depth: 32,
            io_mode: IoMode::Auto,
            residence: Residence::Owned,
            retries_max: RETRIES_DEFAULT_MAX,
            allow_sparse: false,
            on_tensor: None,
            on_read: None,
            progress: None,
            files_open_max: FILES_OPEN_DEFAULT_MAX,
            cancel: None,
            arena_reuse: ArenaReuse::Fresh,
            shard: None,
            dtype: DtypeTarget::Stored,
        }
    }
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("backend", &self.backend)
            .field("selection", &self.selection)
            .field("priority", &self.priority)
            .field("budget_bytes", &self.budget_bytes)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("threads", &self.threads)
            .field("queue_depth", &self.queue_depth)
            .field("io_mode", &self.io_mode)
            .field("residence", &self.residence)
            .field("retries_max", &self.retries_max)
            .field("allow_sparse", &self.allow_sparse)
            .field("on_tensor", &self.on_tensor.is_some())
            .field("on_read", &self.on_read.is_some())
            .field("progress", &self.progress.is_some())
            .field("files_open_max", &self.files_open_max)
            .field("shard", &self.shard)
            .field("dtype", &self.dtype)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycling_is_kept_except_for_direct_loads_on_kernels_that_drop_lazily_freed_dma_pages() {
        use ArenaReuse::{Fresh, Recycle};
        for (reuse, access, kernel, want) in [
            (Recycle, Access::Direct, Some((5, 17)), Fresh),
            (Recycle, Access::Direct, Some((4, 19)), Fresh),
            (Recycle, Access::Direct, None, Fresh),
            (Recycle, Access::Direct, Some((5, 18)), Recycle),
            (Recycle, Access::Direct, Some((6, 1)), Recycle),
            (Recycle, Access::Buffered, Some((5, 4)), Recycle),
            (Fresh, Access::Direct, Some((6, 1)), Fresh),
        ] {
            assert_eq!(reuse.effective(access, kernel), want, "{reuse:?} {access:?} {kernel:?}");
        }
    }

    #[test]
    fn only_a_parked_arena_counts_as_recycled_memory() {
        let (arena, memory) = parked_or_fresh(None, 3 << 12).unwrap();
        assert_eq!((arena.len_bytes(), memory), (3 << 12, Memory::Fresh));
        let (arena, memory) = parked_or_fresh(Some(arena), 3 << 12).unwrap();
        assert_eq!((arena.len_bytes(), memory), (3 << 12, Memory::FaultedIn));
        // `Fresh` never takes what is parked, whatever other tests have parked meanwhile.
        for access in [Access::Buffered, Access::Direct] {
            let (arena, memory) = ArenaReuse::Fresh.arena(5 << 12, access).unwrap();
            assert_eq!((arena.len_bytes(), memory), (5 << 12, Memory::Fresh));
        }
    }

    #[test]
    fn kernel_releases_parse() {
        use crate::auto::probe::{kernel_version, parse_kernel_release};
        assert_eq!(parse_kernel_release("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(parse_kernel_release("6.18.44-fc-v1045"), Some((6, 18)));
        assert_eq!(parse_kernel_release("4.19"), Some((4, 19)));
        assert_eq!(parse_kernel_release("linux"), None);
        assert!(kernel_version().is_some_and(|v| v >= (3, 0)), "{:?}", kernel_version());
    }
}
