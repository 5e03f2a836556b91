//! Sharded loads (`LoadOptions::shard`) on real files: every landed slice equals `narrow` of the
//! whole tensor, contiguous, through every runnable backend, buffered and direct; bad slices,
//! ranks and hooks are typed errors naming what is wrong.

mod support;

use std::sync::Arc;

use proptest::prelude::*;
use support::{generate, runnable_backends};
use tensora_format::{Dtype, Shard, Slice, Split, TensorParallel, TpRules};
use tensora_io::{BackendChoice, IoMode, LoadError, LoadOptions, load};

/// `narrow(dim, start, len)` of a row-major tensor's bytes, made contiguous.
fn narrow(bytes: &[u8], shape: &[u64], elem_bytes: u64, slice: Slice) -> Vec<u8> {
    let outer: u64 = shape[..slice.dim].iter().product();
    let inner: u64 = shape[slice.dim + 1..].iter().product::<u64>() * elem_bytes;
    let mut out = Vec::new();
    for o in 0..outer {
        let row = o * shape[slice.dim] * inner;
        let from = (row + slice.start * inner) as usize;
        out.extend_from_slice(&bytes[from..from + (slice.len * inner) as usize]);
    }
    out
}

fn options(backend: &str, io_mode: IoMode, shard: Shard) -> LoadOptions {
    LoadOptions {
        backend: BackendChoice::Named(backend.to_owned()),
        io_mode,
        shard: Some(shard),
        ..LoadOptions::default()
    }
}

const DTYPES: [(Dtype, u64); 4] = [(Dtype::U8, 1), (Dtype::BF16, 2), (Dtype::F32, 4), (Dtype::F64, 8)];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random shapes, dtypes and slices: each landed tensor is `narrow` of the whole one, with
    /// the narrowed shape, whichever way the planner read it.
    #[test]
    fn landed_slices_equal_narrow_of_the_whole_tensor(
        tensors in prop::collection::vec(
            (prop::collection::vec(1u64..40, 1..4), 0usize..4, any::<(prop::sample::Index, u64, u64)>()),
            1..6,
        ),
        seed in any::<u64>(),
    ) {
        let specs: Vec<(Dtype, Vec<u64>)> = tensors.iter().map(|(shape, d, _)| (DTYPES[*d].0, shape.clone())).collect();
        let g = generate(seed, &[specs]);
        let ckpt = g.open();
        let mut named = Vec::new();
        for (i, (shape, _, pick)) in tensors.iter().enumerate() {
            let dim = pick.0.index(shape.len());
            let start = pick.1 % shape[dim];
            let len = pick.2 % (shape[dim] - start + 1);
            named.push((format!("s0.t{i}"), Slice { dim, start, len }));
        }
        for backend in runnable_backends().into_iter().filter(|b| *b != "mmap") {
            for io_mode in [IoMode::Buffered, IoMode::Direct] {
                let loaded = load(&ckpt, &options(backend, io_mode, Shard::Slices(named.clone()))).unwrap();
                prop_assert_eq!(loaded.len(), tensors.len());
                for (i, (shape, d, _)) in tensors.iter().enumerate() {
                    let (name, slice) = &named[i];
                    let t = loaded.tensor(name).unwrap();
                    let want = narrow(&g.data[name], shape, DTYPES[*d].1, *slice);
                    prop_assert_eq!(t.bytes(), &want[..], "{} {:?} {} {:?}", name, slice, backend, io_mode);
                    let mut narrowed = shape.clone();
                    narrowed[slice.dim] = slice.len;
                    prop_assert_eq!(t.shape(), &narrowed[..]);
                }
                let r = loaded.report();
                prop_assert_eq!(r.slices.contiguous + r.slices.strided + r.slices.covering, tensors.len());
            }
        }
    }
}

fn llama_like(seed: u64) -> support::Generated {
    generate(
        seed,
        &[vec![
            (Dtype::F16, vec![10, 6]), // s0.t0: column (q_proj)
            (Dtype::F16, vec![6, 10]), // s0.t1: row (o_proj)
            (Dtype::F32, vec![6]),     // s0.t2: replicated (norm)
        ]],
    )
}

fn llama_like_rules() -> TpRules {
    TpRules::new(vec![("s0.t0".into(), Split::Column), ("s0.t1".into(), Split::Row)]).unwrap()
}

/// Three ranks of an uneven split (10 = 4 + 4 + 2, as torch.chunk) put back together are the
/// whole tensors; the replicated tensor is whole on every rank; each rank reads its share only.
#[test]
fn tensor_parallel_ranks_are_torch_chunk_and_tile_the_tensors() {
    let g = llama_like(7);
    let ckpt = g.open();
    let world = 3;
    let mut column = Vec::new();
    let mut row_parts = Vec::new();
    for rank in 0..world {
        let tp = TensorParallel { rank, world, rules: llama_like_rules() };
        let loaded = load(&ckpt, &options("sync", IoMode::Buffered, Shard::TensorParallel(tp))).unwrap();
        let q = loaded.tensor("s0.t0").unwrap();
        assert_eq!(q.shape(), &[[4u64, 4, 2][rank as usize], 6]);
        column.extend_from_slice(q.bytes());
        let o = loaded.tensor("s0.t1").unwrap();
        assert_eq!(o.shape(), &[6, [4u64, 4, 2][rank as usize]]);
        row_parts.push(o.bytes().to_vec());
        assert_eq!(loaded.tensor("s0.t2").unwrap().bytes(), &g.data["s0.t2"][..]);
        let r = loaded.report();
        assert_eq!(r.bytes_selected, q.bytes().len() as u64 + o.bytes().len() as u64 + 24);
        assert!(r.bytes_read >= r.bytes_selected, "{r:?}");
    }
    assert_eq!(column, g.data["s0.t0"]);
    let mut rows = Vec::new();
    for r in 0..6 {
        for part in &row_parts {
            let w = part.len() / 6;
            rows.extend_from_slice(&part[r * w..(r + 1) * w]);
        }
    }
    assert_eq!(rows, g.data["s0.t1"]);
}

#[test]
fn bad_slices_ranks_and_hooks_are_typed_errors() {
    let g = llama_like(1);
    let ckpt = g.open();
    let past = Shard::Slices(vec![("s0.t1".into(), Slice { dim: 1, start: 8, len: 3 })]);
    let e = load(&ckpt, &options("sync", IoMode::Buffered, past)).unwrap_err();
    assert!(matches!(e, LoadError::Shard(_)) && e.to_string().contains("s0.t1"), "{e}");
    let missing = Shard::Slices(vec![("nope".into(), Slice { dim: 0, start: 0, len: 1 })]);
    let e = load(&ckpt, &options("sync", IoMode::Buffered, missing)).unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    let rank = Shard::TensorParallel(TensorParallel { rank: 3, world: 3, rules: llama_like_rules() });
    let e = load(&ckpt, &options("sync", IoMode::Buffered, rank)).unwrap_err();
    assert!(matches!(e, LoadError::Shard(tensora_format::TpError::Rank { rank: 3, world: 3 })), "{e}");
    let row_of_1d = TpRules::new(vec![("s0.t2".into(), Split::Row)]).unwrap();
    let tp = Shard::TensorParallel(TensorParallel { rank: 0, world: 2, rules: row_of_1d });
    let e = load(&ckpt, &options("sync", IoMode::Buffered, tp)).unwrap_err();
    assert!(e.to_string().contains("s0.t2"), "{e}");
    let hooked = LoadOptions {
        on_tensor: Some(Arc::new(|_: &tensora_io::TensorRef<'_>| Ok(()))),
        ..options("sync", IoMode::Buffered, Shard::Slices(Vec::new()))
    };
    assert!(matches!(load(&ckpt, &hooked), Err(LoadError::Unsupported { .. })));
    let streamed = options("sync", IoMode::Buffered, Shard::Slices(Vec::new()));
    let e = tensora_io::load_streaming(&ckpt, &streamed, |_| Ok(())).unwrap_err();
    assert!(matches!(e, LoadError::Unsupported { .. }), "{e}");
}

/// A slice of an inner dimension with wide gaps reads its rows, not the tensor: the report's
/// bytes read stay at the slice's bytes (buffered, rows apart by more than a request's cost).
#[test]
fn strided_slices_read_only_their_rows() {
    // [16, 65536] U8, columns 0..4096 of each row: 16 rows of 4 KiB, 60 KiB apart.
    let g = generate(3, &[vec![(Dtype::U8, vec![16, 65_536])]]);
    let ckpt = g.open();
    let slices = Shard::Slices(vec![("s0.t0".into(), Slice { dim: 1, start: 0, len: 4096 })]);
    let loaded = load(&ckpt, &options("sync", IoMode::Buffered, slices)).unwrap();
    let r = loaded.report();
    assert_eq!((r.slices.strided, r.bytes_selected, r.bytes_read), (1, 16 * 4096, 16 * 4096), "{r:?}");
    let want = narrow(&g.data["s0.t0"], &[16, 65_536], 1, Slice { dim: 1, start: 0, len: 4096 });
    assert_eq!(loaded.tensor("s0.t0").unwrap().bytes(), &want[..]);
}

/// TinyLlama's o_proj at TP=4 (F16 rows of 4 KiB, 1 KiB each rank's): through the page cache the
/// rows are read one by one (a `pread` of a cached row costs less than copying the 3 KiB gap:
/// `examples/slice_cost.rs`), with `O_DIRECT` as one covering range (a request costs more than a
/// gap's 4 KiB block). `shard_reads` says the same as the load's report, before any read.
#[test]
fn row_parallel_f16_rows_are_read_strided_buffered_and_shard_reads_says_how() {
    let g = generate(5, &[vec![(Dtype::F16, vec![64, 2048])]]);
    let ckpt = g.open();
    let slice = Slice { dim: 1, start: 512, len: 512 };
    let want = narrow(&g.data["s0.t0"], &[64, 2048], 2, slice);
    for (io_mode, kind, read_bytes) in
        [(IoMode::Buffered, "strided", 64 * 1024), (IoMode::Direct, "covering", 64 * 4096)]
    {
        let opts = options("sync", io_mode, Shard::Slices(vec![("s0.t0".into(), slice)]));
        let planned = tensora_io::shard_reads(&ckpt, &opts).unwrap();
        assert_eq!(planned.len(), 1);
        assert_eq!((planned[0].kind.as_str(), planned[0].slice), (kind, Some(slice)), "{io_mode:?}");
        let loaded = load(&ckpt, &opts).unwrap();
        let r = loaded.report();
        let counted = if kind == "strided" { r.slices.strided } else { r.slices.covering };
        assert_eq!((counted, r.bytes_read), (1, planned[0].bytes_read), "{io_mode:?}: {r:?}");
        if io_mode == IoMode::Buffered {
            assert_eq!(r.bytes_read, read_bytes);
        } else {
            assert!(r.bytes_read >= read_bytes, "{r:?}");
        }
        assert_eq!(loaded.tensor("s0.t0").unwrap().bytes(), &want[..]);
    }
    let e = tensora_io::shard_reads(&ckpt, &LoadOptions::default()).unwrap_err();
    assert!(matches!(e, LoadError::Unsupported { .. }), "{e}");
}

/// Which pages of `file` (of `len_bytes`) are in the page cache (`mincore`), one flag per page.
fn resident_pages(file: &std::fs::File, len_bytes: u64) -> Vec<bool> {
    use std::os::fd::AsRawFd;
    let len = usize::try_from(len_bytes).unwrap();
    // SAFETY: a read-only shared mapping of a descriptor this test owns; the mapping is never
    // read (mincore only asks the page tables) and is unmapped before returning.
    let addr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    assert_ne!(addr, libc::MAP_FAILED);
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: `addr` maps `len` bytes (a whole number of pages rounded up by the kernel) and
    // `vec` holds one byte per page of them.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    // SAFETY: the mapping made above, not used after this.
    unsafe { libc::munmap(addr, len) };
    assert_eq!(rc, 0, "mincore");
    vec.iter().map(|b| b & 1 == 1).collect()
}

/// A cold file read through the page cache (a named backend, buffered: the read-ahead helper runs
/// ahead of the copies): the copies take only the slice's rows (strided, the cached side's rule:
/// a gap of 8 KiB costs more than a `pread`), but the device reads the whole pages in each gap
/// along with the rows (the cold side's rule, `COLD_DEVICE_COST`: a gap of at most two whole
/// pages costs less than a device request), so after the load every page from the first row to
/// the last is cached, and the report counts the gaps the helper advised
/// (`bytes_advised_beyond_reads`: whole gaps, at most the 127; a row the copies reach before the
/// helper is not advised, so the figure depends on the race, pinned by `backends::runtime`'s
/// unit test); a direct load of the same slice advises nothing.
#[test]
fn a_cold_strided_slice_is_copied_row_by_row_while_the_device_reads_the_gap_pages_along() {
    // F16 [128, 6144]: rows of 12,288 bytes; the first 2048 columns, 4096 bytes of each: gaps of
    // 8192 bytes, one or two whole pages each.
    let g = generate(9, &[vec![(Dtype::F16, vec![128, 6144])]]);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("cold.safetensors");
    std::fs::copy(g.path().join("shard-00.safetensors"), &path).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    file.sync_all().unwrap();
    let len_bytes = file.metadata().unwrap().len();
    tensora_sys::evict_file_cache(&file).unwrap();
    assert!(
        resident_pages(&file, len_bytes).iter().all(|r| !r),
        "ext4 drops clean pages on POSIX_FADV_DONTNEED"
    );
    let ckpt = tensora_format::open(&path).unwrap();
    let slice = Slice { dim: 1, start: 0, len: 2048 };
    let opts = options("sync", IoMode::Buffered, Shard::Slices(vec![("s0.t0".into(), slice)]));
    let loaded = load(&ckpt, &opts).unwrap();
    let r = loaded.report();
    assert_eq!((r.slices.strided, r.bytes_read), (1, 128 * 4096), "{r:?}");
    let advised = r.bytes_advised_beyond_reads;
    assert!(advised <= 127 * 8192 && advised.is_multiple_of(8192), "whole gaps between the 128 rows: {r:?}");
    assert_eq!(
        loaded.tensor("s0.t0").unwrap().bytes(),
        &narrow(&g.data["s0.t0"], &[128, 6144], 2, slice)[..]
    );
    let first = ckpt.tensors()[0].offset_bytes();
    let last_end = first + 127 * 12_288 + 4096;
    let resident = resident_pages(&file, len_bytes);
    let missing: Vec<u64> =
        (first / 4096..last_end.div_ceil(4096)).filter(|&p| !resident[p as usize]).collect();
    assert!(missing.is_empty(), "pages not read along: {missing:?}");
    let direct = load(&ckpt, &LoadOptions { io_mode: IoMode::Direct, ..opts }).unwrap();
    assert_eq!(direct.report().bytes_advised_beyond_reads, 0, "{:?}", direct.report());
}

/// `auto` on a cold sharded load that keeps its pages reads the slices with the 4 KiB read-ahead,
/// wherever free memory goes: a fill in 2 MiB folios (`Reading::PopulateAhead`, chosen for whole
/// tensors where free memory is not reported) would read whole folios around each slice, other
/// ranks' rows included (a TP=2 share of the bench fixture read 2.08 GB from the device against
/// 1.46 GB). The report's reason names the slices.
#[test]
fn auto_reads_a_cold_shard_with_the_read_ahead_not_the_large_folio_fill() {
    let g = generate(10, &[vec![(Dtype::F16, vec![128, 6144])]]);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("cold.safetensors");
    std::fs::copy(g.path().join("shard-00.safetensors"), &path).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    file.sync_all().unwrap();
    tensora_sys::evict_file_cache(&file).unwrap();
    let ckpt = tensora_format::open(&path).unwrap();
    let slice = Slice { dim: 0, start: 0, len: 64 };
    let opts =
        LoadOptions { shard: Some(Shard::Slices(vec![("s0.t0".into(), slice)])), ..LoadOptions::default() };
    let loaded = load(&ckpt, &opts).unwrap();
    let reason = &loaded.report().reason;
    assert!(reason.contains("read ahead of the copies in 4 KiB folios, slices"), "{reason}");
    assert_eq!(
        loaded.tensor("s0.t0").unwrap().bytes(),
        &narrow(&g.data["s0.t0"], &[128, 6144], 2, slice)[..]
    );
}
