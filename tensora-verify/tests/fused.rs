//! Fused digests through real loads: every registered backend, owned, mapped and streaming, small
//! and default reads, on the real fixtures and the ServerlessLLM fixture (tied tensors, storage
//! longer than `nbytes`). The crc32c digests must come from the read hook (no byte digested a
//! second time) and equal the scan's; SHA-256 must reproduce the fixtures' `*.expected.json`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tensora_format::Checkpoint;
use tensora_io::{BackendChoice, LoadOptions, PieceRef, Residence, TensorRef};
use tensora_verify::{Algo, Digest};
use tensora_verify::{DigestCollector, DigestStats, hash_with_load};
use tensora_verify::{ScanConfig, scan};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures");

/// (checkpoint path, expected-digest file) for every fixture.
fn fixtures() -> Vec<(String, String)> {
    vec![
        (
            format!("{FIXTURES}/real/fracast-0.safetensors"),
            format!("{FIXTURES}/real/fracast-0.expected.json"),
        ),
        (
            format!("{FIXTURES}/real/fracast-0.int8.safetensors"),
            format!("{FIXTURES}/real/fracast-0.int8.expected.json"),
        ),
        (format!("{FIXTURES}/serverlessllm/tiny"), format!("{FIXTURES}/serverlessllm/tiny.expected.json")),
    ]
}

fn expected_sha256(path: &str) -> BTreeMap<String, String> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    json["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, t)| (name.clone(), t["sha256"].as_str().unwrap().to_owned()))
        .collect()
}

/// The backends that can run here.
fn backends() -> Vec<String> {
    tensora_io::registry::backends()
        .into_iter()
        .filter(|b| b.available().is_ok())
        .map(|b| b.name().to_owned())
        .collect()
}

/// How a load hands its tensors over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// `tensora_io::load`: every tensor in one `Loaded`.
    Whole,
    /// `tensora_io::load_streaming`: each tensor as it completes.
    Streamed,
}

/// The load shapes each backend is run with: (residence, delivery, chunk_bytes, budget_bytes).
fn shapes() -> [(Residence, Delivery, u64, u64); 5] {
    [
        (Residence::Owned, Delivery::Whole, 8 << 20, 1 << 30),
        (Residence::Owned, Delivery::Whole, 4096, 1 << 30),
        (Residence::Owned, Delivery::Streamed, 4096, 64 << 10),
        (Residence::Owned, Delivery::Streamed, 8 << 20, 1 << 30),
        (Residence::Mapped(files_unchanged()), Delivery::Whole, 8 << 20, 1 << 30),
    ]
}

fn load_with(ckpt: &Checkpoint, opts: &LoadOptions, delivery: Delivery) {
    match delivery {
        Delivery::Streamed => drop(tensora_io::load_streaming(ckpt, opts, |_| Ok(())).unwrap()),
        Delivery::Whole => drop(tensora_io::load(ckpt, opts).unwrap()),
    }
}

#[test]
fn crc32c_from_pieces_equals_the_scan_on_every_backend_and_load_shape() {
    for (path, _) in fixtures() {
        let ckpt = tensora_format::open(&path).unwrap();
        let scanned = scan(&ckpt, &ScanConfig::default());
        assert!(scanned.is_clean());
        let total_bytes: u64 = ckpt.tensors().iter().map(|t| t.nbytes()).sum();
        for backend in backends() {
            for (residence, delivery, chunk_bytes, budget_bytes) in shapes() {
                if residence == Residence::Mapped(files_unchanged()) && delivery == Delivery::Streamed {
                    continue;
                }
                let what = format!("{path} {backend} {residence:?} {delivery:?} chunk={chunk_bytes}");
                let collector = DigestCollector::new(&ckpt, Algo::Crc32c);
                let mut opts = LoadOptions {
                    backend: BackendChoice::Named(backend.clone()),
                    residence,
                    chunk_bytes,
                    budget_bytes,
                    ..LoadOptions::default()
                };
                collector.install(&mut opts);
                load_with(&ckpt, &opts, delivery);
                let digests = collector.finish(&ckpt).unwrap();
                for (i, t) in ckpt.tensors().iter().enumerate() {
                    assert_eq!(Some(digests[i]), scanned.digests[i], "{what}: {}", t.name());
                }
                assert_eq!(
                    collector.stats(),
                    DigestStats { bytes_on_arrival: total_bytes, bytes_at_completion: 0 },
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn sha256_and_xxh3_fused_reproduce_the_expected_digests_on_every_backend() {
    for (path, expected) in fixtures() {
        let ckpt = tensora_format::open(&path).unwrap();
        let expected = expected_sha256(&expected);
        assert_eq!(expected.len(), ckpt.tensors().len());
        let xxh3 = scan(&ckpt, &ScanConfig { algo: Algo::Xxh3, ..ScanConfig::default() }).digests;
        for backend in backends() {
            for (residence, delivery, chunk_bytes, budget_bytes) in shapes() {
                if residence == Residence::Mapped(files_unchanged()) && delivery == Delivery::Streamed {
                    continue;
                }
                let opts = LoadOptions {
                    backend: BackendChoice::Named(backend.clone()),
                    residence,
                    chunk_bytes,
                    budget_bytes,
                    ..LoadOptions::default()
                };
                let what = format!("{path} {backend} {residence:?} chunk={chunk_bytes}");
                let (digests, _) = hash_with_load(&ckpt, Algo::Sha256, &opts).unwrap();
                for (t, d) in ckpt.tensors().iter().zip(&digests) {
                    assert_eq!(d.to_hex(), expected[t.name()], "{what}: {}", t.name());
                }
                let (digests, _) = hash_with_load(&ckpt, Algo::Xxh3, &opts).unwrap();
                let digests: Vec<Option<Digest>> = digests.into_iter().map(Some).collect();
                assert_eq!(digests, xxh3, "{what}");
            }
        }
    }
}

#[test]
fn installed_hooks_run_before_the_callers_hooks_and_both_see_everything() {
    let (path, _) = &fixtures()[2];
    let ckpt = tensora_format::open(path).unwrap();
    let pieces_bytes = Arc::new(AtomicU64::new(0));
    let tensors_seen = Arc::new(AtomicU64::new(0));
    let (p, t) = (Arc::clone(&pieces_bytes), Arc::clone(&tensors_seen));
    let opts = LoadOptions {
        chunk_bytes: 4096,
        on_read: Some(Arc::new(move |piece: &PieceRef<'_>| {
            p.fetch_add(piece.bytes.len() as u64, Ordering::Relaxed);
            Ok(())
        })),
        on_tensor: Some(Arc::new(move |_: &TensorRef<'_>| {
            t.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })),
        ..LoadOptions::default()
    };
    let (digests, _) = hash_with_load(&ckpt, Algo::Crc32c, &opts).unwrap();
    let scanned = scan(&ckpt, &ScanConfig::default()).digests;
    assert_eq!(digests.into_iter().map(Some).collect::<Vec<_>>(), scanned);
    assert_eq!(tensors_seen.load(Ordering::Relaxed), ckpt.tensors().len() as u64);
    // Every tensor's whole storage passed through the caller's read hook (tied tensors each).
    let storage: u64 = ckpt.tensors().iter().map(|t| t.len_bytes()).sum();
    assert_eq!(pieces_bytes.load(Ordering::Relaxed), storage);
}

#[test]
fn an_error_from_the_callers_read_hook_stops_the_load_naming_the_tensor() {
    let (path, _) = &fixtures()[0];
    let ckpt = tensora_format::open(path).unwrap();
    let victim = ckpt.tensors()[ckpt.tensors().len() / 2].name().to_owned();
    let v = victim.clone();
    let opts = LoadOptions {
        on_read: Some(Arc::new(
            move |piece: &PieceRef<'_>| {
                if piece.info.name() == v { Err("refused".into()) } else { Ok(()) }
            },
        )),
        ..LoadOptions::default()
    };
    let err = hash_with_load(&ckpt, Algo::Crc32c, &opts).unwrap_err();
    assert!(err.to_string().contains(&victim), "{err}");
}

/// The files-unchanged promise for these tests: repository fixtures and temporary files that
/// nothing modifies while their views live.
fn files_unchanged() -> tensora_io::FilesUnchanged {
    // SAFETY: as above.
    unsafe { tensora_io::FilesUnchanged::promise() }
}
