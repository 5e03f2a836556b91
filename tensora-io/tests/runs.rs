//! `load_runs`: owned runs of consecutive tensors under the budget, each an independent `Loaded`.

mod support;

use proptest::prelude::*;
use support::{files_unchanged, fixture, generate_mixed};
use tensora_format::Selection;
use tensora_io::{IoMode, LoadError, LoadOptions, Residence, load, load_runs};

/// `(name, bytes)` of every tensor of every run, in delivery order, and the runs' tensor counts.
fn collect(ckpt: &tensora_format::Checkpoint, opts: &LoadOptions) -> (Vec<(String, Vec<u8>)>, Vec<usize>) {
    let mut tensors = Vec::new();
    let mut sizes = Vec::new();
    for run in load_runs(ckpt, opts).unwrap() {
        let run = run.unwrap();
        let bytes: u64 = run.tensors().map(|t| t.info().len_bytes()).sum();
        assert!(bytes <= opts.budget_bytes || run.len() == 1, "{bytes} bytes in {} tensors", run.len());
        assert_eq!(run.report().tensors, run.len());
        sizes.push(run.len());
        tensors.extend(run.tensors().map(|t| (t.name().to_owned(), t.bytes().to_vec())));
    }
    (tensors, sizes)
}

#[test]
fn runs_cover_the_selection_in_order_with_the_bytes_of_one_load() {
    let g = generate_mixed(21);
    let ckpt = g.open();
    let opts = LoadOptions { budget_bytes: 64 << 10, ..LoadOptions::default() };
    let (got, sizes) = collect(&ckpt, &opts);
    assert!(sizes.len() > 2, "a small budget makes several runs: {sizes:?}");
    let whole = load(&ckpt, &LoadOptions::default()).unwrap();
    let want: Vec<(String, Vec<u8>)> =
        whole.tensors().map(|t| (t.name().to_owned(), t.bytes().to_vec())).collect();
    assert_eq!(got, want);
    for (name, bytes) in &got {
        assert_eq!(bytes, &g.data[name], "{name}");
    }
}

#[test]
fn runs_keep_their_memory_after_later_runs_load() {
    let ckpt = tensora_format::open(fixture("serverlessllm/tiny")).unwrap();
    let opts = LoadOptions { budget_bytes: 16 << 10, ..LoadOptions::default() };
    let runs: Vec<_> = load_runs(&ckpt, &opts).unwrap().collect::<Result<_, _>>().unwrap();
    assert!(runs.len() > 1);
    let whole = load(&ckpt, &LoadOptions::default()).unwrap();
    for t in whole.tensors() {
        let found: Vec<_> = runs.iter().filter_map(|r| r.tensor(t.name())).collect();
        assert_eq!(found.len(), 1, "{} is in exactly one run", t.name());
        assert_eq!(found[0].bytes(), t.bytes(), "{}", t.name());
    }
}

#[test]
fn runs_follow_priority_and_mapped_residence() {
    let g = generate_mixed(22);
    let ckpt = g.open();
    let last = ckpt.tensors().last().unwrap().name().to_owned();
    let opts = LoadOptions {
        budget_bytes: 64 << 10,
        priority: Some(vec![last.clone()]),
        residence: Residence::Mapped(files_unchanged()),
        ..LoadOptions::default()
    };
    let mut runs = load_runs(&ckpt, &opts).unwrap();
    let first = runs.next().unwrap().unwrap();
    assert_eq!(first.tensors().next().unwrap().name(), last);
    assert_eq!(first.report().residence, "mapped");
    let rest: usize = runs.map(|r| r.unwrap().len()).sum();
    assert_eq!(first.len() + rest, ckpt.tensors().len());
}

#[test]
fn a_failed_run_ends_the_iterator_with_its_error() {
    let g = generate_mixed(23);
    let ckpt = g.open();
    let opts = LoadOptions { budget_bytes: 64 << 10, ..LoadOptions::default() };
    let mut runs = load_runs(&ckpt, &opts).unwrap();
    assert!(runs.next().unwrap().is_ok());
    // Replace a shard after the open: the next run that reads it fails, and nothing follows.
    std::fs::write(g.path().join("shard-02.safetensors"), b"gone").unwrap();
    let results: Vec<_> = runs.collect();
    let failed = results.iter().position(Result::is_err).expect("a run reads the replaced shard");
    assert_eq!(failed, results.len() - 1, "the error is the last item");
    let msg = results[failed].as_ref().err().unwrap().to_string();
    assert!(msg.contains("shard-02.safetensors"), "{msg}");
}

#[test]
fn a_bad_selection_fails_before_any_run() {
    let ckpt = tensora_format::open(fixture("serverlessllm/tiny")).unwrap();
    let opts = LoadOptions { selection: Selection::Names(vec!["nope".into()]), ..LoadOptions::default() };
    assert!(matches!(load_runs(&ckpt, &opts), Err(LoadError::Selection(_))));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Whatever the budget and selection, the runs deliver every selected tensor once, in order,
    /// each run under the budget unless it is a single tensor.
    #[test]
    fn runs_partition_any_selection_under_any_budget(
        mask in proptest::collection::vec(any::<bool>(), 67),
        budget_bytes in 1u64..200_000,
    ) {
        let ckpt = tensora_format::open(fixture("real/fracast-0.int8.safetensors")).unwrap();
        let picked: Vec<String> = ckpt
            .tensors()
            .iter()
            .enumerate()
            .filter(|(i, _)| mask.get(*i).copied().unwrap_or(true))
            .map(|(_, t)| t.name().to_owned())
            .collect();
        prop_assume!(!picked.is_empty());
        let opts = LoadOptions {
            budget_bytes,
            selection: Selection::Names(picked.clone()),
            ..LoadOptions::default()
        };
        let (got, _) = collect(&ckpt, &opts);
        let names: Vec<String> = got.into_iter().map(|(n, _)| n).collect();
        prop_assert_eq!(names, picked);
    }
}

#[test]
fn runs_hold_the_bytes_buffered_and_direct_into_memory_faulted_in_ahead() {
    let g = generate_mixed(24);
    let ckpt = g.open();
    for io_mode in [IoMode::Buffered, IoMode::Direct] {
        // Small runs: with direct reads every run after the first lands in an arena faulted in
        // while the one before loaded; buffered runs map their own.
        let opts = LoadOptions { budget_bytes: 48 << 10, io_mode, ..LoadOptions::default() };
        let (got, sizes) = collect(&ckpt, &opts);
        assert!(sizes.len() > 3, "{io_mode:?}: {sizes:?}");
        assert_eq!(got.len(), ckpt.tensors().len(), "{io_mode:?}");
        for (name, bytes) in &got {
            assert_eq!(bytes, &g.data[name], "{io_mode:?} {name}");
        }
    }
}
