//! A minimal safetensors writer for generated fixtures: header, then random data streamed in large
//! chunks, written to a temporary file and renamed into place only once complete and synced.
//!
//! `tensora_format` is getting a general writer; this one exists so the bench does not wait for it,
//! and it only ever writes what the bench itself describes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tensora_format::Dtype;

use crate::rng::SplitMix64;

/// Bytes generated and written per step when streaming fixture data.
pub const WRITE_CHUNK_BYTES: usize = 8 << 20;

/// Upper bound on a generated header, so a runaway spec fails instead of eating memory. The
/// safetensors reference implementation refuses headers above 100 MB as well.
pub const HEADER_BYTES_MAX: usize = 100_000_000;

/// One tensor to write: name, dtype and shape. Its data is generated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorDef {
    /// Tensor name, unique in its file.
    pub name: String,
    /// Element type.
    #[serde(with = "dtype_serde")]
    pub dtype: Dtype,
    /// Shape; `[]` is a scalar.
    pub shape: Vec<u64>,
}

impl TensorDef {
    /// A tensor definition.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[u64]) -> TensorDef {
        TensorDef { name: name.into(), dtype, shape: shape.to_vec() }
    }

    /// Bytes of data, or `None` on overflow or a sub-byte total.
    pub fn len_bytes(&self) -> Option<u64> {
        let numel = self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        self.dtype.bytes_for(numel)
    }
}

mod dtype_serde {
    use serde::{Deserialize, Deserializer, Serializer};
    use tensora_format::Dtype;

    pub fn serialize<S: Serializer>(dtype: &Dtype, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(dtype.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Dtype, D::Error> {
        let s = String::deserialize(d)?;
        Dtype::from_safetensors(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown dtype {s:?}")))
    }
}

/// Where everything of one safetensors file goes.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The 8-byte length prefix followed by the padded JSON header.
    prefix_and_header: Vec<u8>,
    data_len_bytes: u64,
}

impl Layout {
    /// Lay out `tensors` in the given order, with optional `__metadata__`.
    pub fn new(tensors: &[TensorDef], metadata: &BTreeMap<String, String>) -> Result<Layout> {
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            header.insert("__metadata__".to_string(), serde_json::to_value(metadata)?);
        }
        let mut offset_bytes = 0u64;
        for t in tensors {
            let len_bytes = t
                .len_bytes()
                .with_context(|| format!("tensor {:?}: size overflows or is sub-byte", t.name))?;
            let end = offset_bytes.checked_add(len_bytes).context("total data size overflows u64")?;
            let entry = serde_json::json!({
                "dtype": t.dtype.as_str(),
                "shape": t.shape,
                "data_offsets": [offset_bytes, end],
            });
            if header.insert(t.name.clone(), entry).is_some() {
                bail!("duplicate tensor name {:?}", t.name);
            }
            offset_bytes = end;
        }
        let mut json = serde_json::to_vec(&header)?;
        // Pad with spaces so tensor data starts 8-byte aligned, as the reference writer does.
        while json.len() % 8 != 0 {
            json.push(b' ');
        }
        if json.len() > HEADER_BYTES_MAX {
            bail!("header of {} bytes exceeds {HEADER_BYTES_MAX}", json.len());
        }
        let mut prefix_and_header = Vec::with_capacity(8 + json.len());
        prefix_and_header.extend_from_slice(&(json.len() as u64).to_le_bytes());
        prefix_and_header.extend_from_slice(&json);
        Ok(Layout { prefix_and_header, data_len_bytes: offset_bytes })
    }

    /// Length prefix plus header, in bytes: where tensor data starts.
    pub fn data_start_bytes(&self) -> u64 {
        self.prefix_and_header.len() as u64
    }

    /// Bytes of tensor data.
    #[cfg(test)]
    pub fn data_len_bytes(&self) -> u64 {
        self.data_len_bytes
    }

    /// Size of the whole file.
    pub fn file_len_bytes(&self) -> u64 {
        self.data_start_bytes() + self.data_len_bytes
    }
}

/// Write `layout` to `path` with data from `rng`, atomically: a temporary file in the same
/// directory is written, synced and renamed over `path`. Returns the file length.
pub fn write_random(path: &Path, layout: &Layout, rng: &mut SplitMix64) -> Result<u64> {
    let tmp = TempPath::new(path)?;
    let file = File::create(&tmp.0).with_context(|| format!("create {}", tmp.0.display()))?;
    let mut out = BufWriter::with_capacity(WRITE_CHUNK_BYTES, file);
    out.write_all(&layout.prefix_and_header)?;
    let mut chunk = vec![0u8; WRITE_CHUNK_BYTES];
    let mut left_bytes = layout.data_len_bytes;
    while left_bytes > 0 {
        let n = usize::try_from(left_bytes).map_or(WRITE_CHUNK_BYTES, |l| l.min(WRITE_CHUNK_BYTES));
        rng.fill(&mut chunk[..n]);
        out.write_all(&chunk[..n])?;
        left_bytes -= n as u64;
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all().with_context(|| format!("sync {}", tmp.0.display()))?;
    drop(file);
    tmp.persist(path)?;
    Ok(layout.file_len_bytes())
}

/// Write small text (JSON) atomically.
pub fn write_text(path: &Path, text: &str) -> Result<()> {
    let tmp = TempPath::new(path)?;
    let mut file = File::create(&tmp.0).with_context(|| format!("create {}", tmp.0.display()))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    drop(file);
    tmp.persist(path)
}

/// A temporary path next to the target, removed on drop unless persisted.
struct TempPath(PathBuf);

impl TempPath {
    fn new(target: &Path) -> Result<TempPath> {
        let name = target.file_name().with_context(|| format!("{} has no file name", target.display()))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp{}", std::process::id()));
        Ok(TempPath(target.with_file_name(tmp_name)))
    }

    fn persist(self, target: &Path) -> Result<()> {
        std::fs::rename(&self.0, target)
            .with_context(|| format!("rename {} to {}", self.0.display(), target.display()))?;
        if let Some(dir) = target.parent() {
            // Make the rename durable; a directory that cannot be opened or synced is not fatal.
            if let Ok(d) = File::open(if dir.as_os_str().is_empty() { Path::new(".") } else { dir }) {
                let _ = d.sync_all();
            }
        }
        std::mem::forget(self);
        Ok(())
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_file_parses_with_the_reference_crate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.safetensors");
        let tensors = vec![
            TensorDef::new("b", Dtype::F16, &[3, 5]),
            TensorDef::new("a", Dtype::F32, &[7]),
            TensorDef::new("s", Dtype::U8, &[]),
        ];
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let layout = Layout::new(&tensors, &meta).unwrap();
        let len = write_random(&path, &layout, &mut SplitMix64::new(1)).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, len);
        assert_eq!(layout.data_start_bytes() % 8, 0);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.len(), 3);
        assert_eq!(st.tensor("b").unwrap().shape(), &[3, 5]);
        assert_eq!(st.tensor("b").unwrap().data().len(), 30);
        assert_eq!(st.tensor("a").unwrap().dtype(), safetensors::Dtype::F32);
        assert_eq!(st.tensor("s").unwrap().data().len(), 1);
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn duplicate_names_and_sub_byte_sizes_are_errors() {
        let dup = [TensorDef::new("x", Dtype::U8, &[1]), TensorDef::new("x", Dtype::U8, &[1])];
        assert!(Layout::new(&dup, &BTreeMap::new()).is_err());
        let odd = [TensorDef::new("f4", Dtype::F4, &[3])];
        assert!(Layout::new(&odd, &BTreeMap::new()).is_err());
        let huge = [TensorDef::new("h", Dtype::F64, &[u64::MAX, 2])];
        assert!(Layout::new(&huge, &BTreeMap::new()).is_err());
    }
}
