//! Every fault on every reading backend, owned and streaming: transient errors are retried and the
//! bytes are right; permanent ones fail the load with a typed error naming file, offset and
//! tensor; truncated, replaced and sparse files are refused. Never a `Loaded` with wrong bytes.
//!
//! The injected faults (`tensora_io::FaultPlan`) sit below `sync`'s `pread`s, `io-uring`'s
//! completions and `async`'s positional reads; the real-file conditions (truncation, replacement,
//! sparse files) run on every registered backend, `mmap` included.

mod support;

use std::sync::Arc;

use support::*;
use tensora_format::Dtype;
use tensora_io::{BackendChoice, LoadError, LoadOptions, LoadReport, ReadErrorKind, load, load_streaming};
use tensora_io::{Fault, FaultPlan};

/// A one-shard checkpoint: `s0.t0` (4 KiB), `s0.t1` (64 KiB of F32), `s0.t2` (100 bytes).
fn one_shard() -> Generated {
    generate(7, &[vec![(Dtype::U8, vec![4096]), (Dtype::F32, vec![16 << 10]), (Dtype::U8, vec![100])]])
}

/// How a test hands the tensors over.
#[derive(Debug, Clone, Copy)]
enum Delivery {
    Owned,
    Streaming,
}

/// The backends a fault plan can sit below, each built over `plan`.
fn faulty_backends(plan: &Arc<FaultPlan>) -> Vec<(&'static str, BackendChoice)> {
    let mut out = vec![("sync", BackendChoice::Custom(plan.sync()))];
    if tensora_io::uring_probe().is_ok() {
        out.push(("io-uring", BackendChoice::Custom(plan.uring())));
    } else {
        // tensora_testkit::require decides whether its absence fails the run.
        tensora_testkit::io_uring_or_skip("fault_matrix");
    }
    out.push(("async", BackendChoice::Custom(plan.asynchronous())));
    out
}

/// Loads `ckpt` as `delivery` says, checking every delivered tensor against `g`.
fn run(
    ckpt: &tensora_format::Checkpoint,
    g: &Generated,
    opts: &LoadOptions,
    delivery: Delivery,
) -> Result<LoadReport, LoadError> {
    match delivery {
        Delivery::Owned => {
            let loaded = load(ckpt, opts)?;
            for t in loaded.tensors() {
                assert_eq!(t.bytes(), &g.data[t.name()][..], "{}", t.name());
            }
            Ok(loaded.report().clone())
        }
        Delivery::Streaming => {
            let opts = LoadOptions { budget_bytes: 32 << 10, ..opts.clone() };
            load_streaming(ckpt, &opts, |t| {
                assert_eq!(t.bytes(), &g.data[t.name()][..], "{}", t.name());
                Ok(())
            })
        }
    }
}

/// Each `(backend, delivery)` pair with a fresh plan of `faults`.
fn each(faults: &[Fault], mut f: impl FnMut(&str, Delivery, LoadOptions, &Arc<FaultPlan>)) {
    for delivery in [Delivery::Owned, Delivery::Streaming] {
        let names: Vec<&str> =
            faulty_backends(&Arc::new(FaultPlan::new(vec![]))).iter().map(|b| b.0).collect();
        for name in names {
            let plan = Arc::new(FaultPlan::new(faults.to_vec()));
            let backend = faulty_backends(&plan).into_iter().find(|b| b.0 == name).map(|b| b.1).unwrap();
            let opts = LoadOptions { backend, chunk_bytes: 8 << 10, threads: 2, ..LoadOptions::default() };
            f(name, delivery, opts, &plan);
        }
    }
}

#[test]
fn transient_faults_are_retried_on_every_backend_and_the_bytes_are_right() {
    let g = one_shard();
    let ckpt = g.open();
    let faults = [Fault::Interrupted { times: 3 }, Fault::WouldBlock { times: 2 }, Fault::Short { times: 3 }];
    each(&faults, |name, delivery, opts, plan| {
        // All 8 faults may hit one read: allow that many zero-progress retries.
        let opts = LoadOptions { retries_max: 8, ..opts };
        let report = run(&ckpt, &g, &opts, delivery).unwrap_or_else(|e| panic!("{name} {delivery:?}: {e}"));
        assert_eq!(plan.injected(), 8, "{name} {delivery:?}: every fault fired");
        assert_eq!(report.retries, 8, "{name} {delivery:?}: {report:?}");
        assert_eq!(report.tensors, 3, "{name} {delivery:?}");
    });
}

#[test]
fn eio_fails_every_backend_naming_file_offset_and_tensor() {
    let g = one_shard();
    let ckpt = g.open();
    let path = g.path().join("shard-00.safetensors");
    let t1 = ckpt.tensor("s0.t1").unwrap().clone();
    let bad = t1.offset_bytes() + 5000;
    each(&[Fault::Eio { file: 0, offset_bytes: bad }], |name, delivery, opts, _| {
        let err = run(&ckpt, &g, &opts, delivery).expect_err("an EIO fails the load");
        let msg = err.to_string();
        let LoadError::Read { path: p, offset_bytes, tensor, kind: ReadErrorKind::Io(e), .. } = err else {
            panic!("{name} {delivery:?}: expected a read error, got {msg}");
        };
        assert_eq!((p.as_path(), tensor.as_str()), (path.as_path(), "s0.t1"), "{name} {delivery:?}");
        assert!(offset_bytes <= bad && bad < offset_bytes + (8 << 10), "{name} {delivery:?}: {msg}");
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{name} {delivery:?}");
    });
}

#[test]
fn an_early_end_of_file_fails_every_backend_as_unexpected_eof() {
    let g = one_shard();
    let ckpt = g.open();
    let t2 = ckpt.tensor("s0.t2").unwrap().clone();
    each(&[Fault::Eof { file: 0, len_bytes: t2.offset_bytes() + 10 }], |name, delivery, opts, _| {
        let err = run(&ckpt, &g, &opts, delivery).expect_err("an early EOF fails the load");
        let msg = err.to_string();
        let LoadError::Read { tensor, offset_bytes, kind: ReadErrorKind::UnexpectedEof { .. }, .. } = err
        else {
            panic!("{name} {delivery:?}: expected UnexpectedEof, got {msg}");
        };
        assert_eq!(tensor, "s0.t2", "{name} {delivery:?}: {msg}");
        assert_eq!(
            offset_bytes,
            t2.offset_bytes() + 10,
            "{name} {delivery:?}: the first byte that did not land"
        );
    });
}

/// Options that truncate (or replace) the shard from the `on_tensor` hook of the first tensor to
/// complete, while the rest of the load is still to come.
fn sabotaged(name: &str, path: std::path::PathBuf, act: Sabotage) -> LoadOptions {
    let done = Arc::new(std::sync::Once::new());
    LoadOptions {
        backend: BackendChoice::Named(name.into()),
        chunk_bytes: 8 << 10,
        threads: 1,
        on_tensor: Some(Arc::new(move |_| {
            done.call_once(|| match &act {
                Sabotage::Truncate(len) => {
                    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(*len).unwrap()
                }
                Sabotage::Replace(copy) => std::fs::rename(copy, &path).unwrap(),
            });
            Ok(())
        })),
        ..LoadOptions::default()
    }
}

/// What happens to the file during the load.
#[derive(Debug, Clone)]
enum Sabotage {
    Truncate(u64),
    Replace(std::path::PathBuf),
}

#[test]
fn a_file_truncated_or_replaced_during_the_load_fails_every_backend() {
    for name in runnable_backends() {
        for delivery in [Delivery::Owned, Delivery::Streaming] {
            let g = one_shard();
            let ckpt = g.open();
            let path = g.path().join("shard-00.safetensors");
            let cut = ckpt.tensor("s0.t1").unwrap().offset_bytes() + 100;
            let opts = sabotaged(name, path.clone(), Sabotage::Truncate(cut));
            let err = run(&ckpt, &g, &opts, delivery).expect_err("a truncated file fails the load");
            assert!(
                matches!(
                    &err,
                    LoadError::Read { kind: ReadErrorKind::UnexpectedEof { .. } | ReadErrorKind::Io(_), .. }
                        | LoadError::Changed { .. }
                ),
                "{name} {delivery:?}: {err}"
            );
            let g = one_shard();
            let ckpt = g.open();
            let path = g.path().join("shard-00.safetensors");
            let copy = g.path().join("copy.tmp");
            std::fs::copy(&path, &copy).unwrap();
            let err = run(&ckpt, &g, &sabotaged(name, path, Sabotage::Replace(copy)), delivery)
                .expect_err("a replaced file fails the load");
            assert!(
                matches!(&err, LoadError::Changed { change, .. } if change.what().contains("inode")),
                "{name} {delivery:?}: {err}"
            );
        }
    }
}

#[test]
fn a_sparse_file_is_refused_by_every_backend_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let header = br#"{"w":{"dtype":"U8","shape":[8388608],"data_offsets":[0,8388608]}}"#.to_vec();
    let mut header = header;
    while !(8 + header.len()).is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    let path = dir.path().join("sparse.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(bytes.len() as u64 + (8 << 20))
        .unwrap();
    let ckpt = tensora_format::open(&path).unwrap();
    for name in runnable_backends() {
        let opts = LoadOptions { backend: BackendChoice::Named(name.into()), ..LoadOptions::default() };
        let err = load(&ckpt, &opts).unwrap_err();
        assert!(matches!(&err, LoadError::Sparse { path: p, .. } if *p == path), "{name}: {err}");
        let loaded = load(&ckpt, &LoadOptions { allow_sparse: true, ..opts }).unwrap();
        assert!(loaded.tensor("w").unwrap().bytes().iter().all(|&b| b == 0), "{name}");
    }
}

/// A checkpoint on a disk-backed filesystem (the target dir; a tmpfs `/tmp` refuses `O_DIRECT`),
/// with tensors of whole 4 KiB blocks so every read can go direct.
fn on_disk() -> (tempfile::TempDir, Generated) {
    let g = generate(
        9,
        &[vec![(Dtype::U8, vec![64 << 10]), (Dtype::F32, vec![64 << 10]), (Dtype::U8, vec![4096])]],
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::copy(g.path().join("shard-00.safetensors"), dir.path().join("shard-00.safetensors")).unwrap();
    (dir, g)
}

#[test]
fn direct_loads_read_through_o_direct_and_fall_back_on_einval() {
    let (dir, g) = on_disk();
    let path = dir.path().join("shard-00.safetensors");
    if !tensora_testkit::direct_io_or_skip(&path, "direct loads") {
        return;
    }
    let ckpt = tensora_format::open(&path).unwrap();
    for refused in [false, true] {
        let faults = if refused { vec![Fault::DirectRefused { file: 0 }] } else { vec![] };
        each(&faults, |name, delivery, opts, plan| {
            let opts = LoadOptions { io_mode: tensora_io::IoMode::Direct, ..opts };
            let report =
                run(&ckpt, &g, &opts, delivery).unwrap_or_else(|e| panic!("{name} {delivery:?}: {e}"));
            assert_eq!(report.io_mode, "direct", "{name} {delivery:?}");
            if refused {
                assert!(
                    report.direct_fallbacks >= 1 && plan.injected() >= 1,
                    "{name} {delivery:?}: {report:?}"
                );
            } else {
                assert_eq!(report.direct_fallbacks, 0, "{name} {delivery:?}: every read went direct");
            }
        });
    }
}
