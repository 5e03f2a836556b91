use super::*;
use crate::bench::BenchConfig;

const BACKENDS: [&str; 4] = ["sync", "mmap", "io-uring", "async"];
const PYTHON: [&str; 2] = ["hf-numpy", "hf-torch"];

fn plan(config: &BenchConfig, fixture: &str) -> Vec<CellSpec> {
    plan_cells(config, fixture, &BACKENDS, &PYTHON)
}

fn no_duplicates(cells: &[CellSpec]) {
    for (i, c) in cells.iter().enumerate() {
        assert!(!cells[i + 1..].contains(c), "duplicate {c:?}");
    }
}

fn peers() -> Vec<Subject> {
    let mut p = vec![Subject::PeerRead, Subject::PeerMmap];
    p.extend(PYTHON.iter().map(|k| Subject::PeerPython((*k).to_owned())));
    p
}

#[test]
fn the_default_plan_measures_auto_and_every_peer_in_both_situations() {
    let config = BenchConfig::for_tests(PlanKind::Default);
    let cells = plan(&config, fixtures::TINYLLAMA);
    no_duplicates(&cells);
    let auto = Subject::Tensora(AUTO.to_owned());
    for subject in peers().into_iter().chain([auto.clone()]) {
        for at in [
            (Situation::FirstLoad, Cache::Warm),
            (Situation::FirstLoad, Cache::Cold),
            (Situation::RepeatLoad, Cache::Warm),
        ] {
            // HF torch's load returns views of a mapping: it is planned as mapped.
            let mode = match &subject {
                Subject::PeerPython(key) => crate::python::peer(key).unwrap().mode,
                _ => Mode::Owned,
            };
            let want = CellSpec::new(subject.clone(), at, Scope::Full, mode);
            assert!(cells.contains(&want), "{want:?}");
        }
    }
    for situation in [Situation::FirstLoad, Situation::RepeatLoad] {
        for pages in [RooflinePages::Arena, RooflinePages::Base] {
            let subject = Subject::RooflineWarm { again: false, pages };
            let roofline = CellSpec::new(subject, (situation, Cache::Warm), Scope::Full, Mode::Raw);
            assert!(cells.contains(&roofline), "{roofline:?}");
        }
    }
    // Device rooflines are the only cells of the device situation, and run in the bench's process.
    for c in &cells {
        assert_eq!(c.situation == Situation::Device, c.subject.in_process(), "{c:?}");
        assert_eq!(
            c.situation == Situation::Device,
            c.subject.kind() == Kind::Roofline && c.cache == Cache::Cold
        );
    }
    // Only `auto` among the backends: the full matrix is `--full`'s.
    assert!(cells.iter().all(|c| !matches!(&c.subject, Subject::Tensora(n) if n != AUTO)));
    // Every cell of the default plan is in the full plan too.
    let full = plan(&BenchConfig::for_tests(PlanKind::Full), fixtures::TINYLLAMA);
    assert!(cells.iter().all(|c| full.contains(c)), "default is a subset of full");
    assert!(cells.len() < full.len() / 2);
    assert!(PlanKind::Default.measures(fixtures::TINYLLAMA));
    assert!(!PlanKind::Default.measures(fixtures::MANY_SMALL));
    assert!(PlanKind::Full.measures(fixtures::MANY_SMALL) && PlanKind::Quick.measures(fixtures::MANY_SMALL));
}

#[test]
fn the_full_plan_covers_every_axis() {
    let cells = plan(&BenchConfig::for_tests(PlanKind::Full), fixtures::TINYLLAMA);
    no_duplicates(&cells);
    // Rooflines first ...
    let warm = |again, pages| Subject::RooflineWarm { again, pages };
    assert_eq!(cells[0].subject, warm(false, RooflinePages::Arena));
    assert_eq!(cells[1].subject, warm(false, RooflinePages::Base));
    assert_eq!(cells[2].subject, Subject::RooflineDirect { again: false });
    assert_eq!(cells[3].subject, Subject::RooflineBuffered { again: false });
    // ... and last, measured again (situation (a) and device).
    let n = cells.len();
    assert_eq!(cells[n - 4].subject, warm(true, RooflinePages::Arena));
    assert_eq!(cells[n - 3].subject, warm(true, RooflinePages::Base));
    assert_eq!(cells[n - 2].subject, Subject::RooflineDirect { again: true });
    assert_eq!(cells[n - 1].subject, Subject::RooflineBuffered { again: true });
    let first = |c: &&CellSpec| c.situation == Situation::FirstLoad;
    // (4 backends + auto) × warm/cold × full/partial × owned/streaming, plus auto mapped warm
    // and cold, in situation (a).
    let tensora = cells.iter().filter(first).filter(|c| matches!(c.subject, Subject::Tensora(_))).count();
    assert_eq!(tensora, 5 * 2 * 2 * 2 + 2);
    for b in BACKENDS.iter().chain([&AUTO]) {
        for cache in [Cache::Warm, Cache::Cold] {
            for scope in [Scope::Full, Scope::Partial] {
                for mode in [Mode::Owned, Mode::Streaming] {
                    let at = (Situation::FirstLoad, cache);
                    let want = CellSpec::new(Subject::Tensora(b.to_string()), at, scope, mode);
                    assert!(cells.contains(&want), "{want:?}");
                }
            }
        }
    }
    // Peers in (a): 2 Rust peers × 2 caches × 2 scopes, 2 Python peers × 2 caches; in (b): 4
    // peers × 2 caches.
    let peers_in =
        |s: Situation| cells.iter().filter(|c| c.subject.kind() == Kind::Peer && c.situation == s).count();
    assert_eq!(peers_in(Situation::FirstLoad), 8 + 4);
    assert_eq!(peers_in(Situation::RepeatLoad), 8);
    let repeat_auto = cells
        .iter()
        .filter(|c| c.situation == Situation::RepeatLoad && c.subject == Subject::Tensora(AUTO.into()));
    assert_eq!(repeat_auto.count(), 2);
}

#[test]
fn other_fixtures_run_every_backend_once_per_cache_and_auto_everywhere() {
    let cells = plan(&BenchConfig::for_tests(PlanKind::Full), fixtures::SINGLE_FILE);
    for b in BACKENDS {
        let mine: Vec<_> = cells.iter().filter(|c| c.subject == Subject::Tensora(b.to_string())).collect();
        assert_eq!(mine.len(), 2, "{b}");
        assert!(mine.iter().all(|c| c.scope == Scope::Full && c.mode == Mode::Owned));
    }
    let auto = cells.iter().filter(|c| c.subject == Subject::Tensora(AUTO.to_string())).count();
    assert_eq!(auto, 8);
    assert_eq!(cells.iter().filter(|c| c.subject.kind() == Kind::Peer).count(), 4 * 2);
    assert!(cells.iter().all(|c| c.situation != Situation::RepeatLoad), "(b) on the main fixture only");
}

#[test]
fn no_cold_means_no_cold_cells_and_sllm_has_no_peers() {
    for kind in [PlanKind::Quick, PlanKind::Default, PlanKind::Full] {
        let config = BenchConfig { cold: false, ..BenchConfig::for_tests(kind) };
        let cells = plan(&config, fixtures::TINYLLAMA);
        assert!(cells.iter().all(|c| c.cache == Cache::Warm), "{kind:?}");
        let sllm = plan(&BenchConfig::for_tests(kind), fixtures::TINYLLAMA_SLLM);
        assert!(sllm.iter().all(|c| c.subject.kind() != Kind::Peer), "{kind:?}");
    }
    let sllm = plan(&BenchConfig::for_tests(PlanKind::Full), fixtures::TINYLLAMA_SLLM);
    assert!(sllm.iter().any(|c| c.cache == Cache::Cold));
}

#[test]
fn quick_plan_is_a_small_subset() {
    let full = plan(&BenchConfig::for_tests(PlanKind::Full), fixtures::TINYLLAMA);
    let quick = plan(&BenchConfig::for_tests(PlanKind::Quick), fixtures::TINYLLAMA);
    no_duplicates(&quick);
    assert!(quick.len() < full.len() / 2);
    assert!(quick.iter().all(|c| full.contains(c)), "{:?}", quick.iter().find(|c| !full.contains(c)));
    // Every backend still runs once, and both situations are covered.
    for b in BACKENDS.iter().chain([&AUTO]) {
        assert!(quick.iter().any(|c| c.subject == Subject::Tensora(b.to_string())));
    }
    assert!(quick.iter().any(|c| c.situation == Situation::RepeatLoad));
    let other = plan(&BenchConfig::for_tests(PlanKind::Quick), fixtures::MANY_SMALL);
    assert_eq!(other.len(), 4);
    assert!(other.iter().all(|c| c.cache == Cache::Warm));
}

#[test]
fn subjects_name_themselves_and_round_trip() {
    assert_eq!(Subject::PeerPython("hf-numpy".into()).name(), crate::python::HF_NUMPY.name);
    assert_eq!(Subject::PeerPython("other".into()).name(), "other");
    let spec =
        CellSpec::new(Subject::PeerRead, (Situation::RepeatLoad, Cache::Cold), Scope::Full, Mode::Owned);
    assert_eq!(spec.label(), format!("{PEER_ST_READ} cold full owned (b)"));
    let warm = Subject::RooflineWarm { again: true, pages: RooflinePages::Base };
    assert_eq!(warm.name(), crate::report::ROOFLINE_WARM_BASE_AGAIN);
    for s in [warm, Subject::Tensora("x".into()), Subject::PeerPython("k".into())] {
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Subject>(&json).unwrap(), s);
    }
}
