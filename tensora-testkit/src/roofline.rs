//! The device roofline a cold loader is measured against: every byte of some files read with
//! `O_DIRECT` on one io_uring ring, no planning over tensors, no page cache, no copy.

use std::fs::File;
use std::io;

use tensora_io::Arena;
use tensora_io::UringBackend;
use tensora_io::{
    Budget, CompletionSink, IoBackend, Job, JobConfig, Landed, Reading, SourceFile, StopReason,
};
use tensora_plan::{Extent, Order, Plan, PlanConfig};
use tensora_sys::open_direct;

/// What [`direct_read_roofline`] reads with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectRooflineConfig {
    /// Reads in flight on the one ring (the QD 32).
    pub queue_depth: u32,
    /// Size of one read (8 MiB in the bench).
    pub block_bytes: u64,
}

/// The device roofline: read every byte of `paths` with `O_DIRECT`, one io_uring ring keeping
/// `queue_depth` reads of `block_bytes` in flight, into `dest` (which must hold the files laid end
/// to end, each starting at a 4 KiB boundary: see [`direct_roofline_arena_bytes`]). Returns the
/// file bytes read. This is the raw device speed a loader is measured against: no planning over
/// tensors, no page cache, no copy.
///
/// Fails (rather than silently reading buffered) if a file cannot be opened with `O_DIRECT` or
/// io_uring is unavailable.
pub fn direct_read_roofline(
    paths: &[std::path::PathBuf],
    config: DirectRooflineConfig,
    dest: &mut Arena,
) -> io::Result<u64> {
    const BLOCK_ALIGN_BYTES: u64 = 4096;
    tensora_io::uring_probe().map_err(|why| io::Error::new(io::ErrorKind::Unsupported, why))?;
    let mut files = Vec::with_capacity(paths.len());
    let mut extents = Vec::with_capacity(paths.len());
    let mut lens = Vec::with_capacity(paths.len());
    for (i, path) in paths.iter().enumerate() {
        let buffered = File::open(path)?;
        let len_bytes = buffered.metadata()?.len();
        let direct = open_direct(path)?;
        let file = u32::try_from(i).map_err(|_| io::Error::other("too many files"))?;
        extents.push(Extent { file, offset_bytes: 0, len_bytes, tag: file });
        lens.push(len_bytes);
        files.push(SourceFile { path: path.clone(), len_bytes, buffered, direct: Some(direct) });
    }
    let budget_bytes = config.block_bytes.saturating_mul(u64::from(config.queue_depth.max(1)));
    let plan_config = PlanConfig {
        align_bytes: BLOCK_ALIGN_BYTES,
        chunk_bytes: config.block_bytes,
        coalesce_gap_bytes: 0,
        budget_bytes,
    };
    let plan = Plan::build_with_file_lens(&extents, &plan_config, &Order::File, &lens)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    if plan.arena_len_bytes() > dest.len_bytes() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "destination holds {} bytes, the files need {}",
                dest.len_bytes(),
                plan.arena_len_bytes()
            ),
        ));
    }
    let budget = Budget::new(budget_bytes);
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let job_config =
        JobConfig { threads: 1, queue_depth: config.queue_depth, reading: Reading::Direct, retries_max: 8 };
    let dest: &Arena = dest;
    // SAFETY: `dest` is borrowed mutably by this function for the whole run, so nothing else can
    // write or reference its memory while the job runs, and this is the only job over it.
    let job = unsafe { Job::new(&plan, &files, dest, &budget, &cancel, job_config) };
    struct NoSink;
    impl CompletionSink for NoSink {
        fn read_done(&self, _landed: Landed<'_>) -> Result<(), StopReason> {
            Ok(())
        }
    }
    let stats = IoBackend::execute(&UringBackend::default(), &job, &NoSink)
        .map_err(|e| io::Error::other(e.to_string()))?;
    if stats.direct_fallbacks > 0 {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "O_DIRECT was refused and reads fell back"));
    }
    Ok(lens.iter().sum())
}

/// Arena bytes [`direct_read_roofline`] needs for files of these lengths (each rounded up to
/// 4 KiB, plus one block of slack per file for alignment).
pub fn direct_roofline_arena_bytes(lens_bytes: &[u64]) -> u64 {
    lens_bytes.iter().map(|l| l.next_multiple_of(4096) + 8192).sum()
}

#[cfg(test)]
mod direct_roofline_tests {
    use super::*;

    #[test]
    fn reads_every_byte_of_every_file() {
        // On the repository's disk: a tmpfs /tmp refuses O_DIRECT.
        let target = concat!(env!("CARGO_MANIFEST_DIR"), "/../target");
        std::fs::create_dir_all(target).unwrap();
        let dir = tempfile::tempdir_in(target).unwrap();
        let mut paths = Vec::new();
        let mut want = Vec::new();
        for (i, len) in [3 * 4096 + 17usize, 1 << 20, 5].into_iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|k| (k * 7 + i) as u8).collect();
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, &bytes).unwrap();
            paths.push(p);
            want.push(bytes);
        }
        let direct = crate::require::direct_io_or_skip(&paths[0], "direct roofline");
        if !direct || !crate::require::io_uring_or_skip("direct roofline") {
            // tmpfs and some containers refuse O_DIRECT or io_uring: the function must say so.
            let mut arena = Arena::with_len(8 << 20).unwrap();
            let cfg = DirectRooflineConfig { queue_depth: 4, block_bytes: 64 << 10 };
            assert!(direct_read_roofline(&paths, cfg, &mut arena).is_err());
            return;
        }
        let lens: Vec<u64> = want.iter().map(|w| w.len() as u64).collect();
        let mut arena = Arena::with_len(direct_roofline_arena_bytes(&lens)).unwrap();
        let cfg = DirectRooflineConfig { queue_depth: 4, block_bytes: 64 << 10 };
        let read = direct_read_roofline(&paths, cfg, &mut arena).unwrap();
        assert_eq!(read, lens.iter().sum::<u64>());
        // Files land in file order, each at a 4 KiB boundary.
        let bytes = arena.as_slice();
        let mut at = 0usize;
        for w in &want {
            assert_eq!(&bytes[at..at + w.len()], &w[..]);
            at = (at + w.len()).next_multiple_of(4096);
        }
        let mut small = Arena::with_len(4096).unwrap();
        assert!(direct_read_roofline(&paths, cfg, &mut small).is_err());
    }
}
