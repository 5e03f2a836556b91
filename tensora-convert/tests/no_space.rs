//! A full disk is `ConvertError::NoSpace` and leaves nothing behind: a save (reserving its space
//! first, or failing in the middle of its writes), a sharded save into a new directory and a
//! conversion, on a small tmpfs (where a direct save goes buffered, saying why, on kernels
//! without `O_DIRECT` for tmpfs). Needs root to mount: where mounting fails the test fails if
//! `TENSORA_TEST_REQUIRE` lists `mount` (CI does: `.ci/run`) and logs that it skipped otherwise.

use std::collections::BTreeMap;
use std::path::Path;

use tensora_convert::{ConvertConfig, ConvertError, TargetFormat};
use tensora_convert::{MemoryTensors, Preallocate, SaveOptions, SourceTensor, WriteChoice};
use tensora_format::Dtype;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn source(bytes: &[u8]) -> MemoryTensors<'_> {
    let mut m = MemoryTensors::new();
    m.push(SourceTensor::dense("w", Dtype::U8, vec![bytes.len() as u64]).unwrap(), bytes).unwrap();
    m
}

#[test]
fn a_full_disk_is_a_typed_error_and_leaves_the_previous_file() {
    let Some(fs) = tensora_testkit::small_tmpfs_or_skip(1 << 20, "no-space test") else { return };
    let dir = fs.path();
    let small = vec![3u8; 100 << 10];
    let big = vec![5u8; 2 << 20];
    let meta = BTreeMap::new();
    let path = dir.join("m.safetensors");
    let direct = SaveOptions { mode: WriteChoice::Direct, ..SaveOptions::default() };
    let report = tensora_convert::save_safetensors(&path, &source(&small), &meta, &direct).unwrap();
    // tmpfs takes O_DIRECT since Linux 6.6; before, the save says why it went buffered.
    match tensora_sys::direct_io_supported(&path) {
        Ok(()) => assert_eq!(report.mode, "direct"),
        Err(_) => assert!(report.reason.starts_with("buffered: O_DIRECT open refused"), "{}", report.reason),
    }
    let before = std::fs::read(&path).unwrap();
    for preallocate in [Preallocate::Yes, Preallocate::No] {
        let opts = SaveOptions { preallocate, piece_bytes: 64 << 10, ..SaveOptions::default() };
        let err = tensora_convert::save_safetensors(&path, &source(&big), &meta, &opts).unwrap_err();
        let ConvertError::NoSpace { op, source, .. } = &err else { panic!("{preallocate:?}: {err}") };
        assert_eq!(source.raw_os_error(), Some(libc::ENOSPC), "{op}");
        assert_eq!(*op, if preallocate == Preallocate::Yes { "reserving space" } else { "writing" });
        assert_eq!(std::fs::read(&path).unwrap(), before, "{preallocate:?}: the previous file");
        assert_eq!(names(dir), ["m.safetensors"], "{preallocate:?}: nothing left behind");
    }
    let err = tensora_convert::save_sharded(
        &dir.join("shards"),
        &source(&big),
        &meta,
        512 << 10,
        &SaveOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ConvertError::NoSpace { .. }), "{err}");
    // A conversion of a 2 MiB checkpoint (written elsewhere) into the full disk.
    let elsewhere = tempfile::tempdir().unwrap();
    let src_path = elsewhere.path().join("big.safetensors");
    tensora_convert::save_safetensors(&src_path, &source(&big), &meta, &SaveOptions::default()).unwrap();
    let src = tensora_format::open(&src_path).unwrap();
    for to in [TargetFormat::ServerlessLlm, TargetFormat::Safetensors] {
        let cfg = ConvertConfig { to, ..ConvertConfig::default() };
        let err = tensora_convert::convert(&src, &dir.join("converted"), &cfg).unwrap_err();
        assert!(matches!(err, ConvertError::NoSpace { .. }), "{err}");
    }
    assert_eq!(names(dir), ["m.safetensors"]);
}
