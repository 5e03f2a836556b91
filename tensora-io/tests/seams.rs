//! The seams that let code outside tensora-io plug in: `Job::claim` (a safe, once-only hand-out
//! of each read's destination), backends that do not read local files (`reads_local_files`),
//! the per-read hook (`LoadOptions::on_read`) and writable views (`Loaded::tensor_mut_ptr`).

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use support::*;
use tensora_format::Selection;
use tensora_format::{Checkpoint, Dtype};
use tensora_io::Budget;
use tensora_io::{
    BackendChoice, CompletionSink, IoBackend, IoStats, Job, JobConfig, LoadError, LoadOptions, ReadError,
    ReadErrorKind, Reading, Residence, StopReason, load, load_streaming,
};
use tensora_plan::{Extent, Order, Plan, PlanConfig};

struct CountSink(AtomicUsize);

impl CompletionSink for CountSink {
    fn read_done(&self, _landed: tensora_io::Landed<'_>) -> Result<(), StopReason> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn small_job_parts() -> (Plan, tensora_io::Arena, Budget, AtomicBool) {
    let extents: Vec<Extent> = (0..4)
        .map(|i| Extent { file: 0, offset_bytes: i * 10_000, len_bytes: 5_000, tag: i as u32 })
        .collect();
    let config = PlanConfig { coalesce_gap_bytes: 0, chunk_bytes: 4096, ..PlanConfig::default() };
    let plan = Plan::build(&extents, &config, &Order::File).unwrap();
    let arena = tensora_io::Arena::with_len(plan.arena_len_bytes()).unwrap();
    (plan, arena, Budget::new(1 << 20), AtomicBool::new(false))
}

const CONFIG: JobConfig = JobConfig {
    threads: 1,
    queue_depth: 1,
    reading: Reading::ReadAhead { device_cost: None },
    retries_max: 8,
};

#[test]
fn claim_hands_out_each_read_once_and_checks_the_index() {
    let (plan, arena, budget, cancel) = small_job_parts();
    assert!(plan.reads().len() >= 4, "{} reads", plan.reads().len());
    // SAFETY: nothing else touches `arena` while the job lives.
    let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, CONFIG) };
    let sink = CountSink(AtomicUsize::new(0));
    for (i, read) in plan.reads().iter().enumerate() {
        let mut t = job.claim(i as u32).unwrap();
        assert_eq!(t.index(), i as u32);
        assert_eq!(t.buf().len() as u64, read.len_bytes);
        t.buf().fill(i as u8 + 1);
        let again = job.claim(i as u32).unwrap_err();
        assert!(again.to_string().contains("already claimed"), "{again}");
        t.land(&sink).unwrap();
    }
    assert_eq!(sink.0.load(Ordering::Relaxed), plan.reads().len());
    let past = job.claim(plan.reads().len() as u32).unwrap_err();
    assert!(past.to_string().contains("not in the plan"), "{past}");
    drop(job);
    let mut arena = arena;
    for (i, read) in plan.reads().iter().enumerate() {
        let start = read.arena_offset_bytes as usize;
        let bytes = &arena.as_mut_slice()[start..start + read.len_bytes as usize];
        assert!(bytes.iter().all(|&b| b == i as u8 + 1), "read {i}");
    }
}

/// Hand a claimed read's front out in pieces of `lens` (cut where they run past the read), fill
/// each before it goes, read the pieces on another thread while the rest is filled, and land:
/// the pieces and the rest tile the read, in order, and the arena holds what was written.
fn hand_out_in_pieces(lens: &[usize]) {
    let (plan, arena, budget, cancel) = small_job_parts();
    // SAFETY: nothing else touches `arena` while the job lives.
    let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, CONFIG) };
    let sink = CountSink(AtomicUsize::new(0));
    let mut target = job.claim(0).unwrap();
    let len = target.buf().len();
    let expected = pattern_bytes(len);
    let mut seen = Vec::new();
    std::thread::scope(|s| {
        let (to, pieces) = std::sync::mpsc::channel::<tensora_io::Filled<'_>>();
        let reader = s.spawn(move || pieces.iter().map(|p| (p.offset_bytes(), p.bytes().to_vec())).collect());
        for &want in lens {
            let n = want.min(target.buf().len());
            let at = target.handed_out_bytes();
            target.buf()[..n].copy_from_slice(&expected[at..at + n]);
            let piece = target.hand_out(n).unwrap();
            assert_eq!((piece.offset_bytes(), piece.bytes().len()), (at, n));
            to.send(piece).unwrap();
        }
        let left = target.buf().len();
        assert!(target.hand_out(left + 1).is_none(), "more than is left");
        drop(to);
        seen = reader.join().unwrap();
    });
    let at = target.handed_out_bytes();
    assert_eq!(at + target.buf().len(), len, "the pieces and the rest tile the read");
    target.buf().copy_from_slice(&expected[at..]);
    target.land(&sink).unwrap();
    let mut next = 0;
    for (offset, bytes) in &seen {
        assert_eq!(*offset, next, "pieces come front to back");
        assert_eq!(bytes[..], expected[next..next + bytes.len()]);
        next += bytes.len();
    }
    drop(job);
    let mut arena = arena;
    let start = plan.reads()[0].arena_offset_bytes as usize;
    assert_eq!(arena.as_mut_slice()[start..start + len], expected[..]);
}

#[test]
fn handed_out_pieces_are_read_while_the_rest_fills() {
    hand_out_in_pieces(&[1000, 1, 0, 2000]);
    hand_out_in_pieces(&[]);
    hand_out_in_pieces(&[usize::MAX]);
}

#[test]
fn a_read_does_not_land_while_a_piece_of_it_is_held() {
    let (plan, arena, budget, cancel) = small_job_parts();
    // SAFETY: nothing else touches `arena` while the job lives.
    let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, CONFIG) };
    let sink = CountSink(AtomicUsize::new(0));
    let mut target = job.claim(0).unwrap();
    let held = target.hand_out(10).unwrap();
    let e = target.land(&sink).unwrap_err();
    assert!(e.to_string().contains("still held"), "{e}");
    assert_eq!(held.bytes().len(), 10);
    assert_eq!(sink.0.load(Ordering::Relaxed), 0, "nothing was reported");
    // Dropped pieces let it land.
    let mut target = job.claim(1).unwrap();
    drop(target.hand_out(10).unwrap());
    target.land(&sink).unwrap();
    assert_eq!(sink.0.load(Ordering::Relaxed), 1);
}

proptest::proptest! {
    /// Any cut of a read into handed-out pieces tiles it with the rest, in order.
    #[test]
    fn any_cut_into_pieces_tiles_the_read(lens in proptest::collection::vec(0usize..6000, 0..8)) {
        hand_out_in_pieces(&lens);
    }
}

#[test]
fn a_destination_too_small_for_a_read_is_refused_by_claim() {
    let (plan, _arena, budget, cancel) = small_job_parts();
    let tiny = tensora_io::Arena::with_len(4096).unwrap();
    // SAFETY: nothing else touches `tiny` while the job lives.
    let job = unsafe { Job::new(&plan, &[], &tiny, &budget, &cancel, CONFIG) };
    let last = plan.reads().len() as u32 - 1;
    let e = job.claim(last).unwrap_err();
    assert!(e.to_string().contains("destination holds 4096 bytes"), "{e}");
}

#[test]
fn a_built_in_backend_and_claim_never_share_a_read() {
    let (plan, arena, budget, cancel) = small_job_parts();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), pattern_bytes(40_000)).unwrap();
    let f = std::fs::File::open(file.path()).unwrap();
    let sources = [tensora_io::SourceFile {
        path: file.path().to_owned(),
        len_bytes: 40_000,
        buffered: f,
        direct: None,
    }];
    // SAFETY: nothing else touches `arena` while the job lives.
    let job = unsafe { Job::new(&plan, &sources, &arena, &budget, &cancel, CONFIG) };
    // Someone claimed read 1 first: the sync backend must refuse to run rather than write it.
    let _held = job.claim(1).unwrap();
    let sync = tensora_io::registry::by_name("sync").unwrap();
    let e = sync.execute(&job, &CountSink(AtomicUsize::new(0))).unwrap_err();
    assert!(e.to_string().contains("already claimed"), "{e}");
    // And once a backend ran, nothing can be claimed again.
    let (plan, arena, budget, cancel) = small_job_parts();
    // SAFETY: as above.
    let job = unsafe { Job::new(&plan, &sources, &arena, &budget, &cancel, CONFIG) };
    sync.execute(&job, &CountSink(AtomicUsize::new(0))).unwrap();
    assert!(job.claim(0).is_err());
}

fn pattern_bytes(len: usize) -> Vec<u8> {
    tensor_bytes(99, 0, len)
}

/// A backend that serves every checkpoint file from memory, keyed by checkpoint file id, the way
/// an object-store backend would: it never touches `job.files`.
struct InMemory {
    files: Vec<Vec<u8>>,
    /// What `read_align_bytes` asks for.
    align_bytes: u64,
    /// Reads whose file offset or length (but at a file's end) was not a multiple of 4096, or
    /// whose destination address was not congruent to the file offset modulo 4096.
    misaligned: AtomicUsize,
}

impl IoBackend for InMemory {
    fn name(&self) -> &'static str {
        "in-memory"
    }
    fn reads_local_files(&self) -> bool {
        false
    }
    fn read_align_bytes(&self) -> u64 {
        self.align_bytes
    }
    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        assert!(job.files.is_empty(), "a non-local backend gets no opened files");
        let mut stats = IoStats::default();
        for index in 0..job.plan.reads().len() as u32 {
            let mut target = job.claim(index)?;
            let read = target.read().clone();
            let missing = || ReadError {
                file: read.file,
                offset_bytes: read.offset_bytes,
                len_bytes: read.len_bytes,
                kind: ReadErrorKind::UnexpectedEof { read_bytes: 0, expected_bytes: read.len_bytes },
            };
            let file = job.checkpoint_file(read.file).ok_or_else(missing)?;
            let bytes = self.files.get(file as usize).ok_or_else(missing)?;
            let src = bytes
                .get(read.offset_bytes as usize..(read.offset_bytes + read.len_bytes) as usize)
                .ok_or_else(missing)?;
            let (align, end) = (4096, read.offset_bytes + read.len_bytes);
            let addr = target.buf().as_ptr() as u64;
            if read.offset_bytes % align != 0
                || (read.len_bytes % align != 0 && end != bytes.len() as u64)
                || addr % align != read.offset_bytes % align
            {
                self.misaligned.fetch_add(1, Ordering::Relaxed);
            }
            target.buf().copy_from_slice(src);
            stats.reads += 1;
            stats.bytes_read += read.len_bytes;
            target.land(sink)?;
        }
        Ok(stats)
    }
}

fn in_memory(ckpt: &Checkpoint) -> Arc<InMemory> {
    in_memory_aligned(ckpt, 1)
}

fn in_memory_aligned(ckpt: &Checkpoint, align_bytes: u64) -> Arc<InMemory> {
    Arc::new(InMemory {
        files: ckpt.files().iter().map(|f| std::fs::read(f.path()).unwrap()).collect(),
        align_bytes,
        misaligned: AtomicUsize::new(0),
    })
}

#[test]
fn a_backend_gets_the_read_alignment_it_asks_for_where_the_budget_allows() {
    let g = generate_mixed(11);
    let ckpt = g.open();
    let check = |backend: &Arc<InMemory>, budget_bytes: u64| {
        let custom = BackendChoice::Custom(Arc::clone(backend) as Arc<dyn IoBackend>);
        let opts =
            LoadOptions { backend: custom, budget_bytes, chunk_bytes: 64 << 10, ..LoadOptions::default() };
        let loaded = load(&ckpt, &opts).unwrap();
        for (name, want) in &g.data {
            assert_eq!(loaded.tensor(name).unwrap().bytes(), &want[..], "{name}");
        }
        let mut seen = BTreeMap::new();
        load_streaming(&ckpt, &opts, |t| {
            seen.insert(t.name().to_owned(), t.bytes().to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, g.data);
        backend.misaligned.load(Ordering::Relaxed)
    };
    // Asked for 4 KiB blocks: every read's offset, length and place in the arena is one, owned
    // and streamed (the place congruent to the file offset: what O_DIRECT needs).
    assert_eq!(check(&in_memory_aligned(&ckpt, 4096), 1 << 20), 0);
    // Asked for nothing, the reads of this checkpoint are not block-aligned.
    assert!(check(&in_memory(&ckpt), 1 << 20) > 0);
    // A budget below the block, or an alignment that is no power of two, is not honoured (the
    // load still runs, unaligned).
    assert!(check(&in_memory_aligned(&ckpt, 4096), 2048) > 0);
    assert!(check(&in_memory_aligned(&ckpt, 3000), 1 << 20) > 0);
}

#[test]
fn a_backend_that_reads_no_local_files_loads_owned_partial_and_streaming() {
    let g = generate_mixed(7);
    let ckpt = g.open();
    let backend = in_memory(&ckpt);
    // The files are gone: only the backend's copy remains, so nothing may open them.
    let dir_path = g.path().to_owned();
    for f in ckpt.files() {
        std::fs::remove_file(f.path()).unwrap();
    }
    let opts = LoadOptions { backend: BackendChoice::Custom(backend), ..LoadOptions::default() };
    let loaded = load(&ckpt, &opts).unwrap();
    assert_eq!(loaded.len(), g.data.len());
    for (name, want) in &g.data {
        assert_eq!(loaded.tensor(name).unwrap().bytes(), &want[..], "{name}");
    }
    assert_eq!(loaded.report().backend, "in-memory");

    let partial = LoadOptions { selection: Selection::Glob(vec!["s1.*".into()]), ..opts.clone() };
    let loaded = load(&ckpt, &partial).unwrap();
    assert!(!loaded.is_empty() && loaded.tensors().all(|t| t.name().starts_with("s1.")));

    let mut seen = BTreeMap::new();
    let streaming = LoadOptions { budget_bytes: 256 << 10, ..opts.clone() };
    load_streaming(&ckpt, &streaming, |t| {
        seen.insert(t.name().to_owned(), t.bytes().to_vec());
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, g.data);

    let mapped = LoadOptions { residence: Residence::Mapped(files_unchanged()), ..opts };
    match load(&ckpt, &mapped) {
        Err(LoadError::BackendUnavailable { reason, .. }) => {
            assert!(reason.contains("local files"), "{reason}")
        }
        other => panic!("mapped residence with a non-local backend: {:?}", other.map(|l| l.len())),
    }
    assert!(dir_path.exists());
}

/// Per tensor: the pieces the hook saw, as (offset, bytes).
type Pieces = Mutex<BTreeMap<String, Vec<(u64, Vec<u8>)>>>;

fn piece_hook(pieces: &Arc<Pieces>, completed: &Arc<Mutex<Vec<String>>>) -> LoadOptions {
    let (p, c) = (Arc::clone(pieces), Arc::clone(completed));
    let (p2, completed) = (Arc::clone(pieces), Arc::clone(completed));
    LoadOptions {
        on_read: Some(Arc::new(move |piece| {
            assert!(
                !c.lock().unwrap().iter().any(|n| n == piece.info.name()),
                "{}: a piece arrived after the tensor completed",
                piece.info.name()
            );
            let end = piece.offset_in_tensor_bytes + piece.bytes.len() as u64;
            assert!(end <= piece.info.len_bytes(), "{}: piece past the tensor", piece.info.name());
            p.lock()
                .unwrap()
                .entry(piece.info.name().to_owned())
                .or_default()
                .push((piece.offset_in_tensor_bytes, piece.bytes.to_vec()));
            Ok(())
        })),
        on_tensor: Some(Arc::new(move |t| {
            // Every piece is in before the tensor completes, and they tile it exactly.
            let mut got = p2.lock().unwrap().remove(t.name()).unwrap_or_default();
            got.sort_by_key(|(o, _)| *o);
            let mut joined = Vec::new();
            for (offset, bytes) in got {
                assert_eq!(offset, joined.len() as u64, "{}: pieces overlap or leave a gap", t.name());
                joined.extend_from_slice(&bytes);
            }
            assert_eq!(joined, t.bytes(), "{}", t.name());
            completed.lock().unwrap().push(t.name().to_owned());
            Ok(())
        })),
        ..LoadOptions::default()
    }
}

#[test]
fn read_hook_pieces_tile_every_tensor_before_it_completes_on_every_backend() {
    let g = generate_mixed(11);
    let ckpt = g.open();
    for backend in runnable_backends() {
        for residence in [Residence::Owned, Residence::Mapped(files_unchanged())] {
            for chunk_bytes in [4096, 64 << 10, 8 << 20] {
                let pieces: Arc<Pieces> = Arc::default();
                let completed = Arc::new(Mutex::new(Vec::new()));
                let opts = LoadOptions {
                    backend: BackendChoice::Named(backend.to_owned()),
                    residence,
                    chunk_bytes,
                    ..piece_hook(&pieces, &completed)
                };
                load(&ckpt, &opts).unwrap_or_else(|e| panic!("{backend} {residence:?}: {e}"));
                let mut done = completed.lock().unwrap().clone();
                done.sort();
                let mut want: Vec<String> = g.data.keys().cloned().collect();
                want.sort();
                assert_eq!(done, want, "{backend} {residence:?} chunk {chunk_bytes}");
                assert!(pieces.lock().unwrap().is_empty(), "pieces left over");
            }
        }
    }
}

#[test]
fn read_hook_sees_tied_tensors_and_its_error_names_the_tensor() {
    let ckpt = tensora_format::open(fixture("serverlessllm/tiny")).unwrap();
    let pieces: Arc<Pieces> = Arc::default();
    let completed = Arc::new(Mutex::new(Vec::new()));
    let opts = LoadOptions { budget_bytes: 16 << 10, ..piece_hook(&pieces, &completed) };
    let mut n = 0;
    load_streaming(&ckpt, &opts, |_| {
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(n, ckpt.tensors().len());
    assert_eq!(completed.lock().unwrap().len(), ckpt.tensors().len());

    let victim = ckpt.tensors().iter().find(|t| t.len_bytes() > 0).unwrap().name().to_owned();
    let v = victim.clone();
    let failing = LoadOptions {
        on_read: Some(Arc::new(move |p| if p.info.name() == v { Err("refused".into()) } else { Ok(()) })),
        ..LoadOptions::default()
    };
    match load(&ckpt, &failing) {
        Err(LoadError::Callback { tensor, source }) => {
            assert_eq!(tensor, victim);
            assert_eq!(source.to_string(), "refused");
        }
        other => panic!("expected a callback error, got {:?}", other.map(|l| l.len())),
    }
}

#[test]
fn tensor_mut_ptr_writes_the_load_and_never_the_file() {
    let g = generate(3, &[vec![(Dtype::F32, vec![4096]), (Dtype::U8, vec![0]), (Dtype::I16, vec![3])]]);
    let ckpt = g.open();
    let file = ckpt.files()[0].path().to_owned();
    let before = std::fs::read(&file).unwrap();
    for residence in [Residence::Owned, Residence::Mapped(files_unchanged())] {
        let loaded = load(&ckpt, &LoadOptions { residence, ..LoadOptions::default() }).unwrap();
        assert!(loaded.tensor_mut_ptr("nope").is_none());
        assert!(loaded.tensor_mut_ptr("s0.t1").is_none(), "empty tensor has no bytes to write");
        let (ptr, len) = loaded.tensor_mut_ptr("s0.t0").unwrap();
        assert_eq!(len, 4096 * 4);
        // SAFETY: no slice of `s0.t0` is alive while we write, and `len` bytes are in bounds.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0xAB, len) };
        assert!(loaded.tensor("s0.t0").unwrap().bytes().iter().all(|&b| b == 0xAB), "{residence:?}");
        assert_eq!(loaded.tensor("s0.t2").unwrap().bytes(), &g.data["s0.t2"][..], "{residence:?}");
    }
    assert_eq!(std::fs::read(&file).unwrap(), before, "a private mapping never writes the file");
}

#[test]
fn the_sync_backend_hands_read_hook_pieces_over_in_cache_sized_steps() {
    // One 6 MiB tensor read as one 8 MiB-chunk read: the hook still sees it in steps.
    let g = generate(5, &[vec![(Dtype::U8, vec![6 << 20]), (Dtype::F32, vec![10])]]);
    let ckpt = g.open();
    let pieces: Arc<Pieces> = Arc::default();
    let completed = Arc::new(Mutex::new(Vec::new()));
    let largest = Arc::new(AtomicUsize::new(0));
    let l = Arc::clone(&largest);
    let mut opts = LoadOptions {
        backend: BackendChoice::Named("sync".into()),
        chunk_bytes: 8 << 20,
        ..piece_hook(&pieces, &completed)
    };
    let inner = opts.on_read.take().unwrap();
    opts.on_read = Some(Arc::new(move |p| {
        l.fetch_max(p.bytes.len(), Ordering::Relaxed);
        inner(p)
    }));
    load(&ckpt, &opts).unwrap();
    assert_eq!(completed.lock().unwrap().len(), 2, "both tensors tiled and completed");
    let largest = largest.load(Ordering::Relaxed) as u64;
    assert!(largest <= tensora_io::ON_READ_STEP_BYTES, "largest piece {largest} bytes");
}

#[test]
fn stepped_pieces_tile_every_tensor_through_short_reads_and_interrupts() {
    use tensora_io::{Fault, FaultySource};
    let g = generate(9, &[vec![(Dtype::U8, vec![6 << 20]), (Dtype::F16, vec![3, 1000])]]);
    let ckpt = g.open();
    for faults in [
        vec![Fault::Short { times: 5 }],
        vec![Fault::Interrupted { times: 3 }],
        vec![Fault::Short { times: 4 }, Fault::Interrupted { times: 2 }],
    ] {
        let pieces: Arc<Pieces> = Arc::default();
        let completed = Arc::new(Mutex::new(Vec::new()));
        let opts = LoadOptions {
            backend: BackendChoice::Custom(FaultySource::new(faults.clone()).into_backend()),
            chunk_bytes: 8 << 20,
            ..piece_hook(&pieces, &completed)
        };
        let loaded = load(&ckpt, &opts).unwrap_or_else(|e| panic!("{faults:?}: {e}"));
        assert!(loaded.report().retries > 0, "{faults:?}: the faults were injected");
        // `piece_hook` asserts that the pieces tile each tensor exactly, with no gap or overlap.
        assert_eq!(completed.lock().unwrap().len(), 2, "{faults:?}");
        assert!(pieces.lock().unwrap().is_empty(), "{faults:?}: pieces left over");
    }
}

/// A store's own error, as an object-store backend would have it.
#[derive(Debug, PartialEq)]
struct StoreSaidNo {
    status: u16,
}

impl std::fmt::Display for StoreSaidNo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the store answered {}", self.status)
    }
}

impl std::error::Error for StoreSaidNo {}

/// A backend whose first read fails with its own typed error.
struct Refusing;

impl IoBackend for Refusing {
    fn name(&self) -> &'static str {
        "refusing"
    }
    fn reads_local_files(&self) -> bool {
        false
    }
    fn execute(&self, job: &Job<'_>, _sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        let target = job.claim(0)?;
        let read = target.read().clone();
        Err(ReadError {
            file: read.file,
            offset_bytes: read.offset_bytes,
            len_bytes: read.len_bytes,
            kind: ReadErrorKind::Source(Box::new(StoreSaidNo { status: 412 })),
        })
    }
}

/// Issue 45 item 1: a backend's typed error crosses the seam as it is (`ReadErrorKind::Source`):
/// the load's error names file, offset and tensor around it, and the backend's caller downcasts
/// it back to its own type, with no text parked beside the backend.
#[test]
fn a_backends_typed_error_crosses_the_seam_downcastable() {
    let g = generate_mixed(3);
    let ckpt = g.open();
    let opts = LoadOptions { backend: BackendChoice::Custom(Arc::new(Refusing)), ..LoadOptions::default() };
    let Err(err) = load(&ckpt, &opts) else { panic!("the backend refused every read") };
    let text = err.to_string();
    let LoadError::Read { tensor, kind: ReadErrorKind::Source(source), .. } = err else {
        panic!("a read error carrying the backend's own: {text}")
    };
    assert!(
        !tensor.is_empty() && text.contains(&tensor) && text.contains("the store answered 412"),
        "{text}"
    );
    let own = source.downcast::<StoreSaidNo>().expect("the backend's own type");
    assert_eq!(*own, StoreSaidNo { status: 412 });
}

/// The sync backend, recording the config of every job it runs.
struct Recording {
    inner: Box<dyn IoBackend>,
    configs: Mutex<Vec<JobConfig>>,
}

impl IoBackend for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        self.configs.lock().unwrap().push(job.config);
        self.inner.execute(job, sink)
    }
}

/// `auto`'s cold decision reaches the backend in the job (`Reading::ReadAhead`'s `device_cost`, what the
/// read-ahead helper widens its advice by), not by the backend reaching into the load: a cold
/// buffered load's jobs carry the cold local file's cost, a direct one's none.
#[test]
fn the_cold_device_cost_travels_to_the_backend_in_the_job() {
    let g = generate_mixed(13);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for entry in std::fs::read_dir(g.path()).unwrap() {
        let from = entry.unwrap().path();
        std::fs::copy(&from, dir.path().join(from.file_name().unwrap())).unwrap();
    }
    let ckpt = tensora_format::open(dir.path()).unwrap();
    let backend = Arc::new(Recording {
        inner: tensora_io::registry::by_name("sync").unwrap(),
        configs: Mutex::new(Vec::new()),
    });
    let opts = LoadOptions {
        backend: BackendChoice::Custom(Arc::clone(&backend) as Arc<dyn IoBackend>),
        io_mode: tensora_io::IoMode::Buffered,
        ..LoadOptions::default()
    };
    for file in ckpt.files() {
        let f = std::fs::File::open(file.path()).unwrap();
        f.sync_all().unwrap();
        tensora_sys::evict_file_cache(&f).unwrap();
    }
    load(&ckpt, &opts).unwrap();
    let cold: Vec<JobConfig> = std::mem::take(&mut *backend.configs.lock().unwrap());
    assert!(!cold.is_empty());
    for config in &cold {
        let Reading::ReadAhead { device_cost: Some(cost) } = config.reading else {
            panic!("a cold job reads ahead with the device's cost: {config:?}");
        };
        assert_eq!((cost.granule_bytes, cost.request_cost_bytes), (4096, 8 << 10), "{config:?}");
    }
    // A direct load reads around the page cache: no read-ahead helper, no device cost.
    load(&ckpt, &LoadOptions { io_mode: tensora_io::IoMode::Direct, ..opts }).unwrap();
    let direct = backend.configs.lock().unwrap();
    assert!(!direct.is_empty());
    for config in direct.iter() {
        assert_eq!(config.reading, Reading::Direct, "{config:?}");
    }
}
