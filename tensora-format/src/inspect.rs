//! One description of a checkpoint's structure for every front end: [`Inspection`].
//!
//! `tensora inspect --json` prints it and the Python binding's `tensora.inspect` returns it, so the
//! two cannot drift apart. It is built from headers and indexes only ([`Inspection::of`] reads no
//! file), and every size carries its unit in its field name:
//!
//! ```json
//! {"path": "...", "format": "serverlessllm",
//!  "files": [{"path": "...", "len_bytes": 37376, "tensors": 3}, ...],
//!  "metadata": {},
//!  "tensors": [{"name": "embed.weight", "dtype": "BF16", "shape": [100, 64], "file": 0,
//!               "offset_bytes": 0, "len_bytes": 12800, "nbytes": 12800, "strides": [64, 1]}, ...],
//!  "tensor_bytes": 91835,
//!  "warnings": [{"path": "...", "message": "..."}]}
//! ```
//!
//! ```
//! use tensora_format::Inspection;
//!
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
//! let ckpt = tensora_format::open(dir)?;
//! let inspection = Inspection::of(&ckpt);
//! assert_eq!(inspection.format, "serverlessllm");
//! assert_eq!(inspection.files.len(), 3);
//! let embed = &inspection.tensors[0];
//! assert_eq!((embed.name.as_str(), embed.dtype.as_str()), ("embed.weight", "BF16"));
//! assert_eq!((embed.offset_bytes, embed.len_bytes), (0, 12800));
//! assert_eq!(embed.strides.as_deref(), Some(&[64u64, 1][..]));
//!
//! let json = serde_json::to_value(&inspection)?;
//! assert_eq!(json["tensors"][0]["len_bytes"], 12800);
//! assert_eq!(json["files"][0]["tensors"], 3);
//! assert_eq!(json["tensor_bytes"], 91835);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Checkpoint;

/// A checkpoint's structure: format, files, metadata, tensors and the parser's warnings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inspection {
    /// The path that was opened ([`Checkpoint::root`]): a file, a directory, or a remote URL.
    pub path: String,
    /// The layout: `safetensors`, `safetensors-sharded` or `serverlessllm`
    /// ([`crate::Format::as_str`]).
    pub format: String,
    /// The files, in [`Checkpoint::files`] order; [`InspectedTensor::file`] indexes into it.
    pub files: Vec<InspectedFile>,
    /// `__metadata__` (safetensors) or the index's `metadata` (sharded), as strings.
    pub metadata: BTreeMap<String, String>,
    /// Every tensor, ordered by (file, offset).
    pub tensors: Vec<InspectedTensor>,
    /// Sum of the tensors' `len_bytes` (tied tensors counted once per name), saturating
    /// ([`Checkpoint::total_tensor_bytes`]).
    pub tensor_bytes: u64,
    /// Non-fatal findings made while opening (e.g. a `total_size` that disagrees with the shards).
    pub warnings: Vec<InspectedWarning>,
}

/// One file of an [`Inspection`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InspectedFile {
    /// The file's path as opened.
    pub path: String,
    /// The file's size at parse time.
    pub len_bytes: u64,
    /// How many tensors have their bytes in this file.
    pub tensors: usize,
}

/// One tensor of an [`Inspection`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InspectedTensor {
    /// The tensor's name, unique in the checkpoint.
    pub name: String,
    /// Element type in the safetensors spelling (`F32`, `BF16`, `I8`, ...).
    pub dtype: String,
    /// Shape; `[]` is a scalar.
    pub shape: Vec<u64>,
    /// Index into [`Inspection::files`] of the file holding the bytes.
    pub file: u32,
    /// Absolute offset of the first byte in that file.
    pub offset_bytes: u64,
    /// Bytes of storage to read: `numel × itemsize` for safetensors; the recorded storage size
    /// for ServerlessLLM, which strides may make larger ([`crate::TensorInfo::len_bytes`]).
    pub len_bytes: u64,
    /// `numel × itemsize`: the bytes of the data as a dense array from `offset_bytes`, the bytes a
    /// tensor digest covers ([`crate::TensorInfo::nbytes`]); at most `len_bytes`.
    pub nbytes: u64,
    /// Strides in elements where the format records them (ServerlessLLM); `null` means contiguous
    /// row-major.
    pub strides: Option<Vec<u64>>,
}

/// A non-fatal finding of the parser.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InspectedWarning {
    /// The file the finding is about.
    pub path: String,
    /// What was found, as the parser said it.
    pub message: String,
}

impl Inspection {
    /// Describe `ckpt` (no I/O: everything comes from the parsed headers and indexes).
    pub fn of(ckpt: &Checkpoint) -> Inspection {
        let mut per_file = vec![0usize; ckpt.files().len()];
        for t in ckpt.tensors() {
            per_file[t.file().index()] += 1;
        }
        Inspection {
            path: ckpt.root().display().to_string(),
            format: ckpt.format().as_str().to_owned(),
            files: ckpt
                .files()
                .iter()
                .zip(per_file)
                .map(|(f, tensors)| InspectedFile {
                    path: f.path().display().to_string(),
                    len_bytes: f.len_bytes(),
                    tensors,
                })
                .collect(),
            metadata: ckpt.metadata().clone(),
            tensors: ckpt
                .tensors()
                .iter()
                .map(|t| InspectedTensor {
                    name: t.name().to_owned(),
                    dtype: t.dtype().as_str().to_owned(),
                    shape: t.shape().to_vec(),
                    file: t.file().0,
                    offset_bytes: t.offset_bytes(),
                    len_bytes: t.len_bytes(),
                    nbytes: t.nbytes(),
                    strides: t.strides().map(<[u64]>::to_vec),
                })
                .collect(),
            tensor_bytes: ckpt.total_tensor_bytes(),
            warnings: ckpt
                .warnings()
                .iter()
                .map(|w| InspectedWarning { path: w.path.display().to_string(), message: w.message.clone() })
                .collect(),
        }
    }
}

impl Inspection {
    /// Write `ckpt`'s [`Inspection`] as JSON to `out`, byte for byte what serialising
    /// [`Inspection::of`] writes, without building it: nothing per tensor is copied, so a
    /// 90,000-tensor checkpoint is described with no more memory than it already holds.
    ///
    /// ```
    /// use tensora_format::Inspection;
    /// let ckpt = tensora_format::open(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny"))?;
    /// let mut streamed = Vec::new();
    /// Inspection::write_json(&ckpt, &mut streamed)?;
    /// assert_eq!(streamed, serde_json::to_vec(&Inspection::of(&ckpt))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_json(ckpt: &Checkpoint, out: impl std::io::Write) -> serde_json::Result<()> {
        serde_json::to_writer(out, &View(ckpt))
    }
}

/// [`Inspection`]'s schema, serialised straight from a checkpoint (field order as declared there).
struct View<'a>(&'a Checkpoint);

#[derive(Serialize)]
struct FileView {
    path: String,
    len_bytes: u64,
    tensors: usize,
}

#[derive(Serialize)]
struct TensorView<'a> {
    name: &'a str,
    dtype: &'static str,
    shape: &'a [u64],
    file: u32,
    offset_bytes: u64,
    len_bytes: u64,
    nbytes: u64,
    strides: Option<&'a [u64]>,
}

#[derive(Serialize)]
struct WarningView<'a> {
    path: String,
    message: &'a str,
}

impl Serialize for View<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let ckpt = self.0;
        let mut per_file = vec![0usize; ckpt.files().len()];
        for t in ckpt.tensors() {
            per_file[t.file().index()] += 1;
        }
        let files = ckpt.files().iter().zip(per_file).map(|(f, tensors)| FileView {
            path: f.path().display().to_string(),
            len_bytes: f.len_bytes(),
            tensors,
        });
        let tensors = ckpt.tensors().iter().map(|t| TensorView {
            name: t.name(),
            dtype: t.dtype().as_str(),
            shape: t.shape(),
            file: t.file().0,
            offset_bytes: t.offset_bytes(),
            len_bytes: t.len_bytes(),
            nbytes: t.nbytes(),
            strides: t.strides(),
        });
        let warnings = ckpt
            .warnings()
            .iter()
            .map(|w| WarningView { path: w.path.display().to_string(), message: &w.message });
        let mut s = serializer.serialize_struct("Inspection", 7)?;
        s.serialize_field("path", &ckpt.root().display().to_string())?;
        s.serialize_field("format", ckpt.format().as_str())?;
        s.serialize_field("files", &Seq(std::cell::Cell::new(Some(files))))?;
        s.serialize_field("metadata", ckpt.metadata())?;
        s.serialize_field("tensors", &Seq(std::cell::Cell::new(Some(tensors))))?;
        s.serialize_field("tensor_bytes", &ckpt.total_tensor_bytes())?;
        s.serialize_field("warnings", &Seq(std::cell::Cell::new(Some(warnings))))?;
        s.end()
    }
}

/// A sequence serialised once from an iterator (taken on first use).
struct Seq<I>(std::cell::Cell<Option<I>>);

impl<I: Iterator<Item = T>, T: Serialize> Serialize for Seq<I> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.take().into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::checkpoint::{FileEntry as File, FileStamp, TensorInfo, Warning};
    use crate::{Dtype, FileId, Format};

    fn stamp(len_bytes: u64) -> FileStamp {
        FileStamp { len_bytes, modified: None, dev: 0, inode: 0 }
    }

    /// A `U8` tensor of `len_bytes` storage; with strides, every other byte of it.
    fn tensor(
        name: &str,
        file: u32,
        offset_bytes: u64,
        len_bytes: u64,
        strides: Option<Vec<u64>>,
    ) -> TensorInfo {
        let numel = if strides.is_some() { len_bytes / 2 } else { len_bytes };
        TensorInfo::owned(
            name,
            Dtype::U8,
            &[numel],
            strides.as_deref(),
            (FileId(file), offset_bytes, len_bytes),
        )
    }

    /// Two files, a tied pair in the first, one strided tensor, metadata and a warning.
    fn two_files() -> Checkpoint {
        let files = ["/m/a", "/m/b"]
            .map(|p| File { path: PathBuf::from(p), stamp: stamp(64), data_start_bytes: 0 })
            .to_vec();
        let tensors = vec![
            tensor("embed", 0, 0, 16, None),
            tensor("head", 0, 0, 16, None),
            tensor("w", 1, 8, 24, Some(vec![2])),
        ];
        let metadata = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
        let warnings = vec![Warning { path: PathBuf::from("/m/index"), message: "total_size\n40".into() }];
        Checkpoint::from_parts(Format::ServerlessLlm, PathBuf::from("/m"), files, tensors, metadata, warnings)
    }

    #[test]
    fn every_fact_of_the_checkpoint_is_carried() {
        let i = Inspection::of(&two_files());
        assert_eq!((i.path.as_str(), i.format.as_str()), ("/m", "serverlessllm"));
        let files: Vec<_> = i.files.iter().map(|f| (f.path.as_str(), f.len_bytes, f.tensors)).collect();
        assert_eq!(files, [("/m/a", 64, 2), ("/m/b", 64, 1)]);
        assert_eq!(i.metadata["format"], "pt");
        let w = &i.tensors[2];
        assert_eq!((w.name.as_str(), w.dtype.as_str(), w.shape.as_slice()), ("w", "U8", &[12u64][..]));
        assert_eq!((w.file, w.offset_bytes, w.len_bytes, w.nbytes), (1, 8, 24, 12));
        assert_eq!(w.strides, Some(vec![2]));
        assert_eq!((i.tensors[0].len_bytes, i.tensors[0].nbytes), (16, 16));
        assert_eq!(i.tensors[0].strides, None);
        // Tied tensors count once per name, as `Checkpoint::total_tensor_bytes` does.
        assert_eq!(i.tensor_bytes, 16 + 16 + 24);
        assert_eq!(
            i.warnings,
            [InspectedWarning { path: "/m/index".into(), message: "total_size\n40".into() }]
        );
    }

    /// An object's keys, sorted (whatever order serde_json keeps them in).
    fn keys(v: &serde_json::Value) -> Vec<&str> {
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn the_streamed_json_is_the_built_one_byte_for_byte() {
        let empty = Checkpoint::from_parts(
            Format::Safetensors,
            PathBuf::from("/e"),
            Vec::new(),
            Vec::new(),
            BTreeMap::new(),
            Vec::new(),
        );
        let tiny =
            crate::open(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny")).unwrap();
        for ckpt in [two_files(), empty, tiny] {
            let mut streamed = Vec::new();
            Inspection::write_json(&ckpt, &mut streamed).unwrap();
            assert_eq!(
                String::from_utf8(streamed).unwrap(),
                serde_json::to_string(&Inspection::of(&ckpt)).unwrap()
            );
        }
    }

    #[test]
    fn json_field_names_carry_their_units_and_round_trip() {
        let i = Inspection::of(&two_files());
        let v = serde_json::to_value(&i).unwrap();
        assert_eq!(keys(&v), ["files", "format", "metadata", "path", "tensor_bytes", "tensors", "warnings"]);
        assert_eq!(keys(&v["files"][0]), ["len_bytes", "path", "tensors"]);
        assert_eq!(
            keys(&v["tensors"][0]),
            ["dtype", "file", "len_bytes", "name", "nbytes", "offset_bytes", "shape", "strides"]
        );
        assert_eq!(keys(&v["warnings"][0]), ["message", "path"]);
        assert!(v["tensors"][0]["strides"].is_null(), "absent strides are null, not missing");
        let back: Inspection = serde_json::from_value(v).unwrap();
        assert_eq!(back, i);
    }

    #[test]
    fn an_empty_checkpoint_has_empty_lists() {
        let ckpt = Checkpoint::from_parts(
            Format::Safetensors,
            PathBuf::from("/e.safetensors"),
            vec![File { path: PathBuf::from("/e.safetensors"), stamp: stamp(16), data_start_bytes: 16 }],
            Vec::new(),
            BTreeMap::new(),
            Vec::new(),
        );
        let i = Inspection::of(&ckpt);
        assert_eq!(i.files[0].tensors, 0);
        assert!(i.tensors.is_empty() && i.warnings.is_empty() && i.metadata.is_empty());
        assert_eq!(i.tensor_bytes, 0);
    }
}
