//! Shared helpers for tensora-io's integration tests: fixture paths, expected digests and a
//! generator of small multi-file checkpoints with known bytes.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tensora_format::Dtype;
use tensora_format::write::{SafetensorsLayout, TensorSpec, write_safetensors};

pub fn fixture(rel: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures")).join(rel)
}

/// The real fixtures with their expected-digest files.
pub fn real_fixtures() -> Vec<(PathBuf, PathBuf)> {
    vec![
        (fixture("real/fracast-0.safetensors"), fixture("real/fracast-0.expected.json")),
        (fixture("real/fracast-0.int8.safetensors"), fixture("real/fracast-0.int8.expected.json")),
        (fixture("serverlessllm/tiny"), fixture("serverlessllm/tiny.expected.json")),
    ]
}

/// name -> sha256 hex from an `*.expected.json`.
pub fn expected_digests(path: &Path) -> BTreeMap<String, String> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, t)| (k.clone(), t["sha256"].as_str().unwrap().to_owned()))
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Deterministic bytes for tensor `i` (an LCG seeded by `seed` and `i`).
pub fn tensor_bytes(seed: u64, i: usize, len: usize) -> Vec<u8> {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

/// A generated checkpoint: one safetensors file per shard in `dir`, each tensor's bytes known.
pub struct Generated {
    pub dir: tempfile::TempDir,
    /// name -> bytes
    pub data: BTreeMap<String, Vec<u8>>,
}

impl Generated {
    pub fn open(&self) -> tensora_format::Checkpoint {
        tensora_format::open(self.dir.path()).unwrap()
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// `shards[s]` lists `(dtype, shape)` of shard `s`'s tensors; names are `s{shard}.t{i}`.
pub fn generate(seed: u64, shards: &[Vec<(Dtype, Vec<u64>)>]) -> Generated {
    let dir = tempfile::tempdir().unwrap();
    let mut data = BTreeMap::new();
    for (s, tensors) in shards.iter().enumerate() {
        let specs: Vec<TensorSpec> = tensors
            .iter()
            .enumerate()
            .map(|(i, (dtype, shape))| TensorSpec {
                name: format!("s{s}.t{i}"),
                dtype: *dtype,
                shape: shape.clone(),
            })
            .collect();
        let bytes: Vec<Vec<u8>> = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| tensor_bytes(seed ^ s as u64, i, spec.nbytes().unwrap() as usize))
            .collect();
        let layout = SafetensorsLayout::new(specs.clone(), BTreeMap::new()).unwrap();
        let path = dir.path().join(format!("shard-{s:02}.safetensors"));
        write_safetensors(&path, &layout, |i, out: &mut dyn Write| out.write_all(&bytes[i])).unwrap();
        for (spec, b) in specs.into_iter().zip(bytes) {
            data.insert(spec.name, b);
        }
    }
    Generated { dir, data }
}

/// A 3-shard checkpoint with mixed dtypes, odd sizes, an empty tensor and a 1 MiB tensor.
pub fn generate_mixed(seed: u64) -> Generated {
    generate(
        seed,
        &[
            vec![
                (Dtype::F32, vec![64, 33]),
                (Dtype::F16, vec![7]),
                (Dtype::BF16, vec![512, 1024]),
                (Dtype::U8, vec![3]),
            ],
            vec![(Dtype::I64, vec![100]), (Dtype::F32, vec![0, 4]), (Dtype::F16, vec![4099])],
            vec![(Dtype::F64, vec![20_000]), (Dtype::I8, vec![1])],
        ],
    )
}

/// Backends that can run here: io_uring may be missing (see `tensora_testkit::require`), every other one must run.
pub fn runnable_backends() -> Vec<&'static str> {
    let mut out = Vec::new();
    for name in tensora_io::registry::names() {
        let b = tensora_io::registry::by_name(name).unwrap();
        if *name == "io-uring" {
            if tensora_testkit::io_uring_or_skip("runnable_backends") {
                out.push(*name);
            }
            continue;
        }
        match b.available() {
            Ok(()) => out.push(*name),
            Err(why) => panic!("backend {name} is unavailable here: {why}"),
        }
    }
    assert!(out.contains(&"sync"), "the sync backend runs everywhere");
    out
}

/// The files-unchanged promise for tests: their files are temporary or repository fixtures that
/// nothing modifies or truncates while a test holds views of them (except where a test does so on
/// purpose, inside a child process or before any view is touched).
pub fn files_unchanged() -> tensora_io::FilesUnchanged {
    // SAFETY: as above.
    unsafe { tensora_io::FilesUnchanged::promise() }
}
