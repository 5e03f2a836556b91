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
//!
//! # The memory bound, measured in the same round
//!
//! Warm, both loads are bound by memory traffic, and they differ in what they read: the cast
//! reads the source fixture's page cache, the uncast load the output fixture's (F32 → BF16: 4.4 GB
//! against 2.2; BF16 → F32 the other way round); both write the same output bytes into fresh
//! memory. So each round also runs, each in a fresh process like the loads, a [`PREAD_ONLY`] read
//! of the source's files and one of the output's ([`Subject::PreadOnly`]: 2 threads, 1 MiB
//! `pread`s into one reused buffer per thread, nothing kept; `tensora_testkit::pread_only`, which
//! `tensora-io/examples/cast_cost.rs` runs too): what crossing each page cache costs alone. With
//! the conversion itself free and everything else the uncast load does (faulting in and writing
//! the output) done as fast as there, the cast takes at least
//!
//! `best_cast_s = uncast_s + (read_source_s - read_output_s)`
//!
//! and the ratio (uncast over cast seconds) is at most
//!
//! `bound = uncast_s / (uncast_s + read_source_s - read_output_s)` ([`memory_bound`]).
//!
//! - F32 → BF16: the source read is the longer, so the bound is below 1 (about 0.74 here: the
//!   goal of 0.8 is above what this machine's memory allows, and the pair says so in the same run);
//! - BF16 → F32: the source read is the shorter, the cast may beat the uncast load and the bound
//!   is above 1. It stays a bound (the best the cast can do), so it is not capped at 1;
//! - equal reads: 1. No bound where a time is not a positive number, or where the read saved
//!   is as long as the whole uncast load (`best_cast_s <= 0`: the model says nothing).
//!
//! The model assumes the cast crosses its extra page cache at `pread`'s cost (a copy into a
//! buffer that stays in L2). The cast reads the source through mapped views, with no copy, which
//! may cost less, and the run's noise moves each side: a pair above its bound (`of the bound`
//! over 1) says by how much. The bound is a same-run estimate of what the memory traffic allows,
//! not a ceiling the hardware enforces.
//!
//! Per round the pair keeps the bound and the ratio over it; their medians (min..max) print next
//! to the goal, which they do not change ([`CAST_GOAL`], [`Pair::met`]).

use anyhow::{Context, Result, bail};

use crate::bench::{AUTO, BenchConfig, CastTo, CellSpec, Runner, Subject, WARMUP_RUNS};
use crate::fixtures::{self, Fixture};
use crate::paired::Pair;
use crate::report::{Cache, Mode, Sample, Scope, Situation};
use crate::stats::ratio;

/// Goal of both cast pairs (issue #44): the cast load at least this fraction of the uncast one.
pub const CAST_GOAL: f64 = 0.8;

/// Name of [`Subject::PreadOnly`] in reports.
pub const PREAD_ONLY: &str = "pread only: 2 threads, 1 MiB, nothing kept";

/// The best ratio (uncast seconds over cast seconds) a cast load can reach, from the same round's
/// uncast load and the reads alone of the cast's source files and of the uncast load's (the
/// module docs say why); `None` where a time is not a positive finite number or the model gives
/// no positive cast time.
pub fn memory_bound(uncast_s: f64, read_source_s: f64, read_output_s: f64) -> Option<f64> {
    let positive = |s: f64| s.is_finite() && s > 0.0;
    if !(positive(uncast_s) && positive(read_source_s) && positive(read_output_s)) {
        return None;
    }
    let best_cast_s = uncast_s + (read_source_s - read_output_s);
    (best_cast_s > 0.0).then(|| uncast_s / best_cast_s)
}

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
    let read = first_load(Subject::PreadOnly, Mode::Raw);
    let label = format!("{} → {}", p.source.name, p.to.subject_name());
    let anchor = format!("{AUTO} owned, uncast, of {}", p.same_output.name);
    let mut pair = Pair::new(&label, Cache::Warm, anchor, CAST_GOAL);
    pair.subject = p.to.subject_name().to_owned();
    // The four runs of a round; every other round runs them in the reverse order, so that none
    // always runs on the same one's leftovers.
    let runs = [(p.source, &cast), (p.same_output, &uncast), (p.source, &read), (p.same_output, &read)];
    for i in 0..WARMUP_RUNS + runner.config().pair_runs {
        runner.steps.begin("pairs cast");
        let t = std::time::Instant::now();
        let mut samples: [Option<Sample>; 4] = Default::default();
        for k in 0..runs.len() {
            let which = if i % 2 == 0 { k } else { runs.len() - 1 - k };
            let (fixture, spec) = runs[which];
            let measured = runner
                .sample(fixture, spec)
                .with_context(|| format!("{} of {}", spec.label(), fixture.name))?;
            samples[which] = Some(measured.sample);
        }
        let [Some(c), Some(u), Some(read_source), Some(read_output)] = samples else {
            bail!("a run of round {i} of {label} was not measured");
        };
        let bound = memory_bound(u.seconds, read_source.seconds, read_output.seconds);
        let warmup = i < WARMUP_RUNS;
        if !warmup {
            pair.push(c.gbps, u.gbps);
            if let Some(b) = bound {
                pair.bounds.push(b);
                pair.of_bounds.extend(ratio(c.gbps, u.gbps).map(|r| r / b));
            }
        }
        let what = format!(
            "pairs cast {label} {i}: {:.2} vs {:.2} GB/s; read alone: source {:.3} s, output {:.3} s; memory bound {}{}",
            c.gbps,
            u.gbps,
            read_source.seconds,
            read_output.seconds,
            bound.map_or("none".to_owned(), |b| format!("{b:.2}")),
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

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn the_bound_is_the_uncast_load_over_it_plus_the_extra_reading() {
        // Equal reads: the cast may match the uncast load, no more.
        assert_eq!(memory_bound(0.33, 0.116, 0.116), Some(1.0));
        // F32 -> BF16 as measured on this VM: the source read 0.115 s longer, the bound ~0.74.
        let f32_to_bf16 = memory_bound(0.33, 0.231, 0.116).unwrap();
        assert!(close(f32_to_bf16, 0.33 / 0.445), "{f32_to_bf16}");
        assert!((0.74..0.75).contains(&f32_to_bf16), "{f32_to_bf16}");
        // BF16 -> F32: the source read shorter, the cast may beat the uncast load (a bound above
        // 1, not capped).
        let bf16_to_f32 = memory_bound(0.66, 0.116, 0.231).unwrap();
        assert!(close(bf16_to_f32, 0.66 / 0.545), "{bf16_to_f32}");
        assert!(bf16_to_f32 > 1.0);
    }

    #[test]
    fn no_bound_without_positive_times_or_a_positive_best_cast() {
        for (u, rs, ro) in [
            (f64::NAN, 0.2, 0.1),
            (0.3, f64::NAN, 0.1),
            (0.3, 0.2, f64::NAN),
            (0.0, 0.2, 0.1),
            (0.3, 0.0, 0.1),
            (0.3, 0.2, 0.0),
            (-0.3, 0.2, 0.1),
            (f64::INFINITY, 0.2, 0.1),
            (0.3, f64::INFINITY, 0.1),
            // The read saved is as long as the whole uncast load, or longer.
            (0.1, 0.1, 0.2),
            (0.1, 0.1, 0.5),
        ] {
            assert_eq!(memory_bound(u, rs, ro), None, "uncast {u}, reads {rs} and {ro}");
        }
    }

    #[test]
    fn a_pair_prints_its_bound_next_to_the_goal_it_does_not_change() {
        let mut p = Pair::new("f32 → bf16", Cache::Warm, "uncast".into(), CAST_GOAL);
        p.push(4.93, 6.67);
        p.push(5.0, 6.67);
        p.push(6.0, 6.67);
        for b in [0.74, 0.72, 0.76] {
            p.bounds.push(b);
        }
        p.of_bounds = p.ratios.iter().zip(&p.bounds).map(|(r, b)| r / b).collect();
        let line = p.line();
        assert!(
            line.contains("ratio 0.75 (0.74..0.90) (goal 0.80: missed); memory bound 0.74 (0.72..0.76): "),
            "{line}"
        );
        assert!(line.ends_with("1.04 (1.00..1.18) of the bound"), "{line}");
        assert_eq!(p.met(), Some(false));
        // An old report without bounds still parses, and a pair without bounds writes none.
        let mut json: serde_json::Value = serde_json::to_value(&p).unwrap();
        assert_eq!(json["bounds"], serde_json::json!([0.74, 0.72, 0.76]));
        json.as_object_mut().unwrap().retain(|k, _| k != "bounds" && k != "of_bounds");
        let old: Pair = serde_json::from_value(json).unwrap();
        assert!(old.bounds.is_empty() && old.bound_text().is_none());
        assert!(!serde_json::to_string(&old).unwrap().contains("bound"));
    }
}
