use super::*;
use Situation::{Device, FirstLoad, RepeatLoad};

fn sample(gbps: f64) -> Sample {
    Sample { start_seconds: Some(0.25), ..Sample::new(1.0 / gbps, 1_000_000_000) }
}

fn cell(subject: &str, kind: Kind, at: (Situation, Cache), scope: Scope, mode: Mode) -> Cell {
    Cell::new("m", subject, kind, at, scope, mode)
}

pub(crate) fn example() -> Report {
    let cells = vec![
        cell(ROOFLINE_WARM, Kind::Roofline, (FirstLoad, Cache::Warm), Scope::Full, Mode::Raw)
            .with_samples(vec![sample(10.0), sample(8.0), sample(12.0)]),
        cell(ROOFLINE_DIRECT, Kind::Roofline, (Device, Cache::Cold), Scope::Full, Mode::Raw)
            .with_samples(vec![Sample::new(0.5, 1_000_000_000)]),
        cell(ROOFLINE_BUFFERED, Kind::Roofline, (Device, Cache::Cold), Scope::Full, Mode::Raw)
            .with_samples(vec![Sample::new(1.0, 1_000_000_000)]),
        cell("sync", Kind::Backend, (FirstLoad, Cache::Warm), Scope::Full, Mode::Owned)
            .with_samples(vec![sample(5.0), sample(6.0)]),
        cell("sync", Kind::Backend, (FirstLoad, Cache::Cold), Scope::Full, Mode::Owned)
            .with_samples(vec![sample(1.5)]),
        cell("hf-python", Kind::Peer, (FirstLoad, Cache::Warm), Scope::Full, Mode::Owned)
            .skipped("no module"),
        Cell {
            details: Some(serde_json::json!({ "backend": "io-uring", "io_mode": "direct" })),
            ..cell("auto", Kind::Backend, (FirstLoad, Cache::Cold), Scope::Partial, Mode::Owned)
                .with_samples(vec![sample(1.0)])
        },
        cell("x", Kind::Peer, (FirstLoad, Cache::Warm), Scope::Partial, Mode::Streaming)
            .failed(&anyhow::anyhow!("boom | pipe")),
        // Measured again later, faster: the device roofline is the better pass.
        cell(ROOFLINE_DIRECT_AGAIN, Kind::Roofline, (Device, Cache::Cold), Scope::Full, Mode::Raw)
            .with_samples(vec![Sample::new(0.4, 1_000_000_000)]),
        // Situation (b): its own warm roofline, much faster (memory reused).
        cell(ROOFLINE_WARM, Kind::Roofline, (RepeatLoad, Cache::Warm), Scope::Full, Mode::Raw)
            .with_samples(vec![sample(20.0)]),
        cell("auto", Kind::Backend, (RepeatLoad, Cache::Warm), Scope::Full, Mode::Owned)
            .with_samples(vec![sample(18.0)]),
        cell("auto", Kind::Backend, (FirstLoad, Cache::Warm), Scope::Full, Mode::Owned)
            .with_samples(vec![sample(9.0)]),
        cell("peer", Kind::Peer, (FirstLoad, Cache::Warm), Scope::Full, Mode::Owned)
            .with_samples(vec![sample(6.0)]),
    ];
    let mut r = Report {
        schema_version: SCHEMA_VERSION,
        run: RunFacts {
            size: "small".into(),
            runs: 3,
            pair_runs: 3,
            cold: true,
            plan: "quick".into(),
            seed: 1,
            streaming_budget_bytes: 256 << 20,
            cache_drop: Some("test".into()),
            memory: "relay".into(),
            seconds: 12.0,
            load_average: ["0.10 0.20 0.30".into(), "0.40 0.50 0.60".into()],
        },
        machine: Machine::detect(std::path::Path::new(".")),
        fixtures: vec![FixtureFacts {
            name: "m".into(),
            path: "/x".into(),
            files: 1,
            tensors: 2,
            data_len_bytes: 10,
            files_len_bytes: 20,
            generated: false,
            generate_seconds: 0.0,
        }],
        fixtures_skipped: vec![("sllm".into(), "converter missing".into())],
        rooflines: Vec::new(),
        cells,
        pairs: vec![
            crate::paired::Pair {
                fixture: "m".into(),
                cache: Cache::Warm,
                subject: "auto (sync buffered)".into(),
                anchor: ROOFLINE_WARM.into(),
                subject_gbps: vec![8.0, 9.0],
                anchor_gbps: vec![10.0, 10.0],
                ratios: vec![0.8, 0.9],
                goal: 0.85,
                bounds: vec![],
                of_bounds: vec![],
            },
            crate::paired::Pair {
                fixture: "m-f32 → auto, cast to BF16".into(),
                cache: Cache::Warm,
                subject: "auto, cast to BF16".into(),
                anchor: "auto owned, uncast, of m-bf16".into(),
                subject_gbps: vec![5.0, 4.5],
                anchor_gbps: vec![6.25, 6.25],
                ratios: vec![0.8, 0.72],
                goal: 0.8,
                bounds: vec![0.8, 0.72],
                of_bounds: vec![1.0, 1.0],
            },
        ],
        versus: Vec::new(),
        python_peers: None,
        restarts: None,
    };
    r.compute_rooflines();
    r
}

#[test]
fn each_cell_is_compared_with_the_roofline_of_its_own_situation() {
    let r = example();
    let first = r.rooflines_of("m", FirstLoad).unwrap();
    assert_eq!(first.warm_gbps, Some(10.0));
    assert_eq!(first.device_gbps, Some(2.5));
    assert_eq!(first.device_subject.as_deref(), Some(ROOFLINE_DIRECT_AGAIN));
    let repeat = r.rooflines_of("m", RepeatLoad).unwrap();
    assert_eq!((repeat.warm_gbps, repeat.device_gbps), (Some(20.0), Some(2.5)));
    assert!(r.rooflines_of("m", Device).is_none(), "device cells count with the first loads");
    let sync_warm = &r.cells[3];
    assert_eq!(sync_warm.gbps.unwrap().median, 5.5);
    assert_eq!(sync_warm.ratio, Some(0.55));
    assert_eq!(r.cells[4].ratio, Some(0.6));
    assert_eq!(r.cells[2].ratio, Some(0.4));
    assert_eq!(r.cells[1].ratio, Some(0.8));
    assert_eq!(r.cells[5].ratio, None);
    // (b) against (b)'s roofline (20), never (a)'s (10).
    assert_eq!(r.cells[10].ratio, Some(0.9));
    assert_eq!(r.cells[11].ratio, Some(0.9));
    // auto against the best peer in (a), warm: 9 / 6.
    assert_eq!(r.versus.len(), 1);
    assert_eq!((r.versus[0].peer.as_str(), r.versus[0].ratio), ("peer", Some(1.5)));
    assert_eq!(r.versus[0].peers_missing, vec!["hf-python: no module".to_owned()]);
}

#[test]
fn failures_are_listed_and_skips_are_not() {
    let f = example().failures();
    assert_eq!(f, vec!["m | x | first-load warm partial streaming: boom | pipe".to_owned()]);
}

#[test]
fn json_has_every_sample_and_round_trips() {
    let r = example();
    let json = r.to_json().unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["schema_version"], SCHEMA_VERSION);
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 13);
    assert_eq!(cells[0]["samples"].as_array().unwrap().len(), 3);
    assert_eq!(cells[0]["samples"][0]["start_seconds"], 0.25);
    assert_eq!(cells[0]["kind"], "roofline");
    assert_eq!(cells[0]["situation"], "first-load");
    assert_eq!(cells[1]["situation"], "device");
    assert_eq!(cells[10]["situation"], "repeat-load");
    assert_eq!(cells[3]["gbps"]["median"], 5.5);
    assert_eq!(cells[3]["cache"], "warm");
    assert_eq!(cells[5]["status"], "skipped");
    assert_eq!(cells[7]["status"], "failed");
    assert_eq!(cells[6]["details"]["backend"], "io-uring");
    assert_eq!(v["rooflines"][0]["device_gbps"], 2.5);
    let back: Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
}

#[test]
fn markdown_has_a_table_per_situation_and_escapes_pipes() {
    let md = example().to_markdown();
    let rows = |header: &str| {
        md.lines().skip_while(|l| !l.starts_with(header)).skip(2).take_while(|l| l.starts_with("| ")).count()
    };
    assert!(md.contains("## m, (a) first load in a fresh process"), "{md}");
    assert!(md.contains("## m, (b) repeat load in the same process"), "{md}");
    // The first table holds (a) and the device rooflines: every cell but the two of (b).
    assert_eq!(rows("| subject | cache"), 11);
    assert!(md.contains(
        "| auto | cold | partial | owned | 1.00 | 1.00 | 1.00 | 40 % | 0.25 | ran io-uring/direct |"
    ));
    assert!(md.contains("| sync | warm | full | owned | 5.50 | 5.00 | 6.00 | 55 % | 0.25 |"));
    assert!(
        md.contains(&format!("| {ROOFLINE_DIRECT} | cold | full | raw | 2.00 | 2.00 | 2.00 | 80 % | - |"))
    );
    assert!(md.contains("skipped: no module"));
    assert!(md.contains("FAILED: boom / pipe"));
    assert!(md.contains("Fixture `sllm` skipped: converter missing"));
    assert!(md.contains("| m | warm | auto (sync buffered) |"), "{md}");
    assert!(md.contains("| 0.85 (0.80..0.90) | 0.85: met | - |"), "{md}");
    // A cast pair: its memory bound next to the goal, which it does not change.
    assert!(
        md.contains(
            "| 0.76 (0.72..0.80) | 0.80: missed | 0.76 (0.72..0.80): 1.00 (1.00..1.00) of the bound |"
        ),
        "{md}"
    );
    assert!(
        md.contains("| m | warm | 9.00 | peer | 6.00 | 1.50 | 1.20: met | hf-python: no module |"),
        "{md}"
    );
    // The summary quotes situation (a) only: auto's warm figure is 9, not (b)'s 18.
    assert!(md.contains("| auto | owned | 9.00 | - |"), "{md}");
    assert!(!md.lines().any(|l| l.starts_with("| auto | owned | 18.00")), "{md}");
}

#[test]
fn svg_shows_situation_a_with_its_rooflines_and_the_pairs() {
    let svg = example().to_svg("m").unwrap();
    assert!(svg.starts_with("<svg"));
    assert!(svg.contains("sync"));
    // A subject with no measurement (skipped) gets no empty slot.
    assert!(!svg.contains("hf-python"));
    assert!(svg.contains("warm roofline 10.00 GB/s"), "(a)'s warm roofline, not (b)'s");
    assert!(!svg.contains("20.00 GB/s"));
    assert!(svg.contains("device roofline 2.50 GB/s"));
    assert!(svg.contains("(a) first load in a fresh process"));
    assert!(svg.contains("paired auto/roofline: warm 0.85"), "{svg}");
    assert!(svg.matches("<rect").count() >= 3);
    // A fixture with no cells still renders an (empty) chart.
    assert!(example().to_svg("none").unwrap().starts_with("<svg"));
}
