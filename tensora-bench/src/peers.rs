//! What users run today, measured on the same files: safetensors-rs and Hugging Face's Python
//! `load_file`. Every peer touches the data it loads, so lazy paths are not flattered.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Distance between touched bytes: one per 4 KiB page.
pub const TOUCH_STRIDE_BYTES: usize = 4096;

/// Sum one byte per page of `data`, so every page of it is really present in memory.
pub fn touch(data: &[u8]) -> u64 {
    data.iter().step_by(TOUCH_STRIDE_BYTES).map(|&b| u64::from(b)).sum()
}

/// What a peer run loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Loaded {
    /// Bytes of tensor data that ended up in memory.
    pub bytes: u64,
    /// Tensors loaded.
    pub tensors: u64,
    /// Sum of touched bytes (kept so the work cannot be optimised away).
    pub checksum: u64,
}

/// safetensors-rs the simple way: `fs::read` each file, `SafeTensors::deserialize`, touch every
/// selected tensor (`None` selects all).
pub fn st_read(files: &[PathBuf], selected: Option<&HashSet<String>>) -> Result<Loaded> {
    let mut out = Loaded::default();
    for path in files {
        let buf = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
        let st = safetensors::SafeTensors::deserialize(&buf)
            .with_context(|| format!("deserialize {}", path.display()))?;
        for (name, view) in st.iter() {
            if selected.is_some_and(|s| !s.contains(name)) {
                continue;
            }
            out.bytes += view.data().len() as u64;
            out.tensors += 1;
            out.checksum = out.checksum.wrapping_add(touch(view.data()));
        }
    }
    Ok(out)
}

/// candle-style: deserialize a mapped file and copy each selected tensor out with `to_vec`.
/// `bytes_of(k)` returns file `k`'s whole contents (e.g. a read-only mapping).
pub fn st_to_vec<'a>(
    file_count: usize,
    mut bytes_of: impl FnMut(usize) -> Result<&'a [u8]>,
    selected: Option<&HashSet<String>>,
) -> Result<Loaded> {
    let mut out = Loaded::default();
    for k in 0..file_count {
        let bytes = bytes_of(k)?;
        let st =
            safetensors::SafeTensors::deserialize(bytes).with_context(|| format!("deserialize file #{k}"))?;
        for (name, view) in st.iter() {
            if selected.is_some_and(|s| !s.contains(name)) {
                continue;
            }
            let owned = view.data().to_vec();
            out.bytes += owned.len() as u64;
            out.tensors += 1;
            out.checksum = out.checksum.wrapping_add(touch(&owned));
        }
    }
    Ok(out)
}

/// The Python peer: times `safetensors.numpy.load_file` on each file inside the interpreter
/// (start-up and imports are not timed) and prints `seconds bytes tensors`.
pub const PYTHON_SCRIPT: &str = r#"import sys, time
from safetensors.numpy import load_file
t0 = time.perf_counter()
nbytes = 0
count = 0
for path in sys.argv[1:]:
    tensors = load_file(path)
    for a in tensors.values():
        nbytes += a.nbytes
        count += 1
print(time.perf_counter() - t0, nbytes, count)
"#;

/// Name of the Python interpreter used for the HF peer.
pub const PYTHON: &str = "python3";

/// Whether `python3` can import `safetensors` and `numpy`; `Err` says why not.
pub fn python_available() -> Result<(), String> {
    let out = Command::new(PYTHON)
        .args(["-c", "import safetensors, numpy"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {PYTHON}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(err.lines().last().unwrap_or("import failed").trim().to_string())
    }
}

/// One timed Python `load_file` pass over `files`: returns (seconds, loaded).
pub fn python_load(script: &Path, files: &[PathBuf]) -> Result<(f64, Loaded)> {
    let out = Command::new(PYTHON)
        .arg(script)
        .args(files)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {PYTHON}"))?;
    if !out.status.success() {
        bail!("{PYTHON} load_file failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    parse_python_output(&String::from_utf8_lossy(&out.stdout))
}

fn parse_python_output(stdout: &str) -> Result<(f64, Loaded)> {
    let mut it = stdout.split_whitespace();
    let mut next = |what: &str| it.next().with_context(|| format!("python output lacks {what}: {stdout:?}"));
    let seconds: f64 = next("seconds")?.parse().context("python seconds")?;
    let bytes: u64 = next("bytes")?.parse().context("python bytes")?;
    let tensors: u64 = next("tensors")?.parse().context("python tensor count")?;
    if !(seconds.is_finite() && seconds >= 0.0) {
        bail!("python reported {seconds} seconds");
    }
    Ok((seconds, Loaded { bytes, tensors, checksum: 0 }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use crate::writer::{Layout, TensorDef, write_random};
    use tensora_format::Dtype;

    fn fixture(dir: &Path) -> (PathBuf, u64) {
        let p = dir.join("m.safetensors");
        let t = [TensorDef::new("a", Dtype::F32, &[5000]), TensorDef::new("b", Dtype::F16, &[3, 3])];
        let layout = Layout::new(&t, &Default::default()).unwrap();
        write_random(&p, &layout, &mut SplitMix64::new(9)).unwrap();
        (p, layout.data_len_bytes())
    }

    #[test]
    fn rust_peers_load_everything_or_the_selection() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data_len) = fixture(dir.path());
        let all = st_read(std::slice::from_ref(&p), None).unwrap();
        assert_eq!((all.bytes, all.tensors), (data_len, 2));
        let only_b: HashSet<String> = ["b".to_string()].into();
        let b = st_read(std::slice::from_ref(&p), Some(&only_b)).unwrap();
        assert_eq!((b.bytes, b.tensors), (18, 1));
        let bytes = std::fs::read(&p).unwrap();
        let v = st_to_vec(1, |_| Ok(&bytes[..]), None).unwrap();
        assert_eq!(v, all);
        assert!(st_read(&[dir.path().join("missing")], None).is_err());
        assert!(st_to_vec(1, |_| Ok(&b"garbage"[..]), None).is_err());
    }

    #[test]
    fn touch_reads_one_byte_per_page() {
        let mut data = vec![0u8; 3 * TOUCH_STRIDE_BYTES];
        data[0] = 1;
        data[TOUCH_STRIDE_BYTES] = 2;
        data[TOUCH_STRIDE_BYTES + 1] = 100;
        assert_eq!(touch(&data), 3);
    }

    #[test]
    fn python_output_parsing() {
        let (s, l) = parse_python_output("0.25 1000 3\n").unwrap();
        assert_eq!((s, l.bytes, l.tensors), (0.25, 1000, 3));
        assert!(parse_python_output("").is_err());
        assert!(parse_python_output("nan 1 1").is_err());
        assert!(parse_python_output("0.1 x 1").is_err());
    }
}
