//! `auto` against the best peer of the same run, in situation (a) (the first load of a fresh
//! process, what a server or a job sees): the owned full load of each fixture, warm and cold, each
//! side the median of its cell. Peers that were skipped are named, so a comparison with fewer peers
//! than planned never passes for a complete one.

use serde::{Deserialize, Serialize};

use crate::report::{Cache, Cell, Kind, Mode, Scope, Situation, Status};
use crate::stats::ratio;

/// Goal of the warm comparison (issue #19): `auto` at least this many times the best owned peer.
pub const WARM_GOAL: f64 = 1.2;
/// Goal of the cold comparison (issue #19).
pub const COLD_GOAL: f64 = 1.3;

/// One comparison of `auto` with the best peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versus {
    /// The fixture.
    pub fixture: String,
    /// Page cache state of both cells.
    pub cache: Cache,
    /// `auto`'s median GB/s (owned, full, situation (a)).
    pub auto_gbps: f64,
    /// The best peer of the same cache state.
    pub peer: String,
    /// Its median GB/s.
    pub peer_gbps: f64,
    /// `auto_gbps / peer_gbps`.
    pub ratio: Option<f64>,
    /// [`WARM_GOAL`] or [`COLD_GOAL`].
    pub goal: f64,
    /// Peers of the plan that did not run (skipped or failed), each with its reason.
    pub peers_missing: Vec<String>,
}

impl Versus {
    /// `met`, `missed` or `no data`.
    pub fn verdict(&self) -> &'static str {
        match self.ratio {
            Some(r) if r >= self.goal => "met",
            Some(_) => "missed",
            None => "no data",
        }
    }
}

/// The comparisons of every fixture and cache state that has a measured `auto` cell and at least
/// one measured peer (owned, full scope, situation (a)).
pub fn compare(cells: &[Cell]) -> Vec<Versus> {
    let owned_full_first =
        |c: &&Cell| c.situation == Situation::FirstLoad && c.scope == Scope::Full && c.mode == Mode::Owned;
    let mut out = Vec::new();
    let mut fixtures: Vec<&str> = Vec::new();
    for c in cells {
        if !fixtures.contains(&c.fixture.as_str()) {
            fixtures.push(&c.fixture);
        }
    }
    for fixture in fixtures {
        for cache in [Cache::Warm, Cache::Cold] {
            let here: Vec<&Cell> = cells
                .iter()
                .filter(owned_full_first)
                .filter(|c| c.fixture == fixture && c.cache == cache)
                .collect();
            let auto = here.iter().find(|c| c.kind == Kind::Backend && c.subject == crate::bench::AUTO);
            let Some(auto_gbps) = auto.and_then(|c| c.median()) else { continue };
            let peers: Vec<&&Cell> = here.iter().filter(|c| c.kind == Kind::Peer).collect();
            let best = peers
                .iter()
                .filter_map(|c| c.median().map(|m| (c.subject.as_str(), m)))
                .max_by(|a, b| a.1.total_cmp(&b.1));
            let Some((peer, peer_gbps)) = best else { continue };
            let peers_missing = peers
                .iter()
                .filter(|c| c.status != Status::Ok)
                .map(|c| format!("{}: {}", c.subject, c.reason.as_deref().unwrap_or("")))
                .collect();
            out.push(Versus {
                fixture: fixture.to_owned(),
                cache,
                auto_gbps,
                peer: peer.to_owned(),
                peer_gbps,
                ratio: ratio(auto_gbps, peer_gbps),
                goal: match cache {
                    Cache::Warm => WARM_GOAL,
                    Cache::Cold => COLD_GOAL,
                },
                peers_missing,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Sample;

    fn cell(subject: &str, kind: Kind, at: (Situation, Cache), gbps: &[f64]) -> Cell {
        let samples = gbps.iter().map(|&g| Sample::new(1.0 / g, 1_000_000_000)).collect();
        Cell::new("m", subject, kind, at, Scope::Full, Mode::Owned).with_samples(samples)
    }

    #[test]
    fn auto_is_compared_with_the_best_peer_of_its_own_situation_and_cache() {
        use Situation::{FirstLoad, RepeatLoad};
        let cells = vec![
            cell("auto", Kind::Backend, (FirstLoad, Cache::Warm), &[3.0]),
            cell("a", Kind::Peer, (FirstLoad, Cache::Warm), &[1.0]),
            cell("b", Kind::Peer, (FirstLoad, Cache::Warm), &[2.0, 2.0, 4.0]),
            // Faster, but another situation: never the comparison.
            cell("c", Kind::Peer, (RepeatLoad, Cache::Warm), &[9.0]),
            Cell::new("m", "py", Kind::Peer, (FirstLoad, Cache::Warm), Scope::Full, Mode::Owned)
                .skipped("no venv"),
            cell("auto", Kind::Backend, (FirstLoad, Cache::Cold), &[1.2]),
            cell("a", Kind::Peer, (FirstLoad, Cache::Cold), &[1.0]),
        ];
        let v = compare(&cells);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].cache, v[0].peer.as_str(), v[0].peer_gbps), (Cache::Warm, "b", 2.0));
        assert_eq!(v[0].ratio, Some(1.5));
        assert_eq!(v[0].verdict(), "met");
        assert_eq!(v[0].peers_missing, vec!["py: no venv".to_owned()]);
        assert_eq!((v[1].cache, v[1].goal, v[1].verdict()), (Cache::Cold, COLD_GOAL, "missed"));
        // No peer measured: no comparison at all.
        assert!(compare(&cells[..1]).is_empty());
    }
}
