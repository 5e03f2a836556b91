//! The cast pairs (issue #44): a load that casts every tensor while it lands against an uncast
//! owned load of the same output bytes, run by run, as [`crate::paired`] pairs a load with its
//! roofline.
//!
//! - BF16 → F32: `auto, cast to F32` of [`fixtures::TINYLLAMA_BF16`] against `auto` owned of
//!   [`fixtures::TINYLLAMA_F32`] (both hand out the F32 bytes of the same shapes);
//! - F32 → BF16: `auto, cast to BF16` of [`fixtures::TINYLLAMA_F32`] against `auto` owned of
//!   [`fixtures::TINYLLAMA_BF16`].
//!
//! The cast side runs with Python's default residence for torch (`Residence::Auto`), the uncast
//! side with `Residence::Owned` (a cast always hands out an owned arena; views of the files would
//! be no copy at all). Both warm, each run a fresh process (situation (a)), the order alternating
//! between pairs; GB/s are output bytes per second, so the ratio is the uncast load's seconds over
//! the cast load's.

use anyhow::Result;

use crate::bench::{AUTO, BenchConfig, CastTo, CellSpec, Runner, Subject, WARMUP_RUNS};
use crate::fixtures::{self, Fixture};
use crate::paired::{Pair, side};
use crate::report::{Cache, Mode, Scope, Situation};

/// Goal of both cast pairs (issue #44): the cast load at least this fraction of the uncast one.
pub const CAST_GOAL: f64 = 0.8;

/// One cast pair: the cast load's source fixture, the fixture holding its output's dtype, and
/// the dtype asked for.
struct CastPair<'a> {
    source: &'a Fixture,
    same_output: &'a Fixture,
    to: CastTo,
}

/// Progress keys of the cast pairs `config` runs (none where its plan has no cast fixtures).
pub fn step_keys(config: &BenchConfig) -> Vec<String> {
    if !config.plan.measures(fixtures::TINYLLAMA_BF16) {
        return Vec::new();
    }
    vec!["pairs cast".to_owned(); 2 * (WARMUP_RUNS + config.pair_runs)]
}

/// Runs both cast pairs when the plan measured the cast fixtures; nothing otherwise.
pub(crate) fn measure_cast_pairs(runner: &mut Runner<'_>, all: &[Fixture]) -> Result<Vec<Pair>> {
    let find = |name: &str| all.iter().find(|f| f.name == name);
    let (Some(bf16), Some(f32)) = (find(fixtures::TINYLLAMA_BF16), find(fixtures::TINYLLAMA_F32)) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for pair in [
        CastPair { source: bf16, same_output: f32, to: CastTo::F32 },
        CastPair { source: f32, same_output: bf16, to: CastTo::Bf16 },
    ] {
        let measured = run_cast_pair(runner, &pair)?;
        runner.steps.log(&measured.line());
        out.push(measured);
    }
    Ok(out)
}

fn run_cast_pair(runner: &mut Runner<'_>, p: &CastPair<'_>) -> Result<Pair> {
    let first_load =
        |subject, mode| CellSpec::new(subject, (Situation::FirstLoad, Cache::Warm), Scope::Full, mode);
    let cast = first_load(Subject::Cast(p.to), Mode::Owned);
    let uncast = first_load(Subject::Tensora(AUTO.to_owned()), Mode::Owned);
    let label = format!("{} → {}", p.source.name, p.to.subject_name());
    let anchor = format!("{AUTO} owned, uncast, of {}", p.same_output.name);
    let mut pair = Pair::new(&label, Cache::Warm, anchor, CAST_GOAL);
    pair.subject = p.to.subject_name().to_owned();
    for i in 0..WARMUP_RUNS + runner.config().pair_runs {
        runner.steps.begin("pairs cast");
        let t = std::time::Instant::now();
        // Alternate which side runs first, so neither always runs on the other's leftovers.
        let (cast_gbps, uncast_gbps) = if i % 2 == 0 {
            let c = side(runner, p.source, &cast)?.0;
            (c, side(runner, p.same_output, &uncast)?.0)
        } else {
            let u = side(runner, p.same_output, &uncast)?.0;
            (side(runner, p.source, &cast)?.0, u)
        };
        let warmup = i < WARMUP_RUNS;
        if !warmup {
            pair.push(cast_gbps, uncast_gbps);
        }
        let what = format!(
            "pairs cast {label} {i}: {cast_gbps:.2} vs {uncast_gbps:.2} GB/s{}",
            if warmup { " (warm-up)" } else { "" }
        );
        runner.steps.done(t.elapsed().as_secs_f64(), &what);
    }
    Ok(pair)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::PlanKind;

    #[test]
    fn only_the_plans_with_cast_fixtures_run_cast_pairs() {
        let default = BenchConfig::for_tests(PlanKind::Default);
        assert!(step_keys(&default).is_empty());
        for plan in [PlanKind::Quick, PlanKind::Full] {
            let config = BenchConfig::for_tests(plan);
            assert_eq!(step_keys(&config).len(), 2 * (WARMUP_RUNS + config.pair_runs));
        }
    }
}
