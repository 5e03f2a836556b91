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

/// `(name, dim)` of every tensor of the local checkpoint at `path` under `rules` for a group of
/// `world`: the dimension a rank's share narrows, or `None` for a replicated tensor (what
/// `tensora.distributed` reads collectively). Checked as a load would check it.
#[pyfunction]
#[pyo3(signature = (path, world, rules=None))]
pub(crate) fn tp_splits(
    py: Python<'_>,
    path: std::path::PathBuf,
    world: u32,
    rules: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<(String, Option<usize>)>> {
    let Some(Shard::TensorParallel(tp)) = shard(Some((0, world)), rules)? else {
        return Err(PyValueError::new_err("internal: tp= gave no tensor-parallel shard"));
    };
    let ckpt = py.detach(|| tensora_format::open(&path)).map_err(crate::format_err)?;
    let all: Vec<usize> = (0..ckpt.tensors().len()).collect();
    let slices = tp.slices(&ckpt, &all).map_err(|e| crate::exc::LoadError::new_err(e.to_string()))?;
    Ok(ckpt.tensors().iter().zip(slices).map(|(t, s)| (t.name().to_owned(), s.map(|s| s.dim))).collect())
}
