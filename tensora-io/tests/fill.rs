//! A cold keep filled in 2 MiB folios (`Reading::PopulateAhead`): the sync backend's populators
//! read real files in ahead of its copies. The destination holds the files' bytes, gaps included,
//! and every page read stays in the page cache for the next process.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tensora_io::{
    Budget, CompletionSink, FileRange, Job, JobConfig, Landed, MapMode, MappedFiles, Reading, SourceFile,
    StopReason,
};
use tensora_plan::{DeviceCost, Extent, Order, Plan, PlanConfig};

/// Bytes of each file: 3 huge folios and a tail that ends mid-page.
const FILE_BYTES: u64 = (6 << 20) + 1000;
/// Bytes of each read.
const CHUNK_BYTES: u64 = 1 << 20;

struct Count(AtomicUsize);

impl CompletionSink for Count {
    fn read_done(&self, _landed: Landed<'_>) -> Result<(), StopReason> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn file_bytes(seed: u64) -> Vec<u8> {
    (0..FILE_BYTES).map(|i| ((i * 31 + seed * 7) % 253) as u8).collect()
}

#[test]
fn a_cold_load_populated_ahead_lands_the_files_bytes_and_keeps_their_pages() {
    let dir = tempfile::tempdir().unwrap();
    let contents: Vec<Vec<u8>> = (0..2).map(file_bytes).collect();
    let mut sources = Vec::new();
    for (i, bytes) in contents.iter().enumerate() {
        let path = dir.path().join(format!("shard{i}.bin"));
        std::fs::write(&path, bytes).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        f.sync_all().unwrap();
        tensora_sys::evict_file_cache(&f).unwrap();
        sources.push(SourceFile { path, len_bytes: FILE_BYTES, buffered: f, direct: None });
    }
    // Each file: two tensors with a 3 KiB gap between them (read along by the device cost), the
    // second ending at the file's unaligned end.
    let split = (2 << 20) + 512;
    let gap = 3 << 10;
    let extents: Vec<Extent> = (0..2u32)
        .flat_map(|file| {
            [
                Extent { file, offset_bytes: 0, len_bytes: split, tag: file * 2 },
                Extent {
                    file,
                    offset_bytes: split + gap,
                    len_bytes: FILE_BYTES - split - gap,
                    tag: file * 2 + 1,
                },
            ]
        })
        .collect();
    let config = PlanConfig { chunk_bytes: CHUNK_BYTES, coalesce_gap_bytes: 0, ..PlanConfig::default() };
    let plan = Plan::build(&extents, &config, &Order::File).unwrap();
    let mut arena = tensora_io::Arena::with_len(plan.arena_len_bytes()).unwrap();
    let (budget, cancel) = (Budget::new(4 << 20), AtomicBool::new(false));
    let device_cost = Some(DeviceCost { granule_bytes: 4096, request_cost_bytes: 8 << 10 });
    let config = JobConfig {
        threads: 2,
        queue_depth: 1,
        reading: Reading::PopulateAhead { device_cost },
        retries_max: 8,
    };
    let sync = tensora_io::registry::by_name("sync").unwrap();
    let sink = Count(AtomicUsize::new(0));
    let stats = {
        // SAFETY: nothing else touches `arena` while the job lives.
        let job = unsafe { Job::new(&plan, &sources, &arena, &budget, &cancel, config) };
        sync.execute(&job, &sink).unwrap()
    };
    assert_eq!(sink.0.load(Ordering::Relaxed), plan.reads().len());
    assert_eq!(stats.bytes_read, 2 * (FILE_BYTES - gap));
    let landed = arena.as_slice();
    for read in plan.reads() {
        let at = read.arena_offset_bytes as usize;
        let want = &contents[read.file as usize][read.offset_bytes as usize..][..read.len_bytes as usize];
        assert!(landed[at..at + want.len()] == *want, "read {read:?} landed other bytes");
    }
    // Every page of both files stays cached, the gaps included (populated along).
    // SAFETY: the files are this test's own and are not changed while mapped.
    let maps = unsafe { MappedFiles::map_with(&sources, MapMode::ReadOnly) }.unwrap();
    let whole: Vec<FileRange> =
        (0..2).map(|file| FileRange { file, offset_bytes: 0, len_bytes: FILE_BYTES }).collect();
    let kept = maps.residency(&whole).unwrap();
    assert_eq!(kept.pages_resident, kept.pages_total, "{kept:?}");
}
