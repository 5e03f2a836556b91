//! `tp=(rank, world)` and `rules=` of `load_file` and `weights_iterator` as a
//! [`tensora_format::Shard`]: policy (presets, splits) lives in `tensora_format::tp`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tensora_format::{Shard, Split, TensorParallel, TpRules};

/// `rules=`: a preset name (`"llama"`, `"qwen"`, `"mixtral"`, `"deepseek"`; `None` is
/// `"llama"`), or a list of `(glob, split)` pairs, first match wins, where split is `"column"`
/// or 0, `"row"` or 1, `"replicated"` or `None`.
fn rules(rules: Option<&Bound<'_, PyAny>>) -> PyResult<TpRules> {
    let preset = |name: &str| {
        TpRules::preset(name).ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown rules preset {name:?}; expected one of {:?} or a list of (pattern, split)",
                TpRules::preset_names()
            ))
        })
    };
    let Some(r) = rules.filter(|r| !r.is_none()) else { return preset("llama") };
    if let Ok(name) = r.extract::<String>() {
        return preset(&name);
    }
    let pairs: Vec<(String, Bound<'_, PyAny>)> = r.extract().map_err(|_| {
        PyValueError::new_err("rules must be a preset name or a list of (pattern, split) pairs")
    })?;
    let mut out = Vec::with_capacity(pairs.len());
    for (pattern, split) in pairs {
        out.push((pattern, split_of(&split)?));
    }
    TpRules::new(out).map_err(|e| crate::exc::SelectionError::new_err(e.to_string()))
}

fn split_of(split: &Bound<'_, PyAny>) -> PyResult<Split> {
    if split.is_none() {
        return Ok(Split::Replicated);
    }
    if let Ok(dim) = split.extract::<u32>() {
        return match dim {
            0 => Ok(Split::Column),
            1 => Ok(Split::Row),
            _ => Err(PyValueError::new_err(format!("split dimension {dim}: expected 0 (column) or 1 (row)"))),
        };
    }
    match split.extract::<String>()?.as_str() {
        "column" => Ok(Split::Column),
        "row" => Ok(Split::Row),
        "replicated" => Ok(Split::Replicated),
        other => Err(PyValueError::new_err(format!(
            "split {other:?}: expected \"column\" (0), \"row\" (1) or \"replicated\" (None)"
        ))),
    }
}

/// The shard of `tp=` and `rules=`, or `None` without `tp`; `rules` without `tp` is an error.
pub(crate) fn shard(tp: Option<(u32, u32)>, rules_arg: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Shard>> {
    let Some((rank, world)) = tp else {
        if rules_arg.is_some_and(|r| !r.is_none()) {
            return Err(PyValueError::new_err("rules= applies only with tp=(rank, world)"));
        }
        return Ok(None);
    };
    if world == 0 || rank >= world {
        return Err(PyValueError::new_err(format!(
            "tp=({rank}, {world}): the rank must be below the world size, which must be at least 1"
        )));
    }
    Ok(Some(Shard::TensorParallel(TensorParallel { rank, world, rules: rules(rules_arg)? })))
}

/// What [`TpSource::reads`] returns: the files, then the tensors.
type TpReads = (Vec<crate::share::PlanTuple>, Vec<TpRead>);

/// One tensor of [`TpSource::reads`]: name, dtype, shape, the dimension this rank's share narrows
/// (`None`: replicated), how the rank's sharded load would read it (`"contiguous"`, `"strided"`
/// or `"covering"`) and the whole tensor's bytes.
type TpRead = (String, String, Vec<u64>, Option<usize>, &'static str, u64);

/// A checkpoint opened once for `tensora.distributed.load_tp` (local, or a URL reached with
/// `remote`, a dict of `tensora.RemoteOptions`' fields): the rank's reads are planned from it
/// ([`TpSource::reads`]) and every part of the load (the rank's own slices, each window of the
/// group split's rows) is loaded from it ([`TpSource::load`]), its headers parsed once.
#[pyclass(module = "tensora._native", frozen)]
pub(crate) struct TpSource {
    source: crate::export::Source,
}

#[pymethods]
impl TpSource {
    #[new]
    #[pyo3(signature = (path, remote=None))]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        remote: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<Self> {
        Ok(TpSource { source: crate::export::Source::open(py, &path, remote)? })
    }

    /// What `load_tp` decides from before any tensor is read: the identity of every file of the
    /// checkpoint (the plan tuples the group's load agrees on), and every tensor as rank `rank`
    /// of `world` under `rules` sees it: how `load_file(path, tp=(rank, world), rules=rules,
    /// backend=backend)` would read it, decided by the load's own session
    /// (`tensora_io::shard_reads`).
    #[pyo3(signature = (rank, world, rules=None, backend="auto"))]
    fn reads(
        &self,
        py: Python<'_>,
        rank: u32,
        world: u32,
        rules: Option<&Bound<'_, PyAny>>,
        backend: &str,
    ) -> PyResult<TpReads> {
        let opts = tensora_io::LoadOptions {
            shard: shard(Some((rank, world)), rules)?,
            backend: crate::backend(backend)?,
            ..tensora_io::LoadOptions::default()
        };
        let (files, reads) = match &self.source {
            crate::export::Source::Remote { ckpt, .. } => {
                let reads = py.detach(|| ckpt.shard_reads(&opts)).map_err(crate::remote::remote_err)?;
                (crate::share::plan_files_remote(ckpt), reads)
            }
            crate::export::Source::Local { ckpt, .. } => {
                let reads = py.detach(|| tensora_io::shard_reads(ckpt, &opts)).map_err(crate::load_err)?;
                (crate::share::plan_files_local(ckpt), reads)
            }
        };
        let ckpt = self.source.checkpoint();
        let described = reads
            .into_iter()
            .map(|r| {
                let t = &ckpt.tensors()[r.tensor];
                let dim = r.slice.map(|s| s.dim);
                (
                    t.name().to_owned(),
                    t.dtype().to_string(),
                    t.shape().to_vec(),
                    dim,
                    r.kind.as_str(),
                    t.len_bytes(),
                )
            })
            .collect();
        Ok((files, described))
    }

    /// `load_file(path, select=select, backend=backend, tp=(rank, world), rules=rules)` from the
    /// open checkpoint: `({name: TensorData}, report_json)`, the report's parse 0 (done once, at
    /// the open).
    #[pyo3(signature = (select, rank, world, rules=None, backend="auto"))]
    fn load<'py>(
        &self,
        py: Python<'py>,
        select: &Bound<'py, PyAny>,
        rank: u32,
        world: u32,
        rules: Option<&Bound<'py, PyAny>>,
        backend: &str,
    ) -> PyResult<(Bound<'py, pyo3::types::PyDict>, String)> {
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let opts = tensora_io::LoadOptions {
            shard: shard(Some((rank, world)), rules)?,
            backend: crate::backend(backend)?,
            selection: crate::selection(Some(select))?,
            cancel: Some(std::sync::Arc::clone(&cancel)),
            ..tensora_io::LoadOptions::default()
        };
        self.source.load(py, opts, None, &cancel, None, crate::export::ParsePhase::Earlier)
    }
}
