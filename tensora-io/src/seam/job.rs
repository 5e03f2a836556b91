//! [`Job`]: everything a backend needs for one run, and [`ReadTarget`], the safe once-only
//! hand-out of a read's destination bytes.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tensora_plan::{DeviceCost, Plan, Read};

use super::{
    Budget, CompletionSink, Destination, HeldPiece, KeepMapped, Landed, ReadError, ReadErrorKind, SourceFile,
};

/// The knobs of one run, for [`Job::new`].
///
/// A device cost is part of a read-ahead reading only: a job reading around the page cache, or
/// from it, cannot be given one.
///
/// ```compile_fail,E0560
/// use tensora_io::{JobConfig, Reading};
/// let pages = tensora_plan::DeviceCost { granule_bytes: 4096, request_cost_bytes: 8192 };
/// let direct = JobConfig { threads: 1, queue_depth: 1, reading: Reading::Direct, device_cost: Some(pages), retries_max: 8 };
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobConfig {
    /// Worker threads (sync, mmap-owned) or rings (io_uring). At least 1.
    pub threads: usize,
    /// Submission queue depth per ring (io_uring) or reads kept in flight per worker.
    pub queue_depth: u32,
    /// How the run's reads meet the page cache: around it (`O_DIRECT`), or through it with or
    /// without a helper reading the files ahead of the workers (and then what the device costs).
    pub reading: Reading,
    /// Bound on zero-progress retries (`EINTR`, `EAGAIN`) of one read (see
    /// `read_progress`).
    pub retries_max: u32,
}

/// How a run's reads meet the page cache: the cold/warm decision `auto` makes, carried to the
/// backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Around the page cache: the `O_DIRECT` descriptor where one is open (backends fall back to
    /// buffered on `EINVAL`).
    Direct,
    /// Through the page cache, the pages expected there already (warm): the workers' copies only.
    Cached,
    /// Through the page cache, the pages expected on the device (cold): a helper thread reads each
    /// file queue into the page cache ahead of the workers (`map/readahead.rs`), so the device
    /// sees a deep queue and the pages stay for the next process.
    ReadAhead {
        /// What the device behind the files costs: the helper advises each read widened back over
        /// a gap the device reads along anyway ([`DeviceCost::ahead_ranges`]). Set by whoever
        /// configures the job from what it knows of the medium (a load: `auto`'s cold decision,
        /// with the measured cost of a cold local file); `None`: each read is advised alone.
        device_cost: Option<DeviceCost>,
    },
    /// Through the page cache, cold, filled in 2 MiB folios: per file queue a populator thread
    /// maps the file read-only with `MADV_HUGEPAGE` and reads it in (`MADV_POPULATE_READ`) in the
    /// job's order ahead of the workers, which copy a read once its range is populated
    /// (`map/fill.rs`); a populator that fails or stops lets them read anyway. `auto` picks it for
    /// a cold keep where free memory is not reported to a hypervisor (docs/performance.md
    /// "Restarts"). Only the sync backend populates; the others read it as [`Reading::ReadAhead`].
    PopulateAhead {
        /// As for [`Reading::ReadAhead`]: each read is populated widened back over a gap the
        /// device reads along.
        device_cost: Option<DeviceCost>,
    },
}

impl Reading {
    /// Whether reads use the `O_DIRECT` descriptor.
    pub fn is_direct(self) -> bool {
        self == Reading::Direct
    }

    /// `Direct` when `direct` holds, else `ReadAhead` with each read advised alone (a buffered
    /// read of data not known to be cached, on a device of unknown cost).
    pub fn direct_or_ahead(direct: bool) -> Reading {
        if direct { Reading::Direct } else { Reading::ReadAhead { device_cost: None } }
    }
}

/// Everything a backend needs for one run. Plan file ids index into `files`.
///
/// The fields are public for reading; a `Job` can only be built through the `unsafe`
/// [`Job::new`], and it is neither `Clone` nor `Copy`, so safe code holding a `&Job` cannot make a
/// second job aimed at the same destination ranges.
pub struct Job<'a> {
    /// The reads to execute, in per-file queues.
    pub plan: &'a Plan,
    /// The open files, indexed by plan file id (empty for a backend that reads elsewhere).
    pub files: &'a [SourceFile],
    /// Where the bytes land.
    pub dest: &'a dyn Destination,
    /// In-flight byte budget shared by all workers of this job.
    pub budget: &'a Budget,
    /// Set by the caller to stop the run early; the backend drains what is in flight and returns
    /// [`ReadErrorKind::Cancelled`].
    pub cancel: &'a AtomicBool,
    /// Threads, queue depth, direct I/O and the retry bound of this run.
    pub config: JobConfig,
    /// Checkpoint file id of each plan file (`None`: plan file `i` is checkpoint file `i`).
    file_ids: Option<&'a [u32]>,
    /// Report landed prefixes of each read every this many bytes (see
    /// [`CompletionSink::prefix_landed`]); `None`: whole reads only.
    landed_step_bytes: Option<u64>,
    /// Keeps the destination mapped after the job ([`Job::with_kept_mapping`]).
    kept: Option<KeepMapped>,
    /// One bit per plan read: set once its destination range has been handed out
    /// ([`Job::claim`]) or taken by a built-in backend. A range is never handed out twice.
    claims: Box<[AtomicU64]>,
    /// Whether the reads' destination ranges are pairwise disjoint, checked once, at the first
    /// hand-out (`Err((a, b))`: reads `a` and `b` overlap).
    disjoint: OnceLock<Result<(), (u32, u32)>>,
    /// Private: only [`Job::new`] builds a job.
    _sealed: Sealed,
}

/// Keeps [`Job`] from being built with a struct literal.
#[derive(Debug)]
struct Sealed;

impl<'a> Job<'a> {
    /// A job that writes the reads of `plan` into `dest`.
    ///
    /// # Safety
    ///
    /// Backends write into `dest` through raw pointers, from several threads, while the job runs
    /// (any [`IoBackend::execute`] call with it). The caller guarantees that for that whole time
    /// the destination ranges of the plan's reads (`arena_offset_bytes .. + len_bytes` of every
    /// [`Plan::reads`] entry) are written by nobody else, and none of them is referenced (`&` or
    /// `&mut`) before its read has been reported to the [`CompletionSink`]: in particular no
    /// other job over an overlapping range of the same destination runs at the same time. Ranges
    /// outside the destination are refused by the backends, so the plan need not be checked
    /// against it.
    ///
    /// ```
    /// use std::sync::atomic::AtomicBool;
    /// use tensora_io::{Job, JobConfig, Reading};
    /// use tensora_io::Arena;
    /// use tensora_io::Budget;
    /// use tensora_plan::{Order, Plan, PlanConfig};
    ///
    /// let plan = Plan::build(&[], &PlanConfig::default(), &Order::File)?;
    /// let arena = Arena::with_len(4096)?;
    /// let (budget, cancel) = (Budget::new(1 << 20), AtomicBool::new(false));
    /// let config = JobConfig { threads: 1, queue_depth: 1, reading: Reading::ReadAhead { device_cost: None }, retries_max: 8 };
    /// // SAFETY: nothing else touches `arena` while the job runs.
    /// let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, config) };
    /// assert_eq!(job.config.threads, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// [`IoBackend::execute`]: crate::IoBackend::execute
    pub unsafe fn new(
        plan: &'a Plan,
        files: &'a [SourceFile],
        dest: &'a dyn Destination,
        budget: &'a Budget,
        cancel: &'a AtomicBool,
        config: JobConfig,
    ) -> Job<'a> {
        let words = plan.reads().len().div_ceil(64);
        Job {
            plan,
            files,
            dest,
            budget,
            cancel,
            config,
            file_ids: None,
            landed_step_bytes: None,
            kept: None,
            claims: (0..words).map(|_| AtomicU64::new(0)).collect(),
            disjoint: OnceLock::new(),
            _sealed: Sealed,
        }
    }

    /// Records which checkpoint file each plan file is (`file_ids[plan_file]`), for backends
    /// that do not read through [`Job::files`] (see
    /// [`IoBackend::reads_local_files`](crate::IoBackend::reads_local_files)).
    pub fn with_file_ids(mut self, file_ids: &'a [u32]) -> Job<'a> {
        self.file_ids = Some(file_ids);
        self
    }

    /// Asks backends that can to fill each read in steps of `step_bytes` (at least 4 KiB, a
    /// multiple of 4 KiB) and report each landed prefix to [`CompletionSink::prefix_landed`].
    pub fn with_landed_step(mut self, step_bytes: u64) -> Job<'a> {
        self.landed_step_bytes = Some(step_bytes.max(4096).next_multiple_of(4096));
        self
    }

    /// Says that `dest` stays mapped after the job for as long as `kept` lives (an owned load's
    /// arena, which becomes the loaded model: not a streaming window, which the next batch
    /// reuses), so that backends can hand out [`HeldPiece`]s of its reads
    /// ([`ReadTarget::hand_out_held`]). Ignored unless `kept` covers the whole destination.
    pub fn with_kept_mapping(mut self, kept: KeepMapped) -> Job<'a> {
        if kept.covers(self.dest.host_ptr(), self.dest.len_bytes() as usize) {
            self.kept = Some(kept);
        }
        self
    }

    /// Whether the destination stays mapped after the job ([`Job::with_kept_mapping`]).
    pub fn keeps_mapping(&self) -> bool {
        self.kept.is_some()
    }

    /// The step asked for with [`Job::with_landed_step`].
    pub fn landed_step_bytes(&self) -> Option<u64> {
        self.landed_step_bytes
    }

    /// The checkpoint file id (index into `Checkpoint::files`) of plan file `plan_file`, or
    /// `None` if the plan names a file the job does not know.
    ///
    /// ```
    /// # use std::sync::atomic::AtomicBool;
    /// # use tensora_io::{Job, JobConfig, Reading};
    /// # use tensora_io::Budget;
    /// use tensora_plan::{Order, Plan, PlanConfig};
    /// let plan = Plan::build(&[], &PlanConfig::default(), &Order::File)?;
    /// let arena = tensora_io::Arena::with_len(4096)?;
    /// let (budget, cancel) = (Budget::new(1 << 20), AtomicBool::new(false));
    /// let config = JobConfig { threads: 1, queue_depth: 1, reading: Reading::ReadAhead { device_cost: None }, retries_max: 8 };
    /// // SAFETY: nothing else touches `arena` while the job runs.
    /// let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, config) };
    /// assert_eq!(job.checkpoint_file(3), Some(3));
    /// let job = job.with_file_ids(&[7, 2]);
    /// assert_eq!((job.checkpoint_file(1), job.checkpoint_file(2)), (Some(2), None));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint_file(&self, plan_file: u32) -> Option<u32> {
        match self.file_ids {
            Some(ids) => ids.get(plan_file as usize).copied(),
            None => Some(plan_file),
        }
    }

    /// Claim read `index` (into [`Plan::reads`]) for writing: its destination range as a
    /// [`ReadTarget`]. Each read is handed out at most once per job, whoever asks (a second
    /// claim, or a claim of a read a built-in backend already took, is an error), so a backend
    /// written in safe code can fill reads from several threads or tasks at once.
    ///
    /// Errors name the read: an index outside the plan, a range outside the destination, or a
    /// read claimed before.
    ///
    /// ```
    /// # use std::sync::atomic::AtomicBool;
    /// # use tensora_io::{Job, JobConfig, CompletionSink, Reading, StopReason};
    /// # use tensora_io::Budget;
    /// use tensora_plan::{Extent, Order, Plan, PlanConfig};
    /// struct Count(std::sync::atomic::AtomicU32);
    /// impl CompletionSink for Count {
    ///     fn read_done(&self, _landed: tensora_io::Landed<'_>) -> Result<(), StopReason> {
    ///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ///         Ok(())
    ///     }
    /// }
    /// let extents = [Extent { file: 0, offset_bytes: 8, len_bytes: 100, tag: 0 }];
    /// let plan = Plan::build(&extents, &PlanConfig::default(), &Order::File)?;
    /// let arena = tensora_io::Arena::with_len(plan.arena_len_bytes())?;
    /// let (budget, cancel) = (Budget::new(1 << 20), AtomicBool::new(false));
    /// let config = JobConfig { threads: 1, queue_depth: 1, reading: Reading::ReadAhead { device_cost: None }, retries_max: 8 };
    /// // SAFETY: nothing else touches `arena` while the job runs.
    /// let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, config) };
    /// let mut target = job.claim(0)?;
    /// target.buf().fill(7);
    /// assert!(job.claim(0).is_err(), "a read is handed out once");
    /// let sink = Count(Default::default());
    /// target.land(&sink)?;
    /// assert_eq!(sink.0.into_inner(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn claim(&self, index: u32) -> Result<ReadTarget<'_>, ReadError> {
        self.check_disjoint()?;
        let read = self.checked_read(index)?;
        self.take_claim(index, read)?;
        // SAFETY: `checked_read` proved `arena_offset_bytes + len_bytes <= dest.len_bytes()`,
        // which fits usize, so the offset stays inside the destination's allocation.
        let ptr = unsafe { self.dest.host_ptr().add(read.arena_offset_bytes as usize) };
        Ok(ReadTarget {
            job: self,
            index,
            ptr,
            len: read.len_bytes as usize,
            handed_out_bytes: 0,
            pieces_out: None,
            _bytes: std::marker::PhantomData,
        })
    }

    /// Claims every read of the plan at once, for a built-in backend that writes through raw
    /// pointers (after checking every range). Fails if any read was claimed before.
    pub(crate) fn claim_all(&self) -> Result<(), ReadError> {
        self.check_disjoint()?;
        let reads = self.plan.reads();
        for (w, word) in self.claims.iter().enumerate() {
            let bits = (reads.len() - w * 64).min(64);
            let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
            let before = word.fetch_or(mask, Ordering::AcqRel);
            if before & mask != 0 {
                let index = w * 64 + (before & mask).trailing_zeros() as usize;
                return Err(already_claimed(&reads[index], index as u32));
            }
        }
        Ok(())
    }

    /// Refuses a plan whose reads' destination ranges overlap: two backends' writes (or a write
    /// and a hand-out) would then race on the same bytes. The planner never builds one (its
    /// `Plan::check` re-derives this in debug builds); this is the release-build guard, checked
    /// once per job in O(reads log reads).
    fn check_disjoint(&self) -> Result<(), ReadError> {
        let reads = self.plan.reads();
        match *self.disjoint.get_or_init(|| overlapping_reads(reads)) {
            Ok(()) => Ok(()),
            Err((a, b)) => {
                let why = format!("reads {a} and {b} of the plan land on overlapping destination bytes");
                Err(invalid_read(&reads[b as usize], why))
            }
        }
    }

    fn take_claim(&self, index: u32, read: &Read) -> Result<(), ReadError> {
        let bit = 1u64 << (index % 64);
        let word = &self.claims[index as usize / 64];
        if word.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return Err(already_claimed(read, index));
        }
        Ok(())
    }

    /// Read `index`, checked to exist and to land inside the destination.
    fn checked_read(&self, index: u32) -> Result<&Read, ReadError> {
        let invalid = |read: Option<&Read>, why: String| ReadError {
            file: read.map_or(ReadError::NO_FILE, |r| r.file),
            offset_bytes: read.map_or(0, |r| r.offset_bytes),
            len_bytes: read.map_or(0, |r| r.len_bytes),
            kind: ReadErrorKind::Io(io::Error::new(io::ErrorKind::InvalidInput, why)),
        };
        let reads = self.plan.reads();
        let Some(read) = reads.get(index as usize) else {
            return Err(invalid(None, format!("read {index} is not in the plan ({} reads)", reads.len())));
        };
        let dest_len = self.dest.len_bytes();
        let end = read.arena_offset_bytes.checked_add(read.len_bytes);
        if end.is_none_or(|e| e > dest_len) || usize::try_from(dest_len).is_err() {
            return Err(invalid(
                Some(read),
                format!(
                    "read {index} lands at {}..+{} but the destination holds {dest_len} bytes",
                    read.arena_offset_bytes, read.len_bytes
                ),
            ));
        }
        Ok(read)
    }
}

/// The first pair of reads (by destination offset) whose non-empty destination ranges overlap.
fn overlapping_reads(reads: &[Read]) -> Result<(), (u32, u32)> {
    let mut order: Vec<u32> = (0..reads.len() as u32).filter(|&i| reads[i as usize].len_bytes > 0).collect();
    order.sort_unstable_by_key(|&i| reads[i as usize].arena_offset_bytes);
    for pair in order.windows(2) {
        let (a, b) = (&reads[pair[0] as usize], &reads[pair[1] as usize]);
        if a.arena_offset_bytes.saturating_add(a.len_bytes) > b.arena_offset_bytes {
            return Err((pair[0], pair[1]));
        }
    }
    Ok(())
}

fn already_claimed(read: &Read, index: u32) -> ReadError {
    invalid_read(read, format!("read {index} was already claimed in this job"))
}

/// A refused hand-out of `read`: an `InvalidInput` error naming the read and why.
fn invalid_read(read: &Read, why: String) -> ReadError {
    ReadError {
        file: read.file,
        offset_bytes: read.offset_bytes,
        len_bytes: read.len_bytes,
        kind: ReadErrorKind::Io(io::Error::new(io::ErrorKind::InvalidInput, why)),
    }
}

/// One read's destination range, handed out once by [`Job::claim`]. Fill [`ReadTarget::buf`],
/// then report it with [`ReadTarget::land`]. Dropping it without landing leaves the read
/// incomplete (the load then fails naming the tensor), never half-reported.
///
/// A filled front part can go on before the read lands ([`ReadTarget::hand_out`]): a backend
/// that writes what it fetched elsewhere (a cache) starts on each piece while the rest arrives.
pub struct ReadTarget<'j> {
    job: &'j Job<'j>,
    index: u32,
    /// Start of the read's destination range (`read().len_bytes` bytes), claimed for this target
    /// alone. Kept as a pointer, not a `&mut [u8]` field, so that no unique borrow of the bytes is
    /// alive while [`ReadTarget::land`] hands them to the sink for reading.
    ptr: NonNull<u8>,
    len: usize,
    /// The front bytes handed out read-only as [`Filled`] pieces; `buf` covers the rest.
    handed_out_bytes: usize,
    /// Held by every handed-out piece (`None` before the first): the read lands only once this
    /// is the last holder.
    pieces_out: Option<Arc<()>>,
    _bytes: std::marker::PhantomData<&'j mut [u8]>,
}

// SAFETY: a `ReadTarget` is the one hand-out of its byte range (the claim bit makes it unique), so
// moving it to another thread is like moving the `&mut [u8]` it stands for; the `&Job` it holds is
// `Sync`.
unsafe impl Send for ReadTarget<'_> {}

impl<'j> ReadTarget<'j> {
    /// The read's index in [`Plan::reads`].
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The planned read: file (a plan file; see [`Job::checkpoint_file`]), file offset, length.
    pub fn read(&self) -> &Read {
        &self.job.plan.reads()[self.index as usize]
    }

    /// The destination bytes of this read not handed out yet: all `read().len_bytes` of them
    /// until the first [`ReadTarget::hand_out`], then those after the pieces.
    pub fn buf(&mut self) -> &mut [u8] {
        // SAFETY: `ptr..ptr + len` lies inside the destination (checked by `Job::claim`), whose
        // contract makes it initialised, valid and writable while the job lives ('j); `Job::new`'s
        // contract says nobody outside the job touches it during the run; plan reads never
        // overlap; and the claim bit, set once, makes this target the range's only hand-out. The
        // handed-out front (`..handed_out_bytes`) is left out, so no piece's bytes are in this
        // slice; the `&mut self` borrow keeps the slice unique within the target.
        unsafe {
            let start = self.ptr.as_ptr().add(self.handed_out_bytes);
            std::slice::from_raw_parts_mut(start, self.len - self.handed_out_bytes)
        }
    }

    /// The bytes handed out so far (the front of the read, in pieces).
    pub fn handed_out_bytes(&self) -> usize {
        self.handed_out_bytes
    }

    /// Hand out the next `len_bytes` of the read (the front of [`ReadTarget::buf`], which must
    /// be filled: they are final) as a read-only piece another thread may read while the rest is
    /// filled. `None` if fewer bytes are left. The read lands only once every piece is dropped.
    ///
    /// ```
    /// # use std::sync::atomic::AtomicBool;
    /// # use tensora_io::{Job, JobConfig, CompletionSink, Reading, StopReason};
    /// # use tensora_io::Budget;
    /// use tensora_plan::{Extent, Order, Plan, PlanConfig};
    /// # struct Sink;
    /// # impl CompletionSink for Sink {
    /// #     fn read_done(&self, _landed: tensora_io::Landed<'_>) -> Result<(), StopReason> { Ok(()) }
    /// # }
    /// let extents = [Extent { file: 0, offset_bytes: 0, len_bytes: 100, tag: 0 }];
    /// let plan = Plan::build(&extents, &PlanConfig::default(), &Order::File)?;
    /// let arena = tensora_io::Arena::with_len(plan.arena_len_bytes())?;
    /// let (budget, cancel) = (Budget::new(1 << 20), AtomicBool::new(false));
    /// let config = JobConfig { threads: 1, queue_depth: 1, reading: Reading::ReadAhead { device_cost: None }, retries_max: 8 };
    /// // SAFETY: nothing else touches `arena` while the job runs.
    /// let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, config) };
    /// let mut target = job.claim(0)?;
    /// target.buf()[..60].fill(1);
    /// let front = target.hand_out(60).expect("60 of 100 bytes");
    /// // Another thread reads the front while the rest is filled.
    /// let sum = std::thread::scope(|s| {
    ///     let reader = s.spawn(|| front.bytes().iter().map(|&b| u32::from(b)).sum::<u32>());
    ///     target.buf().fill(2);
    ///     reader.join().unwrap()
    /// });
    /// assert_eq!((sum, target.buf().len()), (60, 40));
    /// assert!(target.hand_out(41).is_none(), "only 40 bytes are left");
    /// drop(front); // the read lands only once its pieces are gone
    /// target.land(&Sink)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hand_out(&mut self, len_bytes: usize) -> Option<Filled<'j>> {
        if len_bytes > self.len - self.handed_out_bytes {
            return None;
        }
        let out = Arc::clone(self.pieces_out.get_or_insert_with(|| Arc::new(())));
        // SAFETY: `handed_out_bytes + len_bytes <= len`, inside the claimed range.
        let ptr = unsafe { self.ptr.add(self.handed_out_bytes) };
        let offset_bytes = self.handed_out_bytes;
        self.handed_out_bytes += len_bytes;
        Some(Filled { ptr, len: len_bytes, offset_bytes, _out: out, _bytes: std::marker::PhantomData })
    }

    /// Hand out the next `len_bytes` of the read (filled: they are final) as a [`HeldPiece`],
    /// which stays mapped after the job and the load (it does not hold the read back from
    /// landing, nor the memory from the load's caller, who may change it once the load returns:
    /// see [`HeldPiece`]). `None` if fewer bytes are left, or if the job's destination is not kept
    /// mapped ([`Job::with_kept_mapping`]); the bytes are then not handed out.
    pub fn hand_out_held(&mut self, len_bytes: usize) -> Option<HeldPiece> {
        if len_bytes > self.len - self.handed_out_bytes {
            return None;
        }
        let kept = self.job.kept.clone()?;
        // SAFETY: `handed_out_bytes + len_bytes <= len`, inside the claimed range, which lies
        // inside the destination that `kept` covers (checked by `Job::with_kept_mapping`).
        let ptr = unsafe { self.ptr.add(self.handed_out_bytes) };
        self.handed_out_bytes += len_bytes;
        Some(HeldPiece::new(kept, ptr, len_bytes))
    }

    /// Every byte of the read has been written: calls [`Destination::on_landed`], then
    /// [`CompletionSink::read_done`] (an error from the sink becomes [`ReadErrorKind::Stopped`]).
    /// Refused (`InvalidInput`) while a piece from [`ReadTarget::hand_out`] is still held: the
    /// sink may hand the bytes to a consumer that reuses them.
    pub fn land(mut self, sink: &dyn CompletionSink) -> Result<(), ReadError> {
        // `get_mut` sees every other holder's drop (acquire): the pieces' reads are done.
        if let Some(out) = self.pieces_out.as_mut()
            && Arc::get_mut(out).is_none()
        {
            return Err(invalid_read(self.read(), "landed while a piece of it is still held".to_owned()));
        }
        let read = self.read();
        let fail = |kind| ReadError {
            file: read.file,
            offset_bytes: read.offset_bytes,
            len_bytes: read.len_bytes,
            kind,
        };
        self.job
            .dest
            .on_landed(read.arena_offset_bytes, read.len_bytes)
            .map_err(|e| fail(ReadErrorKind::Io(e)))?;
        sink.read_done(Landed::new(self.job, self.index)).map_err(|_| fail(ReadErrorKind::Stopped))
    }
}

/// A filled front piece of a claimed read ([`ReadTarget::hand_out`]): its bytes, read-only, on
/// any thread, until it is dropped (the read cannot land before).
pub struct Filled<'j> {
    ptr: NonNull<u8>,
    len: usize,
    /// Where the piece starts within its read.
    offset_bytes: usize,
    _out: Arc<()>,
    _bytes: std::marker::PhantomData<&'j [u8]>,
}

// SAFETY: a piece is a shared view of bytes no one writes while it lives (its target's `buf` no
// longer covers them, and the read, whose landing would pass them on, waits for every piece), so
// it is what a `&[u8]` is: sendable and shareable.
unsafe impl Send for Filled<'_> {}
// SAFETY: as for `Send`: shared reads of bytes no one writes while the piece lives.
unsafe impl Sync for Filled<'_> {}

impl Filled<'_> {
    /// The piece's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: inside the claimed range (`hand_out` checked), valid for 'j, written by no one
        // while the piece lives (see the `Send` impl).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Where the piece starts within its read, in bytes.
    pub fn offset_bytes(&self) -> usize {
        self.offset_bytes
    }
}

impl std::fmt::Debug for Filled<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filled").field("offset_bytes", &self.offset_bytes).field("len", &self.len).finish()
    }
}

impl std::fmt::Debug for ReadTarget<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadTarget").field("index", &self.index).field("read", self.read()).finish()
    }
}

impl std::fmt::Debug for Job<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("reads", &self.plan.reads().len())
            .field("files", &self.files.len())
            .field("dest_len_bytes", &self.dest.len_bytes())
            .field("config", &self.config)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn held_pieces_come_only_from_a_job_whose_memory_is_kept_mapped() {
        use tensora_plan::{Extent, Order, PlanConfig};
        let extents = [Extent { file: 0, offset_bytes: 0, len_bytes: 8192, tag: 0 }];
        let plan = Plan::build(&extents, &PlanConfig::default(), &Order::File).unwrap();
        let arena = crate::arena::Arena::with_len(plan.arena_len_bytes()).unwrap();
        let (budget, cancel) = (Budget::new(1 << 20), AtomicBool::new(false));
        let config = JobConfig {
            threads: 1,
            queue_depth: 1,
            reading: Reading::ReadAhead { device_cost: None },
            retries_max: 8,
        };
        // SAFETY: nothing else touches `arena` while the jobs run, one after the other.
        let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, config) };
        assert!(!job.keeps_mapping());
        assert!(job.claim(0).unwrap().hand_out_held(4096).is_none());
        // SAFETY: as above.
        let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, config) };
        // A keep-alive that does not cover the destination is ignored.
        let small = crate::arena::Arena::with_len(4096).unwrap();
        let job = job.with_kept_mapping(small.keep_mapped());
        assert!(!job.keeps_mapping());
        let job = job.with_kept_mapping(arena.keep_mapped());
        assert!(job.keeps_mapping());
        let mut target = job.claim(0).unwrap();
        target.buf().fill(3);
        let piece = target.hand_out_held(4096).unwrap();
        assert_eq!((piece.addr(), piece.len_bytes()), (arena.as_ptr() as usize, 4096));
        assert!(target.hand_out_held(4097).is_none(), "4096 bytes are left");
        assert_eq!(target.buf().len(), 4096);
        // A held piece does not hold the read back from landing.
        struct Sink;
        impl CompletionSink for Sink {
            fn read_done(&self, _landed: Landed<'_>) -> Result<(), super::super::StopReason> {
                Ok(())
            }
        }
        target.land(&Sink).unwrap();
        drop(job);
        drop(arena);
        let file = tempfile::tempfile().unwrap();
        piece.write_at(&file, 0..4096, 0).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 4096);
    }

    fn read(arena_offset_bytes: u64, len_bytes: u64) -> Read {
        Read { file: 0, offset_bytes: arena_offset_bytes, len_bytes, arena_offset_bytes, pieces: 0..0 }
    }

    #[test]
    fn touching_ranges_are_disjoint_and_overlaps_are_named() {
        assert_eq!(overlapping_reads(&[read(0, 10), read(10, 5), read(20, 0), read(15, 1)]), Ok(()));
        assert_eq!(overlapping_reads(&[read(0, 10), read(30, 5), read(9, 2)]), Err((0, 2)));
        // Empty reads overlap nothing.
        assert_eq!(overlapping_reads(&[read(0, 10), read(5, 0)]), Ok(()));
    }

    proptest! {
        /// The check agrees with the quadratic definition on any set of ranges.
        #[test]
        fn the_check_agrees_with_pairwise_overlap(ranges in proptest::collection::vec((0u64..200, 0u64..40), 0..24)) {
            let reads: Vec<Read> = ranges.iter().map(|&(o, l)| read(o, l)).collect();
            let overlap = reads.iter().enumerate().any(|(i, a)| {
                reads.iter().skip(i + 1).any(|b| {
                    a.len_bytes > 0 && b.len_bytes > 0
                        && a.arena_offset_bytes < b.arena_offset_bytes + b.len_bytes
                        && b.arena_offset_bytes < a.arena_offset_bytes + a.len_bytes
                })
            });
            prop_assert_eq!(overlapping_reads(&reads).is_err(), overlap);
        }
    }
}
