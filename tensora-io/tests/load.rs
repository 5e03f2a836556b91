//! The load API end to end: every registered backend yields identical bytes on the real fixtures
//! and on generated multi-file checkpoints, owned and streaming, full and partial, with budgets
//! smaller than a tensor.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use support::*;
use tensora_format::Dtype;
use tensora_format::Selection;
use tensora_io::{BackendChoice, IoMode, LoadError, LoadOptions, Residence, ViewError, load, load_streaming};

fn named(name: &str) -> LoadOptions {
    LoadOptions { backend: BackendChoice::Named(name.to_owned()), ..LoadOptions::default() }
}

/// `name -> sha256(bytes[..nbytes])` of a load.
fn digests_owned(ckpt: &tensora_format::Checkpoint, opts: &LoadOptions) -> BTreeMap<String, String> {
    let loaded = load(ckpt, opts).unwrap_or_else(|e| panic!("{opts:?}: {e}"));
    assert_eq!(loaded.report().tensors, loaded.len());
    loaded
        .tensors()
        .map(|t| {
            assert_eq!(t.bytes().len() as u64, t.info().len_bytes(), "{}", t.name());
            (t.name().to_owned(), sha256_hex(&t.bytes()[..t.info().nbytes() as usize]))
        })
        .collect()
}

fn digests_streaming(ckpt: &tensora_format::Checkpoint, opts: &LoadOptions) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let report = load_streaming(ckpt, opts, |t| {
        let previous = out.insert(t.name().to_owned(), sha256_hex(&t.bytes()[..t.info().nbytes() as usize]));
        assert!(previous.is_none(), "{} delivered twice", t.name());
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{opts:?}: {e}"));
    assert_eq!(report.tensors, out.len());
    out
}

#[test]
fn every_backend_matches_expected_digests_on_real_fixtures() {
    for (path, expected) in real_fixtures() {
        let expected = expected_digests(&expected);
        let ckpt = tensora_format::open(&path).unwrap();
        for name in runnable_backends() {
            for io_mode in [IoMode::Buffered, IoMode::Direct] {
                let opts = LoadOptions { io_mode, ..named(name) };
                assert_eq!(
                    digests_owned(&ckpt, &opts),
                    expected,
                    "{name} {io_mode:?} owned {}",
                    path.display()
                );
                let opts = LoadOptions { budget_bytes: 64 << 10, chunk_bytes: 16 << 10, ..opts };
                assert_eq!(digests_streaming(&ckpt, &opts), expected, "{name} {io_mode:?} streaming");
            }
        }
        let mapped =
            LoadOptions { residence: Residence::Mapped(files_unchanged()), ..LoadOptions::default() };
        assert_eq!(digests_owned(&ckpt, &mapped), expected, "mapped {}", path.display());
        assert_eq!(digests_streaming(&ckpt, &mapped), expected, "mapped streaming");
        assert_eq!(digests_owned(&ckpt, &LoadOptions::default()), expected, "auto {}", path.display());
    }
}

#[test]
fn every_backend_yields_the_generated_bytes_across_shards() {
    let g = generate_mixed(7);
    let ckpt = g.open();
    assert_eq!(ckpt.files().len(), 3);
    let expected: BTreeMap<String, String> = g.data.iter().map(|(k, v)| (k.clone(), sha256_hex(v))).collect();
    for name in runnable_backends() {
        for threads in [1, 3] {
            let opts = LoadOptions { threads, queue_depth: 4, chunk_bytes: 64 << 10, ..named(name) };
            assert_eq!(digests_owned(&ckpt, &opts), expected, "{name} threads {threads}");
            // One file open at a time: three plans, three parts of one arena.
            let opts = LoadOptions { files_open_max: 1, ..opts };
            assert_eq!(digests_owned(&ckpt, &opts), expected, "{name} files_open_max 1");
            let opts = LoadOptions { budget_bytes: 300 << 10, ..opts };
            assert_eq!(digests_streaming(&ckpt, &opts), expected, "{name} streaming");
        }
    }
    let loaded = tensora_io::load_path(g.path(), &LoadOptions::default()).unwrap();
    assert_eq!(loaded.len(), expected.len());
    assert!(loaded.report().phases.parse > 0.0);
    assert_eq!(loaded.report().files, 3);
}

#[test]
fn budget_smaller_than_a_tensor_still_loads_and_bounds_inflight_bytes() {
    let g = generate(3, &[vec![(Dtype::F32, vec![64 << 10]), (Dtype::U8, vec![10])]]); // 256 KiB tensor
    let ckpt = g.open();
    let budget_bytes = 16 << 10;
    for name in runnable_backends() {
        let opts = LoadOptions { budget_bytes, chunk_bytes: 1 << 20, ..named(name) };
        let loaded = load(&ckpt, &opts).unwrap();
        assert_eq!(loaded.tensor("s0.t0").unwrap().bytes(), &g.data["s0.t0"][..], "{name}");
        assert!(loaded.report().peak_inflight_bytes <= budget_bytes, "{name}: {:?}", loaded.report());
        let mut sizes = Vec::new();
        let report = load_streaming(&ckpt, &opts, |t| {
            assert_eq!(t.bytes(), &g.data[t.name()][..]);
            sizes.push(t.bytes().len());
            Ok(())
        })
        .unwrap();
        assert_eq!(report.windows, 2, "{name}: the big tensor gets a window of its own");
        assert_eq!(sizes.len(), 2);
    }
}

#[test]
fn partial_selection_and_priority_order() {
    let g = generate_mixed(11);
    let ckpt = g.open();
    let opts = LoadOptions {
        selection: Selection::Glob(vec!["s1.*".into(), "s2.t1".into()]),
        priority: Some(vec!["s2.t1".into(), "s1.t2".into()]),
        budget_bytes: 12 << 10,
        ..named("sync")
    };
    let loaded = load(&ckpt, &opts).unwrap();
    let names: Vec<&str> = loaded.tensors().map(|t| t.name()).collect();
    assert_eq!(names, ["s2.t1", "s1.t2", "s1.t0", "s1.t1"]);
    assert!(loaded.tensor("s0.t0").is_none());
    for t in loaded.tensors() {
        assert_eq!(t.bytes(), &g.data[t.name()][..]);
    }
    let selected: u64 = names.iter().map(|n| g.data[*n].len() as u64).sum();
    assert_eq!(loaded.report().bytes_selected, selected);
    assert!(loaded.report().bytes_read >= selected);
    // Streaming with small windows delivers the priority tensors first.
    let mut order = Vec::new();
    load_streaming(&ckpt, &opts, |t| {
        order.push(t.name().to_owned());
        Ok(())
    })
    .unwrap();
    assert_eq!(&order[..2], ["s2.t1", "s1.t2"]);
    // A typo is an error, not an empty load.
    let bad = LoadOptions { selection: Selection::Names(vec!["s9.t9".into()]), ..named("sync") };
    assert!(matches!(load(&ckpt, &bad), Err(LoadError::Selection(_))));
    let bad = LoadOptions { priority: Some(vec!["nope".into()]), ..named("sync") };
    assert!(matches!(load(&ckpt, &bad), Err(LoadError::Selection(_))));
}

#[test]
fn hooks_fire_once_per_tensor_with_the_right_bytes_and_progress_completes() {
    let g = generate_mixed(5);
    let ckpt = g.open();
    let data = Arc::new(g.data.clone());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (seen2, data2) = (Arc::clone(&seen), Arc::clone(&data));
    let last = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (last2, calls2) = (Arc::clone(&last), Arc::clone(&calls));
    let opts = LoadOptions {
        on_tensor: Some(Arc::new(move |t| {
            assert_eq!(t.bytes(), &data2[t.name()][..]);
            seen2.lock().unwrap().push(t.name().to_owned());
            Ok(())
        })),
        progress: Some(Arc::new(move |done, total| {
            assert!(done <= total);
            last2.fetch_max(done, Ordering::Relaxed);
            calls2.fetch_add(1, Ordering::Relaxed);
        })),
        threads: 2,
        chunk_bytes: 32 << 10,
        ..named("sync")
    };
    let loaded = load(&ckpt, &opts).unwrap();
    let mut names = seen.lock().unwrap().clone();
    names.sort();
    assert_eq!(names, data.keys().cloned().collect::<Vec<_>>());
    assert_eq!(last.load(Ordering::Relaxed), loaded.report().bytes_selected);
    assert!(calls.load(Ordering::Relaxed) > 1);
}

#[test]
fn hook_and_callback_errors_stop_the_load() {
    let g = generate_mixed(9);
    let ckpt = g.open();
    let opts = LoadOptions {
        on_tensor: Some(Arc::new(
            |t| if t.name() == "s1.t2" { Err("digest mismatch".into()) } else { Ok(()) },
        )),
        ..named("sync")
    };
    match load(&ckpt, &opts) {
        Err(LoadError::Callback { tensor, source }) => {
            assert_eq!(tensor, "s1.t2");
            assert_eq!(source.to_string(), "digest mismatch");
        }
        other => panic!("{other:?}"),
    }
    let mut calls = 0;
    let opts = LoadOptions { budget_bytes: 8 << 10, ..named("sync") };
    let err = load_streaming(&ckpt, &opts, |_| {
        calls += 1;
        if calls == 2 { Err("consumer full".into()) } else { Ok(()) }
    })
    .unwrap_err();
    assert!(matches!(err, LoadError::Callback { .. }), "{err}");
    assert_eq!(calls, 2, "no callback after the failing one");
}

#[test]
fn typed_views_check_dtype_length_and_alignment() {
    let g = generate_mixed(1);
    let ckpt = g.open();
    let loaded = load(&ckpt, &named("sync")).unwrap();
    let t = loaded.tensor("s0.t0").unwrap();
    let floats = t.as_slice::<f32>().unwrap();
    assert_eq!(floats.len(), 64 * 33);
    assert_eq!(bytemuck::cast_slice::<f32, u8>(floats), &g.data["s0.t0"][..]);
    assert!(matches!(t.as_slice::<u32>(), Err(ViewError::Dtype { .. })));
    assert_eq!(loaded.tensor("s0.t1").unwrap().as_slice::<half::f16>().unwrap().len(), 7);
    assert_eq!(loaded.tensor("s0.t2").unwrap().as_slice::<half::bf16>().unwrap().len(), 512 * 1024);
    assert_eq!(loaded.tensor("s1.t1").unwrap().as_slice::<f32>().unwrap().len(), 0);
    // Alignment is never assumed: each view either is aligned or is refused.
    for t in loaded.tensors() {
        let addr = t.bytes().as_ptr() as usize;
        match (t.dtype(), t.as_slice::<f64>()) {
            (Dtype::F64, Ok(_)) => assert_eq!(addr % 8, 0),
            (Dtype::F64, Err(e)) => assert!(matches!(e, ViewError::Misaligned { .. }), "{e}"),
            (_, r) => assert!(matches!(r, Err(ViewError::Dtype { .. }))),
        }
    }
}

#[test]
fn a_misaligned_tensor_is_refused_not_reinterpreted() {
    // A hand-written safetensors file whose F32 tensor starts 2 bytes into the data section.
    let dir = tempfile::tempdir().unwrap();
    let header = br#"{"pad":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"x":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}}"#;
    let mut header = header.to_vec();
    while !(8 + header.len()).is_multiple_of(8) {
        header.push(b' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(&[9, 9]);
    file.extend_from_slice(bytemuck::cast_slice(&[1.5f32, -2.0]));
    let path = dir.path().join("m.safetensors");
    std::fs::write(&path, &file).unwrap();
    let ckpt = tensora_format::open(&path).unwrap();
    for residence in [Residence::Owned, Residence::Mapped(files_unchanged())] {
        let loaded = load(&ckpt, &LoadOptions { residence, ..LoadOptions::default() }).unwrap();
        let x = loaded.tensor("x").unwrap();
        assert_eq!(x.bytes(), bytemuck::cast_slice::<f32, u8>(&[1.5, -2.0]));
        assert!(matches!(x.as_slice::<f32>(), Err(ViewError::Misaligned { .. })), "{residence:?}");
    }
}

#[test]
fn errors_for_unknown_backends_and_report_fields() {
    let g = generate_mixed(2);
    let ckpt = g.open();
    match load(&ckpt, &named("floppy")) {
        Err(LoadError::UnknownBackend { name, known }) => {
            assert_eq!(name, "floppy");
            assert!(known.contains("sync") && known.contains("io-uring"));
        }
        other => panic!("{other:?}"),
    }
    let loaded = load(&ckpt, &LoadOptions::default()).unwrap();
    let r = loaded.report();
    assert!(!r.reason.is_empty() && !r.reason.contains('\n'));
    assert!(r.seconds > 0.0 && r.gbps > 0.0);
    assert_eq!(r.bytes_selected, g.data.values().map(|v| v.len() as u64).sum::<u64>());
    assert!(r.bytes_read >= r.bytes_selected);
    assert!(r.peak_rss_bytes > 0);
    let json = serde_json::to_value(r).unwrap();
    assert_eq!(json["backend"], r.backend.as_str());
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<tensora_io::Loaded>();
}

#[test]
fn cancel_flag_stops_the_load() {
    let g = generate_mixed(4);
    let ckpt = g.open();
    let cancel = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let opts = LoadOptions { cancel: Some(cancel), ..named("sync") };
    assert!(matches!(load(&ckpt, &opts), Err(LoadError::Cancelled)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Whatever the sizes, budget, chunk and thread count, the sync backend delivers exactly the
    /// written bytes, owned and streaming, and streaming never holds more than the budget in
    /// flight.
    #[test]
    fn any_layout_and_knobs_round_trip(
        shards in proptest::collection::vec(proptest::collection::vec(0u64..5000, 1..5), 1..4),
        budget_kib in 4u64..64,
        chunk_kib in 1u64..32,
        threads in 1usize..4,
        seed in any::<u64>(),
    ) {
        let specs: Vec<Vec<(Dtype, Vec<u64>)>> =
            shards.iter().map(|s| s.iter().map(|&n| (Dtype::F16, vec![n])).collect()).collect();
        let g = generate(seed, &specs);
        let ckpt = g.open();
        let budget_bytes = budget_kib << 10;
        let opts = LoadOptions { budget_bytes, chunk_bytes: chunk_kib << 10, threads, ..named("sync") };
        let loaded = load(&ckpt, &opts).unwrap();
        prop_assert_eq!(loaded.len(), g.data.len());
        for t in loaded.tensors() {
            prop_assert_eq!(t.bytes(), &g.data[t.name()][..]);
        }
        prop_assert!(loaded.report().peak_inflight_bytes <= budget_bytes);
        let mut n = 0;
        let report = load_streaming(&ckpt, &opts, |t| {
            assert_eq!(t.bytes(), &g.data[t.name()][..]);
            n += 1;
            Ok(())
        }).unwrap();
        prop_assert_eq!(n, g.data.len());
        prop_assert!(report.peak_inflight_bytes <= budget_bytes);
    }
}

#[test]
fn mapped_loads_report_mmap_whatever_backend_is_named() {
    let g = generate_mixed(5);
    let ckpt = g.open();
    for backend in [BackendChoice::Named("sync".into()), BackendChoice::Auto] {
        let opts = LoadOptions {
            backend,
            residence: Residence::Mapped(files_unchanged()),
            ..LoadOptions::default()
        };
        let loaded = load(&ckpt, &opts).unwrap();
        let r = loaded.report();
        assert_eq!((r.backend.as_str(), r.io_mode.as_str()), ("mmap", "mapped"), "{r:?}");
        assert!(r.reason.starts_with("mapped: residence \"mapped\""), "{r:?}");
    }
}

#[test]
fn peak_inflight_is_the_budgets_exact_peak() {
    let g = generate_mixed(6);
    let ckpt = g.open();
    for name in runnable_backends() {
        // One worker, reads of at most 16 KiB, a budget far above it: the peak is one read.
        let opts = LoadOptions {
            backend: BackendChoice::Named(name.into()),
            threads: 1,
            queue_depth: 1,
            chunk_bytes: 16 << 10,
            budget_bytes: 1 << 30,
            ..LoadOptions::default()
        };
        let loaded = load(&ckpt, &opts).unwrap();
        let r = loaded.report();
        assert!(r.peak_inflight_bytes > 0 && r.peak_inflight_bytes <= 16 << 10, "{name}: {r:?}");
    }
}
