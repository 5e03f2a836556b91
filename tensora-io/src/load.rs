//! The load API: [`load`] (owned, every tensor in one hugepage arena), [`load_streaming`] (each
//! tensor handed to a callback as soon as it lands, arena space recycled) and [`load_path`].
//!
//! One load:
//! 1. the selection (and priority) picks tensors;
//! 2. `auto` (or the caller) picks a backend and buffered/direct I/O from measured facts;
//! 3. each file is opened once (at most [`LoadOptions::files_open_max`] at a time), `fstat`ed and
//!    compared with the stamp taken at parse time, and refused if sparse;
//! 4. `tensora-plan` turns the tensors into per-file read queues; the backend drains them into the
//!    arena; every completed read decrements its tensors' outstanding-read counts, and the worker
//!    that completes a tensor calls [`LoadOptions::on_tensor`];
//! 5. every file is `fstat`ed (descriptor) and `stat`ed (path) again: a size, mtime or inode change
//!    fails the load. A `Loaded` never has missing bytes.
//!
//! # Example
//!
//! ```
//! use tensora_io::{load, LoadOptions};
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/serverlessllm/tiny");
//! let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
//! let loaded = load(&ckpt, &LoadOptions::default())?;
//! assert_eq!(loaded.len(), ckpt.tensors().len());
//! for t in loaded.tensors() {
//!     assert_eq!(t.bytes().len() as u64, t.info().len_bytes());
//! }
//! println!("{} via {}: {}", loaded.report().gbps, loaded.report().backend, loaded.report().reason);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tensora_format::{Checkpoint, Dtype, FileId, FileStamp, TensorInfo};
use tensora_plan::{Budget, Extent, Order, Plan, PlanConfig, Selection};

use crate::arena::Arena;
use crate::auto;
use crate::backend::{
    CompletionSink, Destination, IoBackend, IoStats, Job, JobConfig, ReadError, ReadErrorKind, SourceFile,
    StopReason,
};
use crate::error::{BoxError, LoadError, ViewError};
use crate::report::{Faults, LoadReport, Phases, peak_rss_bytes};

/// Which backend runs the load.
#[derive(Clone, Default)]
pub enum BackendChoice {
    /// Decide from measured facts (see [`crate::auto`]).
    #[default]
    Auto,
    /// A registered backend by name (see [`crate::registry::names`]).
    Named(String),
    /// A backend that is not in the registry (a test double, an out-of-tree backend).
    Custom(Arc<dyn IoBackend>),
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
    Buffered,
    /// `O_DIRECT` where the filesystem supports it; buffered fallback per file/read otherwise.
    Direct,
}

/// Where tensor bytes live after the load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Residence {
    /// Copied into an owned hugepage arena.
    #[default]
    Owned,
    /// Zero-copy views into a private copy-on-write mapping of each file (see [`crate::mmap`]):
    /// writes through [`Loaded::tensor_mut_ptr`] copy the page and never reach the file.
    /// The bytes are **live views of the page cache, not a snapshot**: another process writing a
    /// file in place is seen through them, and truncating a mapped file while the views live
    /// raises SIGBUS on access. The file stamps are checked once, after mapping; keep the files
    /// unchanged for as long as the `Loaded` lives. On a network or FUSE filesystem every
    /// selected range is read in before the load returns (never faulted in lazily).
    Mapped,
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
/// error ([`LoadError::Callback`], naming the tensor).
pub type ReadHook = Arc<dyn Fn(&PieceRef<'_>) -> Result<(), BoxError> + Send + Sync>;

/// Part of one tensor's bytes, landed by one read (see [`ReadHook`]).
#[derive(Debug, Clone, Copy)]
pub struct PieceRef<'a> {
    pub info: &'a TensorInfo,
    /// Index of the tensor in `Checkpoint::tensors`.
    pub tensor_index: usize,
    /// Where `bytes` start inside the tensor's storage (`0..=info.len_bytes()`).
    pub offset_in_tensor_bytes: u64,
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
    pub backend: BackendChoice,
    pub selection: Selection,
    /// Tensor names to deliver first, most urgent first; the rest follow in file order.
    pub priority: Option<Vec<String>>,
    /// Bytes in flight at once; when streaming, also the bound on arena memory (see
    /// [`load_streaming`]).
    pub budget_bytes: u64,
    /// Target size of one read.
    pub chunk_bytes: u64,
    /// Worker threads (or rings). At least 1.
    pub threads: usize,
    /// Reads kept in flight per worker (io_uring queue depth).
    pub queue_depth: u32,
    pub io_mode: IoMode,
    pub residence: Residence,
    /// Retries of a transient error per read.
    pub retries_max: u32,
    /// Load files whose allocated blocks are far below their size.
    pub allow_sparse: bool,
    pub on_tensor: Option<TensorHook>,
    /// Per-read hook, for work that wants each read's bytes while they are hot in cache (fused
    /// digests). See [`ReadHook`].
    pub on_read: Option<ReadHook>,
    pub progress: Option<ProgressHook>,
    /// Bound on checkpoint files open at once.
    pub files_open_max: usize,
    /// Set to stop the load early; it fails with [`LoadError::Cancelled`].
    pub cancel: Option<Arc<AtomicBool>>,
    /// Whether the destination arena is fresh memory (the default: what a cold start pays) or the
    /// arena parked by an earlier load in this process (see [`crate::arena`], "Recycling").
    pub arena_reuse: ArenaReuse,
}

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
    Recycle,
}

impl ArenaReuse {
    fn arena(self, len_bytes: u64) -> std::io::Result<Arena> {
        match self {
            ArenaReuse::Fresh => Arena::with_len(len_bytes),
            ArenaReuse::Recycle => Arena::recycled(len_bytes),
        }
    }

    fn release(self, arena: Arena) {
        match self {
            ArenaReuse::Fresh => drop(arena),
            ArenaReuse::Recycle => arena.recycle(),
        }
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
            threads: crate::probe::cpu_count().clamp(1, THREADS_DEFAULT_MAX),
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
            .finish()
    }
}

/// A Rust element type that a tensor's bytes can be viewed as.
pub trait Element: bytemuck::Pod {
    /// The one dtype whose bytes are this type.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })* };
}
element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, half::f16 => F16, half::bf16 => BF16, u32 => U32,
    i32 => I32, f32 => F32, u64 => U64, i64 => I64, f64 => F64);

/// A loaded tensor: metadata plus its bytes.
#[derive(Clone, Copy)]
pub struct TensorRef<'a> {
    info: &'a TensorInfo,
    bytes: &'a [u8],
}

impl std::fmt::Debug for TensorRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorRef")
            .field("name", &self.info.name())
            .field("dtype", &self.info.dtype())
            .field("shape", &self.info.shape())
            .field("len_bytes", &self.bytes.len())
            .finish()
    }
}

impl<'a> TensorRef<'a> {
    pub fn name(&self) -> &'a str {
        self.info.name()
    }
    pub fn dtype(&self) -> Dtype {
        self.info.dtype()
    }
    pub fn shape(&self) -> &'a [u64] {
        self.info.shape()
    }
    pub fn info(&self) -> &'a TensorInfo {
        self.info
    }
    /// The tensor's stored bytes (`info().len_bytes()` of them).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    /// The bytes as elements of `T`: refused unless the dtype is `T::DTYPE`, the address is aligned
    /// for `T` and the length is a whole number of elements. Never reinterprets unaligned memory.
    ///
    /// ```
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/serverlessllm/tiny");
    /// # let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
    /// let loaded = tensora_io::load(&ckpt, &Default::default())?;
    /// let t = loaded.tensors().next().unwrap();
    /// assert!(t.as_slice::<i64>().is_err() || t.dtype() == tensora_format::Dtype::I64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T], ViewError> {
        let tensor = || self.info.name().to_owned();
        if self.info.dtype() != T::DTYPE {
            return Err(ViewError::Dtype {
                tensor: tensor(),
                dtype: self.info.dtype(),
                requested: T::DTYPE.as_str(),
            });
        }
        let elem_bytes = std::mem::size_of::<T>();
        let align_bytes = std::mem::align_of::<T>();
        let addr = self.bytes.as_ptr() as usize;
        if !addr.is_multiple_of(align_bytes) {
            return Err(ViewError::Misaligned { tensor: tensor(), addr, align_bytes });
        }
        if !self.bytes.len().is_multiple_of(elem_bytes) {
            return Err(ViewError::Length { tensor: tensor(), len_bytes: self.bytes.len(), elem_bytes });
        }
        bytemuck::try_cast_slice(self.bytes).map_err(|_| ViewError::Misaligned {
            tensor: tensor(),
            addr,
            align_bytes,
        })
    }
}

/// Where the tensors' bytes live.
#[derive(Debug)]
enum Storage {
    Arena(Arena),
    Mapped(crate::mmap::MappedFiles),
}

#[derive(Debug)]
struct Entry {
    info: TensorInfo,
    /// Arena offset (owned) or file index into the mapping (mapped).
    file: u32,
    offset_bytes: u64,
}

/// The result of [`load`]: every selected tensor, complete. `Send + Sync`.
#[derive(Debug)]
pub struct Loaded {
    storage: Storage,
    arena_reuse: ArenaReuse,
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
    report: LoadReport,
}

impl Drop for Loaded {
    /// Unmaps an owned arena, or parks it for the next load under [`ArenaReuse::Recycle`].
    fn drop(&mut self) {
        if let Storage::Arena(a) = &mut self.storage {
            self.arena_reuse.release(std::mem::replace(a, Arena::empty()));
        }
    }
}

impl Loaded {
    /// The tensor called `name`, if it was selected.
    pub fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        self.by_name.get(name).map(|&i| self.get(i))
    }
    /// Every loaded tensor, in delivery (priority, then file) order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorRef<'_>> {
        (0..self.entries.len()).map(|i| self.get(i))
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// A pointer to tensor `name`'s bytes (`info().len_bytes()` of them, returned as the second
    /// value) that may be written through, for bindings that hand out writable buffers (numpy,
    /// DLPack). It derives from the storage's own mutable base pointer (the arena's mapping, or a
    /// private copy-on-write file mapping under [`Residence::Mapped`], whose writes never reach
    /// the file), never from a shared slice. Writing through it is sound only while no `&[u8]` of
    /// the same range (from [`Loaded::tensor`] or [`Loaded::tensors`]) is alive, and tied tensors
    /// (ServerlessLLM names sharing one storage) share their bytes. `None` for an unknown name or
    /// an empty tensor.
    ///
    /// ```
    /// use tensora_io::{load, LoadOptions};
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/serverlessllm/tiny");
    /// let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
    /// let loaded = load(&ckpt, &LoadOptions::default())?;
    /// let name = loaded.tensors().find(|t| !t.bytes().is_empty()).unwrap().name().to_owned();
    /// let (ptr, len) = loaded.tensor_mut_ptr(&name).unwrap();
    /// assert_eq!(len as u64, loaded.tensor(&name).unwrap().info().len_bytes());
    /// // SAFETY: no slice of this tensor is alive while we write.
    /// unsafe { ptr.as_ptr().write(42) };
    /// assert_eq!(loaded.tensor(&name).unwrap().bytes()[0], 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tensor_mut_ptr(&self, name: &str) -> Option<(NonNull<u8>, usize)> {
        let e = &self.entries[*self.by_name.get(name)?];
        let len_bytes = e.info.len_bytes();
        let len = usize::try_from(len_bytes).ok().filter(|&l| l > 0)?;
        let end = e.offset_bytes.checked_add(len_bytes)?;
        let ptr = match &self.storage {
            Storage::Arena(a) => {
                if end > a.len_bytes() {
                    return None;
                }
                // SAFETY: `offset_bytes + len <= arena length` (checked above), so the result
                // stays inside the arena's mapping.
                unsafe { a.host_ptr().add(e.offset_bytes as usize) }
            }
            Storage::Mapped(m) => m.ptr_mut(e.file, e.offset_bytes..end)?,
        };
        Some((ptr, len))
    }

    fn get(&self, i: usize) -> TensorRef<'_> {
        let e = &self.entries[i];
        let len = e.info.len_bytes();
        let bytes = match &self.storage {
            // SAFETY: the load finished, so no backend writes into the arena any more and `Loaded`
            // never writes to it; every entry's range was checked to lie inside the arena.
            Storage::Arena(a) => unsafe { a.slice_unchecked(e.offset_bytes, len) },
            Storage::Mapped(m) => m.get(e.file, e.offset_bytes..e.offset_bytes + len).unwrap_or(&[]),
        };
        TensorRef { info: &e.info, bytes }
    }
}

/// Open, parse and load `path` (a safetensors file, a sharded directory or index, or a
/// ServerlessLLM directory). Fills the `parse` phase of the report.
pub fn load_path(path: &Path, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    let t = Instant::now();
    let ckpt = tensora_format::open(path)?;
    let parse = t.elapsed().as_secs_f64();
    let mut loaded = load(&ckpt, opts)?;
    loaded.report.phases.parse = parse;
    loaded.report.finalize();
    Ok(loaded)
}

/// What every load starts with: the page-fault counters, the selection (billed to the `plan`
/// phase) and the session with its backend (billed to `open`).
fn begin<'c>(
    ckpt: &'c Checkpoint,
    opts: &'c LoadOptions,
    streaming: bool,
) -> Result<(Session<'c>, Vec<usize>, Phases, Faults), LoadError> {
    let faults_before = Faults::now();
    let mut phases = Phases::default();
    let t = Instant::now();
    let selected = select(ckpt, opts)?;
    phases.plan += t.elapsed().as_secs_f64();
    let t = Instant::now();
    let session = Session::new(ckpt, opts, &selected, streaming)?;
    phases.open += t.elapsed().as_secs_f64();
    Ok((session, selected, phases, faults_before))
}

/// Load the selected tensors into one owned hugepage arena. See the module docs.
pub fn load(ckpt: &Checkpoint, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    let (session, selected, mut phases, faults_before) = begin(ckpt, opts, false)?;

    if opts.residence == Residence::Mapped {
        return load_mapped(session, selected, phases, faults_before);
    }

    // Group files so that at most `files_open_max` are open at once; one plan per group, each in
    // its own part of the arena.
    let t = Instant::now();
    let groups = file_groups(ckpt, &selected, opts.files_open_max);
    let mut plans = Vec::with_capacity(groups.len());
    let mut arena_len_bytes: u64 = 0;
    for group in &groups {
        let wp = session.plan_window(group)?;
        let period = wp.plan.config().arena_period_bytes();
        let base = arena_len_bytes
            .checked_next_multiple_of(period)
            .ok_or(LoadError::Plan(tensora_plan::PlanError::ArenaOverflow))?;
        arena_len_bytes = base
            .checked_add(wp.plan.arena_len_bytes())
            .ok_or(LoadError::Plan(tensora_plan::PlanError::ArenaOverflow))?;
        plans.push((base, wp));
    }
    phases.plan += t.elapsed().as_secs_f64();

    let t = Instant::now();
    let arena = opts
        .arena_reuse
        .arena(arena_len_bytes)
        .map_err(|source| LoadError::Arena { len_bytes: arena_len_bytes, source })?;
    let mut files = FileSet::new(opts.files_open_max);
    let io_done = AtomicBool::new(false);
    let stats = std::thread::scope(|scope| {
        if session.direct && opts.arena_reuse == ArenaReuse::Fresh {
            // Direct reads are DMA into the arena: whoever submits them faults the fresh pages in
            // first, stalling the queue. Fault them in ahead of the queue on a helper thread while
            // the device works (I/O bound, so the CPU is idle anyway).
            scope.spawn(|| populate_ahead(&arena, &plans, &io_done));
        }
        let mut stats = Vec::with_capacity(plans.len());
        let mut run = || -> Result<(), LoadError> {
            for (base, wp) in &plans {
                let dest = SubDest::new(&arena, *base, wp.plan.arena_len_bytes());
                let no_stream = |_: u32| Ok(());
                stats.push(session.run_window(&mut files, wp, &dest, &no_stream)?);
            }
            Ok(())
        };
        let result = run();
        io_done.store(true, Ordering::Release);
        result.map(|()| stats)
    })?;
    phases.io += t.elapsed().as_secs_f64();
    files.bill_open(&mut phases);

    let t = Instant::now();
    files.close_and_check(ckpt)?;
    let mut entries = Vec::with_capacity(selected.len());
    for (base, wp) in &plans {
        for (tag, &ti) in wp.tensors.iter().enumerate() {
            let loc = wp.plan.location(tag as u32).copied();
            let info = ckpt.tensors()[ti].clone();
            let offset_bytes = match loc {
                Some(l) if info.len_bytes() > 0 => base + l.arena_offset_bytes,
                _ => 0,
            };
            entries.push(Entry { info, file: 0, offset_bytes });
        }
    }
    let by_name = entries.iter().enumerate().map(|(i, e)| (e.info.name().to_owned(), i)).collect();
    phases.finish += t.elapsed().as_secs_f64();
    let report = session.report(phases, &stats, entries.len(), plans.len(), faults_before);
    Ok(Loaded { storage: Storage::Arena(arena), arena_reuse: opts.arena_reuse, entries, by_name, report })
}

/// Faults in the arena's pages in the order the backends will fill them (the reads of every file
/// queue, round-robin across queues, plan after plan), until `done`. A hint: the first error
/// (e.g. no `MADV_POPULATE_WRITE` before Linux 5.14) ends it quietly. Bounded by one pass over the
/// reads.
fn populate_ahead(arena: &Arena, plans: &[(u64, WindowPlan)], done: &AtomicBool) {
    for (base, wp) in plans {
        let plan = &wp.plan;
        let queues: Vec<&[tensora_plan::Read]> = plan.queues().iter().map(|q| plan.queue_reads(q)).collect();
        let longest = queues.iter().map(|q| q.len()).max().unwrap_or(0);
        for k in 0..longest {
            for q in &queues {
                let Some(read) = q.get(k) else { continue };
                if done.load(Ordering::Acquire) {
                    return;
                }
                if arena.populate_write(base + read.arena_offset_bytes, read.len_bytes).is_err() {
                    return;
                }
            }
        }
    }
}

/// Load the selected tensors, handing each to `f` (on the calling thread) as soon as all its bytes
/// have landed, and recycling arena space.
///
/// Memory: tensors are planned in windows, in priority order, each holding at most
/// `budget_bytes` of arena (a window's plan is split until it fits). One arena is reused for
/// every window, so the peak is `max(budget_bytes, largest single tensor + 8 KiB)` of arena: a
/// tensor larger than the budget gets a window (and, only then, an arena) of its own. Reads stay
/// within the same in-flight budget.
///
/// An error from `f` (or from `on_tensor`) stops the load: the backend stops issuing reads,
/// drains what is in flight, and the error is returned as [`LoadError::Callback`].
///
/// ```
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/serverlessllm/tiny");
/// let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
/// let opts = tensora_io::LoadOptions { budget_bytes: 16 << 10, ..Default::default() };
/// let mut seen = 0;
/// let report = tensora_io::load_streaming(&ckpt, &opts, |t| {
///     assert_eq!(t.bytes().len() as u64, t.info().len_bytes());
///     seen += 1;
///     Ok(())
/// })?;
/// assert_eq!(seen, ckpt.tensors().len());
/// assert!(report.windows > 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn load_streaming(
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    mut f: impl FnMut(&TensorRef<'_>) -> Result<(), BoxError>,
) -> Result<LoadReport, LoadError> {
    let (session, selected, mut phases, faults_before) = begin(ckpt, opts, true)?;

    if opts.residence == Residence::Mapped {
        let mut loaded = load_mapped(session, selected, phases, faults_before)?;
        for t in loaded.tensors() {
            f(&t).map_err(|source| LoadError::Callback { tensor: t.name().to_owned(), source })?;
        }
        return Ok(std::mem::take(&mut loaded.report));
    }

    crate::arena::drop_recycled_larger_than(opts.budget_bytes);
    let mut pending: VecDeque<Vec<usize>> = stream_windows(ckpt, &selected, opts).into();
    let mut arena: Option<Arena> = None;
    let mut files = FileSet::new(opts.files_open_max);
    let mut stats = Vec::new();
    let mut delivered = 0usize;
    while let Some(window) = pending.pop_front() {
        let t = Instant::now();
        let wp = session.plan_window(&window)?;
        if wp.plan.arena_len_bytes() > opts.budget_bytes && window.len() > 1 {
            // Alignment padding or gaps pushed it over: split and retry both halves in order.
            let (a, b) = window.split_at(window.len() / 2);
            pending.push_front(b.to_vec());
            pending.push_front(a.to_vec());
            phases.plan += t.elapsed().as_secs_f64();
            continue;
        }
        phases.plan += t.elapsed().as_secs_f64();

        let t = Instant::now();
        let need = wp.plan.arena_len_bytes();
        if arena.as_ref().is_none_or(|a| a.len_bytes() < need) {
            // Free the old arena before mapping a bigger one, so the peak stays at one arena.
            drop(arena.take());
            let len_bytes = need.max(opts.budget_bytes.min(session.bytes_selected.max(need)));
            arena = Some(
                opts.arena_reuse.arena(len_bytes).map_err(|source| LoadError::Arena { len_bytes, source })?,
            );
        }
        let Some(arena_ref) = arena.as_ref() else { continue };
        let dest = SubDest::new(arena_ref, 0, need);
        let stopped = AtomicBool::new(false);
        let callback_error: Mutex<Option<LoadError>> = Mutex::new(None);
        let (tx, rx) = std::sync::mpsc::sync_channel::<u32>(wp.tensors.len().max(1));
        let result = std::thread::scope(|s| {
            let handle = s.spawn(|| {
                let tx = tx;
                let notify = |tag: u32| {
                    if stopped.load(Ordering::Acquire) {
                        return Err(StopReason);
                    }
                    tx.send(tag).map_err(|_| StopReason)
                };
                session.run_window(&mut files, &wp, &dest, &notify)
            });
            for tag in rx {
                if stopped.load(Ordering::Acquire) {
                    continue;
                }
                let ti = wp.tensors[tag as usize];
                let info = &ckpt.tensors()[ti];
                let bytes = wp.tensor_bytes(arena_ref, tag);
                if let Err(source) = f(&TensorRef { info, bytes }) {
                    stopped.store(true, Ordering::Release);
                    let e = LoadError::Callback { tensor: info.name().to_owned(), source };
                    *callback_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                } else {
                    delivered += 1;
                }
            }
            handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        phases.io += t.elapsed().as_secs_f64();
        files.bill_open(&mut phases);
        if let Some(e) = callback_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        stats.push(result?);
    }
    let t = Instant::now();
    if let Some(a) = arena {
        opts.arena_reuse.release(a);
    }
    files.close_and_check(ckpt)?;
    phases.finish += t.elapsed().as_secs_f64();
    Ok(session.report(phases, &stats, delivered, stats.len(), faults_before))
}

/// Zero-copy load: map every touched file privately and hand out views.
fn load_mapped(
    session: Session<'_>,
    selected: Vec<usize>,
    mut phases: Phases,
    faults_before: Faults,
) -> Result<Loaded, LoadError> {
    let ckpt = session.ckpt;
    let t = Instant::now();
    let ids = touched_files(ckpt, &selected);
    let mut files = FileSet::new(ids.len().max(1));
    let sources = files.take(ckpt, &ids, false, session.opts.allow_sparse)?;
    // Copy-on-write, so `Loaded::tensor_mut_ptr` can hand out writable views that never reach
    // the files.
    let mapped = crate::mmap::MappedFiles::map_with(&sources, crate::mmap::MapMode::CopyOnWrite)
        .map_err(LoadError::Map);
    files.give_back(&ids, sources);
    let mapped = mapped?;
    // Mapped index of each checkpoint file, by checkpoint file id.
    let mut local: Vec<u32> = vec![0; ckpt.files().len()];
    for (i, &f) in ids.iter().enumerate() {
        local[f as usize] = i as u32;
    }
    let mut entries = Vec::with_capacity(selected.len());
    for &ti in &selected {
        let info = ckpt.tensors()[ti].clone();
        let file = local[info.file().index()];
        entries.push(Entry { offset_bytes: info.offset_bytes(), file, info });
    }
    prewarm_remote(ckpt, &ids, &entries, &mapped, session.opts.threads)?;
    let by_name = entries.iter().enumerate().map(|(i, e)| (e.info.name().to_owned(), i)).collect();
    let storage = Storage::Mapped(mapped);
    let mut loaded =
        Loaded { storage, arena_reuse: ArenaReuse::Fresh, entries, by_name, report: LoadReport::default() };
    if let Some(hook) = &session.opts.on_read {
        for (t, &ti) in loaded.tensors().zip(&selected) {
            let piece =
                PieceRef { info: t.info(), tensor_index: ti, offset_in_tensor_bytes: 0, bytes: t.bytes() };
            hook(&piece).map_err(|source| LoadError::Callback { tensor: t.name().to_owned(), source })?;
        }
    }
    if let Some(hook) = &session.opts.on_tensor {
        for t in loaded.tensors() {
            hook(&t).map_err(|source| LoadError::Callback { tensor: t.name().to_owned(), source })?;
        }
    }
    phases.io += t.elapsed().as_secs_f64();
    files.bill_open(&mut phases);
    let t = Instant::now();
    files.close_and_check(ckpt)?;
    phases.finish += t.elapsed().as_secs_f64();
    loaded.report = session.report(phases, &[], loaded.entries.len(), 1, faults_before);
    loaded.report.io_mode = "mapped".to_owned();
    Ok(loaded)
}

/// On a network or FUSE filesystem, mapped views are never faulted in lazily: every selected
/// range is read in (`MADV_POPULATE_READ`) before the views are handed out, so a slow or failing
/// remote read is a typed error now rather than a stall or a `SIGBUS` on first touch.
fn prewarm_remote(
    ckpt: &Checkpoint,
    ids: &[u32],
    entries: &[Entry],
    mapped: &crate::mmap::MappedFiles,
    threads: usize,
) -> Result<(), LoadError> {
    let remote: Vec<bool> = ids
        .iter()
        .map(|&f| crate::probe::filesystem(ckpt.file(FileId(f)).path()).is_ok_and(|fs| fs.remote))
        .collect();
    let ranges: Vec<crate::mmap::FileRange> = entries
        .iter()
        .filter(|e| remote[e.file as usize] && e.info.len_bytes() > 0)
        .map(|e| crate::mmap::FileRange {
            file: e.file,
            offset_bytes: e.offset_bytes,
            len_bytes: e.info.len_bytes(),
        })
        .collect();
    if ranges.is_empty() {
        return Ok(());
    }
    mapped.prewarm(&ranges, threads.max(1)).map(|_| ()).map_err(LoadError::Map)
}

/// The selected tensor indexes, priority names first (in the given order), then file order.
fn select(ckpt: &Checkpoint, opts: &LoadOptions) -> Result<Vec<usize>, LoadError> {
    let matcher = opts.selection.matcher().map_err(LoadError::Selection)?;
    let mut selected =
        matcher.select(ckpt.tensors().iter().map(|t| t.name())).map_err(LoadError::Selection)?;
    if let Some(priority) = &opts.priority {
        let mut rank: HashMap<usize, usize> = HashMap::with_capacity(priority.len());
        let mut unknown = Vec::new();
        for (r, name) in priority.iter().enumerate() {
            match ckpt.tensor_index(name) {
                Some(i) => {
                    rank.entry(i).or_insert(r);
                }
                None => unknown.push(name.clone()),
            }
        }
        if !unknown.is_empty() {
            return Err(LoadError::Selection(tensora_plan::PlanError::UnknownNames { names: unknown }));
        }
        // Stable: unlisted tensors keep file order after the listed ones.
        selected.sort_by_key(|i| rank.get(i).copied().unwrap_or(usize::MAX));
    }
    Ok(selected)
}

/// Checkpoint file ids the selection touches, in order of first use.
fn touched_files(ckpt: &Checkpoint, selected: &[usize]) -> Vec<u32> {
    let mut seen = vec![false; ckpt.files().len()];
    let mut out = Vec::new();
    for &i in selected {
        let f = ckpt.tensors()[i].file().0;
        if !seen[f as usize] {
            seen[f as usize] = true;
            out.push(f);
        }
    }
    out
}

/// Split the selection into groups touching at most `files_max` files each (order kept per group).
fn file_groups(ckpt: &Checkpoint, selected: &[usize], files_max: usize) -> Vec<Vec<usize>> {
    let files_max = files_max.max(1);
    let order = touched_files(ckpt, selected);
    let mut group_of = vec![0usize; ckpt.files().len()];
    for (pos, &f) in order.iter().enumerate() {
        group_of[f as usize] = pos / files_max;
    }
    let mut groups = vec![Vec::new(); order.len().div_ceil(files_max).max(1)];
    for &i in selected {
        groups[group_of[ckpt.tensors()[i].file().index()]].push(i);
    }
    groups
}

/// Streaming windows: consecutive tensors (in selection order) whose bytes plus per-tensor slack fit
/// the budget and that touch at most `files_open_max` files; an oversized tensor stands alone.
fn stream_windows(ckpt: &Checkpoint, selected: &[usize], opts: &LoadOptions) -> Vec<Vec<usize>> {
    // Alignment padding the plan may add around one tensor (arena period on both sides).
    const SLACK_PER_TENSOR_BYTES: u64 = 2 * tensora_plan::ARENA_PERIOD_MIN_BYTES;
    let files_max = opts.files_open_max.max(1);
    let mut windows = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut current_bytes: u64 = 0;
    let mut current_files: Vec<u32> = Vec::new();
    // Whether each checkpoint file (by id) is in `current_files`.
    let mut in_current = vec![false; ckpt.files().len()];
    for &i in selected {
        let t = &ckpt.tensors()[i];
        let cost = t.len_bytes().saturating_add(SLACK_PER_TENSOR_BYTES);
        let new_file = !in_current[t.file().index()];
        let over_bytes = current_bytes.saturating_add(cost) > opts.budget_bytes;
        let over_files = new_file && current_files.len() >= files_max;
        if !current.is_empty() && (over_bytes || over_files) {
            windows.push(std::mem::take(&mut current));
            current_bytes = 0;
            for f in current_files.drain(..) {
                in_current[f as usize] = false;
            }
        }
        current.push(i);
        current_bytes = current_bytes.saturating_add(cost);
        if !in_current[t.file().index()] {
            in_current[t.file().index()] = true;
            current_files.push(t.file().0);
        }
    }
    if !current.is_empty() {
        windows.push(current);
    }
    windows
}

/// One plan over a subset of the selection; tag `i` is `tensors[i]`, file `j` is `files[j]`.
struct WindowPlan {
    plan: Plan,
    tensors: Vec<usize>,
    files: Vec<u32>,
}

impl WindowPlan {
    fn tensor_bytes<'a>(&self, arena: &'a Arena, tag: u32) -> &'a [u8] {
        match self.plan.location(tag) {
            // SAFETY: every read carrying this tensor completed before its tag was reported, and
            // plan reads never overlap, so nothing writes this range while the slice lives (the
            // arena is only reused after the window's backend run and all callbacks return).
            Some(l) if l.len_bytes > 0 => unsafe { arena.slice_unchecked(l.arena_offset_bytes, l.len_bytes) },
            _ => &[],
        }
    }
}

/// Everything fixed for one load.
struct Session<'c> {
    ckpt: &'c Checkpoint,
    opts: &'c LoadOptions,
    backend: Arc<dyn IoBackend>,
    backend_name: String,
    direct: bool,
    reason: String,
    budget: Budget,
    bytes_selected: u64,
    files_touched: usize,
    no_cancel: AtomicBool,
    progress_done: AtomicU64,
}

/// Bytes covered by the selected tensors, counting bytes shared by tied tensors (ServerlessLLM
/// names that alias one storage) once: the union of their file ranges.
pub(crate) fn distinct_bytes(ckpt: &Checkpoint, selected: &[usize]) -> u64 {
    let mut ranges: Vec<(u32, u64, u64)> = selected
        .iter()
        .map(|&i| {
            let t = &ckpt.tensors()[i];
            let r = t.range();
            (t.file().0, r.start, r.end)
        })
        .collect();
    ranges.sort_unstable();
    let mut total_bytes = 0u64;
    let mut current: Option<(u32, u64, u64)> = None;
    for (file, start, end) in ranges {
        current = match current {
            Some((f, s, e)) if f == file && start <= e => Some((f, s, e.max(end))),
            Some((_, s, e)) => {
                total_bytes += e - s;
                Some((file, start, end))
            }
            None => Some((file, start, end)),
        };
    }
    if let Some((_, s, e)) = current {
        total_bytes += e - s;
    }
    total_bytes
}

impl<'c> Session<'c> {
    fn new(
        ckpt: &'c Checkpoint,
        opts: &'c LoadOptions,
        selected: &[usize],
        streaming: bool,
    ) -> Result<Session<'c>, LoadError> {
        let bytes_selected = distinct_bytes(ckpt, selected);
        let ids = touched_files(ckpt, selected);
        let mapped = opts.residence == Residence::Mapped;
        let (backend, backend_name, mut direct, reason): (Arc<dyn IoBackend>, String, bool, String) =
            match &opts.backend {
                BackendChoice::Auto => {
                    let facts = auto::gather(ckpt, selected, streaming, mapped);
                    let choice = auto::choose(&facts);
                    let backend = by_name(choice.backend)?;
                    let name = backend.name().to_owned();
                    (backend, name, choice.direct, choice.reason)
                }
                BackendChoice::Named(n) => {
                    let backend = by_name(n)?;
                    (backend, n.clone(), false, format!("backend {n} requested"))
                }
                BackendChoice::Custom(b) => {
                    (Arc::clone(b), b.name().to_owned(), false, "custom backend".to_owned())
                }
            };
        if let Err(reason) = backend.available() {
            return Err(LoadError::BackendUnavailable { backend: backend_name, reason });
        }
        if mapped && !backend.reads_local_files() {
            return Err(LoadError::BackendUnavailable {
                backend: backend_name,
                reason: "mapped residence needs local files; this backend reads from elsewhere".to_owned(),
            });
        }
        // Mapped views never run a backend: name what actually serves the bytes.
        let (backend_name, reason) = match &opts.backend {
            BackendChoice::Auto => (backend_name, reason),
            _ if mapped => ("mmap".to_owned(), "mapped views requested".to_owned()),
            _ => (backend_name, reason),
        };
        match opts.io_mode {
            IoMode::Auto => direct = direct && direct_plannable(opts),
            IoMode::Buffered => direct = false,
            IoMode::Direct => direct = true,
        }
        Ok(Session {
            ckpt,
            opts,
            backend,
            backend_name,
            direct: direct && !mapped,
            reason,
            budget: Budget::new(opts.budget_bytes),
            bytes_selected,
            files_touched: ids.len(),
            no_cancel: AtomicBool::new(false),
            progress_done: AtomicU64::new(0),
        })
    }

    fn plan_config(&self) -> PlanConfig {
        PlanConfig {
            align_bytes: if self.direct { crate::sync::DIRECT_BLOCK_BYTES } else { 1 },
            chunk_bytes: self.opts.chunk_bytes.max(1),
            budget_bytes: self.opts.budget_bytes,
            ..PlanConfig::default()
        }
    }

    fn plan_window(&self, tensors: &[usize]) -> Result<WindowPlan, LoadError> {
        let ckpt = self.ckpt;
        let mut files: Vec<u32> = Vec::new();
        // Local (plan) id of each checkpoint file, by checkpoint file id.
        let mut local_of: Vec<Option<usize>> = vec![None; ckpt.files().len()];
        let mut extents = Vec::with_capacity(tensors.len());
        for (tag, &ti) in tensors.iter().enumerate() {
            let t = &ckpt.tensors()[ti];
            let local = match local_of[t.file().index()] {
                Some(p) => p,
                None => {
                    files.push(t.file().0);
                    local_of[t.file().index()] = Some(files.len() - 1);
                    files.len() - 1
                }
            };
            extents.push(Extent {
                file: local as u32,
                offset_bytes: t.offset_bytes(),
                len_bytes: t.len_bytes(),
                tag: tag as u32,
            });
        }
        let lens: Vec<u64> = files.iter().map(|&f| ckpt.file(FileId(f)).len_bytes()).collect();
        let order = if self.opts.priority.is_some() {
            Order::Priority((0..tensors.len() as u32).collect())
        } else {
            Order::File
        };
        let plan = Plan::build_with_file_lens(&extents, &self.plan_config(), &order, &lens)
            .map_err(LoadError::Plan)?;
        Ok(WindowPlan { plan, tensors: tensors.to_vec(), files })
    }

    /// Open the window's files, run the backend, and report each completed tensor to `notify`
    /// (after the `on_tensor` hook).
    fn run_window(
        &self,
        files: &mut FileSet,
        wp: &WindowPlan,
        dest: &SubDest<'_>,
        notify: &(dyn Fn(u32) -> Result<(), StopReason> + Sync),
    ) -> Result<IoStats, LoadError> {
        if !self.backend.reads_local_files() {
            // The backend reaches the files its own way (an object store): nothing to open here.
            return self.execute(&[], wp, dest, notify);
        }
        let sources = files.take(self.ckpt, &wp.files, self.direct, self.opts.allow_sparse)?;
        let result = self.execute(&sources, wp, dest, notify);
        files.give_back(&wp.files, sources);
        result
    }

    fn execute(
        &self,
        sources: &[SourceFile],
        wp: &WindowPlan,
        dest: &SubDest<'_>,
        notify: &(dyn Fn(u32) -> Result<(), StopReason> + Sync),
    ) -> Result<IoStats, LoadError> {
        let plan = &wp.plan;
        let mut remaining: Vec<u32> = vec![0; wp.tensors.len()];
        for p in plan.pieces() {
            remaining[p.tag as usize] += 1;
        }
        let tracker = Tracker {
            session: self,
            wp,
            dest,
            remaining: remaining.iter().map(|&n| AtomicU32::new(n)).collect(),
            reported: if self.opts.on_read.is_some() {
                plan.reads().iter().map(|_| AtomicU64::new(0)).collect()
            } else {
                Vec::new()
            },
            notify,
            hook_error: Mutex::new(None),
        };
        // Tensors with no bytes are complete before any read.
        for (tag, &n) in remaining.iter().enumerate() {
            if n == 0 && tracker.complete(tag as u32).is_err() {
                return Err(tracker.stop_error());
            }
        }
        let cancel = self.opts.cancel.as_deref().unwrap_or(&self.no_cancel);
        // SAFETY: `dest` is this window's own part of the arena (windows and file groups get
        // disjoint parts, run one after another); nothing else writes it while the job runs, and
        // the only reads of it during the run are of tensors whose reads all completed
        // (`TensorRef`s handed to hooks and the streaming callback).
        let job = unsafe {
            Job::new(
                plan,
                sources,
                dest,
                &self.budget,
                cancel,
                JobConfig {
                    threads: self.opts.threads.max(1),
                    queue_depth: self.opts.queue_depth.max(1),
                    direct: self.direct,
                    retries_max: self.opts.retries_max,
                },
            )
        }
        .with_file_ids(&wp.files);
        // Hand pieces to `on_read` while they are still in the landing core's cache.
        let job = if self.opts.on_read.is_some() { job.with_landed_step(ON_READ_STEP_BYTES) } else { job };
        let stats = if plan.reads().is_empty() {
            IoStats::default()
        } else {
            match self.backend.execute(&job, &tracker) {
                Ok(s) => s,
                Err(e) => return Err(self.read_error(&tracker, sources, e)),
            }
        };
        if let Some(tag) = tracker.remaining.iter().position(|n| n.load(Ordering::Acquire) != 0) {
            return Err(LoadError::Incomplete {
                backend: self.backend_name.clone(),
                tensor: self.ckpt.tensors()[wp.tensors[tag]].name().to_owned(),
            });
        }
        Ok(stats)
    }

    /// Turn a backend error into a `LoadError` naming path, offset and tensor.
    fn read_error(&self, tracker: &Tracker<'_>, sources: &[SourceFile], e: ReadError) -> LoadError {
        match e.kind {
            ReadErrorKind::Stopped => return tracker.stop_error(),
            ReadErrorKind::Cancelled => return LoadError::Cancelled,
            ReadErrorKind::Unavailable(reason) => {
                return LoadError::BackendUnavailable { backend: self.backend_name.clone(), reason };
            }
            _ if e.file == ReadError::NO_FILE => {
                return LoadError::Backend { backend: self.backend_name.clone(), kind: e.kind };
            }
            _ => {}
        }
        let wp = tracker.wp;
        let path = match (sources.get(e.file as usize), wp.files.get(e.file as usize)) {
            (Some(s), _) => s.path.clone(),
            (None, Some(&f)) => self.ckpt.file(FileId(f)).path().to_owned(),
            (None, None) => PathBuf::new(),
        };
        let covering = wp.plan.reads().iter().find(|r| {
            r.file == e.file
                && r.offset_bytes <= e.offset_bytes
                && e.offset_bytes < r.offset_bytes + r.len_bytes.max(1)
        });
        let tensor = covering
            .and_then(|r| {
                let pieces = wp.plan.read_pieces(r);
                pieces
                    .iter()
                    .find(|p| {
                        let start = r.offset_bytes + p.read_offset_bytes;
                        (start..start + p.len_bytes).contains(&e.offset_bytes)
                    })
                    .or(pieces.first())
                    .map(|p| self.ckpt.tensors()[wp.tensors[p.tag as usize]].name().to_owned())
            })
            .unwrap_or_default();
        LoadError::Read { path, offset_bytes: e.offset_bytes, len_bytes: e.len_bytes, tensor, kind: e.kind }
    }

    fn report(
        &self,
        phases: Phases,
        stats: &[IoStats],
        tensors: usize,
        windows: usize,
        faults_before: Faults,
    ) -> LoadReport {
        let faults = Faults::now().since(faults_before);
        let mut r = LoadReport {
            backend: self.backend_name.clone(),
            reason: self.reason.clone(),
            io_mode: if self.direct { "direct" } else { "buffered" }.to_owned(),
            bytes_selected: self.bytes_selected,
            bytes_read: stats.iter().map(|s| s.bytes_read).sum(),
            phases,
            // The budget's own peak: exact, and the same measure for every backend.
            peak_inflight_bytes: self.budget.peak_bytes(),
            retries: stats.iter().map(|s| s.retries).sum(),
            direct_fallbacks: stats.iter().map(|s| s.direct_fallbacks).sum(),
            minor_faults: faults.minor,
            major_faults: faults.major,
            peak_rss_bytes: peak_rss_bytes(),
            tensors,
            files: self.files_touched,
            windows,
            ..LoadReport::default()
        };
        r.finalize();
        r
    }
}

/// Counts outstanding reads per tensor and fires hooks on the completing worker.
struct Tracker<'a> {
    session: &'a Session<'a>,
    wp: &'a WindowPlan,
    dest: &'a SubDest<'a>,
    remaining: Vec<AtomicU32>,
    /// Per read: bytes from its start already handed to `on_read` (landed prefixes). Written only
    /// by the one worker filling that read.
    reported: Vec<AtomicU64>,
    notify: &'a (dyn Fn(u32) -> Result<(), StopReason> + Sync),
    hook_error: Mutex<Option<LoadError>>,
}

impl Tracker<'_> {
    fn complete(&self, tag: u32) -> Result<(), StopReason> {
        if let Some(hook) = &self.session.opts.on_tensor {
            let info = &self.session.ckpt.tensors()[self.wp.tensors[tag as usize]];
            let bytes = self.dest.rebase(self.wp, tag).unwrap_or(&[]);
            if let Err(source) = hook(&TensorRef { info, bytes }) {
                let mut slot = self.hook_error.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(LoadError::Callback { tensor: info.name().to_owned(), source });
                }
                return Err(StopReason);
            }
        }
        (self.notify)(tag)
    }

    /// Runs the per-read hook on one landed piece.
    fn piece(
        &self,
        hook: &ReadHook,
        r: &tensora_plan::Read,
        p: &tensora_plan::Piece,
        window: std::ops::Range<u64>,
    ) -> Result<(), StopReason> {
        // The part of the piece inside `window` (read-relative bytes).
        let start = p.read_offset_bytes.max(window.start);
        let end = (p.read_offset_bytes + p.len_bytes).min(window.end);
        if start >= end {
            return Ok(());
        }
        let Some(&ti) = self.wp.tensors.get(p.tag as usize) else {
            return self.internal(format!("read piece names tag {} outside the window", p.tag));
        };
        let info = &self.session.ckpt.tensors()[ti];
        let Some(bytes) = self.dest.landed(r.arena_offset_bytes + start, end - start) else {
            return self.internal(format!(
                "tensor {:?}: piece {}..{} of a read at arena offset {} lies outside the destination",
                info.name(),
                start,
                end,
                r.arena_offset_bytes
            ));
        };
        let offset_in_tensor_bytes = p.extent_offset_bytes + (start - p.read_offset_bytes);
        if let Err(source) = hook(&PieceRef { info, tensor_index: ti, offset_in_tensor_bytes, bytes }) {
            let mut slot = self.hook_error.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(LoadError::Callback { tensor: info.name().to_owned(), source });
            }
            return Err(StopReason);
        }
        Ok(())
    }

    /// Stops the run with an internal error (a plan that does not match its destination): named,
    /// never reported as a cancellation.
    fn internal(&self, what: String) -> Result<(), StopReason> {
        let mut slot = self.hook_error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(LoadError::Backend {
                backend: self.session.backend_name.clone(),
                kind: ReadErrorKind::Io(std::io::Error::other(what)),
            });
        }
        Err(StopReason)
    }

    /// The error to report after the sink stopped the run.
    fn stop_error(&self) -> LoadError {
        self.hook_error.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or(LoadError::Cancelled)
    }
}

impl CompletionSink for Tracker<'_> {
    fn read_done(&self, landed: crate::backend::Landed) -> Result<(), StopReason> {
        let read = landed.read();
        let plan = &self.wp.plan;
        let Some(r) = plan.reads().get(read as usize) else { return Err(StopReason) };
        let mut piece_bytes = 0;
        // What landed prefixes already handed to `on_read` is not handed again.
        let from = self.reported.get(read as usize).map_or(0, |d| d.load(Ordering::Relaxed));
        for p in plan.read_pieces(r) {
            piece_bytes += p.len_bytes;
            if let Some(hook) = &self.session.opts.on_read {
                self.piece(hook, r, p, from..r.len_bytes)?;
            }
            let Some(counter) = self.remaining.get(p.tag as usize) else { return Err(StopReason) };
            let before = counter.fetch_sub(1, Ordering::AcqRel);
            if before == 1 {
                self.complete(p.tag)?;
            }
        }
        if let Some(progress) = &self.session.opts.progress {
            let done = self.session.progress_done.fetch_add(piece_bytes, Ordering::Relaxed) + piece_bytes;
            progress(done.min(self.session.bytes_selected), self.session.bytes_selected);
        }
        Ok(())
    }

    fn prefix_landed(&self, prefix: crate::backend::LandedPrefix) -> Result<(), StopReason> {
        let (Some(hook), Some(done)) =
            (&self.session.opts.on_read, self.reported.get(prefix.read() as usize))
        else {
            return Ok(());
        };
        let plan = &self.wp.plan;
        let Some(r) = plan.reads().get(prefix.read() as usize) else { return Err(StopReason) };
        let from = done.load(Ordering::Relaxed);
        let to = prefix.len_bytes().min(r.len_bytes);
        if to <= from {
            return Ok(());
        }
        for p in plan.read_pieces(r) {
            self.piece(hook, r, p, from..to)?;
        }
        done.store(to, Ordering::Relaxed);
        Ok(())
    }
}

/// A range of an arena as a destination (one plan's part of the arena).
struct SubDest<'a> {
    parent: &'a Arena,
    base_bytes: u64,
    len_bytes: u64,
}

impl<'a> SubDest<'a> {
    fn new(parent: &'a Arena, base_bytes: u64, len_bytes: u64) -> SubDest<'a> {
        // Callers pass ranges inside the arena (the arena was sized from these plans).
        let base_bytes = base_bytes.min(parent.len_bytes());
        let len_bytes = len_bytes.min(parent.len_bytes() - base_bytes);
        SubDest { parent, base_bytes, len_bytes }
    }

    /// `len_bytes` at `offset_bytes` of this sub-destination, for a read that has landed.
    fn landed(&self, offset_bytes: u64, len_bytes: u64) -> Option<&'a [u8]> {
        if offset_bytes.checked_add(len_bytes)? > self.len_bytes {
            return None;
        }
        if len_bytes == 0 {
            return Some(&[]);
        }
        // SAFETY: inside this sub-destination (checked above); called from `read_done` for a read
        // that has landed, or from `prefix_landed` for a landed prefix of one (the backend borrows
        // only the bytes of its next call mutably, never the prefix), and plan reads never
        // overlap, so no backend writes this range again while the slice is used (the arena is
        // reused only after the run ends).
        Some(unsafe { self.parent.slice_unchecked(self.base_bytes + offset_bytes, len_bytes) })
    }

    /// The bytes of tensor `tag` of `wp`, which runs in this sub-destination.
    fn rebase(&self, wp: &WindowPlan, tag: u32) -> Option<&'a [u8]> {
        let l = wp.plan.location(tag)?;
        if l.len_bytes == 0 {
            return Some(&[]);
        }
        // SAFETY: called once every read carrying the tensor has completed; plan reads never
        // overlap, so no backend writes this range while the slice is used (the arena is reused only
        // after the run and its callbacks end).
        Some(unsafe { self.parent.slice_unchecked(self.base_bytes + l.arena_offset_bytes, l.len_bytes) })
    }
}

// SAFETY: a sub-range of an arena, which satisfies the contract; `host_ptr` points inside it and
// `len_bytes` never passes the arena's end (clamped in `new`).
unsafe impl Destination for SubDest<'_> {
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    fn host_ptr(&self) -> NonNull<u8> {
        // SAFETY: `base_bytes <= parent.len_bytes()`, so the pointer stays inside (or one past) the
        // mapping.
        unsafe { self.parent.host_ptr().add(self.base_bytes as usize) }
    }
    fn align_bytes(&self) -> u64 {
        let base_align =
            if self.base_bytes == 0 { Arena::ALIGN_BYTES } else { 1 << self.base_bytes.trailing_zeros() };
        base_align.min(Arena::ALIGN_BYTES)
    }
    fn on_landed(&self, offset_bytes: u64, len_bytes: u64) -> std::io::Result<()> {
        self.parent.on_landed(self.base_bytes + offset_bytes, len_bytes)
    }
}

fn by_name(name: &str) -> Result<Arc<dyn IoBackend>, LoadError> {
    crate::registry::by_name(name).map(Arc::from).ok_or_else(|| LoadError::UnknownBackend {
        name: name.to_owned(),
        known: crate::registry::names().join(", "),
    })
}

/// Whether a direct plan can be built under `opts`: direct reads are block-aligned, and
/// `PlanConfig::validate` refuses a budget or chunk below the alignment. `auto` stays buffered
/// when this is false (an explicit [`IoMode::Direct`] still gets the planner's typed error).
fn direct_plannable(opts: &LoadOptions) -> bool {
    let block = crate::sync::DIRECT_BLOCK_BYTES;
    opts.budget_bytes >= block && opts.chunk_bytes.max(1) >= block
}

/// Open files of one load, keyed by checkpoint file id, at most `max` at once.
struct FileSet {
    open: HashMap<u32, SourceFile>,
    /// Every file opened during the load (checked again at the end).
    used: Vec<u32>,
    max: usize,
    /// Seconds spent opening files (open, fstat, sparse check): the `open` phase, not `io`.
    open_secs: f64,
}

impl FileSet {
    fn new(max: usize) -> FileSet {
        FileSet { open: HashMap::new(), used: Vec::new(), max: max.max(1), open_secs: 0.0 }
    }

    /// Moves the time spent opening files from the `io` phase (which includes it) to `open`.
    fn bill_open(&mut self, phases: &mut Phases) {
        let secs = std::mem::take(&mut self.open_secs);
        phases.io = (phases.io - secs).max(0.0);
        phases.open += secs;
    }

    /// The files `ids` in that order, opening (and checking) the ones not open yet and closing
    /// others to stay within the bound.
    fn take(
        &mut self,
        ckpt: &Checkpoint,
        ids: &[u32],
        direct: bool,
        allow_sparse: bool,
    ) -> Result<Vec<SourceFile>, LoadError> {
        let extra = ids.iter().filter(|f| !self.open.contains_key(f)).count();
        if self.open.len() + extra > self.max {
            let surplus: Vec<u32> = self.open.keys().copied().filter(|f| !ids.contains(f)).collect();
            for f in surplus {
                if let Some(s) = self.open.remove(&f) {
                    check_open(ckpt, f, &s)?;
                }
            }
        }
        let mut out = Vec::with_capacity(ids.len());
        for &f in ids {
            let source = match self.open.remove(&f) {
                Some(s) => s,
                None => {
                    let t = Instant::now();
                    let s = open_source(ckpt, f, direct, allow_sparse);
                    self.open_secs += t.elapsed().as_secs_f64();
                    match s {
                        Ok(s) => {
                            if !self.used.contains(&f) {
                                self.used.push(f);
                            }
                            s
                        }
                        Err(e) => {
                            self.give_back(&ids[..out.len()], out);
                            return Err(e);
                        }
                    }
                }
            };
            out.push(source);
        }
        Ok(out)
    }

    fn give_back(&mut self, ids: &[u32], sources: Vec<SourceFile>) {
        for (&f, s) in ids.iter().zip(sources) {
            self.open.insert(f, s);
        }
    }

    /// `fstat` every open descriptor and `stat` every used path: any change is an error.
    fn close_and_check(&mut self, ckpt: &Checkpoint) -> Result<(), LoadError> {
        for (f, s) in std::mem::take(&mut self.open) {
            check_open(ckpt, f, &s)?;
        }
        for &f in &self.used {
            let entry = ckpt.file(FileId(f));
            let meta = std::fs::metadata(entry.path())
                .map_err(|source| LoadError::Open { path: entry.path().to_owned(), source })?;
            compare_stamp(entry.path(), entry.stamp(), &meta)?;
        }
        Ok(())
    }
}

fn check_open(ckpt: &Checkpoint, f: u32, s: &SourceFile) -> Result<(), LoadError> {
    let entry = ckpt.file(FileId(f));
    let meta = s.buffered.metadata().map_err(|source| LoadError::Open { path: s.path.clone(), source })?;
    compare_stamp(entry.path(), entry.stamp(), &meta)
}

/// Open one checkpoint file: buffered descriptor (and a direct one when asked and supported),
/// `fstat` against the parse-time stamp, sparse check.
fn open_source(ckpt: &Checkpoint, f: u32, direct: bool, allow_sparse: bool) -> Result<SourceFile, LoadError> {
    let entry = ckpt.file(FileId(f));
    let path = entry.path();
    let open_err = |source| LoadError::Open { path: path.to_owned(), source };
    let buffered = File::open(path).map_err(open_err)?;
    let meta = buffered.metadata().map_err(open_err)?;
    compare_stamp(path, entry.stamp(), &meta)?;
    let len_bytes = meta.len();
    let allocated_bytes = meta.blocks().saturating_mul(512);
    if !allow_sparse && len_bytes >= SPARSE_MIN_LEN_BYTES && allocated_bytes < len_bytes / SPARSE_RATIO {
        return Err(LoadError::Sparse { path: path.to_owned(), allocated_bytes, len_bytes });
    }
    let direct = if direct { crate::probe::open_direct(path).ok() } else { None };
    if let Some(d) = &direct {
        // The path was opened twice: both descriptors must name the same file, or a rename between
        // the two opens would have the direct reads fetch another file's bytes.
        let d_meta = d.metadata().map_err(open_err)?;
        if (d_meta.dev(), d_meta.ino()) != (meta.dev(), meta.ino()) {
            return Err(LoadError::Changed {
                path: path.to_owned(),
                what: format!("O_DIRECT descriptor opened inode {} instead of {}", d_meta.ino(), meta.ino()),
            });
        }
    }
    Ok(SourceFile { path: path.to_owned(), len_bytes, buffered, direct })
}

fn compare_stamp(path: &Path, parsed: FileStamp, now: &std::fs::Metadata) -> Result<(), LoadError> {
    let now = FileStamp::from_metadata(now);
    let mut what = Vec::new();
    if now.len_bytes != parsed.len_bytes {
        what.push(format!("size {} -> {}", parsed.len_bytes, now.len_bytes));
    }
    if now.modified != parsed.modified {
        what.push("mtime".to_owned());
    }
    if (now.dev, now.inode) != (parsed.dev, parsed.inode) {
        what.push(format!("inode {} -> {}", parsed.inode, now.inode));
    }
    if what.is_empty() {
        Ok(())
    } else {
        Err(LoadError::Changed { path: path.to_owned(), what: what.join(", ") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_direct_needs_a_budget_and_chunk_of_at_least_one_block() {
        let block = crate::sync::DIRECT_BLOCK_BYTES;
        assert!(direct_plannable(&LoadOptions::default()));
        for (budget_bytes, chunk_bytes, ok) in
            [(block, block, true), (block - 1, block, false), (block, block - 1, false), (1, 0, false)]
        {
            let opts = LoadOptions { budget_bytes, chunk_bytes, ..LoadOptions::default() };
            assert_eq!(direct_plannable(&opts), ok, "budget {budget_bytes} chunk {chunk_bytes}");
            // Whatever `auto` decides must be plannable: the direct config validates exactly
            // when `direct_plannable` says so.
            let config = PlanConfig {
                align_bytes: block,
                chunk_bytes: chunk_bytes.max(1),
                budget_bytes,
                ..PlanConfig::default()
            };
            assert_eq!(config.validate().is_ok(), ok, "budget {budget_bytes} chunk {chunk_bytes}");
        }
    }

    #[test]
    fn stream_windows_split_on_files_and_bytes() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/serverlessllm/tiny");
        let ckpt = tensora_format::sllm::open_dir(Path::new(dir)).unwrap();
        let selected: Vec<usize> = (0..ckpt.tensors().len()).collect();
        for files_open_max in [1, 2, 8] {
            let opts = LoadOptions { files_open_max, budget_bytes: 16 << 10, ..LoadOptions::default() };
            let windows = stream_windows(&ckpt, &selected, &opts);
            assert_eq!(windows.concat(), selected);
            for w in &windows {
                let mut files: Vec<u32> = w.iter().map(|&i| ckpt.tensors()[i].file().0).collect();
                files.dedup();
                files.sort_unstable();
                files.dedup();
                assert!(files.len() <= files_open_max, "{w:?}");
            }
        }
    }
}
