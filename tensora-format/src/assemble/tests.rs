use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::write::{SafetensorsLayout, ShardedLayout, TensorSpec, write_safetensors, write_sharded};
use crate::{Dtype, Format};

/// Everything a checkpoint exposes, for comparing two of them.
fn assert_same(a: &Checkpoint, b: &Checkpoint) {
    assert_eq!(a.format(), b.format());
    assert_eq!(a.root(), b.root());
    assert_eq!(a.files(), b.files());
    assert_eq!(a.tensors(), b.tensors());
    assert_eq!(a.metadata(), b.metadata());
    assert_eq!(a.warnings(), b.warnings());
    for (i, t) in a.tensors().iter().enumerate() {
        assert_eq!(b.tensor_index(t.name()), Some(i));
    }
}

/// The object for a local safetensors file, read the way a remote loader reads one: bytes, then
/// `parse_header`, stamped from metadata.
fn object(path: &Path) -> SafetensorsObject {
    let meta = std::fs::metadata(path).unwrap();
    let bytes = std::fs::read(path).unwrap();
    let span = crate::safetensors::header_span_bytes(&bytes[..8], meta.len()).unwrap() as usize;
    let header = crate::safetensors::parse_header(&bytes[..span], meta.len()).unwrap();
    let name = path.file_name().unwrap().to_str().unwrap().to_owned();
    SafetensorsObject { path: path.to_path_buf(), name, stamp: FileStamp::from_metadata(&meta), header }
}

fn spec(name: &str, n: u64) -> TensorSpec {
    TensorSpec { name: name.into(), dtype: Dtype::F32, shape: vec![n] }
}

fn write_file(path: &Path, specs: Vec<TensorSpec>, meta: &[(&str, &str)]) {
    let meta = meta.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    let layout = SafetensorsLayout::new(specs, meta).unwrap();
    write_safetensors(path, &layout, |i, out| {
        let n = layout.specs()[i].nbytes().unwrap() as usize;
        out.write_all(&vec![i as u8; n])
    })
    .unwrap();
}

fn write_sharded_dir(dir: &Path, lens: &[u64], shard_bytes_max: u64) {
    let specs = lens.iter().enumerate().map(|(i, &n)| spec(&format!("t{i}"), n)).collect();
    let meta = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
    let layout = ShardedLayout::new(specs, meta, shard_bytes_max).unwrap();
    write_sharded(dir, &layout, |i, out| out.write_all(&vec![i as u8; lens[i] as usize * 4])).unwrap();
}

fn shard_objects(dir: &Path) -> Vec<SafetensorsObject> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    paths.sort();
    paths.iter().map(|p| object(p)).collect()
}

fn parse_hf_index(dir: &Path) -> (std::path::PathBuf, ShardIndex) {
    let path = dir.join(crate::write::SHARD_INDEX_FILE_NAME);
    let index = crate::sharded::parse_index(std::fs::read(&path).unwrap()).unwrap();
    (path, index)
}

#[test]
fn real_fixtures_assemble_like_open() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real"));
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let opened = crate::open(&path).unwrap();
        let built = safetensors_file(object(&path)).unwrap();
        assert_same(&built, &opened);
        seen += 1;
    }
    assert!(seen > 0, "no fixtures in {}", dir.display());
}

#[test]
fn a_stamp_that_disagrees_with_the_header_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.safetensors");
    write_file(&path, vec![spec("w", 4)], &[]);
    let mut obj = object(&path);
    obj.stamp.len_bytes += 1;
    let err = safetensors_file(obj.clone()).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotACheckpoint { .. }), "{err}");
    assert_eq!(err.path(), path);
    let err = unindexed_shards(dir.path(), vec![obj]).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotACheckpoint { .. }), "{err}");
}

#[test]
fn indexed_shards_assemble_like_open_and_keep_every_rule() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded_dir(dir.path(), &[100, 200, 300, 50, 70], 1200);
    let opened = crate::open(dir.path()).unwrap();
    assert_eq!(opened.format(), Format::SafetensorsSharded);
    let (index_path, index) = parse_hf_index(dir.path());
    let objects = shard_objects(dir.path());
    assert!(objects.len() > 1);
    // Any order in, the index's order out.
    let mut reversed = objects.clone();
    reversed.reverse();
    let built = indexed_shards(dir.path(), &index_path, &index, reversed).unwrap();
    assert_same(&built, &opened);

    // A shard missing.
    let err = indexed_shards(dir.path(), &index_path, &index, objects[1..].to_vec()).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::MissingShard { .. }), "{err}");
    // An object the index does not name, and one given twice.
    let mut extra = objects.clone();
    let mut stranger = objects[0].clone();
    stranger.path = dir.path().join("stranger.safetensors");
    stranger.name = "stranger.safetensors".to_owned();
    extra.push(stranger);
    let err = indexed_shards(dir.path(), &index_path, &index, extra).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotACheckpoint { .. }), "{err}");
    let mut twice = objects.clone();
    twice.push(objects[0].clone());
    let err = indexed_shards(dir.path(), &index_path, &index, twice).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotACheckpoint { .. }), "{err}");
    // Two shards' headers swapped: tensors are not where the map says.
    let mut swapped = objects.clone();
    let (h0, h1) = (swapped[0].header.clone(), swapped[1].header.clone());
    let (s0, s1) = (swapped[0].stamp, swapped[1].stamp);
    swapped[0].header = h1;
    swapped[0].stamp = s1;
    swapped[1].header = h0;
    swapped[1].stamp = s0;
    let err = indexed_shards(dir.path(), &index_path, &index, swapped).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::TensorNotInIndex { .. } | ErrorKind::TensorNotInShard { .. }),
        "{err}"
    );
}

#[test]
fn indexed_shards_match_on_the_name_not_on_an_encoded_url() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded_dir(dir.path(), &[100, 200, 300], 800);
    let (index_path, index) = parse_hf_index(dir.path());
    let mut objects = shard_objects(dir.path());
    assert!(objects.len() > 1);
    for o in &mut objects {
        // What a remote loader has: the URL, whose last segment is percent-encoded.
        o.path = format!("http://h/ckpt/{}", o.name.replace('-', "%2D")).into();
    }
    let built = indexed_shards(Path::new("http://h/ckpt/"), &index_path, &index, objects.clone()).unwrap();
    let paths: Vec<_> = built.files().iter().map(|f| f.path().to_path_buf()).collect();
    let mut want: Vec<_> = objects.iter().map(|o| o.path.clone()).collect();
    want.sort();
    assert_eq!(paths, want);
    // The name decides, so an object whose name is not in the index is refused whatever its path.
    objects[0].name = "elsewhere.safetensors".to_owned();
    let err = indexed_shards(Path::new("http://h/ckpt/"), &index_path, &index, objects).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotACheckpoint { .. }), "{err}");
}

#[test]
fn unindexed_shards_assemble_like_open_and_refuse_a_tensor_in_two() {
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("a.safetensors"), vec![spec("x", 3), spec("y", 5)], &[("k", "1")]);
    write_file(&dir.path().join("b.safetensors"), vec![spec("z", 7)], &[("k", "2")]);
    let opened = crate::open(dir.path()).unwrap();
    let built = unindexed_shards(dir.path(), shard_objects(dir.path())).unwrap();
    assert_same(&built, &opened);
    assert_eq!(built.warnings().len(), 1, "{:?}", built.warnings());

    write_file(&dir.path().join("c.safetensors"), vec![spec("x", 3)], &[]);
    let err = unindexed_shards(dir.path(), shard_objects(dir.path())).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::TensorInTwoShards { .. }), "{err}");
    assert_eq!(err.tensor(), Some("x"));
    let err = unindexed_shards(dir.path(), Vec::new()).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotACheckpoint { .. }), "{err}");
}

fn sllm_parts(dir: &Path) -> (std::path::PathBuf, SllmIndex, Vec<Partition>) {
    let index_path = dir.join(crate::sllm::INDEX_FILE_NAME);
    let index = crate::sllm::parse_index(&std::fs::read(&index_path).unwrap()).unwrap();
    let partitions = (0..)
        .map(|i| crate::sllm::partition_path(dir, i))
        .take_while(|p| p.is_file())
        .map(|path| Partition { stamp: FileStamp::from_metadata(&std::fs::metadata(&path).unwrap()), path })
        .collect();
    (index_path, index, partitions)
}

#[test]
fn serverlessllm_fixture_assembles_like_open() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny"));
    let opened = crate::open(dir).unwrap();
    let (index_path, index, partitions) = sllm_parts(dir);
    let built = serverlessllm(dir, &index_path, index.clone(), partitions.clone()).unwrap();
    assert_same(&built, &opened);

    let err = serverlessllm(dir, &index_path, index.clone(), Vec::new()).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NoPartitions), "{err}");
    // A partition that is shorter than the index needs.
    let mut short = partitions;
    let last = short.last_mut().unwrap();
    last.stamp.len_bytes = last.stamp.len_bytes.saturating_sub(1);
    let err = serverlessllm(dir, &index_path, index, short).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::OutsidePartition { .. }), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// For any sharded layout, assembling the parsed headers gives what `open` gives.
    #[test]
    fn assembled_equals_opened(lens in proptest::collection::vec(0u64..300, 1..12), cap in 64u64..2000) {
        let dir = tempfile::tempdir().unwrap();
        write_sharded_dir(dir.path(), &lens, cap);
        let opened = crate::open(dir.path()).unwrap();
        let (index_path, index) = parse_hf_index(dir.path());
        let built = indexed_shards(dir.path(), &index_path, &index, shard_objects(dir.path())).unwrap();
        assert_same(&built, &opened);
        std::fs::remove_file(&index_path).unwrap();
        let opened = crate::open(dir.path()).unwrap();
        let built = unindexed_shards(dir.path(), shard_objects(dir.path())).unwrap();
        assert_same(&built, &opened);
    }
}
