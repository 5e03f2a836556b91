//! Plans over the real safetensors fixtures, executed with plain positional reads into a byte
//! arena, and every selected tensor checked against its expected sha256. The header is parsed
//! here with serde_json (tensora-plan knows no formats; this test plays the caller's part).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use tensora_plan::{Extent, Order, Plan, PlanConfig};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real");
const FILES: [&str; 2] = ["fracast-0", "fracast-0.int8"];
/// Largest safetensors header this test accepts (the fixtures' are a few KiB).
const HEADER_BYTES_MAX: u64 = 1 << 20;

struct Tensor {
    name: String,
    file: u32,
    offset_bytes: u64,
    len_bytes: u64,
    sha256: String,
}

fn load_fixtures() -> (Vec<Tensor>, Vec<u64>) {
    let mut tensors = Vec::new();
    let mut lens = Vec::new();
    for (file, stem) in FILES.iter().enumerate() {
        let path = PathBuf::from(FIXTURES).join(format!("{stem}.safetensors"));
        let f = File::open(&path).unwrap();
        let file_len = f.metadata().unwrap().len();
        let mut len8 = [0u8; 8];
        f.read_exact_at(&mut len8, 0).unwrap();
        let header_len = u64::from_le_bytes(len8);
        assert!(header_len <= HEADER_BYTES_MAX.min(file_len - 8));
        let mut header = vec![0u8; header_len as usize];
        f.read_exact_at(&mut header, 8).unwrap();
        let header: serde_json::Value = serde_json::from_slice(&header).unwrap();
        let expected: serde_json::Value = serde_json::from_slice(
            &std::fs::read(PathBuf::from(FIXTURES).join(format!("{stem}.expected.json"))).unwrap(),
        )
        .unwrap();
        let data_start = 8 + header_len;
        for (name, info) in header.as_object().unwrap() {
            if name == "__metadata__" {
                continue;
            }
            let range = info["data_offsets"].as_array().unwrap();
            let (begin, end) = (range[0].as_u64().unwrap(), range[1].as_u64().unwrap());
            tensors.push(Tensor {
                name: format!("{stem}/{name}"),
                file: file as u32,
                offset_bytes: data_start + begin,
                len_bytes: end - begin,
                sha256: expected["tensors"][name]["sha256"].as_str().unwrap().to_owned(),
            });
        }
        lens.push(file_len);
    }
    (tensors, lens)
}

/// Executes `plan` queue by queue and returns the arena; no read is larger than the budget.
fn execute(plan: &Plan, budget_bytes: u64) -> Vec<u8> {
    let files: Vec<File> = FILES
        .iter()
        .map(|s| File::open(PathBuf::from(FIXTURES).join(format!("{s}.safetensors"))).unwrap())
        .collect();
    let mut arena = vec![0u8; plan.arena_len_bytes() as usize];
    for q in plan.queues() {
        for r in plan.queue_reads(q) {
            assert!(
                r.len_bytes <= budget_bytes,
                "a read of {} bytes under a {budget_bytes}-byte budget",
                r.len_bytes
            );
            let dst =
                &mut arena[r.arena_offset_bytes as usize..(r.arena_offset_bytes + r.len_bytes) as usize];
            files[r.file as usize].read_exact_at(dst, r.offset_bytes).unwrap();
        }
    }
    arena
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Plans the tensors whose names `select` accepts, executes the plan and checks every tensor.
fn plan_and_verify(select: impl Fn(&str) -> bool, config: &PlanConfig, priority: &[&str]) -> Plan {
    let (tensors, lens) = load_fixtures();
    let picked: Vec<usize> = (0..tensors.len()).filter(|&i| select(&tensors[i].name)).collect();
    assert!(!picked.is_empty());
    let extents: Vec<Extent> = picked
        .iter()
        .map(|&i| Extent {
            file: tensors[i].file,
            offset_bytes: tensors[i].offset_bytes,
            len_bytes: tensors[i].len_bytes,
            tag: i as u32,
        })
        .collect();
    let order = if priority.is_empty() {
        Order::File
    } else {
        Order::Priority(
            priority.iter().map(|p| tensors.iter().position(|t| t.name == *p).unwrap() as u32).collect(),
        )
    };
    let plan = Plan::build_with_file_lens(&extents, config, &order, &lens).unwrap();
    plan.check(&extents).unwrap();
    let arena = execute(&plan, config.budget_bytes);
    for e in &extents {
        let loc = plan.location(e.tag).unwrap();
        let bytes =
            &arena[loc.arena_offset_bytes as usize..(loc.arena_offset_bytes + loc.len_bytes) as usize];
        let t = &tensors[e.tag as usize];
        assert_eq!(sha256_hex(bytes), t.sha256, "{}", t.name);
        assert_eq!(loc.arena_offset_bytes % 4096, e.offset_bytes % 4096, "{}", t.name);
    }
    plan
}

#[test]
fn whole_checkpoints_load_byte_exact_under_every_config() {
    let configs = [
        PlanConfig::default(),
        PlanConfig {
            align_bytes: 4096,
            chunk_bytes: 64 << 10,
            coalesce_gap_bytes: 0,
            budget_bytes: 128 << 10,
        },
        PlanConfig { align_bytes: 512, chunk_bytes: 1000, coalesce_gap_bytes: 100, budget_bytes: 4096 },
        PlanConfig { align_bytes: 1, chunk_bytes: 333, coalesce_gap_bytes: 1, budget_bytes: 100 },
    ];
    for config in &configs {
        let plan = plan_and_verify(|_| true, config, &[]);
        assert_eq!(plan.queues().len(), 2);
        if config.align_bytes == 1 {
            // Tensors are packed: all of them means no overhead.
            assert_eq!(plan.bytes_read(), plan.bytes_selected());
        }
    }
}

#[test]
fn partial_loads_read_little_more_than_the_selection() {
    let config = PlanConfig { coalesce_gap_bytes: 0, ..PlanConfig::default() };
    let sel = |n: &str| n.starts_with("fracast-0/core.block.");
    let plan = plan_and_verify(sel, &config, &[]);
    assert_eq!(plan.queues().len(), 1);
    assert!(plan.bytes_selected() > 0);
    assert_eq!(plan.bytes_read(), plan.bytes_selected(), "packed tensors, no alignment: no overhead");
    let (_, lens) = load_fixtures();
    assert!(plan.bytes_read() < lens[0] / 2);
}

#[test]
fn priority_loads_the_urgent_tensor_first() {
    let (tensors, _) = load_fixtures();
    let urgent = tensors.iter().rev().find(|t| t.file == 1 && t.len_bytes > 0).unwrap().name.clone();
    let config = PlanConfig { chunk_bytes: 4096, ..PlanConfig::default() };
    let plan = plan_and_verify(|_| true, &config, &[&urgent]);
    let tag = tensors.iter().position(|t| t.name == urgent).unwrap() as u32;
    assert_eq!(plan.queues()[0].file, 1);
    assert!(plan.read_pieces(&plan.reads()[0]).iter().any(|p| p.tag == tag));
}
