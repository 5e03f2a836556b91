use tensora_format::ErrorKind;

use super::*;

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");

fn tiny() -> Checkpoint {
    tensora_format::open(TINY).unwrap()
}

fn manifest_of(ckpt: &Checkpoint, algo: Algo) -> Manifest {
    let scan = crate::scan::scan(ckpt, &ScanConfig { algo, ..ScanConfig::default() });
    let digests: Vec<Digest> = scan.digests.into_iter().map(Option::unwrap).collect();
    Manifest::from_checkpoint(ckpt, algo, &digests).unwrap()
}

#[test]
fn a_clean_checkpoint_with_its_manifest_has_no_findings() {
    let ckpt = tiny();
    let m = manifest_of(&ckpt, Algo::Sha256);
    let report = verify_checkpoint(&ckpt, &VerifyOptions { manifest: Some(&m), ..Default::default() });
    assert_eq!(report.findings, []);
    assert_eq!(report.algo, Algo::Sha256);
    assert_eq!(report.tensors_digested, ckpt.tensors().len());
    assert_eq!(report.bytes_scanned, ckpt.files().iter().map(|f| f.len_bytes()).sum::<u64>());
    let json = report.to_json();
    assert_eq!(json["ok"], true);
    assert_eq!(json["summary"], report.summary_line());
}

#[test]
fn a_wrong_digest_names_tensor_file_and_offset() {
    let ckpt = tiny();
    let mut m = manifest_of(&ckpt, Algo::Crc32c);
    m.tensors.get_mut("q8").unwrap().digest = Algo::Crc32c.digest(b"not q8");
    let report = verify_checkpoint(&ckpt, &VerifyOptions { manifest: Some(&m), ..Default::default() });
    let t = ckpt.tensor("q8").unwrap();
    match report.findings.as_slice() {
        [
            Finding {
                severity: Severity::Error,
                kind: FindingKind::DigestMismatch { tensor, path, offset_bytes, .. },
            },
        ] => {
            assert_eq!(tensor, "q8");
            assert_eq!(path, ckpt.file(t.file()).path());
            assert_eq!(*offset_bytes, t.offset_bytes());
        }
        other => panic!("{other:?}"),
    }
    assert!(!report.is_clean());
    assert!(report.summary_line().starts_with("FAILED: 1 errors, 0 warnings"));
}

#[test]
fn cross_check_results_become_findings() {
    let ckpt = tiny();
    let good = manifest_of(&ckpt, Algo::Crc32c);
    let digests: Vec<Digest> = ckpt.tensors().iter().map(|t| good.tensors[t.name()].digest).collect();
    let mut bad = digests.clone();
    let q8 = ckpt.tensor_index("q8").unwrap();
    bad[q8] = Algo::Crc32c.digest(b"x");
    let checker = move |_: &Checkpoint, _: Algo| {
        vec![
            BackendDigests { backend: "same".into(), result: Ok(digests.clone()), unavailable: false },
            BackendDigests { backend: "flaky".into(), result: Ok(bad.clone()), unavailable: false },
            BackendDigests { backend: "absent".into(), result: Err("no ring".into()), unavailable: true },
            BackendDigests { backend: "broken".into(), result: Err("EIO".into()), unavailable: false },
        ]
    };
    let report =
        verify_checkpoint(&ckpt, &VerifyOptions { cross_check: Some(&checker), ..Default::default() });
    let codes: Vec<(&str, Option<&str>)> =
        report.findings.iter().map(|f| (f.kind.code(), f.kind.tensor())).collect();
    assert_eq!(
        codes,
        [("cross-check-mismatch", Some("q8")), ("backend-unavailable", None), ("backend-failed", None)]
    );
    assert_eq!(report.backends_checked, ["same", "flaky"]);
    assert_eq!(report.errors(), 2);
    assert_eq!(report.warnings(), 1);
}

#[test]
fn header_overrun_is_classified_as_truncation() {
    let e = tensora_format::Error::new(
        "/x.safetensors",
        ErrorKind::HeaderBeyondFile { header_len_bytes: 100, file_len_bytes: 50 },
    );
    assert_eq!(
        format_error_finding(&e),
        FindingKind::Truncated {
            path: "/x.safetensors".into(),
            expected_len_bytes: 108,
            actual_len_bytes: 50
        }
    );
    let e = tensora_format::Error::new("/x", ErrorKind::HeaderLenZero);
    assert!(matches!(format_error_finding(&e), FindingKind::Structure { .. }));
}

fn copy_tiny() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(TINY).unwrap() {
        let from = entry.unwrap().path();
        let to = dir.path().join(from.file_name().unwrap());
        std::fs::write(&to, std::fs::read(&from).unwrap()).unwrap();
    }
    dir
}

#[test]
fn a_truncated_partition_is_reported_as_truncation_naming_it() {
    let dir = copy_tiny();
    let part = dir.path().join("tensor.data_2");
    let full_len = std::fs::metadata(&part).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&part).unwrap().set_len(1000).unwrap();
    let report = verify_path(dir.path(), &VerifyOptions::default());
    assert_eq!(
        report.findings,
        [Finding::from(FindingKind::Truncated {
            path: part,
            expected_len_bytes: full_len,
            actual_len_bytes: 1000
        })]
    );
    assert_eq!(report.findings[0].kind.code(), "truncated");
}

/// Writes a safetensors file with `header` and `data_len_bytes` zero bytes of data.
fn raw_safetensors(path: &Path, header: &str, data_len_bytes: usize) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data_len_bytes, 0);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_header_claiming_almost_two_to_the_64_bytes_gives_a_finding_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.safetensors");
    let n: u64 = 2_305_843_009_213_693_951; // 2^61 - 1: eight of them end at 2^64 - 8
    let entries: Vec<String> = (0..8u64)
        .map(|i| {
            format!(r#""t{i}":{{"dtype":"U8","shape":[{n}],"data_offsets":[{},{}]}}"#, i * n, (i + 1) * n)
        })
        .collect();
    raw_safetensors(&path, &format!("{{{}}}", entries.join(",")), 16);
    let report = verify_path(&path, &VerifyOptions::default());
    assert!(!report.is_clean());
    for f in &report.findings {
        if let FindingKind::Truncated { expected_len_bytes, actual_len_bytes, .. } = &f.kind {
            assert!(expected_len_bytes > actual_len_bytes, "{f}");
        }
    }
    // The same error against a file that shrank after the parse: the header length no longer
    // fits in the file, which is structural, not a subtraction below zero.
    let e = tensora_format::Error::new(
        &path,
        ErrorKind::DataLenMismatch { end: u64::MAX - 7, data_len_bytes: u64::MAX - 100 },
    );
    assert!(matches!(format_error_finding(&e), FindingKind::Structure { .. }));
    let e = tensora_format::Error::new(
        &path,
        ErrorKind::DataLenMismatch { end: u64::MAX - 7, data_len_bytes: 16 },
    );
    assert!(matches!(format_error_finding(&e), FindingKind::Structure { .. }));
}

#[test]
fn manifest_file_keys_are_inside_a_directory_root_and_beside_a_file_root() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    std::fs::write(&file, b"x").unwrap();
    assert_eq!(manifest_file_path(dir.path(), "model.safetensors"), file);
    assert_eq!(manifest_file_path(&file, "other.safetensors"), dir.path().join("other.safetensors"));
}

#[test]
fn sparse_is_an_error_only_below_half_allocation() {
    let sparse = |allocated_bytes| FindingKind::Sparse {
        path: "/m".into(),
        sparse_bytes: 1000 - allocated_bytes,
        len_bytes: 1000,
        allocated_bytes,
    };
    assert_eq!(sparse(499).severity(), Severity::Error);
    assert_eq!(sparse(500).severity(), Severity::Warning);
    assert_eq!(sparse(900).severity(), Severity::Warning);
    let text = sparse(900).to_string();
    assert!(text.contains("900 of 1000 bytes allocated") && text.contains("compressing"), "{text}");
    assert!(sparse(0).to_string().contains("holes"));
}

#[test]
fn row_major_strides_are_recognised() {
    assert!(is_row_major(&[2, 3], &[3, 1]));
    assert!(is_row_major(&[], &[]));
    assert!(is_row_major(&[1, 17], &[99, 1]), "extent-1 dimensions may have any stride");
    assert!(!is_row_major(&[4, 3], &[1, 4]));
    assert!(!is_row_major(&[2, 3], &[0, 1]));
    assert!(!is_row_major(&[2], &[1, 1]));
}

/// Element offsets (in elements) of every index of `shape`, in row-major index order.
fn element_offsets(shape: &[u64], strides: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64];
    for (&d, &st) in shape.iter().zip(strides) {
        out = out.iter().flat_map(|&base| (0..d).map(move |i| base + i * st)).collect();
    }
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
    /// Row-major exactly when the elements are the first `numel` elements in order: then the
    /// digest of `numel × itemsize` bytes from the offset covers every element.
    #[test]
    fn row_major_means_the_elements_are_the_dense_prefix(
        dims in proptest::collection::vec((1u64..4, 0u64..13), 0..5)
    ) {
        let (shape, strides): (Vec<u64>, Vec<u64>) = dims.into_iter().unzip();
        let dense: Vec<u64> = (0..shape.iter().product::<u64>()).collect();
        proptest::prop_assert_eq!(
            is_row_major(&shape, &strides),
            element_offsets(&shape, &strides) == dense
        );
    }

    /// Sparse is an error exactly below half allocation, whatever the figures.
    #[test]
    fn sparse_severity_is_the_half_rule(len_bytes in 0u64..1 << 40, allocated_bytes in 0u64..1 << 40) {
        let k = FindingKind::Sparse {
            path: "/m".into(),
            sparse_bytes: len_bytes.saturating_sub(allocated_bytes),
            len_bytes,
            allocated_bytes,
        };
        let error = allocated_bytes < len_bytes / 2 + len_bytes % 2;
        proptest::prop_assert_eq!(k.severity() == Severity::Error, error);
    }
}

#[test]
fn a_strided_tensor_gets_a_warning_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tensor_index.json"),
        r#"{"t": [0, 24, [2, 2], [1, 4], "torch.float32"]}"#,
    )
    .unwrap();
    std::fs::write(dir.path().join("tensor.data_0"), [0u8; 24]).unwrap();
    let report = verify_path(dir.path(), &VerifyOptions::default());
    assert_eq!(report.errors(), 0, "{:?}", report.findings);
    let texts: Vec<String> = report.findings.iter().map(ToString::to_string).collect();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].starts_with("warning: tensor \"t\""), "{texts:?}");
    assert!(texts[0].contains("strided: digest covers 16 of 24 storage bytes"), "{texts:?}");
}

#[test]
fn a_path_that_does_not_open_still_gives_a_report() {
    let report = verify_path(Path::new("/nonexistent/model.safetensors"), &VerifyOptions::default());
    assert!(!report.is_clean());
    assert_eq!(report.findings.len(), 1);
    assert_eq!(report.findings[0].kind.code(), "unreadable");
    assert!(report.summary_line().starts_with("FAILED"));
}
