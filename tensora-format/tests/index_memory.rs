//! Peak heap while parsing the two index formats stays at most 4× the index bytes on adversarial
//! inputs (issue 14, finding 5): deep or wide junk in keys that are not ours, `[0,0,0,…]`
//! padding, millions of tiny entries, entries that each name another shard, maximal ranks.
//! Measured with the counting allocator installed as this binary's global allocator. The counter
//! is process-wide, so each test holds [`SERIAL`] from its first allocation to its last.

use std::sync::Mutex;

use tensora_format::{ErrorKind, sharded, sllm};
use tensora_testkit::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// One test at a time: another test building its input would count in this one's peak.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The bound of the issue: peak heap while parsing at most this many times the index bytes.
const PEAK_PER_INDEX_BYTE_MAX: usize = 4;

/// Target size of each adversarial index: large enough that constants vanish.
const INDEX_BYTES: usize = 8 << 20;

/// Run `parse` on `bytes` (handed over: allocated before the measure), print and check its peak
/// heap, and hand back its result.
fn measured<T>(what: &str, bytes: Vec<u8>, parse: impl FnOnce(Vec<u8>) -> T) -> T {
    let len = bytes.len();
    let (out, peak_bytes) = ALLOC.peak_during(|| parse(bytes));
    let ratio = peak_bytes as f64 / len as f64;
    eprintln!("{what}: {len} index bytes, peak heap {peak_bytes} bytes ({ratio:.2}x)");
    assert!(
        peak_bytes <= PEAK_PER_INDEX_BYTE_MAX * len,
        "{what}: peak {peak_bytes} bytes for a {len}-byte index ({ratio:.2}x)"
    );
    out
}

/// `{prefix` + `item` (formatted with its number) repeated until about [`INDEX_BYTES`] + `suffix`.
fn repeated(prefix: &str, item: impl Fn(usize) -> String, separator: &str, suffix: &str) -> Vec<u8> {
    let mut text = String::with_capacity(INDEX_BYTES + 64);
    text.push_str(prefix);
    let mut i = 0;
    while text.len() < INDEX_BYTES {
        if i > 0 {
            text.push_str(separator);
        }
        text.push_str(&item(i));
        i += 1;
    }
    text.push_str(suffix);
    text.into_bytes()
}

/// A short name unique to `i`, from printable ASCII (so names are as short as they can be).
fn short_name(i: usize) -> String {
    let mut name = String::new();
    let mut n = i;
    loop {
        name.push(char::from(b'a' + (n % 26) as u8));
        n /= 26;
        if n == 0 {
            return name;
        }
    }
}

#[test]
fn hf_index_with_deep_junk() {
    let _serial = serial();
    let depth = INDEX_BYTES / 2;
    let text = format!(
        r#"{{"junk": {}{}, "weight_map": {{"w": "a.safetensors"}}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let index = measured("hf deep junk", text.into_bytes(), sharded::parse_index).unwrap();
    assert_eq!(index.len(), 1);
}

#[test]
fn hf_index_with_wide_junk_and_padded_metadata() {
    let _serial = serial();
    let zeros = vec!["0"; INDEX_BYTES / 4].join(",");
    let text = format!(r#"{{"junk": [{zeros}], "metadata": {{"pad": [{zeros}]}}, "weight_map": {{}}}}"#);
    let index = measured("hf wide junk + padded metadata", text.into_bytes(), sharded::parse_index).unwrap();
    assert_eq!(index.metadata()["pad"].len(), zeros.len() + 2);
}

#[test]
fn hf_index_with_millions_of_tiny_entries() {
    let _serial = serial();
    let text = repeated(r#"{"weight_map":{"#, |i| format!(r#""{}":"s""#, short_name(i)), ",", "}}");
    let index = measured("hf tiny entries, one shard", text, sharded::parse_index).unwrap();
    assert!(index.len() > 500_000, "{}", index.len());
    let text = repeated(r#"{"weight_map":{"#, |i| format!(r#""{0}":"{0}""#, short_name(i)), ",", "}}");
    let index = measured("hf tiny entries, a shard each", text, sharded::parse_index).unwrap();
    assert_eq!(index.shard_names().len(), index.len());
}

#[test]
fn hf_index_that_fails_late_stays_bounded() {
    let _serial = serial();
    let mut text = repeated(r#"{"weight_map":{"#, |i| format!(r#""{}":"s""#, short_name(i)), ",", "}}");
    text.extend_from_slice(b"x");
    let err = measured("hf tiny entries + trailing byte", text, sharded::parse_index).unwrap_err();
    assert!(matches!(err, ErrorKind::BadIndex { .. }), "{err:?}");
}

#[test]
fn sllm_index_with_millions_of_tiny_entries() {
    let _serial = serial();
    let text = repeated("{", |i| format!(r#""{}":[0,1,[],[],"u8",0]"#, short_name(i)), ",", "}");
    let index = measured("sllm tiny legacy entries", text, |b| sllm::parse_index(&b)).unwrap();
    assert!(index.len() > 300_000, "{}", index.len());
    let text = repeated("{", |i| format!(r#""{}":[{i},1,[],[],"torch.int8"]"#, short_name(i)), ",", "}");
    let index = measured("sllm tiny upstream entries", text, |b| sllm::parse_index(&b)).unwrap();
    assert!(index.len() > 200_000, "{}", index.len());
}

#[test]
fn sllm_index_with_maximal_ranks() {
    let _serial = serial();
    let zeros = vec!["0"; sllm::RANK_MAX].join(",");
    let text =
        repeated("{", |i| format!(r#""{}":[0,0,[{zeros}],[{zeros}],"u8",0]"#, short_name(i)), ",", "}");
    let index = measured("sllm rank-64 entries", text, |b| sllm::parse_index(&b)).unwrap();
    assert_eq!(index.entry(0).unwrap().shape.len(), sllm::RANK_MAX);
}

#[test]
fn sllm_index_with_junk_fails_bounded() {
    let _serial = serial();
    let zeros = vec!["0"; INDEX_BYTES / 2].join(",");
    let text = format!(r#"{{"w": [{zeros}]}}"#);
    let err = measured("sllm wide junk entry", text.into_bytes(), |b| sllm::parse_index(&b)).unwrap_err();
    assert!(matches!(err, ErrorKind::BadSllmEntry { .. }), "{err:?}");
    let depth = INDEX_BYTES / 2;
    let text = format!(r#"{{"w": {}{}}}"#, "[".repeat(depth), "]".repeat(depth));
    let err = measured("sllm deep junk entry", text.into_bytes(), |b| sllm::parse_index(&b)).unwrap_err();
    assert!(matches!(err, ErrorKind::BadIndex { .. } | ErrorKind::BadSllmEntry { .. }), "{err:?}");
    let mut text = repeated("{", |i| format!(r#""{}":[0,1,[],[],"u8",0]"#, short_name(i)), ",", "}");
    text.extend_from_slice(b",");
    let err = measured("sllm tiny entries + trailing comma", text, |b| sllm::parse_index(&b)).unwrap_err();
    assert!(matches!(err, ErrorKind::BadIndex { .. }), "{err:?}");
}

/// A `tensor_index.json` that is a symlink to `/dev/zero` is refused before anything is read:
/// on the old code it allocated the whole 256 MiB cap before failing (issue 14, finding 4).
#[cfg(unix)]
#[test]
fn an_index_linked_to_dev_zero_allocates_nothing_much() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join(sllm::INDEX_FILE_NAME)).unwrap();
    let (result, peak_bytes) = ALLOC.peak_during(|| sllm::open_dir(dir.path()).map(|c| c.tensors().len()));
    let err = result.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotRegularFile { .. }), "{err}");
    assert!(peak_bytes < 64 << 10, "peak {peak_bytes} bytes");
}

/// Issue 20: peak heap while opening a sharded checkpoint (index, 100 shards of MoE-named fp8
/// tensors over sparse data) stays at most twice the shards' header bytes, with one header
/// thread and with several.
#[test]
fn opening_a_sharded_checkpoint_peaks_below_twice_its_header_bytes() {
    use std::collections::BTreeMap;
    use tensora_format::write::{SafetensorsLayout, TensorSpec};
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut weight_map = BTreeMap::new();
    let mut header_bytes = 0usize;
    for shard in 0..100 {
        let file = format!("model-{:05}-of-000100.safetensors", shard + 1);
        let mut specs = Vec::new();
        for expert in 0..100 {
            for proj in ["gate_proj", "up_proj", "down_proj"] {
                let base = format!("model.layers.{shard}.mlp.experts.{expert}.{proj}");
                specs.push(TensorSpec {
                    name: format!("{base}.weight"),
                    dtype: tensora_format::Dtype::F8E4M3,
                    shape: vec![2048, 7168],
                });
                specs.push(TensorSpec {
                    name: format!("{base}.weight_scale_inv"),
                    dtype: tensora_format::Dtype::F32,
                    shape: vec![16, 56],
                });
            }
        }
        for s in &specs {
            weight_map.insert(s.name.clone(), file.clone());
        }
        let layout = SafetensorsLayout::new(specs, BTreeMap::new()).unwrap();
        header_bytes += layout.header_bytes().len();
        let mut f = std::fs::File::create(dir.path().join(&file)).unwrap();
        std::io::Write::write_all(&mut f, layout.header_bytes()).unwrap();
        f.set_len(layout.file_len_bytes()).unwrap(); // Sparse: the data section is a hole.
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
    for threads in [1, 2] {
        let options = tensora_format::OpenOptions { header_threads: threads, ..Default::default() };
        let (ckpt, peak_bytes) =
            ALLOC.peak_during(|| tensora_format::open_with(dir.path(), &options).unwrap());
        let ratio = peak_bytes as f64 / header_bytes as f64;
        eprintln!(
            "open, {threads} header threads: {header_bytes} header bytes, peak heap {peak_bytes} bytes ({ratio:.2}x)"
        );
        assert_eq!(ckpt.tensors().len(), 100 * 600);
        assert!(
            peak_bytes <= 2 * header_bytes,
            "peak {peak_bytes} bytes for {header_bytes} header bytes ({ratio:.2}x)"
        );
    }
}
