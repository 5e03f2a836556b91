//! Where a load puts the tensors (`Residence::{Owned, Mapped, Auto}`), why (the report), and that
//! mapped views have every page read in before the load returns.

mod support;

use std::sync::Arc;

use support::{files_unchanged, fixture, generate, generate_mixed};
use tensora_format::Dtype;
use tensora_io::{BackendChoice, IoMode, LoadError, LoadOptions, ReadErrorKind, Residence, load};

/// Reads every byte of every file of `ckpt`, so the page cache holds it.
fn warm_up(ckpt: &tensora_format::Checkpoint) {
    for f in ckpt.files() {
        assert_eq!(std::fs::read(f.path()).unwrap().len() as u64, f.len_bytes());
    }
}

#[test]
fn auto_maps_warm_local_files_and_gives_the_same_bytes_as_an_owned_load() {
    let g = generate_mixed(11);
    let ckpt = g.open();
    warm_up(&ckpt);
    let auto =
        load(&ckpt, &LoadOptions { residence: Residence::Auto(files_unchanged()), ..LoadOptions::default() })
            .unwrap();
    let r = auto.report();
    assert_eq!((r.residence.as_str(), r.backend.as_str(), r.io_mode.as_str()), ("mapped", "mmap", "mapped"));
    assert!(r.reason.starts_with("mapped: warm, on local"), "{}", r.reason);
    let owned = load(&ckpt, &LoadOptions::default()).unwrap();
    assert_eq!(owned.report().residence, "owned");
    assert!(
        owned.report().reason.starts_with("owned: residence \"owned\"; warm"),
        "{}",
        owned.report().reason
    );
    assert_eq!(auto.len(), owned.len());
    for t in owned.tensors() {
        assert_eq!(auto.tensor(t.name()).unwrap().bytes(), t.bytes(), "{}", t.name());
        assert_eq!(t.bytes(), &g.data[t.name()][..], "{}", t.name());
    }
}

#[test]
fn auto_owns_when_a_backend_is_named_or_the_data_is_cold() {
    let g = generate_mixed(12);
    let ckpt = g.open();
    warm_up(&ckpt);
    let named = LoadOptions {
        residence: Residence::Auto(files_unchanged()),
        backend: BackendChoice::Named("sync".into()),
        ..LoadOptions::default()
    };
    let r = load(&ckpt, &named).unwrap().report().clone();
    assert_eq!((r.residence.as_str(), r.backend.as_str()), ("owned", "sync"));
    assert!(r.reason.starts_with("owned: a backend was named"), "{}", r.reason);

    // A file on a disk-backed filesystem (the target dir, not a tmpfs), evicted from the cache.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cold = generate(13, &[vec![(Dtype::F32, vec![1 << 20])]]);
    let path = dir.path().join("cold.safetensors");
    std::fs::copy(cold.path().join("shard-00.safetensors"), &path).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    file.sync_all().unwrap();
    tensora_sys::evict_file_cache(&file).unwrap();
    let sample = tensora_sys::residency_sample(&file, file.metadata().unwrap().len()).unwrap();
    assert_eq!(sample.resident_pages, 0, "ext4 drops clean pages on POSIX_FADV_DONTNEED");
    let ckpt = tensora_format::open(&path).unwrap();
    let len_bytes = file.metadata().unwrap().len();
    let resident = || tensora_sys::residency_sample(&file, len_bytes).unwrap();

    // Asked to read around the page cache: an owned copy.
    let opts = LoadOptions {
        residence: Residence::Auto(files_unchanged()),
        io_mode: IoMode::Direct,
        ..LoadOptions::default()
    };
    let loaded = load(&ckpt, &opts).unwrap();
    let r = loaded.report();
    assert_eq!(r.residence, "owned");
    assert!(r.reason.starts_with("owned: cold, around the page cache (O_DIRECT asked)"), "{}", r.reason);
    assert_eq!(loaded.tensor("s0.t0").unwrap().bytes(), &cold.data["s0.t0"][..]);
    drop(loaded);
    tensora_sys::evict_file_cache(&file).unwrap();
    assert!(resident().fraction() < tensora_io::WARM_FRACTION, "evicted again");

    // The default: the pages fit in the page cache, so the cold load reads them in as views and
    // leaves them for the next load, which finds the file warm.
    let auto = LoadOptions { residence: Residence::Auto(files_unchanged()), ..LoadOptions::default() };
    let loaded = load(&ckpt, &auto).unwrap();
    let r = loaded.report();
    assert_eq!(r.residence, "mapped");
    assert!(r.reason.starts_with("mapped: cold, on local"), "{}", r.reason);
    assert!(r.reason.contains("pages kept cached for the next load"), "{}", r.reason);
    assert_eq!(loaded.tensor("s0.t0").unwrap().bytes(), &cold.data["s0.t0"][..]);
    drop(loaded);
    let after = resident();
    assert_eq!(after.resident_pages, after.sampled_pages, "the cold load left its pages cached: {after:?}");
    let next = load(&ckpt, &auto).unwrap();
    assert!(next.report().reason.starts_with("mapped: warm"), "{}", next.report().reason);
}

#[test]
fn an_owned_cold_copy_keeps_its_pages_unless_asked_for_o_direct() {
    // A file on a disk-backed filesystem (the target dir, not a tmpfs), 16 MiB in 4 tensors.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cold = generate(14, &[vec![(Dtype::F32, vec![1 << 20]); 4]]);
    let path = dir.path().join("cold.safetensors");
    std::fs::copy(cold.path().join("shard-00.safetensors"), &path).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    file.sync_all().unwrap();
    let len_bytes = file.metadata().unwrap().len();
    let resident = || tensora_sys::residency_sample(&file, len_bytes).unwrap();
    let ckpt = tensora_format::open(&path).unwrap();
    for (io_mode, kept) in [(IoMode::Direct, false), (IoMode::Auto, true)] {
        tensora_sys::evict_file_cache(&file).unwrap();
        assert_eq!(resident().resident_pages, 0, "ext4 drops clean pages on POSIX_FADV_DONTNEED");
        let loaded = load(&ckpt, &LoadOptions { io_mode, ..LoadOptions::default() }).unwrap();
        let r = loaded.report();
        assert_eq!(r.residence, "owned");
        for (name, want) in &cold.data {
            assert_eq!(loaded.tensor(name).unwrap().bytes(), &want[..], "{name}");
        }
        let after = resident();
        if kept {
            assert!(r.reason.contains("cold, pages kept cached for the next load"), "{}", r.reason);
            assert_eq!((r.backend.as_str(), r.io_mode.as_str()), ("sync", "buffered"), "{}", r.reason);
            assert_eq!(after.resident_pages, after.sampled_pages, "the cold copy left its pages: {after:?}");
        } else {
            // O_DIRECT asked: read around the cache (a selection this small, by the sync backend).
            assert!(!r.reason.contains("pages kept"), "{}", r.reason);
            assert_eq!(r.io_mode, "direct", "{}", r.reason);
            assert!(after.fraction() < tensora_io::WARM_FRACTION, "{after:?}");
        }
    }
}

#[test]
fn residence_names_parse_and_unknown_ones_are_refused() {
    for r in [Residence::Owned, Residence::Mapped(files_unchanged()), Residence::Auto(files_unchanged())] {
        assert_eq!(Residence::from_name(r.as_str(), files_unchanged()), Ok(r));
    }
    let e = Residence::from_name("lazy", files_unchanged()).unwrap_err();
    assert!(e.contains("\"lazy\"") && e.contains("auto"), "{e}");
}

#[test]
fn a_mapped_load_reads_every_page_in_and_reports_progress() {
    let ckpt = tensora_format::open(fixture("real/fracast-0.safetensors")).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    let opts = LoadOptions {
        residence: Residence::Mapped(files_unchanged()),
        progress: Some(Arc::new(move |done, total| s2.lock().unwrap().push((done, total)))),
        ..LoadOptions::default()
    };
    let loaded = load(&ckpt, &opts).unwrap();
    let total = loaded.report().bytes_selected;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.last().copied(), Some((total, total)), "populate reports up to the total");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0));
    // Every page of every tensor is resident in this process's mapping: no fault left to take.
    for t in loaded.tensors() {
        assert_eq!(t.bytes().len() as u64, t.info().len_bytes());
    }
}

/// A 16-byte tensor then a 12 MiB one; the file is cut while the big tensor's pages are read in:
/// the load fails naming the file, the offset of the first piece that could not be read in, and
/// the tensor.
#[test]
fn a_file_cut_while_its_pages_are_read_in_fails_naming_file_offset_and_tensor() {
    const BIG_BYTES: u64 = 12 << 20;
    let g = generate(14, &[vec![(Dtype::U8, vec![16]), (Dtype::U8, vec![BIG_BYTES])]]);
    let path = g.path().join("shard-00.safetensors");
    let ckpt = tensora_format::open(&path).unwrap();
    let big = ckpt.tensor("s0.t1").unwrap().clone();
    let piece = tensora_io::POPULATE_PIECE_BYTES_MAX as u64;
    let cut_at = big.offset_bytes() + piece + (1 << 20);
    let p2 = path.clone();
    let cut = Arc::new(std::sync::Once::new());
    let opts = LoadOptions {
        residence: Residence::Mapped(files_unchanged()),
        threads: 1,
        // After the first piece (the small tensor and the first 8 MiB of the big one share no
        // piece: one span per tensor), cut the file inside the big tensor's second piece.
        progress: Some(Arc::new(move |done, _| {
            if done >= piece {
                cut.call_once(|| {
                    std::fs::OpenOptions::new().write(true).open(&p2).unwrap().set_len(cut_at).unwrap()
                });
            }
        })),
        ..LoadOptions::default()
    };
    let err = load(&ckpt, &opts).unwrap_err();
    let msg = err.to_string();
    let LoadError::Read { path: p, offset_bytes, tensor, kind, .. } = err else {
        panic!("expected a read error naming the tensor, got {msg}");
    };
    assert_eq!((p.as_path(), tensor.as_str()), (path.as_path(), "s0.t1"));
    assert_eq!(offset_bytes, big.offset_bytes() + piece, "{msg}");
    assert!(
        matches!(&kind, ReadErrorKind::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof),
        "{kind:?}"
    );
    assert!(msg.contains("\"s0.t1\"") && msg.contains(&format!("offset {offset_bytes}")), "{msg}");
}
