//! What users run today, measured on the same files: safetensors-rs (here) and Hugging Face's
//! Python `load_file` ([`crate::python`]). Every peer touches the data it loads, so lazy paths are
//! not flattered, and returns what it holds, so that freeing it is never timed (as for ours).

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::{Context, Result};

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
/// selected tensor (`None` selects all). Returns the file buffers, which the tensors borrow.
pub fn st_read(files: &[PathBuf], selected: Option<&HashSet<String>>) -> Result<(Loaded, Vec<Vec<u8>>)> {
    let mut out = Loaded::default();
    let mut held = Vec::with_capacity(files.len());
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
        held.push(buf);
    }
    Ok((out, held))
}

/// candle-style: deserialize a mapped file and copy each selected tensor out with `to_vec`.
/// `bytes_of(k)` returns file `k`'s whole contents (e.g. a read-only mapping). Returns the copies.
pub fn st_to_vec<'a>(
    file_count: usize,
    mut bytes_of: impl FnMut(usize) -> Result<&'a [u8]>,
    selected: Option<&HashSet<String>>,
) -> Result<(Loaded, Vec<Vec<u8>>)> {
    let mut out = Loaded::default();
    let mut held = Vec::new();
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
            held.push(owned);
        }
    }
    Ok((out, held))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
        let (all, held) = st_read(std::slice::from_ref(&p), None).unwrap();
        assert_eq!((all.bytes, all.tensors), (data_len, 2));
        assert_eq!(held, vec![std::fs::read(&p).unwrap()]);
        let only_b: HashSet<String> = ["b".to_string()].into();
        let (b, _) = st_read(std::slice::from_ref(&p), Some(&only_b)).unwrap();
        assert_eq!((b.bytes, b.tensors), (18, 1));
        let bytes = std::fs::read(&p).unwrap();
        let (v, copies) = st_to_vec(1, |_| Ok(&bytes[..]), None).unwrap();
        assert_eq!(v, all);
        assert_eq!(copies.iter().map(|c| c.len() as u64).sum::<u64>(), data_len);
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
}
