//! Everything that goes through the Tensora crates themselves: tensor names, the ServerlessLLM
//! fixture (via `tensora_convert`), the mmap peer (via `tensora_io::MappedFiles`) and the
//! Tensora load cells.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tensora_convert::{ConvertConfig, TargetFormat};
use tensora_format::Checkpoint;
use tensora_format::Selection;
use tensora_io::MappedFiles;
use tensora_io::{BackendChoice, LoadOptions, Residence, SourceFile};

use crate::bench::AUTO;
use crate::fixtures::{self, Fixture, GENERATOR_VERSION, Manifest, ManifestFile, Size};
use crate::peers;

/// Registered backend names.
pub fn backend_names() -> Vec<&'static str> {
    tensora_io::registry::names().to_vec()
}

/// Open any fixture (safetensors file, sharded directory, ServerlessLLM directory).
pub fn open(path: &Path) -> Result<Checkpoint> {
    let ckpt = if path.is_dir() && path.join("tensor_index.json").is_file() {
        tensora_format::sllm::open_dir(path)
    } else {
        tensora_format::open(path)
    };
    ckpt.with_context(|| format!("open {}", path.display()))
}

/// Make sure the ServerlessLLM conversion of `source` exists under `root` and matches its manifest
/// (kept beside it as `<name>.manifest.json`, since the directory is the converter's output).
pub fn ensure_sllm(root: &Path, source: &Fixture, size: Size, seed: u64) -> Result<Fixture> {
    let name = fixtures::TINYLLAMA_SLLM;
    let dir = root.join(name);
    let manifest_path = root.join(format!("{name}.manifest.json"));
    let existing: Option<Manifest> =
        std::fs::read_to_string(&manifest_path).ok().and_then(|t| serde_json::from_str(&t).ok());
    let reusable = !source.generated
        && existing.as_ref().is_some_and(|m| {
            m.generator_version == GENERATOR_VERSION
                && m.size == size
                && m.seed == seed
                && m.name == name
                && m.files.iter().all(|f| {
                    std::fs::metadata(dir.join(&f.path))
                        .is_ok_and(|md| md.is_file() && md.len() == f.len_bytes)
                })
        });
    if !reusable {
        let _ = std::fs::remove_file(&manifest_path);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("remove stale {}", dir.display()))?;
        }
        let src = open(&source.open_path)?;
        let config = ConvertConfig { to: TargetFormat::ServerlessLlm, ..ConvertConfig::default() };
        tensora_convert::convert(&src, &dir, &config)
            .with_context(|| format!("convert {} to ServerlessLLM", source.open_path.display()))?;
    }
    let ckpt = open(&dir)?;
    let data_files: Vec<PathBuf> = ckpt.files().iter().map(|f| f.path().to_path_buf()).collect();
    if !reusable {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_file() {
                files.push(ManifestFile {
                    path: entry.file_name().to_string_lossy().into_owned(),
                    len_bytes: meta.len(),
                });
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let manifest = Manifest {
            generator_version: GENERATOR_VERSION,
            size,
            seed,
            name: name.to_string(),
            tensors: ckpt.tensors().len() as u64,
            files,
        };
        crate::writer::write_text(&manifest_path, &serde_json::to_string_pretty(&manifest)?)?;
    }
    Ok(Fixture {
        name: name.to_string(),
        open_path: dir.clone(),
        files_len_bytes: ckpt.files().iter().map(|f| f.len_bytes()).sum(),
        data_len_bytes: ckpt.total_tensor_bytes(),
        tensors: ckpt.tensors().len() as u64,
        data_files,
        dir,
        generated: !reusable,
    })
}

fn source_files(paths: &[PathBuf]) -> Result<Vec<SourceFile>> {
    paths
        .iter()
        .map(|p| {
            let buffered = File::open(p).with_context(|| format!("open {}", p.display()))?;
            let len_bytes = buffered.metadata()?.len();
            Ok(SourceFile { path: p.clone(), len_bytes, buffered, direct: None })
        })
        .collect()
}

/// The bench's promise that its fixtures are not modified or truncated while it maps them: it
/// generated them under `target/`, and nothing else writes there while it runs.
#[allow(unsafe_code)]
pub fn fixtures_unchanged() -> tensora_io::FilesUnchanged {
    // SAFETY: as above.
    unsafe { tensora_io::FilesUnchanged::promise() }
}

/// Maps the bench's own fixture files read-only (see [`fixtures_unchanged`]).
#[allow(unsafe_code)]
fn map_fixtures(sources: &[SourceFile]) -> Result<MappedFiles> {
    // SAFETY: the bench's fixtures are not modified or truncated while it runs.
    unsafe { MappedFiles::map(sources) }.context("map fixture files")
}

/// The candle-style peer, one load: map each file (as a user's code would), then
/// `SafeTensors::deserialize` + `to_vec` per selected tensor. Returns the copies.
pub fn peer_mmap_once(
    files: &[PathBuf],
    selected: Option<&HashSet<String>>,
) -> Result<(peers::Loaded, Vec<Vec<u8>>)> {
    let sources = source_files(files)?;
    let mapped = map_fixtures(&sources)?;
    peers::st_to_vec(
        sources.len(),
        |k| {
            let len = sources[k].len_bytes;
            mapped.get(k as u32, 0..len).with_context(|| format!("mapping #{k} is shorter than the file"))
        },
        selected,
    )
}

/// One Tensora cell: which backend, which tensors, owned or streaming.
#[derive(Debug, Clone, Copy)]
pub struct TensoraCell<'a> {
    /// What to open: a file, or a directory of shards.
    pub open_path: &'a Path,
    /// A registered backend name or [`AUTO`].
    pub backend: &'a str,
    /// `None`: every tensor.
    pub selection: Option<&'a [String]>,
    /// Hand out tensors one by one under the streaming budget instead of holding them all.
    pub streaming: bool,
    /// Zero-copy views (`Residence::Mapped`) instead of an owned arena.
    pub mapped: bool,
    /// In-flight (and, streaming, arena) budget of streaming cells.
    pub streaming_budget_bytes: u64,
}

impl TensoraCell<'_> {
    /// The load options of this cell.
    pub fn options(&self) -> LoadOptions {
        let defaults = LoadOptions::default();
        LoadOptions {
            backend: if self.backend == AUTO {
                BackendChoice::Auto
            } else {
                BackendChoice::Named(self.backend.to_string())
            },
            selection: match self.selection {
                None => Selection::All,
                Some(names) => Selection::Names(names.to_vec()),
            },
            budget_bytes: if self.streaming { self.streaming_budget_bytes } else { defaults.budget_bytes },
            residence: if self.mapped { Residence::Mapped(fixtures_unchanged()) } else { Residence::Owned },
            ..defaults
        }
    }
}

/// One timed run of a cell: open and parse the checkpoint, load, and touch one byte per page of
/// every tensor. `held` carries the previous owned result, dropped (unmapped) before the clock
/// starts; this run's result replaces it. Returns (seconds, bytes loaded, the load report).
pub fn run_tensora_once(
    cell: &TensoraCell<'_>,
    opts: &LoadOptions,
    held: &mut Option<tensora_io::Loaded>,
) -> Result<(f64, u64, tensora_io::LoadReport)> {
    drop(held.take());
    let t = std::time::Instant::now();
    let ckpt = open(cell.open_path)?;
    let mut bytes = 0u64;
    let mut checksum = 0u64;
    let report = if cell.streaming {
        tensora_io::load_streaming(&ckpt, opts, |t| {
            bytes += t.bytes().len() as u64;
            checksum = checksum.wrapping_add(peers::touch(t.bytes()));
            Ok(())
        })?
    } else {
        let loaded = tensora_io::load(&ckpt, opts)?;
        for t in loaded.tensors() {
            bytes += t.bytes().len() as u64;
            checksum = checksum.wrapping_add(peers::touch(t.bytes()));
        }
        let report = loaded.report().clone();
        *held = Some(loaded);
        report
    };
    let seconds = t.elapsed().as_secs_f64();
    std::hint::black_box(checksum);
    Ok((seconds, bytes, report))
}

/// Why `backend` cannot run here (`None`: it can, or it is [`AUTO`]); an unknown name is an error.
pub fn backend_unavailable(backend: &str) -> Result<Option<String>> {
    if backend == AUTO {
        return Ok(None);
    }
    let Some(found) = tensora_io::registry::by_name(backend) else {
        anyhow::bail!("no backend named {backend:?}");
    };
    Ok(found.available().err().map(|why| format!("backend unavailable here: {why}")))
}
