//! Manifests: the per-tensor digests of a checkpoint, plus its file sizes and format.
//!
//! The JSON document is
//!
//! ```json
//! {
//!   "algo": "crc32c",
//!   "format": "safetensors",
//!   "files": {"model.safetensors": {"len_bytes": 1234}},
//!   "tensors": {"w": {"dtype": "F32", "shape": [2, 2], "crc32c": "0a1b2c3d"}}
//! }
//! ```
//!
//! `format` and `files` are optional (`tensora hash --json` leaves them out; `--write-manifest`
//! writes them). `algo` is optional when reading: a document without it (such as the fixtures'
//! `*.expected.json`) names its algorithm through the digest key of its tensors. Unknown keys are
//! ignored, so newer manifests stay readable.
//!
//! A manifest is untrusted input: [`Manifest::read`] refuses files over [`MANIFEST_LEN_BYTES_MAX`]
//! before reading them, and reads at most that many bytes even if the file grows meanwhile.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tensora_format::{Checkpoint, ErrorKind};

use crate::digest::{Algo, BadDigest, Digest};

/// Largest manifest [`Manifest::read`] accepts: 256 MiB, room for millions of tensors.
pub const MANIFEST_LEN_BYTES_MAX: u64 = 256 << 20;

/// Highest tensor rank accepted in a manifest (the format parsers allow far less).
pub const MANIFEST_RANK_MAX: usize = 64;

/// One tensor of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestTensor {
    /// Safetensors dtype spelling, e.g. `"BF16"`.
    pub dtype: String,
    /// Shape; `[]` is a scalar.
    pub shape: Vec<u64>,
    /// Digest of the tensor's `nbytes` raw bytes, in the manifest's algorithm.
    pub digest: Digest,
}

/// One file of a manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestFile {
    /// The file's size.
    pub len_bytes: u64,
}

/// Per-tensor digests of a checkpoint, with (optionally) its format and file sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The algorithm of every digest in it.
    pub algo: Algo,
    /// [`tensora_format::Format::as_str`] of the checkpoint, when recorded.
    pub format: Option<String>,
    /// File sizes, keyed by [`file_key`]. Empty when not recorded.
    pub files: BTreeMap<String, ManifestFile>,
    /// Every tensor, by name.
    pub tensors: BTreeMap<String, ManifestTensor>,
}

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be opened or read, or is not a regular file.
    #[error("{path}: {source}")]
    Io {
        /// The manifest's path.
        path: PathBuf,
        /// What failed (`InvalidInput` for a file that is not a regular one).
        source: io::Error,
    },
    /// The file is over [`MANIFEST_LEN_BYTES_MAX`]; refused before it is read.
    #[error("{path}: manifest is {len_bytes} bytes, over the limit of {limit_bytes}")]
    TooLarge {
        /// The manifest's path.
        path: PathBuf,
        /// Its size (or what was read of it, if it grew).
        len_bytes: u64,
        /// The largest manifest accepted.
        limit_bytes: u64,
    },
    /// The document is not valid JSON.
    #[error("manifest is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The document is JSON but not a manifest; the message says which key is wrong.
    #[error("invalid manifest: {0}")]
    Invalid(String),
    /// A tensor's digest is not valid hex of its algorithm's length.
    #[error("invalid manifest: tensor {tensor:?}: {source}")]
    BadDigest {
        /// The tensor whose digest it is.
        tensor: String,
        /// What is wrong with the text.
        source: BadDigest,
    },
    /// A manifest file ([`Manifest::read`]) whose document is not a manifest: the file, and
    /// why ([`ManifestError::Json`], [`ManifestError::Invalid`] or [`ManifestError::BadDigest`]).
    #[error("{path}: {source}")]
    InFile {
        /// The manifest's path.
        path: PathBuf,
        /// What is wrong with its document.
        source: Box<ManifestError>,
    },
}

/// The key of a checkpoint file in [`Manifest::files`]: its path relative to the checkpoint root
/// (for a single-file checkpoint, its file name), with `/` separators.
pub fn file_key(ckpt: &Checkpoint, file_path: &Path) -> String {
    let rel = file_path.strip_prefix(ckpt.root()).ok().filter(|p| !p.as_os_str().is_empty());
    let rel = match rel {
        Some(p) => p.to_path_buf(),
        None => file_path.file_name().map(PathBuf::from).unwrap_or_else(|| file_path.to_path_buf()),
    };
    rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}

impl Manifest {
    /// Build a manifest from a checkpoint and one digest per tensor, in [`Checkpoint::tensors`]
    /// order. Records the format and every file's size.
    ///
    /// Returns `Invalid` if `digests` has the wrong length or a digest of another algorithm.
    pub fn from_checkpoint(
        ckpt: &Checkpoint,
        algo: Algo,
        digests: &[Digest],
    ) -> Result<Manifest, ManifestError> {
        if digests.len() != ckpt.tensors().len() {
            return Err(ManifestError::Invalid(format!(
                "{} digests for {} tensors",
                digests.len(),
                ckpt.tensors().len()
            )));
        }
        let mut tensors = BTreeMap::new();
        for (t, d) in ckpt.tensors().iter().zip(digests) {
            if d.algo() != algo {
                return Err(ManifestError::Invalid(format!(
                    "tensor {:?}: {} digest in a {algo} manifest",
                    t.name(),
                    d.algo()
                )));
            }
            tensors.insert(
                t.name().to_owned(),
                ManifestTensor {
                    dtype: t.dtype().as_str().to_owned(),
                    shape: t.shape().to_vec(),
                    digest: *d,
                },
            );
        }
        let files = ckpt
            .files()
            .iter()
            .map(|f| (file_key(ckpt, f.path()), ManifestFile { len_bytes: f.len_bytes() }))
            .collect();
        Ok(Manifest { algo, format: Some(ckpt.format().as_str().to_owned()), files, tensors })
    }

    /// The `tensora hash --json` document: `{"algo", "tensors": {name: {dtype, shape, <algo>}}}`.
    pub fn tensors_json(&self) -> Value {
        let mut tensors = Map::new();
        for (name, t) in &self.tensors {
            let mut entry = Map::new();
            entry.insert("dtype".into(), Value::from(t.dtype.as_str()));
            entry.insert("shape".into(), Value::from(t.shape.clone()));
            entry.insert(self.algo.as_str().into(), Value::from(t.digest.to_hex()));
            tensors.insert(name.clone(), Value::Object(entry));
        }
        let mut doc = Map::new();
        doc.insert("algo".into(), Value::from(self.algo.as_str()));
        doc.insert("tensors".into(), Value::Object(tensors));
        Value::Object(doc)
    }

    /// The full document: [`Manifest::tensors_json`] plus `format` and `files` when recorded.
    pub fn to_json(&self) -> Value {
        let mut doc = self.tensors_json();
        if let Value::Object(map) = &mut doc {
            if let Some(format) = &self.format {
                map.insert("format".into(), Value::from(format.as_str()));
            }
            if !self.files.is_empty() {
                let files: Map<String, Value> = self
                    .files
                    .iter()
                    .map(|(k, f)| {
                        let mut e = Map::new();
                        e.insert("len_bytes".into(), Value::from(f.len_bytes));
                        (k.clone(), Value::Object(e))
                    })
                    .collect();
                map.insert("files".into(), Value::Object(files));
            }
        }
        doc
    }

    /// Parse a manifest document (see the module docs). Every digest must be valid hex of the
    /// right length; every shape a list of non-negative integers.
    ///
    /// The document is read straight into typed fields (no JSON tree): unknown keys are skipped
    /// unread and a shape longer than [`MANIFEST_RANK_MAX`] stops the parse, so memory stays
    /// proportional to the manifest's useful content. Malformed JSON is [`ManifestError::Json`];
    /// well-formed JSON of the wrong shape is [`ManifestError::Invalid`].
    ///
    /// ```
    /// use tensora_verify::Manifest;
    /// let doc = br#"{"tensors": {"w": {"dtype": "F32", "shape": [2], "crc32c": "0a1b2c3d", "note": [1]}}}"#;
    /// let m = Manifest::from_json_slice(doc).unwrap();
    /// assert_eq!(m.tensors["w"].shape, [2]);
    /// assert_eq!(m.algo, tensora_verify::Algo::Crc32c);
    /// ```
    pub fn from_json_slice(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let raw: RawManifest = serde_json::from_slice(bytes).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => ManifestError::Invalid(e.to_string()),
            _ => ManifestError::Json(e),
        })?;
        raw.into_manifest()
    }

    /// Parse an already-decoded manifest document.
    pub fn from_json_value(doc: &Value) -> Result<Manifest, ManifestError> {
        let invalid = |m: String| ManifestError::Invalid(m);
        let obj = doc.as_object().ok_or_else(|| invalid("the document must be a JSON object".into()))?;
        let tensors_v = obj
            .get("tensors")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid("missing object \"tensors\"".into()))?;
        let algo = match obj.get("algo") {
            Some(Value::String(s)) => s.parse::<Algo>().map_err(|e| invalid(e.to_string()))?,
            Some(_) => return Err(invalid("\"algo\" must be a string".into())),
            None => infer_algo(tensors_v.values().next().map(|t| |a: Algo| t.get(a.as_str()).is_some()))?,
        };
        let format = match obj.get("format") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(invalid("\"format\" must be a string".into())),
        };
        let mut files = BTreeMap::new();
        match obj.get("files") {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (k, v) in map {
                    let len_bytes = v
                        .get("len_bytes")
                        .and_then(Value::as_u64)
                        .ok_or_else(|| invalid(format!("file {k:?}: missing integer \"len_bytes\"")))?;
                    files.insert(k.clone(), ManifestFile { len_bytes });
                }
            }
            Some(_) => return Err(invalid("\"files\" must be an object".into())),
        }
        let mut tensors = BTreeMap::new();
        for (name, v) in tensors_v {
            let e = v.as_object().ok_or_else(|| invalid(format!("tensor {name:?}: not an object")))?;
            let dtype = e
                .get("dtype")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("tensor {name:?}: missing string \"dtype\"")))?
                .to_owned();
            let shape_v = e
                .get("shape")
                .and_then(Value::as_array)
                .ok_or_else(|| invalid(format!("tensor {name:?}: missing list \"shape\"")))?;
            if shape_v.len() > MANIFEST_RANK_MAX {
                return Err(invalid(format!(
                    "tensor {name:?}: rank {} over the limit of {MANIFEST_RANK_MAX}",
                    shape_v.len()
                )));
            }
            let shape = shape_v
                .iter()
                .map(|d| d.as_u64().ok_or_else(|| invalid(format!("tensor {name:?}: bad dimension {d}"))))
                .collect::<Result<Vec<u64>, _>>()?;
            let hex_str = e
                .get(algo.as_str())
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("tensor {name:?}: missing string {:?}", algo.as_str())))?;
            let digest = Digest::from_hex(algo, hex_str)
                .map_err(|source| ManifestError::BadDigest { tensor: name.clone(), source })?;
            tensors.insert(name.clone(), ManifestTensor { dtype, shape, digest });
        }
        Ok(Manifest { algo, format, files, tensors })
    }

    /// Read and parse a manifest file, refusing one over [`MANIFEST_LEN_BYTES_MAX`] (or growing
    /// past it while read) and anything but a regular file (opening a FIFO would block until a
    /// writer appears), with [`tensora_format::read_capped`].
    pub fn read(path: &Path) -> Result<Manifest, ManifestError> {
        let bytes =
            tensora_format::read_capped(path, MANIFEST_LEN_BYTES_MAX).map_err(|e| read_error(path, e))?;
        Manifest::from_json_slice(&bytes)
            .map_err(|e| ManifestError::InFile { path: path.to_path_buf(), source: Box::new(e) })
    }

    /// Write [`Manifest::to_json`] (pretty, with a final newline) to `path` atomically.
    pub fn write_atomic(&self, path: &Path) -> io::Result<()> {
        let mut text = serde_json::to_vec_pretty(&self.to_json()).map_err(io::Error::other)?;
        text.push(b'\n');
        write_atomic(path, &text)
    }
}

/// A manifest document as read by [`Manifest::from_json_slice`]: only the known keys, each typed.
#[derive(serde::Deserialize)]
struct RawManifest {
    algo: Option<String>,
    format: Option<String>,
    files: Option<BTreeMap<String, RawFile>>,
    tensors: Option<BTreeMap<String, RawTensor>>,
}

#[derive(serde::Deserialize)]
struct RawFile {
    len_bytes: Option<u64>,
}

#[derive(serde::Deserialize)]
struct RawTensor {
    dtype: Option<String>,
    shape: Option<BoundedShape>,
    crc32c: Option<String>,
    xxh3: Option<String>,
    sha256: Option<String>,
}

impl RawTensor {
    fn digest_hex(&self, algo: Algo) -> Option<&str> {
        match algo {
            Algo::Crc32c => self.crc32c.as_deref(),
            Algo::Xxh3 => self.xxh3.as_deref(),
            Algo::Sha256 => self.sha256.as_deref(),
        }
    }
}

/// A shape of at most [`MANIFEST_RANK_MAX`] non-negative integers; a longer one stops the parse at
/// its first extra element.
struct BoundedShape(Vec<u64>);

impl<'de> serde::Deserialize<'de> for BoundedShape {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<BoundedShape, D::Error> {
        struct ShapeVisitor;
        impl<'de> serde::de::Visitor<'de> for ShapeVisitor {
            type Value = BoundedShape;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a list of at most {MANIFEST_RANK_MAX} non-negative integers")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<BoundedShape, A::Error> {
                let mut dims = Vec::new();
                while let Some(d) = seq.next_element::<u64>()? {
                    if dims.len() == MANIFEST_RANK_MAX {
                        return Err(serde::de::Error::custom(format!(
                            "shape rank over the limit of {MANIFEST_RANK_MAX}"
                        )));
                    }
                    dims.push(d);
                }
                Ok(BoundedShape(dims))
            }
        }
        d.deserialize_seq(ShapeVisitor)
    }
}

impl RawManifest {
    fn into_manifest(self) -> Result<Manifest, ManifestError> {
        let invalid = |m: String| ManifestError::Invalid(m);
        let tensors_raw = self.tensors.ok_or_else(|| invalid("missing object \"tensors\"".into()))?;
        let algo = match self.algo {
            Some(s) => s.parse::<Algo>().map_err(|e| invalid(e.to_string()))?,
            None => infer_algo(tensors_raw.values().next().map(|t| |a: Algo| t.digest_hex(a).is_some()))?,
        };
        let files = files_of(self.files)?;
        let mut tensors = BTreeMap::new();
        for (name, t) in tensors_raw {
            let hex_str = t
                .digest_hex(algo)
                .ok_or_else(|| invalid(format!("tensor {name:?}: missing string {:?}", algo.as_str())))?;
            let digest = Digest::from_hex(algo, hex_str)
                .map_err(|source| ManifestError::BadDigest { tensor: name.clone(), source })?;
            let dtype =
                t.dtype.ok_or_else(|| invalid(format!("tensor {name:?}: missing string \"dtype\"")))?;
            let shape = t.shape.ok_or_else(|| invalid(format!("tensor {name:?}: missing list \"shape\"")))?.0;
            tensors.insert(name, ManifestTensor { dtype, shape, digest });
        }
        Ok(Manifest { algo, format: self.format, files, tensors })
    }
}

fn files_of(raw: Option<BTreeMap<String, RawFile>>) -> Result<BTreeMap<String, ManifestFile>, ManifestError> {
    raw.unwrap_or_default()
        .into_iter()
        .map(|(k, f)| match f.len_bytes {
            Some(len_bytes) => Ok((k, ManifestFile { len_bytes })),
            None => Err(ManifestError::Invalid(format!("file {k:?}: missing integer \"len_bytes\""))),
        })
        .collect()
}

/// The algorithm of a document without `"algo"`: the one known digest key of its first tensor
/// (`has_key` says whether that tensor has the key of an algorithm). Without tensors it is
/// [`Algo::default`]. Both manifest readers infer it here.
fn infer_algo(has_key: Option<impl Fn(Algo) -> bool>) -> Result<Algo, ManifestError> {
    let Some(has_key) = has_key else {
        return Ok(Algo::default());
    };
    let keys: Vec<Algo> = Algo::ALL.into_iter().filter(|&a| has_key(a)).collect();
    match keys.as_slice() {
        [one] => Ok(*one),
        [] => Err(ManifestError::Invalid("no \"algo\" and no known digest key in the tensors".into())),
        _ => {
            Err(ManifestError::Invalid("no \"algo\" and several digest keys: name one with \"algo\"".into()))
        }
    }
}

/// A failed [`tensora_format::read_capped`] of a manifest, as a [`ManifestError`].
fn read_error(path: &Path, e: tensora_format::Error) -> ManifestError {
    let path = path.to_path_buf();
    match e.into_kind() {
        ErrorKind::IndexTooLarge { len_bytes, limit_bytes } => {
            ManifestError::TooLarge { path, len_bytes, limit_bytes }
        }
        // A FIFO, a device or a directory is no manifest (refused before it is opened for reading).
        other => ManifestError::Io { path, source: crate::scan::io_error(other) },
    }
}

/// Write `bytes` to `path` atomically with [`tensora_format::write::AtomicFile`]: a temporary
/// file in the same directory, `fsync`, `rename` over `path`, `fsync` of the directory. On any
/// error before the rename the temporary file is removed and `path` is untouched.
///
/// An existing `path` that is not a regular file (a FIFO, a device such as `/dev/null`, a
/// directory) is refused: the rename would replace the node itself.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => {
            // The caller names the path.
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "exists and is not a regular file"));
        }
        _ => {}
    }
    let mut file = tensora_format::write::AtomicFile::create(path)?;
    file.write_all(bytes)?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;
    use proptest::prelude::*;

    fn sample(algo: Algo) -> Manifest {
        let mut tensors = BTreeMap::new();
        tensors.insert(
            "a.weight".to_owned(),
            ManifestTensor { dtype: "F32".into(), shape: vec![2, 3], digest: algo.digest(b"abc") },
        );
        tensors.insert(
            "scalar".to_owned(),
            ManifestTensor { dtype: "BF16".into(), shape: vec![], digest: algo.digest(b"") },
        );
        let mut files = BTreeMap::new();
        files.insert("model.safetensors".to_owned(), ManifestFile { len_bytes: 1234 });
        Manifest { algo, format: Some("safetensors".into()), files, tensors }
    }

    #[test]
    fn round_trips_through_json_for_every_algo() {
        for algo in Algo::ALL {
            let m = sample(algo);
            let text = serde_json::to_vec(&m.to_json()).unwrap();
            assert_eq!(Manifest::from_json_slice(&text).unwrap(), m);
        }
    }

    #[test]
    fn tensors_json_has_exactly_the_agreed_keys() {
        let m = sample(Algo::Sha256);
        let doc = m.tensors_json();
        let mut keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["algo", "tensors"]);
        let entry = &doc["tensors"]["a.weight"];
        let mut keys: Vec<&String> = entry.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["dtype", "sha256", "shape"]);
        assert_eq!(entry["shape"], serde_json::json!([2, 3]));
    }

    #[test]
    fn algo_is_inferred_from_the_digest_key() {
        let doc = serde_json::json!({"tensors": {"x": {"dtype": "F32", "shape": [1],
            "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}}});
        let m = Manifest::from_json_value(&doc).unwrap();
        assert_eq!(m.algo, Algo::Sha256);
        assert!(m.files.is_empty());
        assert_eq!(m.format, None);
    }

    /// Well-formed JSON that is no manifest: both readers refuse each as `Invalid`.
    fn invalid_documents() -> Vec<serde_json::Value> {
        vec![
            serde_json::json!([]),
            serde_json::json!({}),
            serde_json::json!({"algo": "md5", "tensors": {}}),
            serde_json::json!({"algo": 3, "tensors": {}}),
            serde_json::json!({"algo": "crc32c", "tensors": {"x": {"dtype": "F32", "shape": [-1], "crc32c": "00000000"}}}),
            serde_json::json!({"algo": "crc32c", "tensors": {"x": {"dtype": "F32", "shape": [1]}}}),
            serde_json::json!({"algo": "crc32c", "tensors": {"x": {"shape": [1], "crc32c": "00000000"}}}),
            serde_json::json!({"algo": "crc32c", "files": {"f": {}}, "tensors": {}}),
            serde_json::json!({"tensors": {"x": {"dtype": "F32", "shape": [1]}}}),
        ]
    }

    #[test]
    fn rejects_bad_documents_with_typed_errors() {
        for doc in invalid_documents() {
            assert!(matches!(Manifest::from_json_value(&doc), Err(ManifestError::Invalid(_))), "{doc}");
        }
        let doc = serde_json::json!({"algo": "crc32c", "tensors": {"x": {"dtype": "F32", "shape": [1], "crc32c": "0000"}}});
        match Manifest::from_json_value(&doc) {
            Err(ManifestError::BadDigest { tensor, .. }) => assert_eq!(tensor, "x"),
            other => panic!("expected BadDigest, got {other:?}"),
        }
        assert!(matches!(Manifest::from_json_slice(b"{not json"), Err(ManifestError::Json(_))));
    }

    #[test]
    fn the_typed_reader_agrees_with_the_value_reader() {
        let mut cases = invalid_documents();
        cases.push(
            serde_json::json!({"tensors": {"x": {"dtype": "F32", "shape": [1], "crc32c": "00000000", "sha256": "00"}}}),
        );
        for doc in cases {
            let bytes = serde_json::to_vec(&doc).unwrap();
            assert!(matches!(Manifest::from_json_slice(&bytes), Err(ManifestError::Invalid(_))), "{doc}");
            assert!(Manifest::from_json_value(&doc).is_err(), "{doc}");
        }
        let doc =
            br#"{"algo": "crc32c", "tensors": {"x": {"dtype": "F32", "shape": [1], "crc32c": "0000"}}}"#;
        assert!(matches!(Manifest::from_json_slice(doc), Err(ManifestError::BadDigest { .. })));
        let doc = br#"{"extra": {"deep": [[1, 2], {"a": null}]}, "format": null, "tensors": {}}"#;
        let m = Manifest::from_json_slice(doc).unwrap();
        assert_eq!((m.algo, m.format, m.tensors.len()), (Algo::default(), None, 0));
    }

    #[test]
    fn a_huge_shape_stops_the_parse_with_a_typed_error() {
        let dims = vec!["1"; 100_000].join(",");
        let doc =
            format!(r#"{{"tensors": {{"x": {{"dtype": "U8", "shape": [{dims}], "crc32c": "00000000"}}}}}}"#);
        match Manifest::from_json_slice(doc.as_bytes()) {
            Err(ManifestError::Invalid(m)) => assert!(m.contains("rank over the limit"), "{m}"),
            other => panic!("expected Invalid, got {other:?}"),
        }
        let ok = vec!["1"; MANIFEST_RANK_MAX].join(",");
        let doc =
            format!(r#"{{"tensors": {{"x": {{"dtype": "U8", "shape": [{ok}], "crc32c": "00000000"}}}}}}"#);
        assert_eq!(
            Manifest::from_json_slice(doc.as_bytes()).unwrap().tensors["x"].shape.len(),
            MANIFEST_RANK_MAX
        );
    }

    #[cfg(unix)]
    #[test]
    fn write_refuses_to_replace_a_fifo_or_directory() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("m.json");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let err = sample(Algo::Crc32c).write_atomic(&fifo).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        assert_eq!(write_atomic(dir.path(), b"{}").unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[cfg(unix)]
    #[test]
    fn read_refuses_a_fifo_without_opening_it() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("m.json");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        match Manifest::read(&fifo) {
            Err(ManifestError::Io { source, .. }) => assert_eq!(source.kind(), io::ErrorKind::InvalidInput),
            other => panic!("expected Io, got {other:?}"),
        }
    }

    /// A manifest path that is a symlink to a terminal (whose read would block) or to `/dev/zero`
    /// (which would stream up to the cap) is refused before it is opened for reading.
    #[cfg(unix)]
    #[test]
    fn read_refuses_links_to_devices_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        for device in ["/dev/tty", "/dev/zero"] {
            let link = dir.path().join(format!("{}.json", &device[5..]));
            std::os::unix::fs::symlink(device, &link).unwrap();
            match Manifest::read(&link) {
                Err(ManifestError::Io { path, source }) => {
                    assert_eq!(path, link);
                    assert_eq!(source.kind(), io::ErrorKind::InvalidInput);
                    assert_eq!(source.to_string(), "not a regular file (a character device)");
                }
                other => panic!("expected Io, got {other:?}"),
            }
        }
    }

    #[test]
    fn read_refuses_an_oversized_file_without_reading_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.json");
        let f = File::create(&path).unwrap();
        f.set_len(MANIFEST_LEN_BYTES_MAX + 1).unwrap(); // sparse: no data written
        match Manifest::read(&path) {
            Err(ManifestError::TooLarge { len_bytes, .. }) => {
                assert_eq!(len_bytes, MANIFEST_LEN_BYTES_MAX + 1)
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(matches!(Manifest::read(&dir.path().join("missing.json")), Err(ManifestError::Io { .. })));
    }

    /// A file that is not JSON, or not a manifest, or holds a bad digest: the error names the
    /// file, as an unreadable one's does, and says what is wrong.
    #[test]
    fn read_errors_of_the_document_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        let docs: [(&[u8], &str); 3] = [
            (b"{not json", "manifest is not valid JSON"),
            (br#"{"algo": 7, "tensors": {}}"#, "invalid manifest"),
            (br#"{"algo": "crc32c", "tensors": {"x": {"crc32c": "zz"}}}"#, "tensor \"x\""),
        ];
        for (doc, what) in docs {
            std::fs::write(&path, doc).unwrap();
            let err = Manifest::read(&path).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with(&format!("{}: ", path.display())) && text.contains(what), "{text}");
            match err {
                ManifestError::InFile { path: named, source } => {
                    assert_eq!(named, path);
                    assert!(!matches!(*source, ManifestError::InFile { .. }), "{source:?}");
                }
                other => panic!("expected InFile, got {other:?}"),
            }
        }
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        std::fs::write(&path, b"old").unwrap();
        let m = sample(Algo::Crc32c);
        m.write_atomic(&path).unwrap();
        assert_eq!(Manifest::read(&path).unwrap(), m);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from("m.json")]);
        // A path inside a missing directory fails and creates nothing.
        assert!(write_atomic(&dir.path().join("no/such/dir/m.json"), b"x").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_manifest_round_trips(
            entries in proptest::collection::btree_map(
                "[a-z][a-z0-9._]{0,12}",
                (proptest::collection::vec(0u64..1 << 40, 0..5), proptest::collection::vec(any::<u8>(), 0..64)),
                0..8,
            ),
            algo_index in 0usize..3,
            len_bytes in any::<u64>(),
        ) {
            let algo = Algo::ALL[algo_index];
            let tensors = entries
                .into_iter()
                .map(|(name, (shape, data))| {
                    (name, ManifestTensor { dtype: "U8".into(), shape, digest: algo.digest(&data) })
                })
                .collect();
            let mut files = BTreeMap::new();
            files.insert("f".to_owned(), ManifestFile { len_bytes });
            let m = Manifest { algo, format: Some("safetensors".into()), files, tensors };
            let text = serde_json::to_vec_pretty(&m.to_json()).unwrap();
            prop_assert_eq!(Manifest::from_json_slice(&text).unwrap(), m);
        }
    }
}
