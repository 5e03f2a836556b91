//! `tensora load --tp` and `tensora inspect --tp` run as a binary on a small Llama-shaped
//! checkpoint written here: each rank's share is `torch.chunk` of every split tensor (the shares
//! tile the tensors), the load's report and the inspect table agree with the shapes, and every bad
//! spelling or conflicting flag is one usage error naming the flag.

mod common;

use std::path::Path;

use common::{assert_one_error_line, llama_specs, tensora, write_llama};

fn ok_json(args: &[&str]) -> serde_json::Value {
    let out = tensora(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The Llama preset's split of each of [`llama_specs`]'s names, written out here: `Some(dim)` or
/// replicated.
fn split_dim(name: &str) -> Option<usize> {
    let row = ["o_proj.weight", "down_proj.weight"];
    let column = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight"];
    if row.iter().any(|s| name.ends_with(s)) {
        Some(1)
    } else if column.iter().any(|s| name.ends_with(s))
        || name.ends_with("embed_tokens.weight")
        || name == "lm_head.weight"
    {
        Some(0)
    } else {
        None
    }
}

/// `rank`'s shape of `shape` split along `dim` among `world`, as `torch.chunk`: ceil(size/world)
/// each, the last ranks fewer.
fn chunked(shape: &[u64], dim: Option<usize>, rank: u64, world: u64) -> Vec<u64> {
    let mut out = shape.to_vec();
    if let Some(d) = dim {
        let per = shape[d].div_ceil(world);
        let start = (per * rank).min(shape[d]);
        out[d] = per.min(shape[d] - start);
    }
    out
}

/// The bytes `rank` of `world` selects, from the shapes alone.
fn share_bytes(rank: u64, world: u64) -> u64 {
    llama_specs()
        .iter()
        .map(|s| {
            let shape = chunked(&s.shape, split_dim(&s.name), rank, world);
            shape.iter().product::<u64>() * u64::from(s.dtype.bits()) / 8
        })
        .sum()
}

fn checkpoint() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    // Shards and an index: the --lazy-index path too.
    write_llama(dir.path(), 1 << 20);
    assert!(dir.path().join("model.safetensors.index.json").exists());
    let path = dir.path().to_str().unwrap().to_owned();
    (dir, path)
}

/// A regular file of the checkpoint in `dir`, for the O_DIRECT probe (which opens a file, not a
/// directory).
fn probe_file(dir: &Path) -> std::path::PathBuf {
    dir.join("model.safetensors.index.json")
}

/// TP=2 and TP=3 (uneven): each rank's `bytes_selected` is its share of the shapes, the slice
/// counts cover every tensor, and the ranks' shapes (from `inspect --tp`) tile every split tensor
/// along its dimension; a replicated tensor is whole on every rank.
#[test]
fn each_rank_loads_its_chunk_and_the_ranks_tile_the_tensors() {
    let (_dir, path) = checkpoint();
    let specs = llama_specs();
    let whole: u64 = specs.iter().map(|s| s.nbytes().unwrap()).sum();
    let replicated: u64 =
        specs.iter().filter(|s| split_dim(&s.name).is_none()).map(|s| s.nbytes().unwrap()).sum();
    for world in [2u64, 3] {
        let mut selected_sum = 0;
        let mut split_len_sum = vec![0u64; specs.len()];
        for rank in 0..world {
            let tp = format!("{rank}/{world}");
            let load = ok_json(&["load", &path, "--tp", &tp, "--json"]);
            assert_eq!(load["bytes_selected"], share_bytes(rank, world), "{tp}: {load}");
            assert_eq!(load["tensors"], specs.len());
            let s = &load["slices"];
            let counted =
                ["contiguous", "strided", "covering"].map(|k| s[k].as_u64().unwrap()).iter().sum::<u64>();
            assert_eq!(counted, specs.len() as u64, "{tp}: {s}");
            assert!(load["bytes_read"].as_u64().unwrap() >= share_bytes(rank, world), "{tp}: {load}");
            selected_sum += load["bytes_selected"].as_u64().unwrap();

            let inspect = ok_json(&["inspect", &path, "--tp", &tp, "--json"]);
            assert_eq!(inspect["bytes_selected"], load["bytes_selected"], "{tp}");
            assert_eq!(inspect["tp"], serde_json::json!({ "rank": rank, "world": world, "rules": "llama" }));
            let rows = inspect["tensors"].as_array().unwrap();
            assert_eq!(rows.len(), specs.len());
            let row_bytes: u64 = rows.iter().map(|r| r["bytes_selected"].as_u64().unwrap()).sum();
            assert_eq!(row_bytes, share_bytes(rank, world), "{tp}: the rows add up to the total");
            for (i, spec) in specs.iter().enumerate() {
                let row = rows.iter().find(|r| r["name"] == spec.name.as_str()).unwrap();
                let dim = split_dim(&spec.name);
                assert_eq!(row["split_dim"], serde_json::json!(dim), "{tp} {}", spec.name);
                let shape: Vec<u64> = serde_json::from_value(row["shape"].clone()).unwrap();
                assert_eq!(shape, chunked(&spec.shape, dim, rank, world), "{tp} {}", spec.name);
                match dim {
                    Some(d) => {
                        // Rank r's part starts where the ranks before it end.
                        assert_eq!(row["start"], split_len_sum[i], "{tp} {}", spec.name);
                        split_len_sum[i] += shape[d];
                    }
                    None => {
                        assert_eq!(shape, spec.shape);
                        assert_eq!(row["start"], serde_json::Value::Null);
                    }
                }
            }
        }
        for (i, spec) in specs.iter().enumerate() {
            if let Some(d) = split_dim(&spec.name) {
                assert_eq!(split_len_sum[i], spec.shape[d], "world {world}: {} tiled", spec.name);
            }
        }
        // The split tensors once, the replicated ones on every rank.
        assert_eq!(selected_sum, whole + replicated * (world - 1), "world {world}");
    }
}

/// `inspect --tp --json` lists every tensor with a kind, before loading: the counts equal the
/// load's (the same decision: `tensora_io::shard_reads`), and each row's `bytes_read` is at
/// least its bytes. The text table names the share, the kinds and the totals.
#[test]
fn inspect_shows_how_each_tensor_of_the_share_would_be_read() {
    let (_dir, path) = checkpoint();
    let v = ok_json(&["inspect", &path, "--tp", "1/2", "--rules", "qwen", "--json"]);
    assert_eq!(v["tp"]["rules"], "qwen");
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "bytes_read",
            "bytes_selected",
            "format",
            "path",
            "read_per_selected",
            "slices",
            "tensors",
            "tp",
            "warnings"
        ]
    );
    let mut read = 0;
    for row in v["tensors"].as_array().unwrap() {
        let kind = row["kind"].as_str().unwrap();
        assert!(["contiguous", "strided", "covering"].contains(&kind), "{row}");
        assert!(row["bytes_read"].as_u64().unwrap() >= row["bytes_selected"].as_u64().unwrap(), "{row}");
        read += row["bytes_read"].as_u64().unwrap();
        if row["split_dim"].is_null() || row["split_dim"] == 0 {
            assert_eq!(kind, "contiguous", "{row}: one range of the file");
        }
    }
    assert_eq!(v["bytes_read"], read);
    let ratio = v["read_per_selected"].as_f64().unwrap();
    assert!((ratio - read as f64 / v["bytes_selected"].as_f64().unwrap()).abs() < 1e-12);
    let load = ok_json(&["load", &path, "--tp", "1/2", "--rules", "qwen", "--json"]);
    assert_eq!(load["slices"], v["slices"], "inspect decides as the load does");
    assert_eq!(load["bytes_selected"], v["bytes_selected"]);

    // Decided as the load with the same I/O mode decides: around the page cache a request
    // costs more, so fewer slices are read row by row (where O_DIRECT works here).
    let mut strided = Vec::new();
    for mode in ["--buffered", "--direct"] {
        let plan = ok_json(&["inspect", &path, "--tp", "1/2", mode, "--json"]);
        let load = ok_json(&["load", &path, "--tp", "1/2", mode, "--json"]);
        assert_eq!(plan["slices"], load["slices"], "{mode}");
        strided.push(plan["slices"]["strided"].as_u64().unwrap());
    }
    assert!(strided[1] <= strided[0], "{strided:?}");
    if tensora_testkit::direct_io_or_skip(&probe_file(Path::new(&path)), "tensora inspect --tp --direct") {
        assert!(
            strided[1] < strided[0],
            "down_proj's 3 KiB gaps are read through with O_DIRECT: {strided:?}"
        );
    }

    let out = tensora(&["inspect", &path, "--tp", "1/2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "share:   rank 1 of 2, llama rules",
        "SPLIT",
        "READ AS",
        "replicated",
        &format!("tensors: {} (", llama_specs().len()),
        &format!("bytes:   {} selected, ", share_bytes(1, 2)),
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    // A local file is read through the page cache (`auto` keeps a small one cached): its 3 KiB
    // gaps between down_proj's rows cost more than a request, so its share is read strided.
    let down = text.lines().find(|l| l.starts_with("model.layers.1.mlp.down_proj.weight ")).unwrap();
    let columns: Vec<&str> = down.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(
        columns[..5],
        ["model.layers.1.mlp.down_proj.weight", "F16", "dim 1", "[64, 1536]", "strided"],
        "{down}"
    );
    assert_eq!(columns[5], (64 * 1536 * 2).to_string(), "{down}");
}

/// The human report of `load --tp` names the share, how many slices were read each way, and the
/// bytes read against the selected.
#[test]
fn the_text_report_names_the_share_and_its_slices() {
    let (_dir, path) = checkpoint();
    let out = tensora(&["load", &path, "--tp", "0/2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("share        rank 0 of 2, llama rules\n"), "{text}");
    let slices = text.lines().find(|l| l.starts_with("slices       ")).unwrap_or_else(|| panic!("{text}"));
    assert!(
        slices.contains(" contiguous, ") && slices.contains(" strided, ") && slices.contains(" covering"),
        "{slices}"
    );
    let bytes = format!("bytes        {} selected, ", share_bytes(0, 2));
    let line = text.lines().find(|l| l.starts_with(&bytes)).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("x the selected)"), "{line}");
    // Without --tp neither line.
    let out = tensora(&["load", &path]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.contains("share ") && !text.contains("slices ") && !text.contains("x the selected"),
        "{text}"
    );
}

/// Every flag `--tp` works with gives the same share: the backends, buffered and direct, a
/// selection and a lazy index (only the shards holding a selected tensor are parsed).
#[test]
fn the_share_is_the_same_through_every_allowed_flag() {
    let (dir, path) = checkpoint();
    let want = share_bytes(0, 2);
    for extra in [
        &["--backend", "sync"][..],
        &["--backend", "mmap"][..],
        &["--backend", "async"][..],
        &["--backend", "io-uring"][..],
        &["--direct"][..],
        &["--buffered", "--threads", "1"][..],
        &["--budget", "64KiB", "--chunk", "4KiB"][..],
    ] {
        let mut args = vec!["load", path.as_str(), "--tp", "0/2", "--json"];
        args.extend_from_slice(extra);
        let out = tensora(&args);
        if extra.contains(&"io-uring")
            && !tensora_testkit::io_uring_or_skip("tensora load --tp --backend io-uring")
        {
            assert!(assert_one_error_line(&out).contains("unavailable"));
            continue;
        }
        if extra.contains(&"--direct")
            && !tensora_testkit::direct_io_or_skip(&probe_file(dir.path()), "tensora load --tp --direct")
        {
            continue;
        }
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["bytes_selected"], want, "{args:?}");
    }
    let glob = "model.layers.1.*";
    let layer1: u64 = llama_specs()
        .iter()
        .filter(|s| s.name.starts_with("model.layers.1."))
        .map(|s| {
            chunked(&s.shape, split_dim(&s.name), 0, 2).iter().product::<u64>() * u64::from(s.dtype.bits())
                / 8
        })
        .sum();
    for extra in [&[][..], &["--lazy-index"][..]] {
        let mut args = vec!["load", path.as_str(), "--tp", "0/2", "--json", "--select", glob];
        args.extend_from_slice(extra);
        let v = ok_json(&args);
        assert_eq!(v["bytes_selected"], layer1, "{args:?}");
        assert_eq!(v["tensors"], 9, "{args:?}");
    }
}

/// Every bad `--tp` spelling, `--rules` without `--tp` or with an unknown preset, and each flag
/// a share cannot go with: one usage error line naming the flag, for `load` and `inspect`
/// (the tool's usage errors exit 1, as every other error).
#[test]
fn bad_tp_spellings_and_conflicting_flags_are_usage_errors() {
    let (_dir, path) = checkpoint();
    let path = path.as_str();
    for command in ["load", "inspect"] {
        for bad in [
            "0/0",
            "3/2",
            "2/2",
            "x/2",
            "1/",
            "/2",
            "2",
            "",
            "+1/2",
            "-1/2",
            "1/2/3",
            "0/99999999999999999999",
        ] {
            let line = assert_one_error_line(&tensora(&[command, path, "--tp", bad]));
            assert!(line.contains("'--tp <RANK/WORLD>'"), "{command} --tp {bad:?}: {line}");
        }
        let line = assert_one_error_line(&tensora(&[command, path, "--rules", "llama"]));
        assert!(line.contains("--tp"), "{command}: {line}");
        let line = assert_one_error_line(&tensora(&[command, path, "--direct", "--buffered", "--tp", "0/2"]));
        assert!(line.contains("--direct") && line.contains("--buffered"), "{command}: {line}");
        let line = assert_one_error_line(&tensora(&["inspect", path, "--direct"]));
        assert!(line.contains("--tp"), "{command}: {line}");
        let line = assert_one_error_line(&tensora(&[command, path, "--tp", "0/2", "--rules", "gpt9"]));
        assert!(line.contains("--rules") && line.contains("deepseek"), "{command}: {line}");
    }
    let manifest = Path::new(path).join("m.json");
    let manifest = manifest.to_str().unwrap();
    for flag in [&["--stream"][..], &["--mapped"][..], &["--dtype", "f32"][..], &["--manifest", manifest][..]]
    {
        let mut args = vec!["load", path, "--tp", "0/2"];
        args.extend_from_slice(flag);
        let line = assert_one_error_line(&tensora(&args));
        assert!(line.contains("--tp") && line.contains(flag[0]), "{args:?}: {line}");
    }
}
