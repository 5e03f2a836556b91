//! The whole measuring pipeline on a real checkpoint from the repository fixtures (`fixtures/`):
//! rooflines, every backend, the peers (the Python ones in the venv `cargo xtask provision`
//! fills), both situations, each sample in a child process, and the three report files.

use std::path::{Path, PathBuf};

use tensora_bench::{BenchConfig, PlanKind, Prepared};
use tensora_bench::{Fixture, Size};
use tensora_bench::{Kind, Machine, Scope, Situation, Status};

const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.safetensors");

fn real_fixture() -> Fixture {
    let path = PathBuf::from(REAL);
    let ckpt = tensora_format::open(&path).unwrap();
    Fixture {
        name: "tinyllama".to_string(),
        dir: path.parent().unwrap().to_path_buf(),
        open_path: path.clone(),
        data_files: vec![path.clone()],
        tensors: ckpt.tensors().len() as u64,
        data_len_bytes: ckpt.total_tensor_bytes(),
        files_len_bytes: std::fs::metadata(&path).unwrap().len(),
        generated: false,
    }
}

#[test]
fn every_cell_runs_on_a_real_checkpoint_and_reports_are_written() {
    let out = tempfile::tempdir().unwrap();
    // Warm only: a cold run would drop the page cache of the whole machine.
    let config = BenchConfig {
        out_dir: out.path().to_path_buf(),
        size: Size::Small,
        runs: 1,
        pair_runs: 1,
        cold: false,
        plan: PlanKind::Full,
        seed: 1,
        child_exe: PathBuf::from(env!("CARGO_BIN_EXE_tensora-bench")),
        memory: tensora_bench::MemoryState::Relay,
    };
    // The Python peers run in the provisioned venv (`cargo xtask test` provisions it first), so no
    // Python peer may be skipped.
    let script_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-python");
    let mut lines = Vec::new();
    let python = tensora_bench::prepare_python(&script_dir, &mut |l| lines.push(l.to_string())).unwrap();
    let fixture = real_fixture();
    let (cells, drop) =
        tensora_bench::measure_fixtures(&config, std::slice::from_ref(&fixture), &python, &mut |l| {
            lines.push(l.to_string())
        })
        .unwrap();
    assert!(drop.is_none());
    for c in &cells {
        match c.status {
            Status::Ok => {
                assert_eq!(c.samples.len(), 1, "{}", c.subject);
                let expected = match (c.kind, c.scope) {
                    (Kind::Roofline, _) => fixture.files_len_bytes,
                    (_, Scope::Full) => fixture.data_len_bytes,
                    _ => c.samples[0].bytes,
                };
                assert!(c.samples.iter().all(|s| s.bytes == expected && s.seconds > 0.0), "{c:?}");
                // Every warm sample ran in a child process, its start timed apart.
                assert!(c.samples.iter().all(|s| s.start_seconds.is_some_and(|t| t > 0.0)), "{c:?}");
                assert!(c.gbps.is_some());
            }
            Status::Skipped => {
                // Only a backend this machine lacks may be skipped, and it says why; every peer is
                // provisioned.
                let reason = c.reason.as_deref().unwrap_or("");
                assert_eq!(c.kind, Kind::Backend, "{} skipped, but it is provisioned: {reason}", c.subject);
                assert!(reason.starts_with("backend unavailable here"), "{}: {reason}", c.subject);
            }
            Status::Failed => panic!("{} failed: {:?}", c.subject, c.reason),
        }
    }
    // Every Python peer was measured, in both situations.
    for p in &tensora_bench::PEERS {
        for situation in [Situation::FirstLoad, Situation::RepeatLoad] {
            let measured = cells
                .iter()
                .any(|c| c.subject == p.name && c.situation == situation && c.status == Status::Ok);
            assert!(measured, "{} {situation:?}", p.name);
        }
    }
    // Every registered backend and auto loaded the checkpoint.
    for name in tensora_io::registry::names().iter().chain(&["auto"]) {
        assert!(cells.iter().any(|c| c.subject == *name && c.status != Status::Failed), "{name}");
    }
    let auto_b = cells.iter().find(|c| c.subject == "auto" && c.situation == Situation::RepeatLoad).unwrap();
    assert_eq!(auto_b.status, Status::Ok);
    // Partial cells load about a tenth of the bytes.
    let partial = cells
        .iter()
        .find(|c| c.subject == "auto" && c.scope == Scope::Partial && c.status == Status::Ok)
        .unwrap();
    assert!(partial.samples[0].bytes < fixture.data_len_bytes);

    let prepared = Prepared {
        fixtures: vec![fixture.clone()],
        facts: vec![tensora_bench::fixture_facts(&fixture, 0.0)],
        skipped: vec![],
    };
    let report =
        tensora_bench::build_report(&config, Machine::detect(Path::new(REAL)), prepared, cells, drop);
    assert!(report.failures().is_empty());
    let first = report.rooflines_of("tinyllama", Situation::FirstLoad).unwrap();
    assert!(first.warm_gbps.is_some_and(|g| g > 0.0));
    assert!(first.device_gbps.is_none());
    assert!(report.rooflines_of("tinyllama", Situation::RepeatLoad).unwrap().warm_gbps.is_some());
    assert!(report.versus.iter().any(|v| v.cache == tensora_bench::Cache::Warm));
    let paths = tensora_bench::write_reports(&report, out.path()).unwrap();
    assert_eq!(paths.len(), 3);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(json["cells"].as_array().unwrap().len(), report.cells.len());
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("| auto | warm | full | owned |"), "{md}");
    assert!(md.contains("(b) repeat load in the same process"), "{md}");
    assert!(std::fs::read_to_string(out.path().join("report.svg")).unwrap().starts_with("<svg"));
}
