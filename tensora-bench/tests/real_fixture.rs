//! The whole measuring pipeline on a real checkpoint from the repository fixtures (`fixtures/`): rooflines, every
//! backend, the peers, and the three report files.

use std::path::{Path, PathBuf};

use tensora_bench::bench::{self, BenchConfig, Prepared};
use tensora_bench::fixtures::{Fixture, Size};
use tensora_bench::report::{Kind, Machine, Status};

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
        cold: false,
        quick: false,
        seed: 1,
    };
    let fixture = real_fixture();
    let mut lines = Vec::new();
    let (cells, drop) =
        bench::measure_fixtures(&config, std::slice::from_ref(&fixture), &mut |l| lines.push(l.to_string()))
            .unwrap();
    assert!(drop.is_none());
    assert_eq!(lines.len(), cells.len());
    for c in &cells {
        match c.status {
            Status::Ok => {
                assert_eq!(c.samples.len(), 1, "{}", c.subject);
                let expected = match (c.kind, c.scope) {
                    (Kind::Roofline, _) => fixture.files_len_bytes,
                    (_, tensora_bench::report::Scope::Full) => fixture.data_len_bytes,
                    _ => c.samples[0].bytes,
                };
                assert!(c.samples.iter().all(|s| s.bytes == expected && s.seconds > 0.0), "{c:?}");
                assert!(c.gbps.is_some());
            }
            // Python without safetensors, or a backend this machine lacks, is skipped; nothing fails.
            Status::Skipped => assert!(c.reason.is_some()),
            Status::Failed => panic!("{} failed: {:?}", c.subject, c.reason),
        }
    }
    // Every registered backend and auto loaded the checkpoint.
    for name in tensora_io::registry::names().iter().chain(&["auto"]) {
        assert!(cells.iter().any(|c| c.subject == *name && c.status != Status::Failed), "{name}");
    }
    // Partial cells load about a tenth of the bytes.
    let partial = cells
        .iter()
        .find(|c| {
            c.subject == "auto" && c.scope == tensora_bench::report::Scope::Partial && c.status == Status::Ok
        })
        .unwrap();
    assert!(partial.samples[0].bytes < fixture.data_len_bytes);

    let prepared = Prepared {
        fixtures: vec![fixture.clone()],
        facts: vec![bench::fixture_facts(&fixture, 0.0)],
        skipped: vec![],
    };
    let report = bench::build_report(&config, Machine::detect(Path::new(REAL)), prepared, cells, drop);
    assert!(report.rooflines[0].warm_gbps.is_some_and(|g| g > 0.0));
    assert!(report.rooflines[0].device_gbps.is_none());
    let paths = bench::write_reports(&report, out.path()).unwrap();
    assert_eq!(paths.len(), 3);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(json["cells"].as_array().unwrap().len(), report.cells.len());
    assert!(
        std::fs::read_to_string(out.path().join("report.md"))
            .unwrap()
            .contains("| auto | warm | full | owned |")
    );
    assert!(std::fs::read_to_string(out.path().join("report.svg")).unwrap().starts_with("<svg"));
}
