//! The mmap backend (owned mode) against random plans, and `MappedFiles`: residency via
//! `mincore`, prewarm, lock, size checks, cancellation and sink stops.

use proptest::prelude::*;
use tensora_io::{FileRange, MappedFiles};
use tensora_io::{MmapBackend, MmapConfig};
use tensora_io::{ReadErrorKind, SourceFile};
use tensora_plan::{Order, Plan};

mod harness;

use harness::*;

/// Maps test files read-only.
fn map_read_only(files: &[tensora_io::SourceFile]) -> MappedFiles {
    // SAFETY: temporary files that nothing else modifies or truncates while they are mapped.
    unsafe { MappedFiles::map(files) }.unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_plans_land_the_right_bytes(
        (lens, picked) in extents_strategy(),
        direct in any::<bool>(),
        threads in 1usize..4,
        chunk_kib in 4u64..64,
        populate_source in any::<bool>(),
        willneed_lookahead_reads in 0u32..3,
        seed in any::<u64>(),
        budget_kib in 4u64..256,
    ) {
        let (files, extents) = random_files_and_extents(&lens, &picked, seed, direct);
        let config = random_plan_config(direct, chunk_kib);
        // Without file lengths, aligned plans read past EOF: the backend treats that as padding.
        let plan = Plan::build(&extents, &config, &Order::File).unwrap();
        let sources: Vec<SourceFile> = files.iter().map(|f| clone_source(&f.source)).collect();
        let backend = MmapBackend::new(MmapConfig { populate_source, willneed_lookahead_reads });
        let knobs = Knobs { threads, queue_depth: 1, direct, budget_bytes: budget_kib << 10 };
        let mut run = run(&backend, &plan, &sources, knobs);
        check_bytes(&mut run, &plan, &extents, &files);
    }
}

#[test]
fn a_file_shorter_than_expected_is_refused_before_mapping() {
    let file = test_file(pattern(10_000, 1), 100 << 10, false);
    let (_, plan) = whole_file_plan(100 << 10, 1, 16 << 10);
    let knobs = Knobs { threads: 2, queue_depth: 1, direct: false, budget_bytes: 1 << 20 };
    let run = run(&MmapBackend::default(), &plan, std::slice::from_ref(&file.source), knobs);
    let err = run.result.unwrap_err();
    assert!(
        matches!(err.kind, ReadErrorKind::Io(ref e) if e.kind() == std::io::ErrorKind::InvalidData),
        "{err}"
    );
    assert!(run.reported.is_empty());
}

#[test]
fn cancel_flag_stops_the_run() {
    check_cancel_flag_stops_the_run(&MmapBackend::default(), 1);
}

#[test]
fn sink_stop_returns_stopped() {
    check_sink_stop_returns_stopped(&MmapBackend::default(), 1);
}

fn whole(len_bytes: u64) -> [FileRange; 1] {
    [FileRange { file: 0, offset_bytes: 0, len_bytes }]
}

#[test]
fn residency_rises_after_reading_and_drops_after_dontneed() {
    let len = 4u64 << 20;
    let file = test_file(pattern(len as usize, 8), len, false);
    let maps = map_read_only(std::slice::from_ref(&file.source));
    // Read through the page cache without touching the mapping, so eviction is not blocked by
    // mapped pages.
    let read_back = std::fs::read(&file.source.path).unwrap();
    assert_eq!(read_back.len() as u64, len);
    let warm = maps.residency(&whole(len)).unwrap();
    assert_eq!(warm.pages_total, len / 4096);
    assert!(warm.fraction() > 0.0, "{warm:?}");
    tensora_sys::evict_file_cache(&file.source.buffered).unwrap();
    let cold = maps.residency(&whole(len)).unwrap();
    assert!(cold.fraction() < 1.0, "{cold:?}");
    // Prewarm brings every page back; the sampled view agrees.
    assert_eq!(maps.prewarm(&whole(len), 2).unwrap(), len);
    assert_eq!(maps.residency(&whole(len)).unwrap().fraction(), 1.0);
    let sampled = maps.residency_sampled(&whole(len), 16).unwrap();
    assert!(sampled.pages_total >= 16 && sampled.pages_total <= 17, "{sampled:?}");
    assert_eq!(sampled.fraction(), 1.0);
}

#[test]
fn locked_hot_set_survives_dontneed() {
    let len = 1u64 << 20;
    let file = test_file(pattern(len as usize, 9), len, false);
    let maps = map_read_only(std::slice::from_ref(&file.source));
    let hot = [FileRange { file: 0, offset_bytes: 0, len_bytes: 256 << 10 }];
    maps.advise_willneed(&hot).unwrap();
    maps.advise_sequential(&whole(len)).unwrap();
    maps.lock(&hot).unwrap();
    tensora_sys::evict_file_cache(&file.source.buffered).unwrap();
    assert_eq!(maps.residency(&hot).unwrap().fraction(), 1.0);
    maps.unlock(&hot).unwrap();
    assert_eq!(maps.bytes(0, 0..4096), &file.data[..4096]);
}

#[test]
fn mapped_files_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MappedFiles>();
    let file = test_file(pattern(8192, 10), 8192, false);
    let maps = std::sync::Arc::new(map_read_only(std::slice::from_ref(&file.source)));
    let other = std::sync::Arc::clone(&maps);
    let got = std::thread::spawn(move || other.bytes(0, 100..200).to_vec()).join().unwrap();
    assert_eq!(got, &file.data[100..200]);
    assert_eq!(maps.path(0), Some(file.source.path.as_path()));
    assert_eq!(maps.file_count(), 1);
}

#[test]
fn a_copy_on_write_mapping_larger_than_memory_is_not_charged_up_front() {
    // 64 GiB, sparse: more than this machine's RAM + swap. Without MAP_NORESERVE a writable
    // private mapping of it is refused with ENOMEM under the default overcommit heuristic.
    const LEN_BYTES: u64 = 64 << 30;
    let file = tempfile::NamedTempFile::new().unwrap();
    // Every filesystem the tests run on (ext4, xfs, btrfs, tmpfs, overlayfs) holds a sparse file
    // of this size: one that cannot is a failure, not a reason to test nothing.
    if let Err(e) = file.as_file().set_len(LEN_BYTES) {
        panic!("{}: cannot make a sparse 64 GiB file to map: {e}", file.path().display());
    }
    let source = tensora_io::SourceFile {
        path: file.path().to_owned(),
        len_bytes: LEN_BYTES,
        buffered: std::fs::File::open(file.path()).unwrap(),
        direct: None,
    };
    // SAFETY: a temporary file nothing else touches while it is mapped.
    let maps =
        unsafe { MappedFiles::map_with(std::slice::from_ref(&source), tensora_io::MapMode::CopyOnWrite) }
            .expect("a copy-on-write mapping charges only the pages written");
    let ptr = maps.ptr_mut(0, (LEN_BYTES - 4096)..LEN_BYTES).unwrap();
    // SAFETY: no slice of these bytes is alive; the range is inside the mapping.
    unsafe { ptr.as_ptr().write(7) };
    assert_eq!(maps.get(0, (LEN_BYTES - 4096)..(LEN_BYTES - 4095)).unwrap(), &[7]);
    assert!(maps.ptr_mut(0, 0..LEN_BYTES + 1).is_none());
    let read_only = map_read_only(std::slice::from_ref(&source));
    assert!(read_only.ptr_mut(0, 0..1).is_none(), "a read-only mapping hands out no writable pointer");
    assert_eq!(std::fs::metadata(file.path()).unwrap().len(), LEN_BYTES);
}
