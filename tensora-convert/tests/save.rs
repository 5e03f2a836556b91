//! The save writer end to end: what it writes is read back by HF's `safetensors` crate (and our
//! parser) with the expected bytes for every dtype, strided sources, metadata, shards, both write
//! modes and many piece sizes; the manifest computed while writing is what `verify` checks; a
//! cancelled or failing save leaves the previous file.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use proptest::prelude::*;
use tensora_convert::{
    self, MemoryTensors, SaveOptions, SaveSource, SaveStage, SourceTensor, StorageLayout, WriteChoice,
};
use tensora_convert::{ConvertConfig, ConvertError, TargetFormat};
use tensora_format::Dtype;
use tensora_verify::Algo;
use tensora_verify::{VerifyOptions, verify_path};

const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real");
const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");

/// Whether direct writes can be asked for on the temporary directory's filesystem (skipped on
/// tmpfs unless `TENSORA_TEST_REQUIRE` lists `o-direct`).
fn direct_ok(dir: &Path) -> bool {
    let probe = dir.join("probe");
    std::fs::write(&probe, [0u8; 4096]).unwrap();
    let ok = tensora_testkit::direct_io_or_skip(&probe, "save test");
    std::fs::remove_file(probe).unwrap();
    ok
}

/// A tensor to save and its expected row-major bytes.
struct Case {
    tensor: SourceTensor,
    storage: Vec<u8>,
    dense: Vec<u8>,
}

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Tensor `i`: a dtype from every class, contiguous, or (`strided`) a [rows, cols] transpose of
/// a [cols, rows] storage.
fn case(i: usize, rows: u64, cols: u64, strided: bool) -> Case {
    let dtypes = [
        Dtype::F32,
        Dtype::BF16,
        Dtype::F8E4M3,
        Dtype::I64,
        Dtype::Bool,
        Dtype::C64,
        Dtype::F16,
        Dtype::U16,
        Dtype::F8E5M2,
        Dtype::F64,
        Dtype::F8E8M0,
        Dtype::U32,
    ];
    let dtype = dtypes[i % dtypes.len()];
    let item = dtype.size_bytes().unwrap() as usize;
    let storage = bytes((rows * cols) as usize * item, i as u64 + 7);
    let name = format!("layer.{i}.{}", dtype.as_str().to_lowercase());
    if !strided {
        let tensor = SourceTensor::dense(name, dtype, vec![rows, cols]).unwrap();
        return Case { tensor, dense: storage.clone(), storage };
    }
    // Element [r, c] of the view is element [c, r] of the stored [cols, rows] matrix.
    let mut dense = Vec::with_capacity(storage.len());
    for r in 0..rows as usize {
        for c in 0..cols as usize {
            let at = (c * rows as usize + r) * item;
            dense.extend_from_slice(&storage[at..at + item]);
        }
    }
    let layout = StorageLayout::Strided {
        start_bytes: 0,
        strides_bytes: vec![item as i64, (rows as usize * item) as i64],
    };
    let tensor = SourceTensor {
        name,
        dtype,
        shape: vec![rows, cols],
        layout,
        storage_len_bytes: storage.len() as u64,
    };
    Case { tensor, storage, dense }
}

fn source(cases: &[Case]) -> MemoryTensors<'_> {
    let mut m = MemoryTensors::new();
    for c in cases {
        m.push(c.tensor.clone(), &c.storage).unwrap();
    }
    m
}

/// HF's parser reads `path` and finds exactly `cases`, with `metadata`.
fn assert_hf_reads(path: &Path, cases: &[Case], metadata: &BTreeMap<String, String>) {
    let file = std::fs::read(path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&file).unwrap();
    let got_meta: BTreeMap<String, String> =
        meta.metadata().clone().unwrap_or_default().into_iter().collect();
    assert_eq!(&got_meta, metadata);
    let st = safetensors::SafeTensors::deserialize(&file).unwrap();
    assert_eq!(st.len(), cases.len());
    for c in cases {
        let t = st.tensor(&c.tensor.name).unwrap();
        assert_eq!(t.dtype().to_string(), c.tensor.dtype.as_str(), "{}", c.tensor.name);
        assert_eq!(t.shape(), c.tensor.shape.iter().map(|&d| d as usize).collect::<Vec<_>>());
        assert!(t.data() == &c.dense[..], "{}: bytes differ", c.tensor.name);
    }
}

fn leftovers(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

proptest! {
    // Each case writes and fsyncs a few files: keep the count low.
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Random models (every dtype class, some strided, some empty) saved with any piece size,
    /// thread count, mode and digest: HF reads the expected bytes, and the manifest computed while
    /// writing has the digests of those bytes.
    #[test]
    fn any_model_saved_any_way_reads_back_with_hf(
        dims in proptest::collection::vec((0u64..40, 1u64..300, any::<bool>()), 1..10),
        piece_pages in 1u64..5,
        threads in 1usize..5,
        direct in any::<bool>(),
        algo in 0usize..3,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cases: Vec<Case> = dims.iter().enumerate().map(|(i, &(r, c, s))| case(i, r, c, s)).collect();
        let metadata = BTreeMap::from([("format".to_owned(), "pt".to_owned()), ("k".to_owned(), "\"v\"".to_owned())]);
        let mode = if direct && direct_ok(dir.path()) { WriteChoice::Direct } else { WriteChoice::Buffered };
        let opts = SaveOptions {
            mode,
            threads,
            piece_bytes: piece_pages * tensora_convert::ALIGN_BYTES,
            manifest: Some(Algo::ALL[algo]),
            ..SaveOptions::default()
        };
        let path = dir.path().join("m.safetensors");
        let report = tensora_convert::save_safetensors(&path, &source(&cases), &metadata, &opts).unwrap();
        prop_assert_eq!(report.mode, if mode == WriteChoice::Direct { "direct" } else { "buffered" });
        prop_assert_eq!(report.bytes_written, std::fs::metadata(&path).unwrap().len());
        assert_hf_reads(&path, &cases, &metadata);
        let manifest = report.manifest.unwrap();
        for c in &cases {
            prop_assert_eq!(manifest.tensors[&c.tensor.name].digest, Algo::ALL[algo].digest(&c.dense));
        }
        prop_assert_eq!(leftovers(dir.path()), vec!["m.safetensors".to_owned()]);
    }
}

#[test]
fn bytes_in_memory_equal_the_file() {
    let cases: Vec<Case> = (0..6).map(|i| case(i, 3 + i as u64, 5, i % 2 == 1)).collect();
    let src = source(&cases);
    let meta = BTreeMap::from([("format".to_owned(), "np".to_owned())]);
    let layout = tensora_convert::safetensors_layout(&src, &meta).unwrap();
    let mut out = vec![0u8; layout.file_len_bytes() as usize];
    tensora_convert::serialize_into(&layout, &src, &mut out).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    tensora_convert::save_safetensors(&path, &src, &meta, &SaveOptions::default()).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), out);
    assert!(
        tensora_convert::serialize_into(&layout, &src, &mut out[1..]).is_err(),
        "a buffer of the wrong size"
    );
}

#[test]
fn sharded_saves_read_back_and_verify_passes_on_the_manifest_written_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<Case> = (0..9).map(|i| case(i, 40, 100, i % 3 == 0)).collect();
    let meta = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
    let out = dir.path().join("ckpt");
    for algo in [Algo::Crc32c, Algo::Sha256] {
        let opts =
            SaveOptions { manifest: Some(algo), threads: 3, piece_bytes: 8192, ..SaveOptions::default() };
        let report = tensora_convert::save_sharded(&out, &source(&cases), &meta, 20_000, &opts).unwrap();
        let ckpt = tensora_format::open(&out).unwrap();
        assert!(ckpt.files().len() > 3, "{} shards", ckpt.files().len());
        assert_eq!(report.files_written, ckpt.files().len() + 1);
        for f in ckpt.files() {
            let names: Vec<&Case> = cases
                .iter()
                .filter(|c| {
                    ckpt.tensor(&c.tensor.name).is_some_and(|t| ckpt.file(t.file()).path() == f.path())
                })
                .collect();
            let shard: Vec<Case> = names
                .iter()
                .map(|c| Case {
                    tensor: c.tensor.clone(),
                    storage: c.storage.clone(),
                    dense: c.dense.clone(),
                })
                .collect();
            assert_hf_reads(f.path(), &shard, &meta);
        }
        let manifest = report.manifest.unwrap();
        let verified =
            verify_path(&out, &VerifyOptions { manifest: Some(&manifest), ..VerifyOptions::default() });
        assert!(verified.is_clean(), "{}", verified.summary_line());
    }
}

#[test]
fn a_loaded_checkpoint_saves_its_tensors_unchanged() {
    let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(REAL)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    paths.push(TINY.into()); // strided and tied ServerlessLLM tensors
    for p in paths {
        let ckpt = tensora_format::open(&p).unwrap();
        let loaded = tensora_io::load(&ckpt, &tensora_io::LoadOptions::default()).unwrap();
        let src = MemoryTensors::from_loaded(&loaded).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("again.safetensors");
        tensora_convert::save_safetensors(&out, &src, ckpt.metadata(), &SaveOptions::default()).unwrap();
        let again = tensora_format::open(&out).unwrap();
        let reloaded = tensora_io::load(&again, &tensora_io::LoadOptions::default()).unwrap();
        for t in loaded.tensors() {
            let mut want = vec![0u8; t.info().nbytes() as usize];
            tensora_convert::gather(&SourceTensor::from_info(t.info()), t.bytes(), 0, &mut want).unwrap();
            assert_eq!(
                reloaded.tensor(t.name()).unwrap().bytes(),
                &want[..],
                "{}: {}",
                p.display(),
                t.name()
            );
        }
    }
}

/// A source whose reads fail after `ok_reads` of them.
struct Failing<'a> {
    inner: MemoryTensors<'a>,
    ok_reads: usize,
    reads: AtomicUsize,
}

impl SaveSource for Failing<'_> {
    fn tensors(&self) -> &[SourceTensor] {
        self.inner.tensors()
    }
    fn storage(&self, _i: usize) -> Option<&[u8]> {
        None
    }
    fn read_storage(&self, i: usize, offset_bytes: u64, dst: &mut [u8]) -> Result<(), ConvertError> {
        if self.reads.fetch_add(1, Ordering::Relaxed) >= self.ok_reads {
            return Err(ConvertError::InvalidTensor {
                tensor: self.tensors()[i].name.clone(),
                reason: "gone".into(),
            });
        }
        self.inner.read_storage(i, offset_bytes, dst)
    }
}

#[test]
fn a_failing_or_cancelled_save_leaves_the_previous_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let old: Vec<Case> = vec![case(0, 2, 2, false)];
    tensora_convert::save_safetensors(&path, &source(&old), &BTreeMap::new(), &SaveOptions::default())
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    // A replacement keeps the permissions of the file it replaces.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    tensora_convert::save_safetensors(&path, &source(&old), &BTreeMap::new(), &SaveOptions::default())
        .unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let cases: Vec<Case> = (0..4).map(|i| case(i, 64, 64, false)).collect();
    let failing = Failing { inner: source(&cases), ok_reads: 2, reads: AtomicUsize::new(0) };
    let opts = SaveOptions { piece_bytes: 4096, threads: 2, ..SaveOptions::default() };
    let err = tensora_convert::save_safetensors(&path, &failing, &BTreeMap::new(), &opts).unwrap_err();
    assert!(matches!(&err, ConvertError::InvalidTensor { reason, .. } if reason == "gone"), "{err}");
    // Cancelled at the first piece written, from the stage hook.
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    let stage: tensora_convert::StageHook = Arc::new(move |s, _| {
        if s == SaveStage::PieceWritten {
            flag.store(true, Ordering::Release);
        }
    });
    let opts =
        SaveOptions { piece_bytes: 4096, cancel: Some(cancel), stage: Some(stage), ..SaveOptions::default() };
    let err = tensora_convert::save_safetensors(&path, &source(&cases), &BTreeMap::new(), &opts).unwrap_err();
    assert!(matches!(err, ConvertError::Cancelled), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(leftovers(dir.path()), vec!["m.safetensors".to_owned()]);
    // Bad options and a destination that is not a directory are refused before writing.
    let bad = SaveOptions { piece_bytes: 1000, ..SaveOptions::default() };
    assert!(matches!(
        tensora_convert::save_safetensors(&path, &source(&cases), &BTreeMap::new(), &bad),
        Err(ConvertError::Config { .. })
    ));
    let err =
        tensora_convert::save_sharded(&path, &source(&cases), &BTreeMap::new(), 10, &SaveOptions::default())
            .unwrap_err();
    assert!(matches!(err, ConvertError::Config { .. }), "{err}");
}

#[test]
fn conversions_write_the_manifest_verify_checks() {
    let src = tensora_format::open(TINY).unwrap();
    for (to, name, algo) in [
        (TargetFormat::Safetensors, "st", Algo::Xxh3),
        (TargetFormat::ServerlessLlm, "sllm", Algo::Crc32c),
        (TargetFormat::Safetensors, "one.safetensors", Algo::Sha256),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join(name);
        let cfg = ConvertConfig { to, manifest: Some(algo), threads: 3, ..ConvertConfig::default() };
        let report = tensora_convert::convert(&src, &dst, &cfg).unwrap();
        assert_eq!(report.digest_algo, Some(algo.as_str()));
        let manifest = report.manifest.unwrap();
        let verified =
            verify_path(&dst, &VerifyOptions { manifest: Some(&manifest), ..VerifyOptions::default() });
        assert!(verified.is_clean(), "{name}: {}", verified.summary_line());
    }
}

/// `Durability::ProcessCrashSafe` writes the same bytes, renamed into place, without the
/// `fsync` stage (and buffered when the mode is left to choose); `Synced` reaches it.
#[test]
fn process_crash_safe_saves_skip_the_sync_and_write_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<Case> = (0..3).map(|i| case(i, 64, 64, false)).collect();
    let mut files = Vec::new();
    for durability in [tensora_convert::Durability::Synced, tensora_convert::Durability::ProcessCrashSafe] {
        let synced = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&synced);
        let stage: tensora_convert::StageHook = Arc::new(move |s, _| {
            if s == SaveStage::Synced {
                seen.fetch_add(1, Ordering::Relaxed);
            }
        });
        let path = dir.path().join(format!("{}.safetensors", durability.as_str()));
        let opts = SaveOptions { durability, stage: Some(stage), ..SaveOptions::default() };
        let report =
            tensora_convert::save_safetensors(&path, &source(&cases), &BTreeMap::new(), &opts).unwrap();
        assert_eq!(report.durability, durability.as_str());
        let want_synced = usize::from(durability == tensora_convert::Durability::Synced);
        assert_eq!(synced.load(Ordering::Relaxed), want_synced, "{durability:?}");
        if durability == tensora_convert::Durability::ProcessCrashSafe {
            assert_eq!(report.mode, "buffered", "{}", report.reason);
        }
        files.push(std::fs::read(&path).unwrap());
    }
    assert_eq!(files[0], files[1]);
    assert_eq!(
        "process-crash-safe".parse::<tensora_convert::Durability>(),
        Ok(tensora_convert::Durability::ProcessCrashSafe)
    );
    assert!("fast".parse::<tensora_convert::Durability>().is_err());
}
