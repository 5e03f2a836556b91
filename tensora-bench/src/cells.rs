//! Which cells a bench run measures on a fixture, in which order ([`plan_cells`]); re-exported
//! from [`crate::bench`].
//!
//! Three plans ([`PlanKind`]): `default` (what `cargo xtask bench` runs: the main fixture, what a
//! user sees, a few minutes), `full` (`--full`: every backend, scope, mode and fixture) and `quick`
//! (`--quick`, small fixtures, for CI). Every plan measures its subjects in situation (a) and, for
//! the owned loaders, peers and warm roofline, in situation (b) ([`Situation`]).
//!
//! Extending the plan:
//! - a new subject: a [`Subject`] variant with its [`Subject::name`] and [`Subject::kind`], the
//!   code of one load in [`crate::child`] (`load_once`), and a line in the plan functions below;
//! - a Python peer: an entry in [`crate::python::PEERS`] (every plan lists all of them);
//! - a new fixture with its own cells (e.g. a MoE module): its spec in [`crate::fixtures::specs`]
//!   (or a `fixtures` function of its own module) and a branch on its name in [`plan_cells`] that
//!   returns its cells, built with [`CellSpec::new`] from the same subjects.

use serde::{Deserialize, Serialize};

use crate::bench::{AUTO, BenchConfig, PEER_ST_MMAP, PEER_ST_READ};
use crate::fixtures;
use crate::report::{
    Cache, Kind, Mode, ROOFLINE_BUFFERED, ROOFLINE_BUFFERED_AGAIN, ROOFLINE_DIRECT, ROOFLINE_DIRECT_AGAIN,
    ROOFLINE_WARM, ROOFLINE_WARM_AGAIN, ROOFLINE_WARM_BASE, ROOFLINE_WARM_BASE_AGAIN, Scope, Situation,
};

/// Which cells a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PlanKind {
    /// Small fixtures, every backend once, the peers warm (`--quick`, for CI).
    Quick,
    /// The main fixture: `auto`, the peers and the rooflines in both situations, the paired
    /// acceptance runs (`cargo xtask bench`).
    Default,
    /// Every fixture, backend, scope and mode (`--full`).
    Full,
}

impl PlanKind {
    /// Lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            PlanKind::Quick => "quick",
            PlanKind::Default => "default",
            PlanKind::Full => "full",
        }
    }

    /// Whether the plan measures `fixture` (the default plan only the main one).
    pub fn measures(self, fixture: &str) -> bool {
        self != PlanKind::Default || fixture == fixtures::TINYLLAMA
    }
}

/// The pages of a warm roofline's fresh arena. Where fresh huge pages are cheap depends on what
/// the machine freed a moment ago (`tensora_io::arena`), so the warm roofline is the better of two:
/// an arena as a load gets it, and one of base pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RooflinePages {
    /// `Arena::with_len`: huge pages, unless they fault in slowly (the arena's own probe).
    Arena,
    /// Base pages throughout (`Arena::use_base_pages` before the first read).
    Base,
}

/// Who is measured in a cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Subject {
    /// Warm roofline: `pread` with [`crate::roofline::COPY_THREADS`] threads into an arena (fresh
    /// in situation (a), the first pass's in situation (b)). The full plan measures the rooflines
    /// before (`again: false`) and after (`again: true`) the loaders.
    RooflineWarm {
        /// The second pass, after the loaders.
        again: bool,
        /// Which pages the fresh arena gets.
        pages: RooflinePages,
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
    /// A Python peer, by its key in [`crate::python::PEERS`].
    PeerPython(String),
    /// `auto` with Python's default residence (`Residence::Auto`), every tensor cast while it
    /// lands ([`crate::casts`]).
    Cast(CastTo),
    /// Every data file read with `tensora_testkit::pread_only` (2 threads, 1 MiB reads into one
    /// buffer each, nothing kept): what crossing the files' page cache costs alone, the cast
    /// pairs' memory bound ([`crate::casts`]).
    PreadOnly,
}

/// The dtype a [`Subject::Cast`] load asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CastTo {
    /// `--dtype f32`.
    F32,
    /// `--dtype bf16`.
    Bf16,
}

impl CastTo {
    /// What the load options ask for.
    pub fn target(self) -> tensora_io::DtypeTarget {
        match self {
            CastTo::F32 => tensora_io::DtypeTarget::F32,
            CastTo::Bf16 => tensora_io::DtypeTarget::BF16,
        }
    }

    /// The subject's name in reports.
    pub const fn subject_name(self) -> &'static str {
        match self {
            CastTo::F32 => "auto, cast to F32",
            CastTo::Bf16 => "auto, cast to BF16",
        }
    }
}

impl Subject {
    /// Name in reports.
    pub fn name(&self) -> &str {
        match self {
            Subject::RooflineWarm { again: false, pages: RooflinePages::Arena } => ROOFLINE_WARM,
            Subject::RooflineWarm { again: false, pages: RooflinePages::Base } => ROOFLINE_WARM_BASE,
            Subject::RooflineWarm { again: true, pages: RooflinePages::Base } => ROOFLINE_WARM_BASE_AGAIN,
            Subject::RooflineDirect { again: false } => ROOFLINE_DIRECT,
            Subject::RooflineBuffered { again: false } => ROOFLINE_BUFFERED,
            Subject::RooflineWarm { again: true, pages: RooflinePages::Arena } => ROOFLINE_WARM_AGAIN,
            Subject::RooflineDirect { again: true } => ROOFLINE_DIRECT_AGAIN,
            Subject::RooflineBuffered { again: true } => ROOFLINE_BUFFERED_AGAIN,
            Subject::Tensora(name) => name,
            Subject::PeerRead => PEER_ST_READ,
            Subject::PeerMmap => PEER_ST_MMAP,
            Subject::PeerPython(key) => crate::python::peer(key).map_or(key.as_str(), |p| p.name),
            Subject::Cast(to) => to.subject_name(),
            Subject::PreadOnly => crate::casts::PREAD_ONLY,
        }
    }

    /// Kind in reports.
    pub fn kind(&self) -> Kind {
        match self {
            Subject::RooflineWarm { .. }
            | Subject::RooflineDirect { .. }
            | Subject::RooflineBuffered { .. }
            | Subject::PreadOnly => Kind::Roofline,
            Subject::Tensora(_) | Subject::Cast(_) => Kind::Backend,
            Subject::PeerRead | Subject::PeerMmap | Subject::PeerPython(_) => Kind::Peer,
        }
    }

    /// Whether the subject runs in the bench's own process (the device rooflines, whose memory
    /// is ready before the clock starts) rather than in a child process.
    pub fn in_process(&self) -> bool {
        matches!(self, Subject::RooflineDirect { .. } | Subject::RooflineBuffered { .. })
    }
}

/// One cell to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellSpec {
    /// Who is measured.
    pub subject: Subject,
    /// First load of a fresh process, repeat load, or device only.
    pub situation: Situation,
    /// Page cache state at the start of each run.
    pub cache: Cache,
    /// Which tensors are loaded.
    pub scope: Scope,
    /// Where the loaded bytes end up.
    pub mode: Mode,
}

impl CellSpec {
    /// A cell of `subject` in `situation` with `cache`.
    pub fn new(subject: Subject, at: (Situation, Cache), scope: Scope, mode: Mode) -> CellSpec {
        CellSpec { subject, situation: at.0, cache: at.1, scope, mode }
    }

    /// A short label for progress lines.
    pub fn label(&self) -> String {
        let situation = match self.situation {
            Situation::FirstLoad => "(a)",
            Situation::RepeatLoad => "(b)",
            Situation::Device => "device",
        };
        format!(
            "{} {} {} {} {situation}",
            self.subject.name(),
            self.cache.as_str(),
            self.scope.as_str(),
            self.mode.as_str()
        )
    }
}

/// The cells to measure on `fixture`, in order, for `config.plan`: `backends` are the registered
/// backend names ([`AUTO`] is added), `python` the keys of the Python peers (each planned; the
/// unavailable ones end up skipped with their enabling command). Cold cells only when
/// `config.cold`.
pub fn plan_cells(config: &BenchConfig, fixture: &str, backends: &[&str], python: &[&str]) -> Vec<CellSpec> {
    if fixtures::casts_only(fixture) {
        return Vec::new();
    }
    let plan = Plan { cold: config.cold, fixture, python };
    match config.plan {
        PlanKind::Quick => plan.quick(backends),
        PlanKind::Default => plan.default_cells(),
        PlanKind::Full => {
            let mut cells = plan.full(backends);
            // The rooflines again after the loaders: a virtual disk's speed drifts within a run,
            // and the better pass is the roofline.
            let again: Vec<CellSpec> = cells
                .iter()
                .filter(|c| c.situation != Situation::RepeatLoad)
                .filter_map(|c| {
                    let subject = match c.subject {
                        Subject::RooflineWarm { again: false, pages } => {
                            Subject::RooflineWarm { again: true, pages }
                        }
                        Subject::RooflineDirect { again: false } => Subject::RooflineDirect { again: true },
                        Subject::RooflineBuffered { again: false } => {
                            Subject::RooflineBuffered { again: true }
                        }
                        _ => return None,
                    };
                    Some(CellSpec { subject, ..c.clone() })
                })
                .collect();
            cells.extend(again);
            cells
        }
    }
}

/// What the plan functions share.
struct Plan<'a> {
    cold: bool,
    fixture: &'a str,
    python: &'a [&'a str],
}

impl Plan<'_> {
    fn main(&self) -> bool {
        self.fixture == fixtures::TINYLLAMA
    }

    /// The peers read safetensors only.
    fn has_peers(&self) -> bool {
        self.fixture != fixtures::TINYLLAMA_SLLM
    }

    fn caches(&self) -> &'static [Cache] {
        if self.cold { &[Cache::Warm, Cache::Cold] } else { &[Cache::Warm] }
    }

    /// Every peer, full, owned (HF torch: mapped, as its load is), at `at`.
    fn peers(&self, at: (Situation, Cache), out: &mut Vec<CellSpec>) {
        if !self.has_peers() {
            return;
        }
        out.push(CellSpec::new(Subject::PeerRead, at, Scope::Full, Mode::Owned));
        out.push(CellSpec::new(Subject::PeerMmap, at, Scope::Full, Mode::Owned));
        for key in self.python {
            let mode = crate::python::peer(key).map_or(Mode::Owned, |p| p.mode);
            out.push(CellSpec::new(Subject::PeerPython((*key).to_owned()), at, Scope::Full, mode));
        }
    }

    /// The warm rooflines (both pages) at `at`.
    fn warm_rooflines(at: (Situation, Cache), out: &mut Vec<CellSpec>) {
        for pages in [RooflinePages::Arena, RooflinePages::Base] {
            out.push(CellSpec::new(
                Subject::RooflineWarm { again: false, pages },
                at,
                Scope::Full,
                Mode::Raw,
            ));
        }
    }

    /// The device rooflines (cold, measured in the bench's process).
    fn device(&self, out: &mut Vec<CellSpec>) {
        let at = (Situation::Device, Cache::Cold);
        out.push(CellSpec::new(Subject::RooflineDirect { again: false }, at, Scope::Full, Mode::Raw));
        out.push(CellSpec::new(Subject::RooflineBuffered { again: false }, at, Scope::Full, Mode::Raw));
    }

    /// `cargo xtask bench`: the rooflines, `auto` (owned, and mapped warm) and every peer in
    /// situation (a), warm and cold; the warm roofline, `auto` and the peers in situation (b), warm.
    fn default_cells(&self) -> Vec<CellSpec> {
        use Situation::{FirstLoad, RepeatLoad};
        let auto = || Subject::Tensora(AUTO.to_owned());
        let mut out = Vec::new();
        let first_warm = (FirstLoad, Cache::Warm);
        Plan::warm_rooflines(first_warm, &mut out);
        out.push(CellSpec::new(auto(), first_warm, Scope::Full, Mode::Owned));
        out.push(CellSpec::new(auto(), first_warm, Scope::Full, Mode::Mapped));
        self.peers(first_warm, &mut out);
        if self.cold {
            self.device(&mut out);
            out.push(CellSpec::new(auto(), (FirstLoad, Cache::Cold), Scope::Full, Mode::Owned));
            self.peers((FirstLoad, Cache::Cold), &mut out);
        }
        let repeat_warm = (RepeatLoad, Cache::Warm);
        Plan::warm_rooflines(repeat_warm, &mut out);
        out.push(CellSpec::new(auto(), repeat_warm, Scope::Full, Mode::Owned));
        self.peers(repeat_warm, &mut out);
        out
    }

    /// `--quick`: on the main fixture every backend once (warm, full, owned, (a)), `auto` across
    /// the other axes, the peers warm, and situation (b) for the warm roofline, `auto` and one
    /// peer; on the others
    /// `auto` and one peer, warm.
    fn quick(&self, backends: &[&str]) -> Vec<CellSpec> {
        use Situation::{FirstLoad, RepeatLoad};
        let tensora = |n: &str| Subject::Tensora(n.to_owned());
        let first_warm = (FirstLoad, Cache::Warm);
        let mut out = Vec::new();
        Plan::warm_rooflines(first_warm, &mut out);
        if !self.main() {
            out.push(CellSpec::new(tensora(AUTO), first_warm, Scope::Full, Mode::Owned));
            if self.has_peers() {
                out.push(CellSpec::new(Subject::PeerRead, first_warm, Scope::Full, Mode::Owned));
            }
            return out;
        }
        for n in backends.iter().chain(&[AUTO]) {
            out.push(CellSpec::new(tensora(n), first_warm, Scope::Full, Mode::Owned));
        }
        out.push(CellSpec::new(tensora(AUTO), first_warm, Scope::Partial, Mode::Owned));
        out.push(CellSpec::new(tensora(AUTO), first_warm, Scope::Full, Mode::Streaming));
        out.push(CellSpec::new(tensora(AUTO), first_warm, Scope::Full, Mode::Mapped));
        self.peers(first_warm, &mut out);
        if self.cold {
            self.device(&mut out);
            out.push(CellSpec::new(tensora(AUTO), (FirstLoad, Cache::Cold), Scope::Full, Mode::Owned));
        }
        let repeat_warm = (RepeatLoad, Cache::Warm);
        Plan::warm_rooflines(repeat_warm, &mut out);
        out.push(CellSpec::new(tensora(AUTO), repeat_warm, Scope::Full, Mode::Owned));
        out.push(CellSpec::new(Subject::PeerRead, repeat_warm, Scope::Full, Mode::Owned));
        out
    }

    /// `--full`: on the main fixture the whole matrix in situation (a) (every backend and `auto`
    /// × cache × scope × owned/streaming, `auto` mapped, the peers full and partial) and situation
    /// (b) for the warm roofline, `auto` and the peers; on the others every backend on a full owned
    /// load, `auto` on the other axes, and the peers full.
    fn full(&self, backends: &[&str]) -> Vec<CellSpec> {
        use Situation::{FirstLoad, RepeatLoad};
        let main = self.main();
        let mut out = Vec::new();
        Plan::warm_rooflines((FirstLoad, Cache::Warm), &mut out);
        if self.cold {
            self.device(&mut out);
        }
        for n in backends.iter().chain(&[AUTO]) {
            for &cache in self.caches() {
                for scope in [Scope::Full, Scope::Partial] {
                    for mode in [Mode::Owned, Mode::Streaming] {
                        if main || *n == AUTO || (scope == Scope::Full && mode == Mode::Owned) {
                            let subject = Subject::Tensora((*n).to_owned());
                            out.push(CellSpec::new(subject, (FirstLoad, cache), scope, mode));
                        }
                    }
                }
            }
        }
        for &cache in self.caches().iter().filter(|_| main) {
            out.push(CellSpec::new(
                Subject::Tensora(AUTO.to_owned()),
                (FirstLoad, cache),
                Scope::Full,
                Mode::Mapped,
            ));
        }
        for &cache in self.caches() {
            self.peers((FirstLoad, cache), &mut out);
            if main && self.has_peers() {
                for peer in [Subject::PeerRead, Subject::PeerMmap] {
                    out.push(CellSpec::new(peer, (FirstLoad, cache), Scope::Partial, Mode::Owned));
                }
            }
        }
        if main {
            let warm = (RepeatLoad, Cache::Warm);
            Plan::warm_rooflines(warm, &mut out);
            for &cache in self.caches() {
                out.push(CellSpec::new(
                    Subject::Tensora(AUTO.to_owned()),
                    (RepeatLoad, cache),
                    Scope::Full,
                    Mode::Owned,
                ));
                self.peers((RepeatLoad, cache), &mut out);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
