//! Which cells a bench run measures on a fixture, in which order ([`plan_cells`]); re-exported
//! from [`crate::bench`].

use crate::bench::{AUTO, BenchConfig, PEER_PYTHON, PEER_ST_MMAP, PEER_ST_READ};
use crate::fixtures;
use crate::report::{
    Cache, Kind, Mode, ROOFLINE_BUFFERED, ROOFLINE_BUFFERED_AGAIN, ROOFLINE_DIRECT, ROOFLINE_DIRECT_AGAIN,
    ROOFLINE_WARM, ROOFLINE_WARM_AGAIN, Scope,
};

/// Who is measured in a cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// Warm roofline: `pread` into a fresh hugepage arena. The rooflines are measured before
    /// (`again: false`) and after (`again: true`) the loaders.
    RooflineWarm {
        /// The second pass, after the loaders.
        again: bool,
    },
    /// Cold roofline: `O_DIRECT` reads on one io_uring ring.
    RooflineDirect {
        /// The second pass, after the loaders.
        again: bool,
    },
    /// Cold roofline: buffered `pread` with [`crate::roofline::COPY_THREADS`] threads.
    RooflineBuffered {
        /// The second pass, after the loaders.
        again: bool,
    },
    /// A registered backend name, or [`AUTO`].
    Tensora(String),
    /// Peer [`PEER_ST_READ`].
    PeerRead,
    /// Peer [`PEER_ST_MMAP`].
    PeerMmap,
    /// Peer [`PEER_PYTHON`].
    PeerPython,
}

impl Subject {
    /// Name in reports.
    pub fn name(&self) -> &str {
        match self {
            Subject::RooflineWarm { again: false } => ROOFLINE_WARM,
            Subject::RooflineDirect { again: false } => ROOFLINE_DIRECT,
            Subject::RooflineBuffered { again: false } => ROOFLINE_BUFFERED,
            Subject::RooflineWarm { again: true } => ROOFLINE_WARM_AGAIN,
            Subject::RooflineDirect { again: true } => ROOFLINE_DIRECT_AGAIN,
            Subject::RooflineBuffered { again: true } => ROOFLINE_BUFFERED_AGAIN,
            Subject::Tensora(name) => name,
            Subject::PeerRead => PEER_ST_READ,
            Subject::PeerMmap => PEER_ST_MMAP,
            Subject::PeerPython => PEER_PYTHON,
        }
    }

    /// Kind in reports.
    pub fn kind(&self) -> Kind {
        match self {
            Subject::RooflineWarm { .. }
            | Subject::RooflineDirect { .. }
            | Subject::RooflineBuffered { .. } => Kind::Roofline,
            Subject::Tensora(_) => Kind::Backend,
            Subject::PeerRead | Subject::PeerMmap | Subject::PeerPython => Kind::Peer,
        }
    }
}

/// One cell to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellSpec {
    /// Who is measured.
    pub subject: Subject,
    /// Page cache state at the start of each run.
    pub cache: Cache,
    /// Which tensors are loaded.
    pub scope: Scope,
    /// Where the loaded bytes end up.
    pub mode: Mode,
}

impl CellSpec {
    fn new(subject: Subject, cache: Cache, scope: Scope, mode: Mode) -> CellSpec {
        CellSpec { subject, cache, scope, mode }
    }
}

/// The cells to measure on `fixture`, in order: rooflines, Tensora (`backends` and [`AUTO`]),
/// peers, then the rooflines again (except with `--quick`): a virtual disk's speed drifts within a
/// run, and the better pass is the roofline. Cold cells only when `config.cold`.
pub fn plan_cells(config: &BenchConfig, fixture: &str, backends: &[&str]) -> Vec<CellSpec> {
    let mut cells = plan_cells_once(config, fixture, backends);
    if !config.quick {
        let again: Vec<CellSpec> = cells
            .iter()
            .filter_map(|c| {
                let subject = match c.subject {
                    Subject::RooflineWarm { again: false } => Subject::RooflineWarm { again: true },
                    Subject::RooflineDirect { again: false } => Subject::RooflineDirect { again: true },
                    Subject::RooflineBuffered { again: false } => Subject::RooflineBuffered { again: true },
                    _ => return None,
                };
                Some(CellSpec { subject, ..c.clone() })
            })
            .collect();
        cells.extend(again);
    }
    cells
}

fn plan_cells_once(config: &BenchConfig, fixture: &str, backends: &[&str]) -> Vec<CellSpec> {
    use Cache::{Cold, Warm};
    use Mode::{Owned, Raw, Streaming};
    use Scope::{Full, Partial};
    let mut cells = vec![CellSpec::new(Subject::RooflineWarm { again: false }, Warm, Full, Raw)];
    // Quick runs measure cold only on the main fixture: each cold run empties the page cache.
    if config.cold && (!config.quick || fixture == fixtures::TINYLLAMA) {
        cells.push(CellSpec::new(Subject::RooflineDirect { again: false }, Cold, Full, Raw));
        cells.push(CellSpec::new(Subject::RooflineBuffered { again: false }, Cold, Full, Raw));
    }
    let caches: &[Cache] = if config.cold { &[Warm, Cold] } else { &[Warm] };
    // The peers read safetensors only.
    let peers = fixture != fixtures::TINYLLAMA_SLLM;
    let mut names: Vec<String> = backends.iter().map(|b| b.to_string()).collect();
    names.push(AUTO.to_string());
    if config.quick {
        // Quick: every backend once (warm, full, owned); auto across the other axes; peers warm.
        let main = fixture == fixtures::TINYLLAMA;
        let tensora = |n: &str| Subject::Tensora(n.to_string());
        if main {
            for n in &names {
                cells.push(CellSpec::new(tensora(n), Warm, Full, Owned));
            }
            cells.push(CellSpec::new(tensora(AUTO), Warm, Partial, Owned));
            cells.push(CellSpec::new(tensora(AUTO), Warm, Full, Streaming));
            if config.cold {
                cells.push(CellSpec::new(tensora(AUTO), Cold, Full, Owned));
            }
            cells.push(CellSpec::new(Subject::PeerRead, Warm, Full, Owned));
            cells.push(CellSpec::new(Subject::PeerMmap, Warm, Full, Owned));
            cells.push(CellSpec::new(Subject::PeerPython, Warm, Full, Owned));
        } else {
            cells.push(CellSpec::new(tensora(AUTO), Warm, Full, Owned));
            if peers {
                cells.push(CellSpec::new(Subject::PeerRead, Warm, Full, Owned));
            }
        }
        return cells;
    }
    // The main fixture gets the whole matrix; the others every backend on a full owned load, and
    // `auto` on the other axes, which keeps a full run near a quarter of an hour here.
    let main = fixture == fixtures::TINYLLAMA;
    for n in &names {
        for &cache in caches {
            for scope in [Full, Partial] {
                for mode in [Owned, Streaming] {
                    let wanted = main || n == AUTO || (scope == Full && mode == Owned);
                    if wanted {
                        cells.push(CellSpec::new(Subject::Tensora(n.clone()), cache, scope, mode));
                    }
                }
            }
        }
    }
    if main {
        // Zero-copy views, for the comparison with peers that map (and with `fs::read`).
        for &cache in caches {
            cells.push(CellSpec::new(Subject::Tensora(AUTO.to_string()), cache, Full, Mode::Mapped));
        }
    }
    if !peers {
        return cells;
    }
    let peer_scopes: &[Scope] = if main { &[Full, Partial] } else { &[Full] };
    for peer in [Subject::PeerRead, Subject::PeerMmap] {
        for &cache in caches {
            for &scope in peer_scopes {
                cells.push(CellSpec::new(peer.clone(), cache, scope, Owned));
            }
        }
    }
    for &cache in caches {
        cells.push(CellSpec::new(Subject::PeerPython, cache, Full, Owned));
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKENDS: [&str; 4] = ["sync", "mmap", "io-uring", "async"];

    #[test]
    fn full_plan_covers_every_axis() {
        let cells = plan_cells(&BenchConfig::full_for_tests(), fixtures::TINYLLAMA, &BACKENDS);
        // Rooflines first.
        assert_eq!(cells[0].subject, Subject::RooflineWarm { again: false });
        assert_eq!(cells[1].subject, Subject::RooflineDirect { again: false });
        assert_eq!(cells[2].subject, Subject::RooflineBuffered { again: false });
        // ... and last, measured again.
        let n = cells.len();
        assert_eq!(cells[n - 3].subject, Subject::RooflineWarm { again: true });
        assert_eq!(cells[n - 2].subject, Subject::RooflineDirect { again: true });
        assert_eq!(cells[n - 1].subject, Subject::RooflineBuffered { again: true });
        assert!(cells[3..n - 3].iter().all(|c| c.subject.kind() != Kind::Roofline));
        // (4 backends + auto) × warm/cold × full/partial × owned/streaming, plus auto mapped
        // warm and cold.
        let tensora = cells.iter().filter(|c| matches!(c.subject, Subject::Tensora(_))).count();
        assert_eq!(tensora, 5 * 2 * 2 * 2 + 2);
        for cache in [Cache::Warm, Cache::Cold] {
            let want = CellSpec::new(Subject::Tensora(AUTO.to_string()), cache, Scope::Full, Mode::Mapped);
            assert!(cells.contains(&want), "{want:?}");
        }
        for b in BACKENDS.iter().chain([&AUTO]) {
            for cache in [Cache::Warm, Cache::Cold] {
                for scope in [Scope::Full, Scope::Partial] {
                    for mode in [Mode::Owned, Mode::Streaming] {
                        let want = CellSpec::new(Subject::Tensora(b.to_string()), cache, scope, mode);
                        assert!(cells.contains(&want), "{want:?}");
                    }
                }
            }
        }
        // Peers: 2 Rust peers × 2 caches × 2 scopes, Python × 2 caches.
        assert_eq!(cells.iter().filter(|c| c.subject.kind() == Kind::Peer).count(), 8 + 2);
        // No duplicates.
        for (i, c) in cells.iter().enumerate() {
            assert!(!cells[i + 1..].contains(c), "duplicate {c:?}");
        }
    }

    #[test]
    fn other_fixtures_run_every_backend_once_per_cache_and_auto_everywhere() {
        let cells = plan_cells(&BenchConfig::full_for_tests(), fixtures::SINGLE_FILE, &BACKENDS);
        for b in BACKENDS {
            let mine: Vec<_> =
                cells.iter().filter(|c| c.subject == Subject::Tensora(b.to_string())).collect();
            assert_eq!(mine.len(), 2, "{b}");
            assert!(mine.iter().all(|c| c.scope == Scope::Full && c.mode == Mode::Owned));
        }
        let auto = cells.iter().filter(|c| c.subject == Subject::Tensora(AUTO.to_string())).count();
        assert_eq!(auto, 8);
        assert_eq!(cells.iter().filter(|c| c.subject.kind() == Kind::Peer).count(), 4 + 2);
    }

    #[test]
    fn no_cold_means_no_cold_cells_and_sllm_has_no_peers() {
        let cells = plan_cells(&BenchConfig::warm_only_for_tests(), fixtures::TINYLLAMA, &BACKENDS);
        assert!(cells.iter().all(|c| c.cache == Cache::Warm));
        let sllm = plan_cells(&BenchConfig::full_for_tests(), fixtures::TINYLLAMA_SLLM, &BACKENDS);
        assert!(sllm.iter().all(|c| c.subject.kind() != Kind::Peer));
        assert!(sllm.iter().any(|c| c.cache == Cache::Cold));
    }

    #[test]
    fn quick_plan_is_a_small_subset() {
        let full = plan_cells(&BenchConfig::full_for_tests(), fixtures::TINYLLAMA, &BACKENDS);
        let quick = plan_cells(&BenchConfig::quick_for_tests(), fixtures::TINYLLAMA, &BACKENDS);
        assert!(quick.len() < full.len() / 2);
        assert!(quick.iter().all(|c| full.contains(c)));
        // Every backend still runs once.
        for b in BACKENDS.iter().chain([&AUTO]) {
            assert!(quick.iter().any(|c| c.subject == Subject::Tensora(b.to_string())));
        }
        let other = plan_cells(&BenchConfig::quick_for_tests(), fixtures::MANY_SMALL, &BACKENDS);
        assert_eq!(other.len(), 3);
        assert!(other.iter().all(|c| c.cache == Cache::Warm));
    }
}
