//! Loads with `LoadOptions::dtype`: every tensor equal to its stored bytes converted by
//! `tensora_io::cast` (itself checked against torch), on every backend, with windows and pieces
//! that split elements, and the typed errors.

mod support;

use std::io::Write;

use support::{files_unchanged, generate, runnable_backends};
use tensora_format::{Dtype, Selection};
use tensora_io::{BackendChoice, LoadError, LoadOptions, Loaded, Residence, load, load_runs, load_streaming};
use tensora_io::{CastError, DtypeTarget, convert};

/// The stored bytes of `name` as they should be delivered under `target`.
fn expected(from: Dtype, target: DtypeTarget, stored: &[u8]) -> (Dtype, Vec<u8>) {
    match target.cast_of(from).unwrap() {
        None => (from, stored.to_vec()),
        Some(to) => {
            let n = stored.len() / from.size_bytes().unwrap() as usize;
            let mut out = vec![0u8; n * to.size_bytes().unwrap() as usize];
            convert(from, to, stored, &mut out).unwrap();
            (to, out)
        }
    }
}

fn check(
    loaded: &Loaded,
    stored: &std::collections::BTreeMap<String, (Dtype, Vec<u8>)>,
    target: DtypeTarget,
) {
    assert_eq!(loaded.len(), stored.len());
    for (name, (from, bytes)) in stored {
        let t = loaded.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
        let (dtype, want) = expected(*from, target, bytes);
        assert_eq!(t.dtype(), dtype, "{name}");
        assert_eq!(t.info().len_bytes(), want.len() as u64, "{name}");
        assert!(t.bytes() == want.as_slice(), "{name}: bytes differ");
        assert!((t.bytes().as_ptr() as usize).is_multiple_of(tensora_io::CAST_ALIGN_BYTES as usize));
    }
}

fn mixed() -> (support::Generated, std::collections::BTreeMap<String, (Dtype, Vec<u8>)>) {
    let g = generate(
        44,
        &[
            vec![
                (Dtype::F32, vec![300, 1031]),
                (Dtype::BF16, vec![7]),
                (Dtype::U8, vec![3]),
                (Dtype::F16, vec![513, 1024]),
                (Dtype::F32, vec![0, 4]),
            ],
            vec![(Dtype::I64, vec![100]), (Dtype::F8E4M3, vec![70_001]), (Dtype::F8E5M2, vec![33])],
        ],
    );
    let ckpt = g.open();
    let stored =
        ckpt.tensors().iter().map(|t| (t.name().to_owned(), (t.dtype(), g.data[t.name()].clone()))).collect();
    (g, stored)
}

#[test]
fn every_backend_delivers_each_target_dtype_converted_in_windows_and_chunks() {
    let (g, stored) = mixed();
    let ckpt = g.open();
    for backend in runnable_backends() {
        for target in [DtypeTarget::BF16, DtypeTarget::F32, DtypeTarget::F16] {
            let opts = LoadOptions {
                backend: BackendChoice::Named(backend.to_owned()),
                dtype: target,
                // Several staging windows, and reads split into many pieces.
                budget_bytes: 1 << 20,
                chunk_bytes: 96 << 10,
                ..LoadOptions::default()
            };
            let loaded = load(&ckpt, &opts).unwrap_or_else(|e| panic!("{backend} {target:?}: {e}"));
            check(&loaded, &stored, target);
            let report = loaded.report();
            assert_eq!(report.residence, "owned");
            assert!(report.windows > 1, "{backend}: {} windows", report.windows);
            let cast = report.cast.as_ref().unwrap();
            let want: Vec<&str> = stored
                .iter()
                .filter(|(_, (from, _))| target.cast_of(*from).unwrap().is_some())
                .map(|(n, _)| n.as_str())
                .collect();
            let mut got: Vec<&str> = cast.tensors.iter().map(|t| t.name.as_str()).collect();
            got.sort_unstable();
            assert_eq!(got, want, "{backend} {target:?}");
            assert_eq!(cast.kept + cast.tensors.len(), stored.len());
            assert_eq!(cast.staging_bytes, 1 << 20);
            assert!(cast.seconds > 0.0 && cast.bytes_out > 0, "{cast:?}");
        }
    }
}

#[test]
fn views_become_an_owned_cast_copy_converted_from_the_mapping_under_mapped() {
    let (g, stored) = mixed();
    let ckpt = g.open();
    for (residence, source) in [
        (Residence::Mapped(files_unchanged()), "straight from views of the files (residence mapped)"),
        // Just written, so warm: auto converts from the page cache instead of staging a copy.
        (Residence::Auto(files_unchanged()), "straight from views of the files (auto: warm"),
        (Residence::Owned, "staging window"),
    ] {
        let opts = LoadOptions { residence, dtype: DtypeTarget::BF16, ..LoadOptions::default() };
        let loaded = load(&ckpt, &opts).unwrap();
        check(&loaded, &stored, DtypeTarget::BF16);
        assert_eq!(loaded.report().residence, "owned");
        let reason = &loaded.report().reason;
        assert!(reason.contains("cast to BF16: an owned copy") && reason.contains(source), "{reason}");
    }
}

/// A safetensors file of `header` and `data`, the header padded to an odd length so the data (and
/// every tensor) starts at an odd file offset.
fn write_at_an_odd_offset(path: &std::path::Path, header: String, data: &[u8]) -> tensora_format::Checkpoint {
    let header = if header.len().is_multiple_of(2) { format!("{header} ") } else { header };
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    f.write_all(data).unwrap();
    drop(f);
    tensora_format::open(path).unwrap()
}

/// A file whose F32 and BF16 tensors start at odd offsets: chunks and the sync backend's steps
/// split elements between pieces, which the load gathers and converts whole.
#[test]
fn elements_split_between_pieces_are_converted_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.safetensors");
    let (a, b, c) = (3u64, 4 * 200_003, 2 * 150_001);
    let header = format!(
        r#"{{"a":{{"dtype":"U8","shape":[3],"data_offsets":[0,{a}]}},"b":{{"dtype":"F32","shape":[200003],"data_offsets":[{a},{}]}},"c":{{"dtype":"BF16","shape":[150001],"data_offsets":[{},{}]}}}}"#,
        a + b,
        a + b,
        a + b + c
    );
    let data = support::tensor_bytes(7, 0, (a + b + c) as usize);
    let ckpt = write_at_an_odd_offset(&path, header, &data);
    assert_eq!(ckpt.tensor("b").unwrap().offset_bytes() % 4, 2);
    let stored: std::collections::BTreeMap<String, (Dtype, Vec<u8>)> = [
        ("a".to_owned(), (Dtype::U8, data[..a as usize].to_vec())),
        ("b".to_owned(), (Dtype::F32, data[a as usize..(a + b) as usize].to_vec())),
        ("c".to_owned(), (Dtype::BF16, data[(a + b) as usize..].to_vec())),
    ]
    .into();
    for backend in runnable_backends() {
        for chunk_bytes in [4 << 10, 5001, 64 << 10] {
            for target in [DtypeTarget::BF16, DtypeTarget::F32] {
                let opts = LoadOptions {
                    backend: BackendChoice::Named(backend.to_owned()),
                    dtype: target,
                    chunk_bytes,
                    ..LoadOptions::default()
                };
                let loaded = load(&ckpt, &opts).unwrap_or_else(|e| panic!("{backend} {chunk_bytes}: {e}"));
                check(&loaded, &stored, target);
            }
        }
    }
}

#[test]
fn a_float_dtype_with_no_cast_fails_before_reading_and_names_the_tensor() {
    let g = generate(3, &[vec![(Dtype::F32, vec![8]), (Dtype::F64, vec![4])]]);
    let ckpt = g.open();
    let opts = LoadOptions { dtype: DtypeTarget::BF16, ..LoadOptions::default() };
    match load(&ckpt, &opts) {
        Err(LoadError::Cast { tensor, source }) => {
            assert_eq!(tensor, "s0.t1");
            assert_eq!(source, CastError::Unsupported { from: Dtype::F64, to: Dtype::BF16 });
            let text = LoadError::Cast { tensor, source }.to_string();
            assert!(text.contains("s0.t1") && text.contains("F64") && text.contains("BF16"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    // Without the F64 tensor the load casts.
    let opts = LoadOptions { selection: Selection::Names(vec!["s0.t0".into()]), ..opts };
    assert_eq!(load(&ckpt, &opts).unwrap().tensor("s0.t0").unwrap().dtype(), Dtype::BF16);
}

#[test]
fn a_streaming_load_refuses_a_cast() {
    let g = generate(5, &[vec![(Dtype::F32, vec![8])]]);
    let ckpt = g.open();
    let opts = LoadOptions { dtype: DtypeTarget::F16, ..LoadOptions::default() };
    let streaming = load_streaming(&ckpt, &opts, |_| Ok(()));
    assert!(
        matches!(streaming, Err(LoadError::CastNotSupportedHere { api: "load_streaming", dtype: "f16" })),
        "{streaming:?}"
    );
}

#[test]
fn runs_are_cast_loads_of_their_tensors() {
    let (g, stored) = mixed();
    let ckpt = g.open();
    let opts = LoadOptions { dtype: DtypeTarget::BF16, budget_bytes: 512 << 10, ..LoadOptions::default() };
    let mut seen = std::collections::BTreeMap::new();
    let mut runs = 0;
    for run in load_runs(&ckpt, &opts).unwrap() {
        let run = run.unwrap();
        runs += 1;
        assert!(run.report().cast.is_some());
        for t in run.tensors() {
            seen.insert(t.name().to_owned(), (t.dtype(), t.bytes().to_vec()));
        }
    }
    assert!(runs > 2, "{runs} runs");
    assert_eq!(seen.len(), stored.len());
    for (name, (from, bytes)) in &stored {
        assert_eq!(seen[name], expected(*from, DtypeTarget::BF16, bytes), "{name}");
    }
}

/// F32 to BF16 by round to nearest even, every NaN `0xFFFF` (torch's vectorised CPU cast),
/// written here from the definition, independently of `tensora_io::cast`'s kernels.
fn bf16_of(bits: u32) -> u16 {
    if f32::from_bits(bits).is_nan() {
        return 0xFFFF;
    }
    let (upper, lower) = (bits >> 16, bits & 0xFFFF);
    let up = lower > 0x8000 || (lower == 0x8000 && upper & 1 == 1);
    (upper + u32::from(up)) as u16
}

/// A warm F32 to BF16 cast under `Residence::Auto` (converted from views of the page cache, in
/// work items long enough for the streaming-store kernel): every element bit-exact with round to
/// nearest even (ties both ways, NaNs, ±Inf, subnormals, overflow to Inf), a tensor at an odd file
/// offset with an odd element count (the kernel's scalar head and tail), and `on_read` sees every
/// byte once.
#[test]
fn a_warm_f32_to_bf16_cast_is_bit_exact_with_round_to_nearest_even() {
    let specials: [u32; 16] = [
        0x3F80_8000, // a tie, even: stays
        0x3F81_8000, // a tie, odd: up
        0x3F80_8001,
        0x3F80_7FFF,
        0x7F7F_FFFF, // largest finite: rounds to +Inf
        0xFF7F_8000, // a tie at -max: to -Inf
        0x0000_0001, // subnormals, kept (no flush to zero)
        0x8000_8000,
        0x007F_FFFF,
        0x7F80_0000, // +Inf
        0xFF80_0000,
        0x7FC0_0000, // NaNs
        0xFF80_0001,
        0x7FBF_FFFF,
        0x0000_0000,
        0x8000_0000,
    ];
    let n = 300_007usize; // 1.2 MB in, 600 KB out: above `STREAMING_STORES_MIN_BYTES`
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let values: Vec<u32> = (0..n)
        .map(|i| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            if i % 3 == 0 { specials[(i / 3) % specials.len()] } else { (state >> 32) as u32 }
        })
        .collect();
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f32.safetensors");
    let header = format!(r#"{{"w":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#, data.len());
    let ckpt = write_at_an_odd_offset(&path, header, &data);
    assert_eq!(ckpt.tensor("w").unwrap().offset_bytes() % 2, 1);

    let seen_bytes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = std::sync::Arc::clone(&seen_bytes);
    let opts = LoadOptions {
        residence: Residence::Auto(files_unchanged()),
        dtype: DtypeTarget::BF16,
        threads: 3,
        on_read: Some(std::sync::Arc::new(move |p: &tensora_io::PieceRef<'_>| {
            seen.fetch_add(p.bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        })),
        ..LoadOptions::default()
    };
    let loaded = load(&ckpt, &opts).unwrap();
    let reason = &loaded.report().reason;
    assert!(reason.contains("straight from views of the files (auto: warm"), "{reason}");
    assert_eq!(seen_bytes.load(std::sync::atomic::Ordering::Relaxed), data.len() as u64);
    let t = loaded.tensor("w").unwrap();
    assert_eq!(t.dtype(), Dtype::BF16);
    let got: Vec<u16> = t.bytes().chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
    assert_eq!(got.len(), n);
    for (i, (&x, &y)) in values.iter().zip(&got).enumerate() {
        assert_eq!(y, bf16_of(x), "element {i}: {x:#010x} became {y:#06x}");
    }
}
