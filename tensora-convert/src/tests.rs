//! Conversion round trips on the real and ServerlessLLM fixtures and on generated models, and every
//! failure path leaving no destination.

use std::sync::Mutex;

use proptest::prelude::*;
use tensora_format::write::write_safetensors;
use tensora_format::{Dtype, sllm};

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use tensora_format::write::{SafetensorsLayout, TensorSpec};
use tensora_format::{FileEntry, Format};

use super::*;

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real");

fn tiny() -> Checkpoint {
    sllm::open_dir(Path::new(TINY)).unwrap()
}

/// The dense bytes of a contiguous tensor.
fn bytes_of(ckpt: &Checkpoint, name: &str) -> Vec<u8> {
    let t = ckpt.tensor(name).unwrap();
    assert!(crate::save::SourceTensor::from_info(t).is_contiguous(), "{name}");
    let mut buf = vec![0u8; t.nbytes() as usize];
    File::open(ckpt.file(t.file()).path()).unwrap().read_exact_at(&mut buf, t.offset_bytes()).unwrap();
    buf
}

fn assert_same_tensors(a: &Checkpoint, b: &Checkpoint) {
    assert_eq!(a.tensors().len(), b.tensors().len());
    for t in a.tensors() {
        let u = b.tensor(t.name()).unwrap_or_else(|| panic!("missing {}", t.name()));
        assert_eq!((t.dtype(), t.shape()), (u.dtype(), u.shape()), "{}", t.name());
        assert_eq!(bytes_of(a, t.name()), bytes_of(b, t.name()), "{}", t.name());
    }
}

fn cfg(to: TargetFormat) -> ConvertConfig {
    ConvertConfig { to, ..ConvertConfig::default() }
}

fn leftovers(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect()
}

/// A generated safetensors model with varied dtypes and odd sizes.
fn generated_model(dir: &Path, tensors: usize, seed: u8) -> PathBuf {
    let dtypes = [Dtype::BF16, Dtype::F32, Dtype::I8, Dtype::F16, Dtype::F8E4M3, Dtype::I64];
    let specs: Vec<TensorSpec> = (0..tensors)
        .map(|i| TensorSpec {
            name: format!("layers.{i}.weight"),
            dtype: dtypes[i % dtypes.len()],
            shape: vec![(i as u64 % 7) + 1, 13 + i as u64],
        })
        .collect();
    let path = dir.join("model.safetensors");
    let meta = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
    let layout = SafetensorsLayout::new(specs, meta).unwrap();
    write_safetensors(&path, &layout, |i, out| {
        let n = layout.specs()[i].nbytes().unwrap();
        let data: Vec<u8> = (0..n).map(|k| (k as u8).wrapping_mul(7).wrapping_add(i as u8 ^ seed)).collect();
        out.write_all(&data)
    })
    .unwrap();
    path
}

#[test]
fn tiny_to_safetensors_and_back_keeps_every_tensor() {
    let out = tempfile::tempdir().unwrap();
    let src = tiny();
    let st = out.path().join("st");
    let report = convert(&src, &st, &cfg(TargetFormat::Safetensors)).unwrap();
    assert_eq!((report.from, report.to, report.tensors), ("serverlessllm", "safetensors", 14));
    let st_ckpt = tensora_format::open(&st).unwrap();
    assert_same_tensors(&src, &st_ckpt);
    assert_eq!(st_ckpt.metadata().get("format").map(String::as_str), Some("pt"));

    let back = out.path().join("sllm");
    let report = convert(&st_ckpt, &back, &cfg(TargetFormat::ServerlessLlm)).unwrap();
    assert_eq!(report.tied_tensors, 0, "safetensors has no ties");
    assert_same_tensors(&src, &sllm::open_dir(&back).unwrap());
}

#[test]
fn sllm_to_sllm_stores_tied_weights_once() {
    let out = tempfile::tempdir().unwrap();
    let src = tiny();
    let dst = out.path().join("again");
    let report = convert(
        &src,
        &dst,
        &ConvertConfig { partition_bytes_max: 40_000, ..cfg(TargetFormat::ServerlessLlm) },
    )
    .unwrap();
    assert_eq!(report.tied_tensors, 1);
    let again = sllm::open_dir(&dst).unwrap();
    assert_same_tensors(&src, &again);
    let (e, h) = (again.tensor("embed.weight").unwrap(), again.tensor("lm_head.weight").unwrap());
    assert_eq!((e.file(), e.range()), (h.file(), h.range()));
    let src_total: u64 = src.files().iter().map(FileEntry::len_bytes).sum();
    let dst_total: u64 = again.files().iter().map(FileEntry::len_bytes).sum();
    assert_eq!(src_total, dst_total);
    // Padding is written as zeros (the fixture's 0xAA is not copied).
    let p1 = fs::read(sllm::partition_path(&dst, 1)).unwrap();
    assert_eq!(&p1[8454..8456], &[0, 0]);
}

#[test]
fn legacy_layout_migrates_to_upstream() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("legacy");
    fs::create_dir(&dir).unwrap();
    let index = r#"{"a": [0, 8, [2], [1], "f32", 0], "b": [0, 6, [3], [1], "bf16", 1], "c": [8, 2, [2], [1], "i8", 1]}"#;
    fs::write(dir.join(sllm::INDEX_FILE_NAME), index).unwrap();
    fs::write(sllm::partition_path(&dir, 0), [1u8, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    fs::write(sllm::partition_path(&dir, 1), [9u8, 10, 11, 12, 13, 14, 0, 0, 15, 16]).unwrap();
    let src = sllm::open_dir(&dir).unwrap();
    assert_eq!(src.warnings().len(), 1);
    let dst = out.path().join("upstream");
    convert(&src, &dst, &cfg(TargetFormat::ServerlessLlm)).unwrap();
    let index = fs::read(dst.join(sllm::INDEX_FILE_NAME)).unwrap();
    let parsed = sllm::parse_index(&index).unwrap();
    assert_eq!(parsed.layout, sllm::IndexLayout::Upstream);
    let migrated = sllm::open_dir(&dst).unwrap();
    assert!(migrated.warnings().is_empty());
    assert_same_tensors(&src, &migrated);
    assert_eq!(bytes_of(&migrated, "c"), [15, 16]);
}

#[test]
fn real_fixtures_round_trip_byte_identical() {
    let mut seen = 0;
    for entry in fs::read_dir(REAL).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        seen += 1;
        let out = tempfile::tempdir().unwrap();
        let src = tensora_format::open(&path).unwrap();
        let mid = out.path().join("sllm");
        convert(
            &src,
            &mid,
            &ConvertConfig { partition_bytes_max: 1 << 16, ..cfg(TargetFormat::ServerlessLlm) },
        )
        .unwrap();
        let mid_ckpt = sllm::open_dir(&mid).unwrap();
        assert_same_tensors(&src, &mid_ckpt);
        let back = out.path().join("back.safetensors");
        convert(&mid_ckpt, &back, &cfg(TargetFormat::Safetensors)).unwrap();
        let back_ckpt = tensora_format::open(&back).unwrap();
        assert_same_tensors(&src, &back_ckpt);
    }
    assert!(seen >= 2, "expected the shared real fixtures");
}

#[test]
fn generated_model_round_trips_through_many_partitions_and_shards() {
    let out = tempfile::tempdir().unwrap();
    let src = tensora_format::open(generated_model(out.path(), 40, 3)).unwrap();
    let mid = out.path().join("sllm");
    let report =
        convert(&src, &mid, &ConvertConfig { partition_bytes_max: 300, ..cfg(TargetFormat::ServerlessLlm) })
            .unwrap();
    let mid_ckpt = sllm::open_dir(&mid).unwrap();
    assert!(mid_ckpt.files().len() > 10, "{} partitions", mid_ckpt.files().len());
    assert_eq!(report.files_written, mid_ckpt.files().len() + 1);
    assert_same_tensors(&src, &mid_ckpt);
    let back = out.path().join("sharded");
    let report = convert(
        &mid_ckpt,
        &back,
        &ConvertConfig { shard_bytes_max: Some(2_000), buffer_bytes: 64, ..cfg(TargetFormat::Safetensors) },
    )
    .unwrap();
    assert!(report.files_written > 3);
    assert!(back.join(tensora_format::write::SHARD_INDEX_FILE_NAME).is_file());
    let back_ckpt = tensora_format::open(&back).unwrap();
    assert_eq!(back_ckpt.format(), Format::SafetensorsSharded);
    assert_same_tensors(&src, &back_ckpt);
}

#[test]
fn gathers_non_contiguous_tensors_into_row_major_order() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("strided");
    fs::create_dir(&dir).unwrap();
    // Storage [0, 1, 2, 3, 4, 5] as u8 viewed as a [3, 2] transpose of a [2, 3] matrix.
    fs::write(dir.join(sllm::INDEX_FILE_NAME), r#"{"t": [0, 6, [3, 2], [1, 3], "torch.uint8"]}"#).unwrap();
    fs::write(sllm::partition_path(&dir, 0), [0u8, 1, 2, 3, 4, 5, 0xAA, 0xAA]).unwrap();
    let src = sllm::open_dir(&dir).unwrap();
    let dst = out.path().join("t.safetensors");
    convert(&src, &dst, &cfg(TargetFormat::Safetensors)).unwrap();
    let st = tensora_format::open(&dst).unwrap();
    assert_eq!(st.tensor("t").unwrap().shape(), &[3, 2]);
    assert_eq!(bytes_of(&st, "t"), [0, 3, 1, 4, 2, 5]);
    // To ServerlessLLM the storage and strides are kept as they are.
    let again = out.path().join("again");
    convert(&src, &again, &cfg(TargetFormat::ServerlessLlm)).unwrap();
    let again = sllm::open_dir(&again).unwrap();
    assert_eq!(again.tensor("t").unwrap().strides(), Some(&[1u64, 3][..]));
}

#[test]
fn single_file_output_sizes_the_buffer_for_strided_storage() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("strided");
    fs::create_dir(&dir).unwrap();
    // A [2, 2] u8 view with strides [1, 4] over 16 bytes of storage: 4 logical bytes, but the
    // gather reads all 16 into the buffer.
    fs::write(dir.join(sllm::INDEX_FILE_NAME), r#"{"t": [0, 16, [2, 2], [1, 4], "torch.uint8"]}"#).unwrap();
    let storage: Vec<u8> = (0..16).collect();
    fs::write(sllm::partition_path(&dir, 0), &storage).unwrap();
    let src = sllm::open_dir(&dir).unwrap();
    for dst in [out.path().join("t.safetensors"), out.path().join("t-dir")] {
        convert(&src, &dst, &cfg(TargetFormat::Safetensors)).unwrap();
        let st = tensora_format::open(&dst).unwrap();
        assert_eq!(bytes_of(&st, "t"), [0, 4, 1, 5], "{}", dst.display());
    }
}

#[test]
fn a_source_rewritten_in_place_during_conversion_fails() {
    for single_file in [true, false] {
        let out = tempfile::tempdir().unwrap();
        let model = generated_model(out.path(), 4, 3);
        let src = tensora_format::open(&model).unwrap();
        // Rewrite the source in place (same size, same inode, new mtime) once copying started.
        let victim = model.clone();
        let touched = Mutex::new(false);
        let progress: ConvertProgress = Arc::new(move |done, _| {
            let mut touched = touched.lock().unwrap();
            if done > 0 && !*touched {
                *touched = true;
                let f = fs::OpenOptions::new().write(true).open(&victim).unwrap();
                f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1))
                    .unwrap();
            }
        });
        let dst = if single_file { out.path().join("o.safetensors") } else { out.path().join("o") };
        let c = ConvertConfig { progress: Some(progress), ..cfg(TargetFormat::Safetensors) };
        let err = convert(&src, &dst, &c).unwrap_err();
        assert!(
            matches!(&err, ConvertError::SourceChanged { change, .. } if change.what().contains("mtime")),
            "{err}"
        );
        assert!(!dst.exists());
        assert_eq!(leftovers(out.path()), std::slice::from_ref(&model));
    }
}

#[test]
fn failure_mid_way_leaves_no_destination() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("strided");
    fs::create_dir(&dir).unwrap();
    // "big" is non-contiguous and its 64-byte storage does not fit a 16-byte buffer; it comes
    // after "a", so the output is half written when the conversion fails.
    let index = r#"{"a": [0, 16, [16], [1], "torch.uint8"], "big": [16, 64, [8, 8], [1, 8], "torch.uint8"]}"#;
    fs::write(dir.join(sllm::INDEX_FILE_NAME), index).unwrap();
    fs::write(sllm::partition_path(&dir, 0), [7u8; 80]).unwrap();
    let src = sllm::open_dir(&dir).unwrap();
    let dst = out.path().join("out");
    let cfg = ConvertConfig { buffer_bytes: 16, ..cfg(TargetFormat::Safetensors) };
    let err = convert(&src, &dst, &cfg).unwrap_err();
    assert!(matches!(&err, ConvertError::Unsupported { tensor, .. } if tensor == "big"), "{err}");
    assert!(!dst.exists());
    assert_eq!(leftovers(out.path()), std::slice::from_ref(&dir));
}

#[test]
fn truncated_source_is_refused_and_leaves_no_destination() {
    let out = tempfile::tempdir().unwrap();
    let model = generated_model(out.path(), 4, 1);
    let src = tensora_format::open(&model).unwrap();
    let f = fs::OpenOptions::new().write(true).open(&model).unwrap();
    f.set_len(src.files()[0].len_bytes() - 10).unwrap();
    let dst = out.path().join("out");
    let err = convert(&src, &dst, &cfg(TargetFormat::ServerlessLlm)).unwrap_err();
    assert!(matches!(err, ConvertError::SourceChanged { .. }), "{err}");
    assert!(!dst.exists());
    assert_eq!(leftovers(out.path()), [model]);
}

/// A source swapped for a FIFO after the parse is refused (typed, naming it), not waited on for a
/// writer: the conversion runs on a detached thread behind a generous hang guard.
#[test]
fn a_source_swapped_for_a_fifo_is_refused_without_waiting_and_leaves_no_destination() {
    let out = tempfile::tempdir().unwrap();
    let model = generated_model(out.path(), 4, 1);
    let src = tensora_format::open(&model).unwrap();
    fs::remove_file(&model).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&model).status().unwrap().success());
    let dst = out.path().join("out");
    let (done, result) = std::sync::mpsc::channel();
    let d = dst.clone();
    std::thread::spawn(move || done.send(convert(&src, &d, &cfg(TargetFormat::ServerlessLlm)).map(|_| ())));
    let err = result
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the conversion waited on a FIFO")
        .unwrap_err();
    match &err {
        ConvertError::Format(e) => {
            assert_eq!(e.path(), model, "{err}");
            assert!(
                matches!(
                    e.kind(),
                    tensora_format::ErrorKind::NotRegularFile { found: tensora_format::NonRegular::Fifo }
                ),
                "{err}"
            );
        }
        other => panic!("expected NotRegularFile, got {other:?}"),
    }
    assert!(!dst.exists());
}

#[test]
fn read_error_during_copy_names_file_offset_and_tensor_and_leaves_nothing() {
    let out = tempfile::tempdir().unwrap();
    let model = generated_model(out.path(), 8, 2);
    let src = tensora_format::open(&model).unwrap();
    let dst = out.path().join("out");
    // Truncate the source from the progress callback, after the first chunk was copied.
    let victim = model.clone();
    let cut = Mutex::new(false);
    let progress: ConvertProgress = Arc::new(move |done, _| {
        let mut cut = cut.lock().unwrap();
        if done > 0 && !*cut {
            *cut = true;
            fs::OpenOptions::new().write(true).open(&victim).unwrap().set_len(100).unwrap();
        }
    });
    // One writer thread and a partition per few tensors: the pieces after the first are read
    // after the truncation.
    let cfg = ConvertConfig {
        progress: Some(progress),
        threads: 1,
        partition_bytes_max: 300,
        ..cfg(TargetFormat::ServerlessLlm)
    };
    let err = convert(&src, &dst, &cfg).unwrap_err();
    let ConvertError::Read { path, offset_bytes, tensor, .. } = &err else { panic!("unexpected {err}") };
    assert_eq!(path, &model);
    assert!(*offset_bytes >= 100 - 32);
    assert!(src.tensor(tensor).is_some());
    assert!(!dst.exists());
    assert_eq!(leftovers(out.path()), [model]);
}

#[test]
fn dtype_without_a_torch_name_is_refused_before_writing() {
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("f4.safetensors");
    let specs = vec![TensorSpec { name: "packed".into(), dtype: Dtype::F4, shape: vec![4] }];
    let layout = SafetensorsLayout::new(specs, BTreeMap::new()).unwrap();
    write_safetensors(&path, &layout, |_, o| o.write_all(&[0x12, 0x34])).unwrap();
    let src = tensora_format::open(&path).unwrap();
    let dst = out.path().join("out");
    let err = convert(&src, &dst, &cfg(TargetFormat::ServerlessLlm)).unwrap_err();
    let ConvertError::Format(e) = &err else { panic!("unexpected {err}") };
    assert_eq!(e.tensor(), Some("packed"));
    assert_eq!(leftovers(out.path()), [path]);
}

#[test]
fn existing_destination_is_refused_and_untouched() {
    let out = tempfile::tempdir().unwrap();
    let dst = out.path().join("taken");
    fs::create_dir(&dst).unwrap();
    let err = convert(&tiny(), &dst, &cfg(TargetFormat::ServerlessLlm)).unwrap_err();
    assert!(matches!(err, ConvertError::DestinationExists { .. }));
    assert!(leftovers(&dst).is_empty());
    assert_eq!(leftovers(out.path()), std::slice::from_ref(&dst));
    // The final rename refuses to replace as well.
    let temp = TempDir::create_beside(&dst).unwrap();
    assert!(matches!(temp.commit(&dst), Err(ConvertError::DestinationExists { .. })));
    assert_eq!(leftovers(out.path()), [dst]);
}

#[test]
fn bad_configs_are_refused() {
    let out = tempfile::tempdir().unwrap();
    let dst = out.path().join("x");
    let bad = [
        ConvertConfig { buffer_bytes: 0, ..ConvertConfig::default() },
        ConvertConfig { buffer_bytes: COPY_BUFFER_BYTES_MAX + 1, ..ConvertConfig::default() },
        ConvertConfig { partition_bytes_max: 0, ..ConvertConfig::default() },
        ConvertConfig { shard_bytes_max: Some(0), ..cfg(TargetFormat::Safetensors) },
        ConvertConfig { shard_bytes_max: Some(10), ..cfg(TargetFormat::ServerlessLlm) },
    ];
    for c in bad {
        assert!(matches!(convert(&tiny(), &dst, &c), Err(ConvertError::Config { .. })), "{c:?}");
    }
    assert!(leftovers(out.path()).is_empty());
}

#[test]
fn progress_is_monotone_and_reaches_the_total() {
    let out = tempfile::tempdir().unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&calls);
    let progress: ConvertProgress = Arc::new(move |done, total| sink.lock().unwrap().push((done, total)));
    let c =
        ConvertConfig { progress: Some(progress), buffer_bytes: 1000, ..cfg(TargetFormat::ServerlessLlm) };
    let report = convert(&tiny(), &out.path().join("p"), &c).unwrap();
    let calls = calls.lock().unwrap();
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 == w[1].1));
    let &(done, total) = calls.last().unwrap();
    assert_eq!((done, total), (report.bytes_copied, report.bytes_copied));
    assert_eq!(report.buffer_bytes, 1000);
    // All 79048 bytes of the partitions minus the padding (2 + 2 + 4 + 5): embed.weight, tied
    // with lm_head.weight, is copied once.
    let unique: u64 = 79_048 - (2 + 2 + 4 + 5);
    assert_eq!(report.bytes_copied, unique);
}

proptest! {
    // Every conversion fsyncs each output file, so keep the case count low.
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn random_models_round_trip(tensors in 1usize..16, seed in any::<u8>(), cap in 64u64..4_000, buf in 1usize..300) {
        let out = tempfile::tempdir().unwrap();
        let src = tensora_format::open(generated_model(out.path(), tensors, seed)).unwrap();
        let mid = out.path().join("sllm");
        let c = ConvertConfig { partition_bytes_max: cap, buffer_bytes: buf, ..cfg(TargetFormat::ServerlessLlm) };
        convert(&src, &mid, &c).unwrap();
        let mid_ckpt = sllm::open_dir(&mid).unwrap();
        let back = out.path().join("st");
        let c = ConvertConfig { shard_bytes_max: Some(cap), buffer_bytes: buf, ..cfg(TargetFormat::Safetensors) };
        convert(&mid_ckpt, &back, &c).unwrap();
        let back_ckpt = tensora_format::open(&back).unwrap();
        assert_same_tensors(&src, &mid_ckpt);
        assert_same_tensors(&src, &back_ckpt);
    }
}
