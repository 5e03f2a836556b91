//! The HF-written fixtures in `fixtures/real`: parse, check every tensor against the
//! independently computed `*.expected.json`, re-write with our writer, and check that the copy has
//! the same layout and bytes and that HF's own crate reads it.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tensora_format::write::{SafetensorsLayout, TensorSpec, write_safetensors};
use tensora_format::{Dtype, Format};

const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real");

fn fixtures() -> Vec<(PathBuf, serde_json::Value, usize)> {
    ["fracast-0", "fracast-0.int8"]
        .iter()
        .zip([47usize, 67])
        .map(|(stem, count)| {
            let st = Path::new(REAL).join(format!("{stem}.safetensors"));
            let exp = Path::new(REAL).join(format!("{stem}.expected.json"));
            let exp: serde_json::Value = serde_json::from_slice(&std::fs::read(exp).unwrap()).unwrap();
            (st, exp, count)
        })
        .collect()
}

fn read_range(path: &Path, offset: u64, len: u64) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf).unwrap();
    buf
}

#[test]
fn real_fixtures_match_expected_dtype_shape_and_sha256() {
    for (path, expected, count) in fixtures() {
        let ckpt = tensora_format::open(&path).unwrap();
        assert_eq!(ckpt.format(), Format::Safetensors);
        assert_eq!(ckpt.files().len(), 1);
        assert_eq!(ckpt.tensors().len(), count, "{}", path.display());
        let exp = expected["tensors"].as_object().unwrap();
        assert_eq!(exp.len(), count);
        assert_eq!(ckpt.metadata().len(), 5);
        assert_eq!(ckpt.metadata()["model_name"], "fracast-0");
        let mut previous_end = ckpt.file(tensora_format::FileId(0)).data_start_bytes();
        for t in ckpt.tensors() {
            // Ordered by offset, tiling the data section.
            assert_eq!(t.offset_bytes(), previous_end);
            previous_end = t.range().end;
            let e = &exp[t.name()];
            assert_eq!(t.dtype().as_str(), e["dtype"].as_str().unwrap(), "{}", t.name());
            let shape: Vec<u64> =
                e["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            assert_eq!(t.shape(), &shape[..], "{}", t.name());
            assert_eq!(t.len_bytes(), t.nbytes());
            let bytes = read_range(&path, t.offset_bytes(), t.len_bytes());
            assert_eq!(hex::encode(Sha256::digest(&bytes)), e["sha256"].as_str().unwrap(), "{}", t.name());
            assert_eq!(ckpt.tensor(t.name()), Some(t));
        }
        assert_eq!(previous_end, std::fs::metadata(&path).unwrap().len());
    }
}

#[test]
fn int8_fixture_has_both_dtypes() {
    let (path, _, _) = fixtures().pop().unwrap();
    let ckpt = tensora_format::open(&path).unwrap();
    let count = |d: Dtype| ckpt.tensors().iter().filter(|t| t.dtype() == d).count();
    assert_eq!((count(Dtype::F32), count(Dtype::I8)), (47, 20));
}

#[test]
fn rewriting_hf_fixtures_keeps_layout_and_bytes_and_hf_reads_ours() {
    for (path, expected, count) in fixtures() {
        let original = tensora_format::open(&path).unwrap();
        let specs: Vec<TensorSpec> = original
            .tensors()
            .iter()
            .map(|t| TensorSpec { name: t.name().to_string(), dtype: t.dtype(), shape: t.shape().to_vec() })
            .collect();
        let layout = SafetensorsLayout::new(specs, original.metadata().clone()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("copy.safetensors");
        let infos = original.tensors().to_vec();
        write_safetensors(&out, &layout, |i, w| {
            w.write_all(&read_range(&path, infos[i].offset_bytes(), infos[i].len_bytes()))
        })
        .unwrap();
        assert_eq!(std::fs::metadata(&out).unwrap().len(), layout.file_len_bytes());

        let copy = tensora_format::open(&out).unwrap();
        assert_eq!(copy.tensors().len(), count);
        assert_eq!(copy.metadata(), original.metadata());
        let exp = expected["tensors"].as_object().unwrap();
        for t in copy.tensors() {
            let o = original.tensor(t.name()).unwrap();
            assert_eq!((t.dtype(), t.shape(), t.len_bytes()), (o.dtype(), o.shape(), o.len_bytes()));
            assert_eq!(t.offset_bytes() % t.dtype().align_bytes(), 0, "{} misaligned", t.name());
            let bytes = read_range(&out, t.offset_bytes(), t.len_bytes());
            assert_eq!(hex::encode(Sha256::digest(&bytes)), exp[t.name()]["sha256"].as_str().unwrap());
        }
        // The same relative layout as HF wrote: HF also orders by alignment, so F32 data comes
        // before I8 and the data sections are the same size.
        let data_len =
            |c: &tensora_format::Checkpoint| c.files()[0].len_bytes() - c.files()[0].data_start_bytes();
        assert_eq!(data_len(&copy), data_len(&original));
        // Indeed the very same layout: HF orders by alignment, then name, which is the order we
        // were given the specs in, so every tensor sits at the same place in the data section.
        let rel = |c: &tensora_format::Checkpoint, name: &str| {
            c.tensor(name).unwrap().offset_bytes() - c.files()[0].data_start_bytes()
        };
        for t in original.tensors() {
            assert_eq!(rel(&copy, t.name()), rel(&original, t.name()), "{}", t.name());
        }

        // HF's reference implementation accepts our file and sees the same tensors and bytes.
        let bytes = std::fs::read(&out).unwrap();
        let hf = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(hf.len(), count);
        for (name, view) in hf.tensors() {
            let t = copy.tensor(&name).unwrap();
            assert_eq!(view.shape().iter().map(|&d| d as u64).collect::<Vec<_>>(), t.shape());
            assert_eq!(format!("{:?}", view.dtype()), t.dtype().as_str());
            assert_eq!(view.data(), &bytes[t.range().start as usize..t.range().end as usize]);
        }
        let (_, hf_meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let hf_meta: BTreeMap<String, String> = hf_meta.metadata().clone().unwrap().into_iter().collect();
        assert_eq!(&hf_meta, original.metadata());
    }
}
