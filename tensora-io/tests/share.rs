//! Collective loads (`load_share`): the ranks' shares read every planned byte once in all, each
//! share within one read of an equal split, and the regions put together give exactly the tensors
//! of a single-process load.

mod support;

use std::sync::Arc;

use proptest::prelude::*;
use support::*;
use tensora_format::{Checkpoint, Dtype, Selection};
use tensora_io::{IoMode, LoadError, LoadOptions, Residence, ShareOf, load, load_share};

/// Every rank's share of `ckpt`, then every region copied into rank 0's arena, as a transport
/// would; checks the tensors against a single-process load and returns the bytes each rank read.
fn collective(ckpt: &Checkpoint, opts: &LoadOptions, world: usize) -> Vec<u64> {
    let mut shares: Vec<_> =
        (0..world).map(|r| load_share(ckpt, opts, ShareOf::new(r, world).unwrap()).unwrap()).collect();
    let read: Vec<u64> = shares.iter().map(|s| s.report().bytes_read).collect();
    for (r, s) in shares.iter().enumerate() {
        for other in &shares {
            assert_eq!(s.region(r), other.region(r), "every rank computes the same regions");
        }
    }
    // Populating the regions a transport will fill changes no byte (each rank's own included).
    for s in shares.iter_mut() {
        let own = s.share().rank();
        let before = s.region_mut(own).to_vec();
        let populated = s.populate_regions();
        let others: u64 = (0..world).filter(|&r| r != own).map(|r| s.region(r).end - s.region(r).start).sum();
        assert!(populated == 0 || populated >= others, "{populated} < {others}");
        assert_eq!(s.region_mut(own), &before[..]);
    }
    let (first, rest) = shares.split_at_mut(1);
    for (i, other) in rest.iter_mut().enumerate() {
        let rank = i + 1;
        let bytes = other.region_mut(rank).to_vec();
        first[0].region_mut(rank).copy_from_slice(&bytes);
    }
    let got = shares.swap_remove(0).finish();
    let want = load(ckpt, opts).unwrap();
    assert_eq!(got.len(), want.len());
    for t in want.tensors() {
        assert_eq!(got.tensor(t.name()).unwrap().bytes(), t.bytes(), "{} with {world} ranks", t.name());
    }
    // Shares are planned block-aligned whatever each rank's I/O decision (so every rank computes
    // the same regions): in all they read what one block-aligned load reads.
    let aligned = load(ckpt, &LoadOptions { io_mode: IoMode::Direct, ..opts.clone() }).unwrap();
    let whole = aligned.report().bytes_read;
    assert_eq!(read.iter().sum::<u64>(), whole, "storage is read once in all: {read:?}");
    read
}

#[test]
fn shares_of_a_sharded_checkpoint_read_it_once_and_rebuild_it() {
    let g = generate_mixed(31);
    let ckpt = g.open();
    let opts = LoadOptions { chunk_bytes: 64 << 10, ..LoadOptions::default() };
    for world in 1..=4 {
        let read = collective(&ckpt, &opts, world);
        let total: u64 = read.iter().sum();
        for r in &read {
            let off = (*r as f64 - total as f64 / world as f64).abs();
            assert!(off <= (64 << 10) as f64, "{world} ranks: {read:?} (one read of 64 KiB at most off)");
        }
    }
}

#[test]
fn shares_of_the_real_and_serverlessllm_fixtures_rebuild_them() {
    for (path, _) in real_fixtures() {
        let ckpt = tensora_format::open(&path).unwrap();
        for world in [2, 3, 4] {
            let opts = LoadOptions { chunk_bytes: 4096, ..LoadOptions::default() };
            collective(&ckpt, &opts, world);
        }
    }
}

#[test]
fn ranks_that_decide_their_io_differently_compute_the_same_regions() {
    let g = generate_mixed(7);
    let ckpt = g.open();
    let opts = |io_mode| LoadOptions { io_mode, chunk_bytes: 64 << 10, ..LoadOptions::default() };
    for world in [2, 3] {
        for rank in 0..world {
            let share = ShareOf::new(rank, world).unwrap();
            let buffered = load_share(&ckpt, &opts(IoMode::Buffered), share).unwrap();
            let direct = load_share(&ckpt, &opts(IoMode::Direct), share).unwrap();
            assert_eq!(buffered.regions(), direct.regions(), "rank {rank} of {world}");
        }
    }
}

#[test]
fn options_a_collective_load_cannot_honour_are_refused() {
    let ckpt = tensora_format::open(fixture("serverlessllm/tiny")).unwrap();
    let share = ShareOf::new(0, 2).unwrap();
    let hook = LoadOptions { on_tensor: Some(Arc::new(|_| Ok(()))), ..LoadOptions::default() };
    let priority = LoadOptions { priority: Some(vec!["embed.weight".into()]), ..LoadOptions::default() };
    let mapped = LoadOptions { residence: Residence::Mapped(files_unchanged()), ..LoadOptions::default() };
    for opts in [hook, priority, mapped] {
        assert!(matches!(load_share(&ckpt, &opts, share), Err(LoadError::Unsupported { .. })));
    }
    assert!(matches!(ShareOf::new(2, 2), Err(LoadError::Unsupported { .. })));
    assert!(matches!(ShareOf::new(0, 0), Err(LoadError::Unsupported { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Any layout, selection, chunk size and world size: the shares rebuild a single-process load
    /// and read the storage once.
    #[test]
    fn any_collective_load_rebuilds_the_single_process_load(
        sizes in proptest::collection::vec(1u64..40_000, 1..12),
        keep in proptest::collection::vec(any::<bool>(), 12),
        chunk in 4096u64..65_536,
        world in 1usize..6,
    ) {
        let g = generate(5, &[sizes.iter().map(|&n| (Dtype::U8, vec![n])).collect()]);
        let ckpt = g.open();
        let names: Vec<String> = ckpt.tensors().iter().enumerate()
            .filter(|(i, _)| keep[*i])
            .map(|(_, t)| t.name().to_owned())
            .collect();
        prop_assume!(!names.is_empty());
        let opts = LoadOptions { chunk_bytes: chunk, selection: Selection::Names(names), ..LoadOptions::default() };
        collective(&ckpt, &opts, world);
    }
}

#[test]
fn share_runs_rebuild_every_window_with_the_budget() {
    let g = generate_mixed(32);
    let ckpt = g.open();
    let opts = LoadOptions { budget_bytes: 256 << 10, chunk_bytes: 64 << 10, ..LoadOptions::default() };
    let world = 3;
    let mut ranks: Vec<_> = (0..world)
        .map(|r| tensora_io::load_share_runs(&ckpt, &opts, ShareOf::new(r, world).unwrap()).unwrap())
        .collect();
    let mut seen = 0;
    let mut windows = 0;
    loop {
        let step: Vec<_> = ranks.iter_mut().map(Iterator::next).collect();
        if step.iter().all(Option::is_none) {
            break;
        }
        let mut shares: Vec<_> =
            step.into_iter().map(|s| s.expect("every rank has the same windows").unwrap()).collect();
        windows += 1;
        let (first, rest) = shares.split_at_mut(1);
        for (i, other) in rest.iter_mut().enumerate() {
            let bytes = other.region_mut(i + 1).to_vec();
            first[0].region_mut(i + 1).copy_from_slice(&bytes);
        }
        let run = shares.swap_remove(0).finish();
        for t in run.tensors() {
            assert_eq!(t.bytes(), &g.data[t.name()][..], "{}", t.name());
            seen += 1;
        }
    }
    assert_eq!(seen, ckpt.tensors().len());
    assert!(windows > 1, "a 256 KiB budget cuts the 1.3 MB checkpoint into windows");
}
