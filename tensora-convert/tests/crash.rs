//! `kill -9` at any point of a save leaves the previous file (or nothing), never a torn one.
//!
//! This binary is its own child (`harness = false`): with `TENSORA_CRASH_CHILD` set it saves
//! versions 1, 2, 3, … of a model to one path, alternating direct and buffered writes, small
//! pieces and two writer threads, and announces every stage of every save (each piece written,
//! the header, the `fsync`, the rename) on stdout, then waits for a go-ahead byte on stdin. The
//! parent picks, per child, a random announcement at which to `SIGKILL` it instead of answering:
//! the kill lands exactly there (the announcing thread is parked; the other writer may be in the
//! middle of a write), without sleeps. After each kill the destination must be absent (nothing
//! committed yet) or a complete file of the last committed version or the one being committed,
//! every tensor of it exactly that version's bytes; nothing else may be left but a named
//! temporary file of the killed child (only between linking the new file and renaming it). Set
//! `TENSORA_CRASH_SEED` to replay a run; the seed is printed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use tensora_convert::{MemoryTensors, SaveOptions, SaveStage, SourceTensor, WriteChoice};
use tensora_format::Dtype;

const CHILD_VAR: &str = "TENSORA_CRASH_CHILD";
const SEED_VAR: &str = "TENSORA_CRASH_SEED";
/// Children killed per run.
const KILLS: usize = 40;
/// Saves a child makes before it stops on its own (it is killed long before).
const VERSIONS_MAX: u64 = 4;
/// Tensor bytes per version (with 16 KiB pieces, dozens of kill points per save).
const TENSOR_BYTES: usize = 96 << 10;

/// The tensors of `version`: a marker holding the version, and three tensors whose bytes derive
/// from it.
fn model(version: u64) -> Vec<(String, Dtype, Vec<u8>)> {
    let mut out = vec![("version".to_owned(), Dtype::U64, version.to_le_bytes().to_vec())];
    for (i, dtype) in [Dtype::F32, Dtype::BF16, Dtype::U8].into_iter().enumerate() {
        let bytes = (0..TENSOR_BYTES).map(|k| (k as u64 * 31 + version * 7 + i as u64) as u8).collect();
        out.push((format!("w{i}"), dtype, bytes));
    }
    out
}

fn child(dst: &Path) {
    let out = Arc::new(Mutex::new((std::io::stdout(), std::io::stdin())));
    for version in 1..=VERSIONS_MAX {
        let tensors = model(version);
        let mut source = MemoryTensors::new();
        for (name, dtype, bytes) in &tensors {
            let numel = bytes.len() as u64 / dtype.size_bytes().unwrap();
            source.push(SourceTensor::dense(name.clone(), *dtype, vec![numel]).unwrap(), bytes).unwrap();
        }
        let line = Arc::clone(&out);
        let stage: tensora_convert::StageHook = Arc::new(move |stage, _| {
            let mut io = line.lock().unwrap_or_else(|p| p.into_inner());
            let (stdout, stdin) = &mut *io;
            writeln!(stdout, "{version} {stage:?}").and_then(|()| stdout.flush()).expect("parent gone");
            let mut go = [0u8; 1];
            stdin.read_exact(&mut go).expect("parent gone");
        });
        let mode = if version % 2 == 0 { WriteChoice::Direct } else { WriteChoice::Buffered };
        let opts = SaveOptions {
            mode,
            threads: 2,
            piece_bytes: 16 << 10,
            stage: Some(stage),
            ..SaveOptions::default()
        };
        let meta = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
        // Direct on a filesystem without O_DIRECT falls back to buffered with its reason.
        tensora_convert::save_safetensors(dst, &source, &meta, &opts).expect("save");
    }
}

/// The version of the file at `dst` after checking every tensor is that version's, exactly.
fn version_of(dst: &Path) -> u64 {
    let bytes = std::fs::read(dst).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("torn file: {e}"));
    let version = u64::from_le_bytes(st.tensor("version").unwrap().data().try_into().unwrap());
    let want = model(version);
    assert_eq!(st.len(), want.len());
    for (name, _, data) in want {
        assert!(st.tensor(&name).unwrap().data() == &data[..], "tensor {name} of version {version} differs");
    }
    version
}

/// A small xorshift: the kill points of a run, reproducible from its seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn parent() {
    let seed = std::env::var(SEED_VAR).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
            | 1
    });
    eprintln!("crash test: {SEED_VAR}={seed}");
    let mut rng = seed;
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("model.safetensors");
    let mut stages_seen = std::collections::HashSet::new();
    for kill in 0..KILLS {
        // Every fourth kill aims at a later stage (its first, second or third occurrence), the
        // others at any announcement of the first three saves (about 21 each).
        let aim: Option<&str> =
            (kill % 4 == 0).then(|| ["HeaderWritten", "Synced", "Committed"][kill / 4 % 3]);
        let target = if aim.is_some() { next(&mut rng) % 3 } else { next(&mut rng) % 63 };
        // What a save must leave when nothing of its own was committed: the file before it.
        let previous = dst.exists().then(|| version_of(&dst));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(CHILD_VAR, &dst)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut committed, mut in_flight) = (previous, 0u64);
        let mut seen = 0u64;
        while let Some(Ok(line)) = lines.next() {
            let (version, stage) = line.split_once(' ').unwrap();
            in_flight = version.parse().unwrap();
            if aim.is_none_or(|a| a == stage) {
                if seen == target {
                    child.kill().unwrap();
                    stages_seen.insert(stage.to_owned());
                    break;
                }
                seen += 1;
            }
            if stage == format!("{:?}", SaveStage::Committed) {
                committed = Some(in_flight);
            }
            stdin.write_all(b"g").unwrap();
        }
        let status = child.wait().unwrap();
        let context = format!("kill {kill} at {aim:?} #{target} ({SEED_VAR}={seed}, {status})");
        match std::fs::metadata(&dst) {
            Err(_) => assert_eq!(committed, None, "{context}: the committed file vanished"),
            Ok(_) => {
                let v = version_of(&dst);
                assert!(
                    Some(v) == committed || v == in_flight,
                    "{context}: version {v}, committed {committed:?}"
                );
            }
        }
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name == "model.safetensors" {
                continue;
            }
            assert!(name.starts_with(&format!(".model.safetensors.tmp-{pid}-")), "{context}: left {name}");
            std::fs::remove_file(dir.path().join(&name)).unwrap();
        }
    }
    assert_eq!(stages_seen.len(), 4, "kills at every stage: {stages_seen:?} ({SEED_VAR}={seed})");
    eprintln!("crash test: {KILLS} kills, stages hit: {stages_seen:?}");
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test -- --list`: this binary has no named tests to list
    }
    match std::env::var_os(CHILD_VAR) {
        Some(dst) => child(Path::new(&dst)),
        None => parent(),
    }
}
