//! Verified loads (`tensora_verify::verified`): a byte flipped on disk in any tensor stops every
//! kind of load with a `TensorMismatch` naming that tensor, its file and its offset, before the
//! tensor is handed out; a clean file loads unchanged.

use std::path::{Path, PathBuf};

use tensora_format::Checkpoint;
use tensora_io::{BackendChoice, LoadError, LoadOptions, Residence};
use tensora_verify::{Algo, Manifest, hash_with_load};
use tensora_verify::{
    CheckBytesError, ManifestCheck, ManifestCheckError, VerifiedLoadError, load_verified, mismatch_of,
};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.int8.safetensors");

/// The fixture copied into `dir`, and its manifest in `algo`.
fn copy_with_manifest(dir: &Path, algo: Algo) -> (PathBuf, Manifest) {
    let path = dir.join("model.safetensors");
    std::fs::copy(FIXTURE, &path).unwrap();
    let ckpt = tensora_format::open(&path).unwrap();
    let (digests, _) = hash_with_load(&ckpt, algo, &LoadOptions::default()).unwrap();
    (path, Manifest::from_checkpoint(&ckpt, algo, &digests).unwrap())
}

/// Flip one byte of `path` at `offset_bytes` (in place, same length).
fn flip(path: &Path, offset_bytes: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset_bytes).unwrap();
    f.write_all_at(&[b[0] ^ 0x5A], offset_bytes).unwrap();
}

/// Every way to load: each registered backend that runs here (owned), mapped views, a streaming
/// load (whose callback must never see the bad tensor) and `load_runs`.
#[derive(Debug, Clone)]
enum Path_ {
    Owned(BackendChoice),
    Mapped,
    Streaming,
    Runs,
}

fn every_path() -> Vec<Path_> {
    let mut out: Vec<Path_> = tensora_io::registry::backends()
        .into_iter()
        .filter(|b| b.available().is_ok())
        .map(|b| Path_::Owned(BackendChoice::Named(b.name().to_owned())))
        .collect();
    assert!(out.len() >= 2, "at least sync and mmap run everywhere");
    out.extend([Path_::Mapped, Path_::Streaming, Path_::Runs]);
    out
}

/// Load `ckpt` along `how` with `check` installed; the error, and the names handed out.
fn load_along(
    ckpt: &Checkpoint,
    how: &Path_,
    check: &std::sync::Arc<ManifestCheck>,
) -> (Result<(), LoadError>, Vec<String>) {
    let mut opts = LoadOptions { budget_bytes: 16 << 10, chunk_bytes: 8 << 10, ..LoadOptions::default() };
    let mut seen = Vec::new();
    match how {
        Path_::Owned(b) => opts.backend = b.clone(),
        Path_::Mapped => {
            // SAFETY: the test's files live in its own temporary directory and nothing rewrites
            // them while the views live (each load is checked and dropped here).
            opts.residence = Residence::Mapped(unsafe { tensora_io::FilesUnchanged::promise() })
        }
        Path_::Streaming | Path_::Runs => {}
    }
    check.install(&mut opts);
    let result = match how {
        Path_::Owned(_) | Path_::Mapped => tensora_io::load(ckpt, &opts).map(|l| {
            seen.extend(l.tensors().map(|t| t.name().to_owned()));
        }),
        Path_::Streaming => tensora_io::load_streaming(ckpt, &opts, |t| {
            seen.push(t.name().to_owned());
            Ok(())
        })
        .map(|_| ()),
        Path_::Runs => (|| {
            for run in tensora_io::load_runs(ckpt, &opts)? {
                seen.extend(run?.tensors().map(|t| t.name().to_owned()));
            }
            Ok(())
        })(),
    };
    (result, seen)
}

#[test]
fn a_clean_checkpoint_loads_on_every_path_with_every_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    for algo in Algo::ALL {
        let (path, manifest) = copy_with_manifest(dir.path(), algo);
        let ckpt = tensora_format::open(&path).unwrap();
        let check = ManifestCheck::new(&ckpt, &manifest).unwrap();
        assert_eq!(check.algo(), algo);
        for how in every_path() {
            let (result, seen) = load_along(&ckpt, &how, &check);
            result.unwrap_or_else(|e| panic!("{algo} {how:?}: {e}"));
            assert_eq!(seen.len(), ckpt.tensors().len(), "{algo} {how:?}");
        }
    }
}

#[test]
fn a_flipped_byte_in_any_tensor_stops_every_path_naming_it_before_it_is_handed_out() {
    let dir = tempfile::tempdir().unwrap();
    let (path, manifest) = copy_with_manifest(dir.path(), Algo::Crc32c);
    let clean = std::fs::read(&path).unwrap();
    let ckpt = tensora_format::open(&path).unwrap();
    for (i, t) in ckpt.tensors().iter().enumerate() {
        if t.nbytes() == 0 {
            continue;
        }
        std::fs::write(&path, &clean).unwrap();
        flip(&path, t.offset_bytes() + (i as u64 * 7919) % t.nbytes());
        let ckpt = tensora_format::open(&path).unwrap();
        let check = ManifestCheck::new(&ckpt, &manifest).unwrap();
        for how in every_path() {
            let (result, seen) = load_along(&ckpt, &how, &check);
            let err = result.expect_err("a flipped byte must fail the load");
            let m = mismatch_of(&err).unwrap_or_else(|| panic!("{how:?}: not a mismatch: {err}"));
            assert_eq!(
                (m.tensor.as_str(), m.path.as_path(), m.offset_bytes),
                (t.name(), path.as_path(), t.offset_bytes()),
                "{how:?}"
            );
            assert_ne!(m.expected, m.actual);
            assert!(!seen.iter().any(|n| n == t.name()), "{how:?}: the bad tensor was handed out");
            let text = err.to_string();
            assert!(
                text.contains(t.name()) && text.contains(&format!("offset {}", t.offset_bytes())),
                "{text}"
            );
        }
    }
}

#[test]
fn sha256_and_xxh3_manifests_catch_a_flip_too() {
    for algo in [Algo::Sha256, Algo::Xxh3] {
        let dir = tempfile::tempdir().unwrap();
        let (path, manifest) = copy_with_manifest(dir.path(), algo);
        let ckpt = tensora_format::open(&path).unwrap();
        let t = ckpt.tensors().iter().rev().find(|t| t.nbytes() > 0).unwrap().clone();
        flip(&path, t.offset_bytes() + t.nbytes() - 1);
        let ckpt = tensora_format::open(&path).unwrap();
        let err = load_verified(&ckpt, &manifest, &LoadOptions::default()).unwrap_err();
        let VerifiedLoadError::Load(e) = err else { panic!("{algo}: {err}") };
        assert_eq!(mismatch_of(&e).map(|m| m.tensor.as_str()), Some(t.name()), "{algo}");
    }
}

#[test]
fn a_manifest_that_does_not_describe_the_checkpoint_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let (path, manifest) = copy_with_manifest(dir.path(), Algo::Crc32c);
    let ckpt = tensora_format::open(&path).unwrap();
    let name = ckpt.tensors()[0].name().to_owned();

    let mut missing = manifest.clone();
    missing.tensors.remove(&name);
    let err = ManifestCheck::new(&ckpt, &missing).unwrap_err();
    assert_eq!(err, ManifestCheckError::NotInManifest { tensor: name.clone(), path: path.clone() });

    let mut reshaped = manifest.clone();
    reshaped.tensors.get_mut(&name).unwrap().shape.push(1);
    assert!(
        matches!(ManifestCheck::new(&ckpt, &reshaped), Err(ManifestCheckError::Meta { tensor, .. }) if tensor == name)
    );

    // A manifest of more tensors (a whole model, of which this is one shard) is fine.
    let mut more = manifest.clone();
    let extra = more.tensors[&name].clone();
    more.tensors.insert("other.shard.weight".into(), extra);
    assert!(ManifestCheck::new(&ckpt, &more).is_ok());
}

#[test]
fn check_bytes_checks_one_tensor_read_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let (path, manifest) = copy_with_manifest(dir.path(), Algo::Crc32c);
    let ckpt = tensora_format::open(&path).unwrap();
    let check = ManifestCheck::new(&ckpt, &manifest).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (i, t) = ckpt.tensors().iter().enumerate().find(|(_, t)| t.nbytes() > 1).unwrap();
    let range = t.offset_bytes() as usize..(t.offset_bytes() + t.len_bytes()) as usize;
    let mut data = bytes[range].to_vec();
    check.check_bytes(i, &data).unwrap();
    data[1] ^= 1;
    let err = check.check_bytes(i, &data).unwrap_err();
    assert!(
        matches!(&err, CheckBytesError::Mismatch(m)
            if m.tensor == t.name() && m.offset_bytes == t.offset_bytes()),
        "{err}"
    );
    assert!(matches!(check.check_bytes(i, &data[..1]), Err(CheckBytesError::Short { .. })));
    assert!(matches!(check.check_bytes(usize::MAX, &data), Err(CheckBytesError::Unknown { .. })));
}
