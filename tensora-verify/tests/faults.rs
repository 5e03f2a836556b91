//! Fault and corruption tests: digests fused into real loads, with `tensora_io::fault` injecting
//! bit flips, truncation, permanent and transient errors, and with files replaced mid-load.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tensora_format::Checkpoint;
use tensora_io::{BackendChoice, LoadError, LoadOptions, TensorRef};
use tensora_io::{Fault, FaultySource};
use tensora_verify::HashError;
use tensora_verify::hash_with_load;
use tensora_verify::{Algo, Digest};

const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real");

fn fixture() -> Checkpoint {
    tensora_format::open(format!("{REAL}/fracast-0.int8.safetensors")).unwrap()
}

fn faulty(faults: Vec<Fault>) -> LoadOptions {
    LoadOptions {
        backend: BackendChoice::Custom(FaultySource::new(faults).into_backend()),
        // Several windows and reads, so faults land in the middle of a load.
        budget_bytes: 32 << 10,
        chunk_bytes: 8 << 10,
        ..LoadOptions::default()
    }
}

fn clean_digests(ckpt: &Checkpoint, algo: Algo) -> Vec<Digest> {
    hash_with_load(ckpt, algo, &LoadOptions::default()).unwrap().0
}

#[test]
fn a_flipped_bit_in_any_tensor_changes_that_tensor_and_no_other() {
    let ckpt = fixture();
    let clean = clean_digests(&ckpt, Algo::Crc32c);
    for (i, t) in ckpt.tensors().iter().enumerate() {
        if t.nbytes() == 0 {
            continue;
        }
        let at = t.offset_bytes() + (i as u64 * 7919) % t.nbytes();
        let opts = faulty(vec![Fault::BitFlip { file: 0, offset_bytes: at, bit: (i % 8) as u8 }]);
        let (got, _) = hash_with_load(&ckpt, Algo::Crc32c, &opts).unwrap();
        let differing: Vec<&str> = ckpt
            .tensors()
            .iter()
            .zip(clean.iter().zip(&got))
            .filter(|(_, (a, b))| a != b)
            .map(|(t, _)| t.name())
            .collect();
        assert_eq!(differing, [t.name()]);
    }
}

#[test]
fn transient_faults_are_retried_and_digests_still_match() {
    let ckpt = fixture();
    for algo in Algo::ALL {
        let clean = clean_digests(&ckpt, algo);
        // The counters are shared by all reads: at worst one read meets all 7 faults, within
        // the bound of 8 retries per read.
        let opts = LoadOptions {
            retries_max: 8,
            ..faulty(vec![
                Fault::Interrupted { times: 3 },
                Fault::WouldBlock { times: 2 },
                Fault::Short { times: 2 },
            ])
        };
        let (got, report) = hash_with_load(&ckpt, algo, &opts).unwrap();
        assert_eq!(got, clean, "{algo}");
        assert!(report.retries >= 5, "retries {}", report.retries);
    }
}

#[test]
fn transient_faults_beyond_the_retry_bound_fail_naming_file_and_offset() {
    let ckpt = fixture();
    let opts = LoadOptions { retries_max: 2, ..faulty(vec![Fault::Interrupted { times: 1000 }]) };
    let err = hash_with_load(&ckpt, Algo::Crc32c, &opts).unwrap_err();
    assert!(!err.is_truncation());
    assert!(matches!(err, HashError::Load(LoadError::Read { .. })), "{err}");
    assert!(err.to_string().contains("fracast-0.int8.safetensors"), "{err}");
}

#[test]
fn a_truncated_file_is_reported_as_truncation_not_as_a_mismatch() {
    let ckpt = fixture();
    let len = ckpt.files()[0].len_bytes();
    let opts = faulty(vec![Fault::Eof { file: 0, len_bytes: len - 1000 }]);
    let err = hash_with_load(&ckpt, Algo::Sha256, &opts).unwrap_err();
    assert!(err.is_truncation(), "{err}");
    match &err {
        HashError::Load(LoadError::Read { tensor, offset_bytes, .. }) => {
            let t = ckpt.tensor(tensor).unwrap();
            assert!(t.range().contains(&(len - 1000)) || *offset_bytes + 1 >= len - 1000, "{err}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_permanent_error_names_the_tensor_and_offset() {
    let ckpt = fixture();
    let victim = &ckpt.tensors()[ckpt.tensors().len() / 2];
    let at = victim.offset_bytes() + victim.nbytes() / 2;
    let err = hash_with_load(&ckpt, Algo::Crc32c, &faulty(vec![Fault::Eio { file: 0, offset_bytes: at }]))
        .unwrap_err();
    assert!(!err.is_truncation());
    match &err {
        HashError::Load(LoadError::Read { tensor, offset_bytes, len_bytes, .. }) => {
            assert!((*offset_bytes..offset_bytes + len_bytes).contains(&at), "{err}");
            assert!(ckpt.tensor(tensor).is_some(), "{err}");
        }
        other => panic!("{other}"),
    }
}

/// A writable copy of the fixture.
fn copy_fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::copy(format!("{REAL}/fracast-0.int8.safetensors"), &path).unwrap();
    (dir, path)
}

/// Replace `path` by a new file with the same bytes (a new inode, as `cp` + `mv` would make).
fn replace_same_content(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    let tmp = path.with_extension("replacement");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn a_file_replaced_mid_load_is_detected() {
    let (_dir, path) = copy_fixture();
    let ckpt = tensora_format::open(&path).unwrap();
    let replaced = Arc::new(AtomicBool::new(false));
    let hook_path = path.clone();
    let flag = Arc::clone(&replaced);
    let hook = Arc::new(move |_: &TensorRef<'_>| {
        if !flag.swap(true, Ordering::AcqRel) {
            replace_same_content(&hook_path);
        }
        Ok(())
    });
    let opts = LoadOptions { on_tensor: Some(hook), budget_bytes: 32 << 10, ..LoadOptions::default() };
    let err = hash_with_load(&ckpt, Algo::Crc32c, &opts).unwrap_err();
    assert!(replaced.load(Ordering::Acquire));
    assert!(matches!(err, HashError::Load(LoadError::Changed { .. })), "{err}");
}

#[test]
fn a_file_replaced_mid_scan_is_detected_by_verify() {
    use tensora_verify::{FileProblem, ReadAt, ScanConfig, scan_with};

    /// Replaces the file at `path` on its first read, then reads the original.
    #[derive(Debug)]
    struct ReplaceOnFirstRead {
        inner: std::fs::File,
        path: PathBuf,
        done: AtomicBool,
    }
    impl ReadAt for ReplaceOnFirstRead {
        fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> std::io::Result<usize> {
            if !self.done.swap(true, Ordering::AcqRel) {
                replace_same_content(&self.path);
            }
            ReadAt::read_at(&self.inner, buf, offset_bytes)
        }
        fn stamp(&self) -> std::io::Result<tensora_format::FileStamp> {
            self.inner.stamp()
        }
        fn allocated_bytes(&self) -> std::io::Result<Option<u64>> {
            self.inner.allocated_bytes()
        }
    }

    let (_dir, path) = copy_fixture();
    let ckpt = tensora_format::open(&path).unwrap();
    let open = |_: tensora_format::FileId, p: &Path| -> std::io::Result<Box<dyn ReadAt>> {
        Ok(Box::new(ReplaceOnFirstRead {
            inner: std::fs::File::open(p)?,
            path: p.to_path_buf(),
            done: AtomicBool::new(false),
        }))
    };
    let config = ScanConfig { chunk_bytes: 4096, ..ScanConfig::default() };
    let result = scan_with(&ckpt, &config, &open, None);
    assert!(matches!(result.files[0].problem, Some(FileProblem::Changed { .. })), "{:?}", result.files[0]);
    assert!(!result.is_clean());
    // No digest of a changed file is trusted.
    assert!(result.digests.iter().zip(ckpt.tensors()).all(|(d, t)| d.is_none() || t.nbytes() == 0));
}
