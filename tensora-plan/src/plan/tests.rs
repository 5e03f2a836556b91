use proptest::prelude::*;

use super::sort::{RADIX_ITEMS_MIN, Shape, sorted_items};
use super::*;

fn ext(file: u32, offset_bytes: u64, len_bytes: u64, tag: u32) -> Extent {
    Extent { file, offset_bytes, len_bytes, tag }
}

fn cfg(align_bytes: u64, chunk_bytes: u64, coalesce_gap_bytes: u64, budget_bytes: u64) -> PlanConfig {
    PlanConfig { align_bytes, chunk_bytes, coalesce_gap_bytes, budget_bytes }
}

/// Deterministic file contents: byte `offset` of `file`.
fn file_byte(file: u32, offset: u64) -> u8 {
    (offset.wrapping_mul(0x9E37_79B9).wrapping_add(u64::from(file) * 131) >> 7) as u8
}

/// Executes the plan against synthetic files, in queue order, and checks that every extent's
/// bytes land where its location says. Independent of `Plan::check`.
fn simulate(plan: &Plan, extents: &[Extent]) -> Result<(), String> {
    let mut arena = vec![0u8; plan.arena_len_bytes() as usize];
    let mut landed = vec![0u32; extents.len()];
    for q in plan.queues() {
        for r in plan.queue_reads(q) {
            for i in 0..r.len_bytes {
                arena[(r.arena_offset_bytes + i) as usize] = file_byte(r.file, r.offset_bytes + i);
            }
            for p in plan.read_pieces(r) {
                landed[plan.extent_index(p.tag).ok_or("unknown tag")?] += 1;
            }
        }
    }
    for (i, e) in extents.iter().enumerate() {
        let loc = plan.locations()[i];
        if landed[i] != loc.reads_total {
            return Err(format!("{e:?}: {} of {} reads landed", landed[i], loc.reads_total));
        }
        for j in 0..e.len_bytes {
            if arena[(loc.arena_offset_bytes + j) as usize] != file_byte(e.file, e.offset_bytes + j) {
                return Err(format!("{e:?}: wrong byte {j}"));
            }
        }
    }
    Ok(())
}

#[test]
fn empty_input_is_an_empty_plan() {
    let plan = Plan::build(&[], &PlanConfig::default(), &Order::File).unwrap();
    assert!(plan.reads().is_empty() && plan.queues().is_empty() && plan.pieces().is_empty());
    assert_eq!((plan.arena_len_bytes(), plan.bytes_selected(), plan.bytes_read()), (0, 0, 0));
    assert_eq!(plan.location(0), None);
    plan.check(&[]).unwrap();
}

#[test]
fn zero_length_extents_get_a_location_and_no_reads() {
    let extents = [ext(0, 100, 0, 7), ext(0, 10, 5, 8), ext(3, 0, 0, 9)];
    let plan = Plan::build(&extents, &PlanConfig::default(), &Order::File).unwrap();
    let empty = plan.location(7).unwrap();
    assert_eq!((empty.len_bytes, empty.reads_total), (0, 0));
    assert_eq!(plan.location(9).unwrap().reads_total, 0);
    assert_eq!(plan.reads().len(), 1);
    assert_eq!(plan.queues(), &[FileQueue { file: 0, reads: 0..1 }]);
    assert_eq!(plan.bytes_selected(), 5);
    simulate(&plan, &extents).unwrap();
}

#[test]
fn one_extent_larger_than_the_budget_is_split_into_budget_sized_reads() {
    let extents = [ext(0, 4096, 10_000, 1)];
    let plan = Plan::build(&extents, &cfg(1, 1 << 20, 0, 4096), &Order::File).unwrap();
    let lens: Vec<u64> = plan.reads().iter().map(|r| r.len_bytes).collect();
    assert_eq!(lens, vec![4096, 4096, 1808]);
    assert_eq!(plan.location(1).unwrap().reads_total, 3);
    assert_eq!(plan.bytes_read(), 10_000);
    simulate(&plan, &extents).unwrap();
}

#[test]
fn align_4096_rounds_unaligned_extents_out_and_keeps_their_alignment() {
    let extents = [ext(0, 5000, 100, 0), ext(0, 9000, 8, 1), ext(1, 123, 10, 2)];
    let config = cfg(4096, 1 << 20, 0, 1 << 30);
    let plan = Plan::build(&extents, &config, &Order::File).unwrap();
    // 5000..5100 and 9000..9008 share aligned block 8192..12288 with 4096..8192: one run.
    assert_eq!(plan.reads()[0].offset_bytes, 4096);
    assert_eq!(plan.reads()[0].len_bytes, 8192);
    assert_eq!(plan.bytes_selected(), 118);
    assert_eq!(plan.bytes_read(), 8192 + 4096);
    for (e, loc) in extents.iter().zip(plan.locations()) {
        assert_eq!(loc.arena_offset_bytes % 4096, e.offset_bytes % 4096);
    }
    for r in plan.reads() {
        assert_eq!((r.offset_bytes % 4096, r.len_bytes % 4096, r.arena_offset_bytes % 4096), (0, 0, 0));
    }
    simulate(&plan, &extents).unwrap();
}

#[test]
fn file_lengths_end_the_final_read_at_eof() {
    let extents = [ext(0, 4000, 1000, 0)];
    let config = cfg(4096, 1 << 20, 0, 1 << 30);
    let plan = Plan::build_with_file_lens(&extents, &config, &Order::File, &[6000]).unwrap();
    assert_eq!(plan.reads()[0].offset_bytes, 0);
    assert_eq!(plan.reads()[0].len_bytes, 6000);
    let unbounded = Plan::build(&extents, &config, &Order::File).unwrap();
    assert_eq!(unbounded.reads()[0].len_bytes, 8192);
    assert_eq!(
        Plan::build_with_file_lens(&extents, &config, &Order::File, &[4999]).unwrap_err(),
        PlanError::ExtentPastEof { tag: 0, file: 0, end_bytes: 5000, file_len_bytes: 4999 }
    );
    assert_eq!(
        Plan::build_with_file_lens(&[ext(2, 0, 1, 5)], &config, &Order::File, &[10]).unwrap_err(),
        PlanError::UnknownFile { tag: 5, file: 2, files: 1 }
    );
}

#[test]
fn offsets_near_u64_max_are_errors_not_panics() {
    let config = PlanConfig::default();
    let overflow = [ext(0, u64::MAX - 10, 11, 3)];
    assert!(matches!(Plan::build(&overflow, &config, &Order::File), Err(PlanError::Overflow { tag: 3, .. })));
    // Ends exactly at u64::MAX: fine with align 1.
    let edge = [ext(0, u64::MAX - 10, 10, 3)];
    let plan = Plan::build(&edge, &config, &Order::File).unwrap();
    assert_eq!(plan.location(3).unwrap().arena_offset_bytes % 4096, (u64::MAX - 10) % 4096);
    // ...but aligned to 4096 its end would overflow, unless the file length bounds it.
    let direct = cfg(4096, 1 << 20, 0, 1 << 30);
    assert!(matches!(Plan::build(&edge, &direct, &Order::File), Err(PlanError::Overflow { .. })));
    let plan = Plan::build_with_file_lens(&edge, &direct, &Order::File, &[u64::MAX]).unwrap();
    assert_eq!(plan.reads()[0].offset_bytes + plan.reads()[0].len_bytes, u64::MAX);
    // Offset 0.
    let plan = Plan::build(&[ext(0, 0, 1, 0)], &direct, &Order::File).unwrap();
    assert_eq!((plan.reads()[0].offset_bytes, plan.reads()[0].len_bytes), (0, 4096));
}

#[test]
fn an_oversized_arena_is_an_error() {
    let extents = [ext(0, 0, u64::MAX / 2 + 1, 0), ext(1, 0, u64::MAX / 2 + 1, 1)];
    let config = cfg(1, u64::MAX, 0, u64::MAX);
    assert_eq!(Plan::build(&extents, &config, &Order::File).unwrap_err(), PlanError::ArenaOverflow);
}

#[test]
fn read_and_piece_counts_are_bounded_before_allocating() {
    let config = cfg(1, 1, 0, 1 << 30);
    let err = Plan::build(&[ext(0, 0, 1 << 40, 0)], &config, &Order::File).unwrap_err();
    assert_eq!(err, PlanError::TooManyReads { reads: 1 << 40, max: READS_MAX });
    // Many tied copies of one extent: few reads, too many pieces.
    let config = cfg(1, 64, 0, 1 << 30);
    let tied: Vec<Extent> = (0..5000).map(|t| ext(0, 0, 1 << 20, t)).collect();
    assert!(matches!(
        Plan::build(&tied, &config, &Order::File),
        Err(PlanError::TooManyPieces { max: PIECES_MAX, .. })
    ));
}

#[test]
fn bad_configs_and_inputs_are_typed_errors() {
    for bad in [cfg(3, 8, 0, 8), cfg(0, 8, 0, 8), cfg(4096, 1024, 0, 1 << 20), cfg(4096, 8192, 0, 100)] {
        assert!(matches!(Plan::build(&[], &bad, &Order::File), Err(PlanError::InvalidConfig { .. })));
    }
    let dup = [ext(0, 0, 4, 1), ext(0, 8, 4, 1)];
    assert_eq!(
        Plan::build(&dup, &PlanConfig::default(), &Order::File).unwrap_err(),
        PlanError::DuplicateTag { tag: 1 }
    );
    let sparse_dup = [ext(0, 0, 4, u32::MAX), ext(0, 8, 4, u32::MAX)];
    assert_eq!(
        Plan::build(&sparse_dup, &PlanConfig::default(), &Order::File).unwrap_err(),
        PlanError::DuplicateTag { tag: u32::MAX }
    );
    assert_eq!(
        Plan::build(&[ext(0, 0, 4, 1)], &PlanConfig::default(), &Order::Priority(vec![2])).unwrap_err(),
        PlanError::UnknownPriorityTag { tag: 2 }
    );
}

#[test]
fn tied_extents_are_read_once_and_share_arena_bytes() {
    let extents = [ext(0, 0, 100, 0), ext(0, 0, 100, 1), ext(0, 50, 100, 2)];
    let plan = Plan::build(&extents, &PlanConfig::default(), &Order::File).unwrap();
    assert_eq!((plan.bytes_selected(), plan.bytes_read()), (150, 150));
    assert_eq!(plan.location(0).unwrap().arena_offset_bytes, plan.location(1).unwrap().arena_offset_bytes);
    assert_eq!(
        plan.location(2).unwrap().arena_offset_bytes,
        plan.location(0).unwrap().arena_offset_bytes + 50
    );
    assert_eq!(plan.read_pieces(&plan.reads()[0]).len(), 3);
    simulate(&plan, &extents).unwrap();
}

#[test]
fn gaps_are_read_through_only_below_the_coalesce_gap() {
    let extents = [ext(0, 0, 10, 0), ext(0, 20, 10, 1), ext(0, 100, 10, 2)];
    let plan = Plan::build(&extents, &cfg(1, 1 << 20, 11, 1 << 30), &Order::File).unwrap();
    let spans: Vec<(u64, u64)> = plan.reads().iter().map(|r| (r.offset_bytes, r.len_bytes)).collect();
    assert_eq!(spans, vec![(0, 30), (100, 10)]);
    assert_eq!(plan.bytes_overhead(), 10);
    // Gap exactly the coalesce gap: not read through.
    let plan = Plan::build(&extents, &cfg(1, 1 << 20, 10, 1 << 30), &Order::File).unwrap();
    assert_eq!(plan.reads().len(), 3);
    // A gap larger than a whole read is never read through.
    let plan = Plan::build(&extents, &cfg(1, 16, 1 << 20, 1 << 30), &Order::File).unwrap();
    assert_eq!(plan.bytes_read(), 40);
    // Adjacent extents share reads even with coalescing off.
    let adjacent = [ext(0, 0, 10, 0), ext(0, 10, 10, 1)];
    let plan = Plan::build(&adjacent, &cfg(1, 1 << 20, 0, 1 << 30), &Order::File).unwrap();
    assert_eq!(plan.reads().len(), 1);
}

#[test]
fn priority_orders_reads_within_and_across_files() {
    let extents = [ext(0, 0, 10, 0), ext(0, 1000, 10, 1), ext(1, 0, 10, 2), ext(1, 1000, 10, 3)];
    let config = cfg(1, 1 << 20, 0, 1 << 30);
    let plan = Plan::build(&extents, &config, &Order::Priority(vec![3, 1])).unwrap();
    let order: Vec<(u32, u64)> = plan.reads().iter().map(|r| (r.file, r.offset_bytes)).collect();
    assert_eq!(order, vec![(1, 1000), (1, 0), (0, 1000), (0, 0)]);
    assert_eq!(plan.queues(), &[FileQueue { file: 1, reads: 0..2 }, FileQueue { file: 0, reads: 2..4 }]);
    let file_order = Plan::build(&extents, &config, &Order::File).unwrap();
    let order: Vec<(u32, u64)> = file_order.reads().iter().map(|r| (r.file, r.offset_bytes)).collect();
    assert_eq!(order, vec![(0, 0), (0, 1000), (1, 0), (1, 1000)]);
}

#[test]
fn tag_indexes_fit_the_tags() {
    let extents = [ext(0, 0, 4, 4_000_000_000), ext(0, 8, 4, 17), ext(0, 16, 0, 99_999)];
    let plan = Plan::build(&extents, &PlanConfig::default(), &Order::Priority(vec![17])).unwrap();
    assert!(matches!(plan.tags, TagIndex::Sorted(_)));
    assert_eq!(plan.extent_index(4_000_000_000), Some(0));
    assert_eq!(plan.extent_index(17), Some(1));
    assert_eq!(plan.extent_index(99_999), Some(2));
    assert_eq!(plan.extent_index(18), None);
    let identity = [ext(0, 0, 4, 0), ext(0, 8, 4, 1), ext(1, 0, 4, 2)];
    let plan = Plan::build(&identity, &PlanConfig::default(), &Order::Priority(vec![2])).unwrap();
    assert!(matches!(plan.tags, TagIndex::Identity(3)));
    assert_eq!((plan.extent_index(2), plan.extent_index(3)), (Some(2), None));
    assert_eq!(
        Plan::build(&identity, &PlanConfig::default(), &Order::Priority(vec![3])).unwrap_err(),
        PlanError::UnknownPriorityTag { tag: 3 }
    );
    let dense = [ext(0, 0, 4, 1), ext(0, 8, 4, 0)];
    let plan = Plan::build(&dense, &PlanConfig::default(), &Order::File).unwrap();
    assert!(matches!(plan.tags, TagIndex::Dense(_)));
    assert_eq!(plan.extent_index(0), Some(1));
}

/// `check` must be able to fail: corrupt a good plan in each way it guards against.
#[test]
fn check_rejects_corrupted_plans() {
    let extents = [ext(0, 0, 100, 0), ext(0, 5000, 100, 1), ext(1, 0, 50, 2)];
    let config = cfg(1, 64, 16, 1 << 30);
    let good = Plan::build(&extents, &config, &Order::File).unwrap();
    good.check(&extents).unwrap();
    type Corruption = (&'static str, Box<dyn Fn(&mut Plan)>);
    let corruptions: Vec<Corruption> = vec![
        ("overlapping reads", Box::new(|p| p.reads[1].offset_bytes -= 1)),
        ("shifted arena", Box::new(|p| p.reads[0].arena_offset_bytes += 1)),
        ("too long", Box::new(|p| p.reads[0].len_bytes = 65)),
        ("lost piece", Box::new(|p| p.reads[0].pieces.end -= 1)),
        ("wrong count", Box::new(|p| p.locations[0].reads_total += 1)),
        ("selected", Box::new(|p| p.bytes_selected += 1)),
        ("read", Box::new(|p| p.bytes_read -= 1)),
        ("arena", Box::new(|p| p.arena_len_bytes += 1)),
        ("queue order", Box::new(|p| p.queues.reverse())),
        ("read order", Box::new(|p| p.reads.swap(0, 1))),
        (
            "extra read",
            Box::new(|p| {
                let mut r = p.reads[1].clone();
                r.offset_bytes += 4096;
                r.arena_offset_bytes = p.arena_len_bytes + 4096;
                p.arena_len_bytes = r.arena_offset_bytes + r.len_bytes;
                p.reads.push(r);
            }),
        ),
    ];
    for (what, corrupt) in corruptions {
        let mut bad = good.clone();
        corrupt(&mut bad);
        assert!(bad.check(&extents).is_err(), "check missed: {what}");
    }
    let mut missing = extents.to_vec();
    missing[1].len_bytes += 1;
    assert!(good.check(&missing).is_err(), "check missed an uncovered byte");
    // Foreign extents give an error, not a panic.
    let mut foreign = extents.to_vec();
    foreign[0].offset_bytes = u64::MAX;
    assert!(good.check(&foreign).is_err());
    assert!(good.check(&extents[..2]).is_err());
    let with_lens = Plan::build_with_file_lens(&extents, &config, &Order::File, &[6000, 50]).unwrap();
    let mut other_file = extents.to_vec();
    other_file[2].file = 7;
    assert!(with_lens.check(&other_file).is_err());
}

fn sort_by_comparison(extents: &[Extent]) -> Vec<(u32, u64, u64, u32)> {
    let mut want: Vec<(u32, u64, u64, u32)> = extents
        .iter()
        .enumerate()
        .filter(|(_, e)| e.len_bytes > 0)
        .map(|(i, e)| (e.file, e.offset_bytes, e.offset_bytes + e.len_bytes, i as u32))
        .collect();
    want.sort_unstable_by_key(|&(file, offset, _, index)| (file, offset, index));
    want
}

/// The first position where two sorted lists differ (short failure messages).
fn first_difference<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
    (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))
}

fn sorted_items_of(extents: &[Extent]) -> Vec<(u32, u64, u64, u32)> {
    let mut shape = Shape::default();
    let mut prev = (0, 0);
    for e in extents.iter().filter(|e| e.len_bytes > 0) {
        shape.add(e, &mut prev);
    }
    sorted_items(extents, &shape).iter().map(|i| (i.file, i.offset_bytes, i.end_bytes, i.index)).collect()
}

#[test]
fn large_shuffled_inputs_take_the_radix_path_and_plan_correctly() {
    let n = RADIX_ITEMS_MIN * 2 + 17;
    let mut x: u64 = 0x1234_5678;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut extents: Vec<Extent> =
        (0..n as u32).map(|t| ext((next() % 5) as u32, next() % (1 << 34), next() % 70_000, t)).collect();
    extents[3] = ext(2, extents[2].offset_bytes, 9, 3); // a duplicate offset somewhere
    assert_eq!(first_difference(&sorted_items_of(&extents), &sort_by_comparison(&extents)), None);
    let config = cfg(4096, 1 << 20, 1 << 16, 1 << 30);
    let plan = Plan::build(&extents, &config, &Order::File).unwrap();
    plan.check(&extents).unwrap();
    // Same plan from the sorted input (the in-place path).
    let mut sorted = extents.clone();
    sorted.sort_by_key(|e| (e.file, e.offset_bytes));
    let in_place = Plan::build(&sorted, &config, &Order::File).unwrap();
    same_plan(&plan, &in_place, &extents).unwrap();
}

/// Two plans of the same extents in different input orders agree on everything but the order
/// of `locations` and of tied pieces inside one read.
fn same_plan(a: &Plan, b: &Plan, extents: &[Extent]) -> Result<(), String> {
    let totals = |p: &Plan| (p.arena_len_bytes(), p.bytes_selected(), p.bytes_read());
    if a.queues() != b.queues() || totals(a) != totals(b) || a.reads().len() != b.reads().len() {
        return Err("queues or totals differ".into());
    }
    for (ra, rb) in a.reads().iter().zip(b.reads()) {
        let key = |r: &Read| (r.file, r.offset_bytes, r.len_bytes, r.arena_offset_bytes);
        let mut pa = a.read_pieces(ra).to_vec();
        let mut pb = b.read_pieces(rb).to_vec();
        pa.sort_by_key(|p| p.tag);
        pb.sort_by_key(|p| p.tag);
        if key(ra) != key(rb) || pa != pb {
            return Err(format!("reads differ: {ra:?} vs {rb:?}"));
        }
    }
    match extents.iter().find(|e| a.location(e.tag) != b.location(e.tag)) {
        Some(e) => Err(format!("locations of {e:?} differ")),
        None => Ok(()),
    }
}

fn arb_config() -> impl Strategy<Value = PlanConfig> {
    (0u32..=12, 0u64..6, 0u64..3000, 0u64..6, any::<bool>()).prop_map(
        |(align_pow, chunk_x, gap, budget_x, small)| {
            let align = 1u64 << align_pow;
            let chunk =
                if small { align * (chunk_x + 1) } else { align * (chunk_x + 1) * 64 + align * chunk_x };
            PlanConfig {
                align_bytes: align,
                chunk_bytes: chunk + chunk_x % 3, // sometimes not a multiple of align
                coalesce_gap_bytes: gap,
                budget_bytes: align * (budget_x + 1) * 3,
            }
        },
    )
}

/// Extents clustered in small files, so overlaps, ties, touching and gaps all happen.
fn arb_extents() -> impl Strategy<Value = Vec<Extent>> {
    prop::collection::vec((0u32..3, 0u64..20_000, 0u64..3000, 0u8..8), 0..40).prop_map(|raw| {
        let mut out: Vec<Extent> = Vec::with_capacity(raw.len());
        for (i, (file, offset, len, kind)) in raw.into_iter().enumerate() {
            let (offset, len) = match (kind, out.last()) {
                // Tied with the previous extent.
                (0, Some(prev)) if prev.file == file => (prev.offset_bytes, prev.len_bytes),
                // Touching the previous extent.
                (1, Some(prev)) if prev.file == file => (prev.offset_bytes + prev.len_bytes, len),
                (2, _) => (offset, 0),
                _ => (offset, len),
            };
            out.push(Extent { file, offset_bytes: offset, len_bytes: len, tag: (i as u32) * 3 + 1 });
        }
        out
    })
}

fn arb_order(n: usize) -> impl Strategy<Value = Order> {
    prop_oneof![
        Just(Order::File),
        prop::collection::vec(0..n.max(1), 0..n + 2).prop_map(move |picks| {
            Order::Priority(picks.into_iter().filter(|&i| i < n).map(|i| (i as u32) * 3 + 1).collect())
        })
    ]
}

fn arb_case() -> impl Strategy<Value = (Vec<Extent>, PlanConfig, Order)> {
    (arb_extents(), arb_config()).prop_flat_map(|(extents, config)| {
        let n = extents.len();
        (Just(extents), Just(config), arb_order(n))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Every invariant (`Plan::check`) and the end-to-end byte check hold for random inputs.
    #[test]
    fn random_plans_satisfy_every_invariant((extents, config, order) in arb_case()) {
        let plan = Plan::build(&extents, &config, &order).unwrap();
        prop_assert_eq!(plan.check(&extents), Ok(()));
        prop_assert_eq!(simulate(&plan, &extents), Ok(()));
    }

    /// With file lengths, no read passes EOF, and reads not ending at EOF stay aligned.
    #[test]
    fn random_plans_with_file_lengths((extents, config, order) in arb_case(), slack in 0u64..5000) {
        let mut lens = vec![0u64; 3];
        for e in &extents {
            let end = e.offset_bytes + e.len_bytes;
            lens[e.file as usize] = lens[e.file as usize].max(end);
        }
        for len in &mut lens {
            *len += slack;
        }
        let plan = Plan::build_with_file_lens(&extents, &config, &order, &lens).unwrap();
        prop_assert_eq!(plan.check(&extents), Ok(()));
        prop_assert_eq!(simulate(&plan, &extents), Ok(()));
        for r in plan.reads() {
            prop_assert!(r.offset_bytes + r.len_bytes <= lens[r.file as usize]);
        }
    }

    /// The arena is bounded by the selected bytes plus a documented slack per extent.
    #[test]
    fn arena_slack_is_bounded((extents, config, order) in arb_case()) {
        let plan = Plan::build(&extents, &config, &order).unwrap();
        let nonempty = extents.iter().filter(|e| e.len_bytes > 0).count() as u64;
        let bound = plan.bytes_selected() + nonempty * config.arena_slack_per_extent_bytes();
        prop_assert!(plan.arena_len_bytes() <= bound, "{} > {}", plan.arena_len_bytes(), bound);
    }

    /// Overhead is reported and bounded: per requested run, alignment padding on both sides,
    /// and each gap read through is below the effective coalesce gap.
    #[test]
    fn overhead_is_bounded((extents, config, order) in arb_case()) {
        let plan = Plan::build(&extents, &config, &order).unwrap();
        let runs = extents.iter().filter(|e| e.len_bytes > 0).count() as u64;
        let pad = 2 * (config.align_bytes - 1);
        let bound = runs * pad + runs.saturating_sub(1) * config.coalesce_gap_effective_bytes();
        prop_assert!(plan.bytes_overhead() <= bound, "{} > {}", plan.bytes_overhead(), bound);
        prop_assert_eq!(plan.bytes_read(), plan.bytes_selected() + plan.bytes_overhead());
    }

    /// The most urgent tag is carried by the very first read of the plan.
    #[test]
    fn the_most_urgent_tag_is_read_first((extents, config, order) in arb_case()) {
        let plan = Plan::build(&extents, &config, &order).unwrap();
        if let Order::Priority(tags) = &order
            && let Some(&first) = tags.iter().find(|&&t| plan.location(t).is_some_and(|l| l.len_bytes > 0))
        {
            let carried = plan.read_pieces(&plan.reads()[0]).iter().any(|p| p.tag == first);
            prop_assert!(carried, "tag {} not in the first read", first);
        }
    }

    /// Partial loads of a packed, safetensors-like layout: the plan reads every selected byte,
    /// counts each once, and stays within the overhead rules.
    #[test]
    fn random_selections_of_a_packed_layout(
        lens in prop::collection::vec(0u64..5000, 1..60),
        mask in prop::collection::vec(any::<bool>(), 60),
        config in arb_config(),
        header_bytes in 8u64..300,
    ) {
        let mut offset = header_bytes;
        let mut all = Vec::with_capacity(lens.len());
        for (i, &len) in lens.iter().enumerate() {
            all.push(Extent { file: 0, offset_bytes: offset, len_bytes: len, tag: i as u32 });
            offset += len;
        }
        let selected: Vec<Extent> = all.iter().zip(&mask).filter(|(_, m)| **m).map(|(e, _)| *e).collect();
        let plan = Plan::build_with_file_lens(&selected, &config, &Order::File, &[offset]).unwrap();
        prop_assert_eq!(plan.check(&selected), Ok(()));
        prop_assert_eq!(simulate(&plan, &selected), Ok(()));
        prop_assert_eq!(plan.bytes_selected(), selected.iter().map(|e| e.len_bytes).sum::<u64>());
        prop_assert!(plan.bytes_read() <= offset);
        if selected.len() == all.len() && config.align_bytes == 1 {
            // Everything selected, unaligned: exactly the tensor bytes are read.
            prop_assert_eq!(plan.bytes_read(), offset - header_bytes);
        }
    }

    /// The plan does not depend on the input order (in-place, sorted and radix paths agree),
    /// apart from the order of `locations` and of tied pieces inside one read.
    #[test]
    fn input_order_does_not_change_the_plan((extents, config, order) in arb_case(), seed in any::<u64>()) {
        let mut sorted = extents.clone();
        sorted.sort_by_key(|e| (e.file, e.offset_bytes));
        let mut shuffled = sorted.clone();
        let mut x = seed | 1;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let a = Plan::build(&sorted, &config, &order).unwrap();
        let b = Plan::build(&shuffled, &config, &order).unwrap();
        prop_assert_eq!(same_plan(&a, &b, &extents), Ok(()));
    }

    /// The radix and merge paths sort exactly like a comparison sort (ties by input position).
    #[test]
    fn radix_sort_matches_a_comparison_sort(
        seed in any::<u64>(),
        offset_bits in 1u32..48,
        files in 1u32..1000,
        n in RADIX_ITEMS_MIN..RADIX_ITEMS_MIN + 600,
        runs in 0usize..4,
    ) {
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut extents: Vec<Extent> = (0..n as u32)
            .map(|t| ext((next() % u64::from(files)) as u32, next() % (1 << offset_bits), next() % 3, t))
            .collect();
        if runs > 0 {
            // A few long sorted runs: the merge path.
            for chunk in extents.chunks_mut(n.div_ceil(runs)) {
                chunk.sort_by_key(|e| (e.file, e.offset_bytes));
            }
        }
        prop_assert_eq!(first_difference(&sorted_items_of(&extents), &sort_by_comparison(&extents)), None);
    }

    /// Overflowing inputs give typed errors, never panics; valid ones still pass the check.
    #[test]
    fn huge_offsets_never_panic(
        raw in prop::collection::vec((0u32..2, u64::MAX - 100_000..=u64::MAX, 0u64..200_000), 1..8),
        config in arb_config(),
    ) {
        let extents: Vec<Extent> = raw.iter().enumerate().map(|(i, &(file, offset_bytes, len_bytes))| {
            Extent { file, offset_bytes, len_bytes, tag: i as u32 }
        }).collect();
        match Plan::build(&extents, &config, &Order::File) {
            Ok(plan) => prop_assert_eq!(plan.check(&extents), Ok(())),
            Err(PlanError::Overflow { .. } | PlanError::ArenaOverflow | PlanError::TooManyReads { .. }) => {}
            Err(other) => prop_assert!(false, "unexpected error {}", other),
        }
    }
}
