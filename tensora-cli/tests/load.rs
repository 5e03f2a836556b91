//! `tensora load` run as a binary on the repository fixtures.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{REAL, SLLM_TINY as SLLM, assert_one_error_line, tensora};

fn tensora_load(args: &[&str]) -> Output {
    tensora(&[&["load"], args].concat())
}

fn report(args: &[&str]) -> serde_json::Value {
    let out = tensora_load(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The report's times and rate agree with each other and with the clock: every phase is
/// non-negative, the phases add up to at most `seconds` (the load's own time), which is at most
/// the `wall_seconds` the process ran, and `gbps` is `bytes_selected / seconds`.
fn assert_times_add_up(v: &serde_json::Value, wall_seconds: f64, args: &[&str]) {
    let seconds = v["seconds"].as_f64().unwrap();
    let phases: Vec<f64> =
        ["open", "parse", "plan", "io", "finish"].iter().map(|p| v["phases"][p].as_f64().unwrap()).collect();
    assert!(phases.iter().all(|&p| p >= 0.0), "{args:?}: {phases:?}");
    let sum: f64 = phases.iter().sum();
    // Rounding only: the sum and `seconds` are the same five numbers added up.
    assert!(sum <= seconds * (1.0 + 1e-9), "{args:?}: phases add up to {sum} s, over seconds = {seconds}");
    assert!(0.0 < seconds && seconds <= wall_seconds, "{args:?}: {seconds} s reported, {wall_seconds} s run");
    let want_gbps = v["bytes_selected"].as_u64().unwrap() as f64 / seconds / 1e9;
    let gbps = v["gbps"].as_f64().unwrap();
    assert!(
        (gbps - want_gbps).abs() <= want_gbps * 1e-9,
        "{args:?}: gbps {gbps}, bytes / seconds {want_gbps}"
    );
}

#[test]
fn json_report_for_every_backend_and_mode() {
    let path = format!("{REAL}/fracast-0.safetensors");
    let tensor_bytes: u64 = {
        let ckpt = tensora_format::open(&path).unwrap();
        ckpt.tensors().iter().map(|t| t.len_bytes()).sum()
    };
    for backend in ["auto", "sync", "mmap", "io-uring", "async"] {
        for extra in [
            &[][..],
            &["--stream", "--budget", "64KiB"][..],
            &["--direct"][..],
            &["--buffered", "--threads", "1"][..],
        ] {
            let mut args = vec![path.as_str(), "--json", "--backend", backend];
            args.extend_from_slice(extra);
            let started = std::time::Instant::now();
            let out = tensora_load(&args);
            let wall_seconds = started.elapsed().as_secs_f64();
            if backend == "io-uring" && !tensora_testkit::io_uring_or_skip("tensora load --backend io-uring")
            {
                // io_uring is unavailable here (and not required): said in one error line.
                assert_one_error_line(&out);
                assert!(String::from_utf8_lossy(&out.stderr).contains("unavailable"));
                continue;
            }
            assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            for key in [
                "backend",
                "reason",
                "bytes_selected",
                "bytes_read",
                "bytes_advised_beyond_reads",
                "seconds",
                "gbps",
                "phases",
                "peak_inflight_bytes",
                "retries",
                "minor_faults",
                "major_faults",
                "peak_rss_bytes",
                "tensors",
            ] {
                assert!(v.get(key).is_some(), "{key} missing in {v}");
            }
            assert_times_add_up(&v, wall_seconds, &args);
            if backend != "auto" {
                assert_eq!(v["backend"], backend);
            }
            assert_eq!(v["bytes_selected"], tensor_bytes);
            assert!(v["bytes_read"].as_u64().unwrap() >= tensor_bytes);
            assert_eq!(v["tensors"], 47);
            let reads_direct = ["sync", "io-uring", "async"].contains(&backend) && extra == ["--direct"];
            if reads_direct && tensora_testkit::direct_io_or_skip(Path::new(&path), "tensora load --direct") {
                assert_eq!(v["io_mode"], "direct", "{args:?}");
                assert_eq!(v["direct_fallbacks"], 0, "{args:?}: every read went direct");
                assert_eq!(v["bytes_advised_beyond_reads"], 0, "{args:?}: no read-ahead around the cache");
            }
            assert!(v["phases"]["parse"].as_f64().unwrap() > 0.0);
        }
    }
}

#[test]
fn selection_mapped_and_sllm() {
    let v = report(&[SLLM, "--json", "--select", "layers.0.*", "--select", "embed.weight"]);
    let ckpt = tensora_format::open(SLLM).unwrap();
    let want = ckpt
        .tensors()
        .iter()
        .filter(|t| t.name().starts_with("layers.0.") || t.name() == "embed.weight")
        .count();
    assert_eq!(v["tensors"], want);
    assert!(want < ckpt.tensors().len());
    let v = report(&[SLLM, "--json", "--mapped"]);
    assert_eq!(v["backend"], "mmap");
    assert_eq!(v["io_mode"], "mapped");
    assert_eq!(v["tensors"], ckpt.tensors().len());
}

#[test]
fn text_output_names_backend_and_reason() {
    let out = tensora_load(&[&format!("{REAL}/fracast-0.int8.safetensors")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("backend "), "{text}");
    assert!(text.contains("reason ") && text.contains("phases ") && text.contains("GB/s"), "{text}");
}

#[test]
fn errors_exit_1_with_one_error_line() {
    assert_one_error_line(&tensora_load(&["/nonexistent/model.safetensors"]));
    let path = format!("{REAL}/fracast-0.safetensors");
    assert_one_error_line(&tensora_load(&[&path, "--select", "no.such.*"]));
    // Usage errors come from clap: exit 1, starting with `error:`.
    for args in [&["--backend", "floppy"][..], &["--budget", "lots"][..], &["--direct", "--buffered"][..]] {
        let mut all = vec![path.as_str()];
        all.extend_from_slice(args);
        let out = tensora_load(&all);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("error:"), "{args:?}");
    }
}

/// `tensora SUBCOMMAND ARGS...` with stdout and stderr captured.
/// Exactly one stderr line starting `error: `, in which no `": "`-separated part is repeated.
fn assert_one_plain_error_line(out: &Output, what: &str) -> String {
    assert_eq!(out.status.code(), Some(1), "{what}");
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
    let line = stderr.trim_end().to_owned();
    let body = line.strip_prefix("error: ").unwrap_or_else(|| panic!("{what}: {line}"));
    assert!(!body.starts_with("error"), "{what}: {line}");
    let parts: Vec<&str> = body.split(": ").collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(!parts[i + 1..].contains(p), "{what}: {p:?} repeated in {line}");
    }
    line
}

#[test]
fn every_subcommand_reports_a_missing_path_and_a_bad_flag_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("out");
    let dst = dst.to_str().unwrap();
    let missing = "/nonexistent/model.safetensors";
    let runs: [(&str, Vec<&str>); 5] = [
        ("inspect", vec![missing]),
        ("load", vec![missing]),
        ("convert", vec![missing, dst, "--to", "serverlessllm"]),
        ("hash", vec![missing]),
        ("verify", vec![missing]),
    ];
    for (sub, rest) in &runs {
        let mut args = vec![*sub];
        args.extend_from_slice(rest);
        let line = assert_one_plain_error_line(&tensora(&args), &format!("{args:?}"));
        assert!(line.contains(missing), "{line}");
        assert_eq!(
            line.matches("No such file").count() + line.matches("verification failed").count(),
            1,
            "{line}"
        );

        let mut args = vec![*sub, "--no-such-flag"];
        args.extend_from_slice(rest);
        let line = assert_one_plain_error_line(&tensora(&args), &format!("{args:?}"));
        assert!(line.contains("--no-such-flag"), "{line}");
    }
    // Not an error: help and version go to stdout, exit 0.
    let out = tensora(&["load", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1024-based"));
    assert!(out.stderr.is_empty());
}

#[test]
fn budget_units_are_the_shared_ones_and_zero_is_refused() {
    let path = format!("{REAL}/fracast-0.safetensors");
    let r = report(&[&path, "--json", "--stream", "--budget", "64K"]);
    assert!(r["peak_inflight_bytes"].as_u64().unwrap() <= 64_000, "{r}");
    for bad in ["0", "0MiB", "64Q"] {
        let line = assert_one_plain_error_line(&tensora_load(&[&path, "--budget", bad]), bad);
        assert!(line.contains("--budget"), "{line}");
    }
}

#[test]
fn a_reader_that_leaves_early_is_not_an_error() {
    let path = format!("{REAL}/fracast-0.safetensors");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensora"))
        .args(["load", "--json", &path])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before the report is written
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn manifest_verifies_every_tensor_and_names_the_one_that_does_not_match() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::copy(format!("{REAL}/fracast-0.int8.safetensors"), &path).unwrap();
    let manifest = dir.path().join("model.manifest.json");
    let (p, m) = (path.to_str().unwrap(), manifest.to_str().unwrap());
    let out = tensora(&["hash", p, "--write-manifest", m]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let modes: [&[&str]; 3] = [&[], &["--stream", "--budget", "16KiB"], &["--mapped"]];
    for extra in modes {
        let mut args = vec![p, "--json", "--manifest", m];
        args.extend_from_slice(extra);
        let v = report(&args);
        assert!(v["tensors"].as_u64().unwrap() > 0, "{extra:?}");
    }

    // One byte flipped inside the last tensor: every mode stops and names it.
    let ckpt = tensora_format::open(&path).unwrap();
    let t = ckpt.tensors().iter().max_by_key(|t| t.offset_bytes()).unwrap().clone();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(t.offset_bytes() + t.nbytes() / 2) as usize] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    for extra in modes {
        let mut args = vec![p, "--manifest", m];
        args.extend_from_slice(extra);
        let out = tensora_load(&args);
        assert_eq!(out.status.code(), Some(1), "{extra:?}");
        let line = assert_one_error_line(&out);
        for want in [t.name().to_owned(), p.to_owned(), format!("offset {}", t.offset_bytes())] {
            assert!(line.contains(&want), "{extra:?}: {want:?} not in {line}");
        }
    }

    // A manifest that lacks a tensor is refused before loading.
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    doc["tensors"].as_object_mut().unwrap().remove(t.name());
    std::fs::write(&manifest, doc.to_string()).unwrap();
    let out = tensora_load(&[p, "--manifest", m]);
    assert_eq!(out.status.code(), Some(1));
    assert!(assert_one_error_line(&out).contains("is not in the manifest"));
}

#[test]
fn lazy_index_parses_only_the_shards_holding_the_selection_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(format!("{REAL}/fracast-0.safetensors"), dir.path().join("a.safetensors")).unwrap();
    // A second shard that is not a safetensors file at all: a strict open refuses the checkpoint.
    std::fs::write(dir.path().join("b.safetensors"), b"not a header").unwrap();
    let listing = tensora(&["inspect", "--json", &format!("{REAL}/fracast-0.safetensors")]);
    let names: Vec<String> = serde_json::from_slice::<serde_json::Value>(&listing.stdout).unwrap()["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    let mut weight_map = serde_json::Map::new();
    for n in &names {
        weight_map.insert(n.clone(), "a.safetensors".into());
    }
    weight_map.insert("extra.weight".into(), "b.safetensors".into());
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let path = dir.path().to_str().unwrap();
    let pick = names[0].as_str();

    let strict = tensora_load(&[path, "--select", pick, "--json"]);
    assert!(assert_one_error_line(&strict).contains("b.safetensors"));
    let lazy = report(&[path, "--select", pick, "--lazy-index", "--json"]);
    assert_eq!(lazy["tensors"], 1);
    let warnings = lazy["warnings"].as_array().unwrap();
    assert!(warnings.iter().any(|w| w.as_str().unwrap().contains("lazy")), "{warnings:?}");
    // Without a selection there is nothing to be lazy about: the flag needs --select.
    let bare = tensora_load(&[path, "--lazy-index"]);
    assert!(!bare.status.success());
}

#[test]
fn dtype_casts_every_float_tensor_and_reports_them() {
    let path = format!("{REAL}/fracast-0.safetensors");
    let ckpt = tensora_format::open(&path).unwrap();
    for (dtype, to) in [("bf16", "BF16"), ("f32", "F32")] {
        let r = report(&[&path, "--json", "--dtype", dtype]);
        let cast = &r["cast"];
        assert_eq!(cast["to"], to, "{r}");
        let mut names: Vec<&str> =
            cast["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        names.sort_unstable();
        let mut want: Vec<&str> = ckpt
            .tensors()
            .iter()
            .filter(|t| {
                let d = t.dtype().as_str();
                ["F32", "BF16", "F16", "F8_E4M3", "F8_E5M2"].contains(&d) && d != to
            })
            .map(|t| t.name())
            .collect();
        want.sort_unstable();
        assert_eq!(names, want, "{dtype}");
        assert_eq!(r["residence"], "owned");
        let text = String::from_utf8(tensora_load(&[&path, "--dtype", dtype]).stdout).unwrap();
        assert!(text.contains(&format!("cast         {} tensor(s) to {to}", want.len())), "{text}");
        let mapped = report(&[&path, "--json", "--dtype", dtype, "--mapped"]);
        assert_eq!(mapped["cast"]["tensors"], r["cast"]["tensors"]);
        assert!(mapped["reason"].as_str().unwrap().contains("straight from views of the files"), "{mapped}");
    }
    let line = assert_one_plain_error_line(&tensora_load(&[&path, "--dtype", "f64"]), "f64");
    assert!(line.contains("bf16, f16, f32"), "{line}");
}
