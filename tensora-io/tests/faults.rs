//! Injected faults and bad conditions: transient errors are retried and the data is right;
//! permanent ones fail the load naming path, offset and tensor; truncated, replaced and sparse
//! files are refused.

mod support;

use std::sync::Arc;

use support::*;
use tensora_format::Dtype;
use tensora_io::{BackendChoice, LoadError, LoadOptions, ReadErrorKind, load, load_streaming};
use tensora_io::{Fault, FaultySource};

fn faulty(faults: Vec<Fault>) -> LoadOptions {
    LoadOptions {
        backend: BackendChoice::Custom(FaultySource::new(faults).into_backend()),
        ..LoadOptions::default()
    }
}

fn sync() -> LoadOptions {
    LoadOptions { backend: BackendChoice::Named("sync".into()), ..LoadOptions::default() }
}

/// A one-shard checkpoint: tensor `s0.t1` spans bytes 4096.. of its data.
fn one_shard() -> Generated {
    generate(42, &[vec![(Dtype::U8, vec![4096]), (Dtype::F32, vec![16 << 10]), (Dtype::U8, vec![100])]])
}

#[test]
fn transient_faults_are_retried_and_the_data_is_right() {
    let g = one_shard();
    let ckpt = g.open();
    let opts = LoadOptions {
        chunk_bytes: 8 << 10,
        threads: 2,
        // All 12 faults may hit one read (the other worker may not have started): allow that.
        retries_max: 12,
        ..faulty(vec![
            Fault::Interrupted { times: 4 },
            Fault::WouldBlock { times: 3 },
            Fault::Short { times: 5 },
        ])
    };
    let loaded = load(&ckpt, &opts).unwrap();
    for t in loaded.tensors() {
        assert_eq!(t.bytes(), &g.data[t.name()][..], "{}", t.name());
    }
    assert_eq!(loaded.report().retries, 12);
    let report = load_streaming(&ckpt, &LoadOptions { budget_bytes: 16 << 10, ..opts }, |t| {
        assert_eq!(t.bytes(), &g.data[t.name()][..]);
        Ok(())
    })
    .unwrap();
    assert_eq!(report.tensors, 3);
}

fn assert_names_path_offset_tensor(err: &LoadError, g: &Generated, tensor: &str) {
    let msg = err.to_string();
    assert!(msg.contains(&g.path().join("shard-00.safetensors").display().to_string()), "{msg}");
    assert!(msg.contains("offset"), "{msg}");
    assert!(msg.contains(&format!("{tensor:?}")), "{msg}");
}

#[test]
fn transient_faults_beyond_the_retry_bound_fail_with_path_offset_tensor() {
    let g = one_shard();
    let ckpt = g.open();
    let opts = LoadOptions { retries_max: 2, threads: 1, ..faulty(vec![Fault::Interrupted { times: 1000 }]) };
    let err = load(&ckpt, &opts).unwrap_err();
    match &err {
        LoadError::Read { kind: ReadErrorKind::Io(e), .. } => {
            assert!(e.to_string().contains("gave up after 2 retries"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // The very first read fails: it names the tensor stored first in the file.
    let first = ckpt.tensors().iter().min_by_key(|t| t.offset_bytes()).unwrap();
    assert_names_path_offset_tensor(&err, &g, first.name());
}

#[test]
fn eio_fails_the_load_naming_the_tensor_that_holds_the_offset() {
    let g = one_shard();
    let ckpt = g.open();
    let t1 = ckpt.tensor("s0.t1").unwrap();
    let bad_offset = t1.offset_bytes() + 5000;
    for streaming in [false, true] {
        let opts = LoadOptions {
            chunk_bytes: 4 << 10,
            ..faulty(vec![Fault::Eio { file: 0, offset_bytes: bad_offset }])
        };
        let err = if streaming {
            load_streaming(&ckpt, &opts, |_| Ok(())).unwrap_err()
        } else {
            load(&ckpt, &opts).unwrap_err()
        };
        match &err {
            LoadError::Read { offset_bytes, tensor, kind: ReadErrorKind::Io(e), .. } => {
                assert_eq!(tensor, "s0.t1");
                assert!(*offset_bytes <= bad_offset && bad_offset < offset_bytes + (4 << 10));
                assert_eq!(e.raw_os_error(), Some(libc::EIO));
            }
            other => panic!("{other:?}"),
        }
        assert_names_path_offset_tensor(&err, &g, "s0.t1");
    }
}

#[test]
fn truncation_is_an_error_never_a_short_tensor() {
    let g = one_shard();
    let ckpt = g.open();
    let t2 = ckpt.tensor("s0.t2").unwrap();
    // Simulated truncation at read time: EOF before the planned end.
    let opts = faulty(vec![Fault::Eof { file: 0, len_bytes: t2.offset_bytes() + 10 }]);
    let err = load(&ckpt, &opts).unwrap_err();
    assert!(matches!(err, LoadError::Read { kind: ReadErrorKind::UnexpectedEof { .. }, .. }), "{err}");
    assert_names_path_offset_tensor(&err, &g, "s0.t2");
    // Real truncation after parsing: the size no longer matches the parse-time stamp.
    let path = g.path().join("shard-00.safetensors");
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(t2.offset_bytes() + 10).unwrap();
    for name in runnable_backends() {
        let opts = LoadOptions { backend: BackendChoice::Named(name.into()), ..LoadOptions::default() };
        let err = load(&ckpt, &opts).unwrap_err();
        assert!(
            matches!(&err, LoadError::Changed { change, .. } if change.what().contains("size")),
            "{name}: {err}"
        );
    }
}

#[test]
fn a_file_replaced_before_or_during_the_load_is_an_error() {
    let g = one_shard();
    let ckpt = g.open();
    let path = g.path().join("shard-00.safetensors");
    let copy = g.path().join("copy.tmp");
    // Replaced during the load: the first completed tensor's hook swaps the file under us.
    std::fs::copy(&path, &copy).unwrap();
    let (p, c) = (path.clone(), copy.clone());
    let opts = LoadOptions {
        on_tensor: Some(Arc::new(move |_| {
            if c.exists() {
                std::fs::rename(&c, &p)?;
            }
            Ok(())
        })),
        ..sync()
    };
    let err = load(&ckpt, &opts).unwrap_err();
    assert!(matches!(&err, LoadError::Changed { change, .. } if change.what().contains("inode")), "{err}");
    // Replaced before the load started (same size, new inode).
    let err = load(&ckpt, &sync()).unwrap_err();
    assert!(matches!(err, LoadError::Changed { .. }), "{err}");
}

#[test]
fn sparse_files_are_refused_unless_allowed() {
    // A valid safetensors file whose 8 MiB tensor is a hole (an interrupted download).
    let dir = tempfile::tempdir().unwrap();
    let header = br#"{"w":{"dtype":"U8","shape":[8388608],"data_offsets":[0,8388608]}}"#;
    let mut header = header.to_vec();
    while !(8 + header.len()).is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    let path = dir.path().join("sparse.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(bytes.len() as u64 + (8 << 20)).unwrap();
    drop(f);
    let ckpt = tensora_format::open(&path).unwrap();
    let err = load(&ckpt, &sync()).unwrap_err();
    assert!(matches!(err, LoadError::Sparse { .. }), "{err}");
    assert!(err.to_string().contains("allow_sparse"));
    let loaded = load(&ckpt, &LoadOptions { allow_sparse: true, ..sync() }).unwrap();
    assert!(loaded.tensor("w").unwrap().bytes().iter().all(|&b| b == 0));
}

#[test]
fn a_bit_flip_passes_the_loader_and_changes_exactly_one_bit() {
    let g = one_shard();
    let ckpt = g.open();
    let t1 = ckpt.tensor("s0.t1").unwrap();
    let at = t1.offset_bytes() + 123;
    let loaded = load(&ckpt, &faulty(vec![Fault::BitFlip { file: 0, offset_bytes: at, bit: 6 }])).unwrap();
    let got = loaded.tensor("s0.t1").unwrap().bytes();
    let want = &g.data["s0.t1"];
    let diffs: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
    assert_eq!(diffs, [123]);
    assert_eq!(got[123] ^ want[123], 1 << 6);
}

/// A `pread` source like a FUSE filesystem: at most `call_bytes_max` per call, and `EIO` for any
/// call that starts at or after `eio_from` in file 0.
#[derive(Debug)]
struct Fuse {
    call_bytes_max: usize,
    eio_from: u64,
}

impl tensora_io::ReadAt for Fuse {
    fn read_at(
        &self,
        file: &tensora_io::SourceFile,
        file_index: u32,
        buf: &mut [u8],
        offset_bytes: u64,
        access: tensora_io::Access,
    ) -> std::io::Result<usize> {
        if file_index == 0 && offset_bytes >= self.eio_from {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        let n = buf.len().min(self.call_bytes_max);
        tensora_io::Pread.read_at(file, file_index, &mut buf[..n], offset_bytes, access)
    }
}

fn fuse(call_bytes_max: usize, eio_from: u64) -> LoadOptions {
    let backend = tensora_io::SyncBackend::with_reader(Arc::new(Fuse { call_bytes_max, eio_from }));
    LoadOptions { backend: BackendChoice::Custom(Arc::new(backend)), ..LoadOptions::default() }
}

#[test]
fn short_reads_that_make_progress_never_exhaust_the_retries() {
    // 1 MiB reads served 4 KiB per call with retries_max 0: progress is not a retry.
    let g = generate(9, &[vec![(Dtype::F32, vec![512 << 10])]]);
    let ckpt = g.open();
    let opts = LoadOptions { chunk_bytes: 1 << 20, retries_max: 0, threads: 2, ..fuse(4096, u64::MAX) };
    let loaded = load(&ckpt, &opts).unwrap();
    for t in loaded.tensors() {
        assert_eq!(t.bytes(), &g.data[t.name()][..], "{}", t.name());
    }
    assert!(loaded.report().retries >= 255, "{:?}", loaded.report());
}

#[test]
fn an_error_mid_read_names_the_first_byte_that_did_not_land() {
    let g = one_shard();
    let ckpt = g.open();
    let t1 = ckpt.tensor("s0.t1").unwrap();
    // Reads of 64 KiB served 4 KiB per call; the call at t1 + 8 KiB fails.
    let bad_offset = t1.offset_bytes() + (8 << 10);
    let opts = LoadOptions { chunk_bytes: 64 << 10, threads: 1, ..fuse(4096, bad_offset) };
    let err = load(&ckpt, &opts).unwrap_err();
    match &err {
        LoadError::Read { offset_bytes, tensor, kind: ReadErrorKind::Io(e), .. } => {
            assert_eq!(*offset_bytes, bad_offset, "{err}");
            assert_eq!(tensor, "s0.t1");
            assert_eq!(e.raw_os_error(), Some(libc::EIO));
        }
        other => panic!("{other:?}"),
    }
}
