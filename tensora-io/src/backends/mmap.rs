//! The `mmap` backend (owned mode): maps the checkpoint files read-only and copies each plan read
//! out of the mapping into the destination with worker threads, holding a budget permit per read.
//! Each read's source pages are populated (`MADV_POPULATE_READ`) before the copy, so a file
//! truncated after mapping fails the read with a typed error instead of raising `SIGBUS`; one
//! truncated by another process during a copy still faults, which is why `auto` never picks this
//! backend.
//! Zero-copy views (`Residence::Mapped`) do not run this backend: see [`crate::map`].

use std::io;

use tensora_plan::Read;

use super::runtime::{DestPtr, RunState, job_error, run_workers, validate_job};
use crate::map::{FileRange, MapMode, MappedFiles};
use crate::seam::{CompletionSink, IoBackend, IoStats, Job, ReadError, ReadErrorKind};

/// Default read-ahead distance of the mmap backend, in plan reads (see [`MmapConfig`]).
pub const WILLNEED_LOOKAHEAD_DEFAULT_READS: u32 = 4;
/// Largest number of copy threads the mmap backend uses.
pub const MMAP_THREADS_MAX: usize = 256;

/// Knobs of the mmap backend's owned mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmapConfig {
    /// `MADV_POPULATE_READ` each read's source range before copying it (one fault-in syscall per
    /// read instead of one page fault per 64 KiB of fault-around).
    pub populate_source: bool,
    /// When a worker takes read `i`, `MADV_WILLNEED` read `i + willneed_lookahead_reads` so the
    /// kernel reads ahead while this one is copied (cold files). 0 turns it off.
    pub willneed_lookahead_reads: u32,
}

impl Default for MmapConfig {
    fn default() -> Self {
        Self { populate_source: true, willneed_lookahead_reads: WILLNEED_LOOKAHEAD_DEFAULT_READS }
    }
}

/// The mmap backend, owned mode: maps the files and copies each plan read from the mapping into
/// the destination with `job.config.threads` threads, holding a budget permit per read.
///
/// ```
/// use tensora_io::IoBackend;
/// use tensora_io::MmapBackend;
///
/// assert_eq!(MmapBackend::default().name(), "mmap");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MmapBackend {
    config: MmapConfig,
}

impl MmapBackend {
    /// A backend with the given configuration.
    pub fn new(config: MmapConfig) -> Self {
        Self { config }
    }

    /// The configuration this backend runs with.
    pub fn config(&self) -> MmapConfig {
        self.config
    }
}

impl IoBackend for MmapBackend {
    fn name(&self) -> &'static str {
        "mmap"
    }

    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        validate_job(job)?;
        let reads = job.plan.reads();
        if reads.is_empty() {
            return Ok(IoStats::default());
        }
        // SAFETY: no `&[u8]` over these maps outlives one read's copy, which reads through raw
        // pointers right after that read's pages were read in (a file truncated before then is a
        // typed error). A file truncated by another process during a copy still faults (SIGBUS),
        // the risk this backend documents (`auto` never picks it); in-place writes by others land
        // in the copy, and the load's closing stamp check then fails the load.
        let maps =
            unsafe { MappedFiles::map_indexed(job.files, MapMode::ReadOnly) }.map_err(|(file, e)| {
                ReadError {
                    file,
                    offset_bytes: 0,
                    len_bytes: job.files.get(file as usize).map_or(0, |f| f.len_bytes),
                    kind: ReadErrorKind::Io(e),
                }
            })?;
        // Sequential advice over each file queue's span. Advice is only a hint: failures are ignored.
        for q in job.plan.queues() {
            let queue_reads = reads.get(q.reads.start as usize..q.reads.end as usize).unwrap_or(&[]);
            let start = queue_reads.iter().map(|r| r.offset_bytes).min();
            let end = queue_reads.iter().map(|r| r.offset_bytes + r.len_bytes).max();
            if let (Some(start), Some(end)) = (start, end) {
                let len = end.min(maps.len_bytes(q.file).unwrap_or(0)).saturating_sub(start);
                let _ = maps.advise_sequential(&[FileRange {
                    file: q.file,
                    offset_bytes: start,
                    len_bytes: len,
                }]);
            }
        }
        let state = RunState::new(job);
        let base = DestPtr::new(job);
        let workers = job.config.threads.clamp(1, MMAP_THREADS_MAX).min(reads.len());
        let config = self.config;
        let per_worker = run_workers(workers, |w| copy_worker(job, sink, &state, &maps, base, config, w));
        state.finish(per_worker)
    }
}

fn copy_worker(
    job: &Job<'_>,
    sink: &dyn CompletionSink,
    state: &RunState,
    maps: &MappedFiles,
    base: DestPtr,
    config: MmapConfig,
    worker: usize,
) -> IoStats {
    let mut stats = IoStats::default();
    let reads = job.plan.reads();
    while let Some(index) = state.next_read(job, worker) {
        let read = &reads[index as usize];
        if config.willneed_lookahead_reads > 0 {
            let ahead = reads.get(index as usize + config.willneed_lookahead_reads as usize);
            if let Some(ahead) = ahead.filter(|a| a.file == read.file) {
                let mapped_len = maps.len_bytes(ahead.file).unwrap_or(0);
                let len_bytes = ahead.len_bytes.min(mapped_len.saturating_sub(ahead.offset_bytes));
                // A hint: failures only cost read-ahead.
                let _ = maps.advise_willneed(&[FileRange {
                    file: ahead.file,
                    offset_bytes: ahead.offset_bytes,
                    len_bytes,
                }]);
            }
        }
        // Bytes past the mapped (known) file length are alignment padding that no extent uses.
        let mapped_len = maps.len_bytes(read.file).unwrap_or(0);
        let copy_len = read.len_bytes.min(mapped_len.saturating_sub(read.offset_bytes));
        let permit = job.budget.acquire(read.len_bytes);
        state.begin_inflight(permit.bytes());
        let range = FileRange { file: read.file, offset_bytes: read.offset_bytes, len_bytes: copy_len };
        if copy_len > 0 {
            if config.populate_source
                && let Err(e) = maps.prewarm_piece(&range)
            {
                // Populating failed (EFAULT: the pages are gone, e.g. the file was truncated; EIO:
                // the storage failed). Copying would raise SIGBUS: fail the read instead.
                state.end_inflight(permit.bytes());
                drop(permit);
                state.fail(populate_error(job, read, e));
                break;
            }
            let src = maps.bytes(read.file, read.offset_bytes..read.offset_bytes + copy_len);
            // SAFETY: `validate_job` checked that [arena_offset, arena_offset + len) lies inside
            // the destination and `copy_len <= len`; plan reads never overlap, so no other thread
            // writes this range; `src` is a separate (file) mapping, so the ranges do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), base.at(read.arena_offset_bytes), src.len())
            };
        }
        state.end_inflight(permit.bytes());
        drop(permit);
        stats.reads += 1;
        stats.bytes_read += read.len_bytes;
        state.land(job, sink, index);
    }
    stats
}

/// The error for a read whose source pages could not be populated. `EFAULT` means the pages
/// past the file's end are gone: the file was truncated after mapping, so this is an unexpected
/// end of file at the file's current length (found with `fstat`).
fn populate_error(job: &Job<'_>, read: &Read, e: io::Error) -> ReadError {
    if e.kind() != io::ErrorKind::UnexpectedEof {
        return job_error(read, ReadErrorKind::Io(e));
    }
    let file = &job.files[read.file as usize];
    let now_len = file.buffered.metadata().map_or(read.offset_bytes, |m| m.len());
    let read_bytes = now_len.saturating_sub(read.offset_bytes).min(read.len_bytes);
    ReadError {
        file: read.file,
        offset_bytes: read.offset_bytes + read_bytes,
        len_bytes: read.len_bytes - read_bytes,
        kind: ReadErrorKind::UnexpectedEof { read_bytes, expected_bytes: read.len_bytes },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::{JobConfig, Reading};
    use std::sync::atomic::Ordering;
    use tensora_plan::Extent;

    struct TruncateAfterFirst {
        path: std::path::PathBuf,
        done: std::sync::atomic::AtomicU32,
    }

    impl crate::seam::CompletionSink for TruncateAfterFirst {
        fn read_done(&self, _landed: crate::seam::Landed<'_>) -> Result<(), crate::seam::StopReason> {
            if self.done.fetch_add(1, Ordering::AcqRel) == 0 {
                std::fs::OpenOptions::new().write(true).open(&self.path).unwrap().set_len(0).unwrap();
            }
            Ok(())
        }
    }

    #[test]
    fn a_file_truncated_after_mapping_is_an_error_not_sigbus() {
        const LEN: usize = 256 << 10;
        let (tmp, f) = crate::seam::temp_source(&vec![5u8; LEN]);
        let extents = [Extent { file: 0, offset_bytes: 0, len_bytes: LEN as u64, tag: 0 }];
        let config =
            tensora_plan::PlanConfig { chunk_bytes: 64 << 10, ..tensora_plan::PlanConfig::default() };
        let plan = tensora_plan::Plan::build(&extents, &config, &tensora_plan::Order::File).unwrap();
        assert_eq!(plan.reads().len(), 4);
        let arena = crate::arena::Arena::with_len(plan.arena_len_bytes()).unwrap();
        let budget = crate::seam::Budget::new(1 << 20);
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let files = [f];
        // SAFETY: nothing else reads or writes the destination while this job runs.
        let job = unsafe {
            Job::new(
                &plan,
                &files,
                &arena,
                &budget,
                &cancel,
                JobConfig {
                    threads: 1,
                    queue_depth: 1,
                    reading: Reading::ReadAhead { device_cost: None },
                    retries_max: 0,
                },
            )
        };
        let sink = TruncateAfterFirst { path: tmp.path().to_path_buf(), done: Default::default() };
        let backend = MmapBackend::new(MmapConfig { populate_source: true, willneed_lookahead_reads: 0 });
        let err = backend.execute(&job, &sink).unwrap_err();
        assert!(
            matches!(err.kind, ReadErrorKind::UnexpectedEof { read_bytes: 0, .. } | ReadErrorKind::Io(_)),
            "{err}"
        );
        assert_eq!(err.offset_bytes, 64 << 10, "{err}");
        assert_eq!(sink.done.load(Ordering::Acquire), 1);
    }
}
