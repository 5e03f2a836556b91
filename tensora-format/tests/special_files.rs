//! Every file the format readers open by path (indexes, headers, shards, partitions) must be a
//! regular file: a FIFO, a terminal, `/dev/zero` or a directory is refused with
//! `ErrorKind::NotRegularFile` naming the path, without blocking and without reading from it
//! (issue 14, finding 4). Each call runs on a thread behind a generous hang guard: the guard only
//! turns a hang (the bug) into a failure, it does not time anything.
#![cfg(unix)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use tensora_format::write::{SafetensorsLayout, TensorSpec, write_safetensors};
use tensora_format::{Dtype, ErrorKind, NonRegular, sllm};

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");

/// How long a call may take before the test calls it a hang. Far above any real open.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// Run `open` on its own thread; fail the test if it has not returned within [`HANG_GUARD`].
fn returns<T: Send + 'static>(open: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(open());
    });
    rx.recv_timeout(HANG_GUARD).expect("the open blocked (a FIFO or terminal was opened or read)")
}

/// What a special node at `path` is made of.
#[derive(Debug, Clone, Copy)]
enum Node {
    Fifo,
    LinkToTty,
    LinkToZero,
}

impl Node {
    fn make(self, path: &Path) {
        let _ = std::fs::remove_file(path);
        match self {
            Node::Fifo => {
                let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
                assert!(status.success(), "mkfifo {}", path.display());
            }
            Node::LinkToTty => std::os::unix::fs::symlink("/dev/tty", path).unwrap(),
            Node::LinkToZero => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        }
    }
    fn found(self) -> NonRegular {
        match self {
            Node::Fifo => NonRegular::Fifo,
            Node::LinkToTty | Node::LinkToZero => NonRegular::CharDevice,
        }
    }
}

const NODES: [Node; 3] = [Node::Fifo, Node::LinkToTty, Node::LinkToZero];

/// `open(root)` fails promptly with `NotRegularFile { found }` naming `culprit`.
fn assert_refused(root: PathBuf, culprit: &Path, node: Node) {
    let shown = root.display().to_string();
    let err = returns(move || tensora_format::open(&root).map(|c| c.tensors().len()))
        .expect_err(&format!("{shown} opened with a special file inside"));
    assert_eq!(err.path(), culprit, "{err}");
    match err.kind() {
        ErrorKind::NotRegularFile { found } => assert_eq!(*found, node.found(), "{err}"),
        other => panic!("{shown}: expected NotRegularFile, got {other:?}"),
    }
    assert!(err.to_string().contains("not a regular file"), "{err}");
}

fn copy_tiny() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(TINY).unwrap() {
        let from = entry.unwrap().path();
        std::fs::copy(&from, dir.path().join(from.file_name().unwrap())).unwrap();
    }
    dir
}

#[test]
fn the_sllm_index_as_a_fifo_a_terminal_or_dev_zero_is_refused() {
    let dir = copy_tiny();
    let index = dir.path().join(sllm::INDEX_FILE_NAME);
    for node in NODES {
        node.make(&index);
        assert_refused(dir.path().to_path_buf(), &index, node);
        assert_refused(index.clone(), &index, node);
        let d = dir.path().to_path_buf();
        let err = returns(move || sllm::open_dir(&d).map(|c| c.tensors().len())).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::NotRegularFile { .. }), "{err}");
        let d = dir.path().to_path_buf();
        let err = returns(move || sllm::partition_shortfalls(&d).map(|s| s.len())).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::NotRegularFile { .. }), "{err}");
    }
}

#[test]
fn a_partition_that_is_not_a_regular_file_is_refused() {
    let dir = copy_tiny();
    let part = sllm::partition_path(dir.path(), 1);
    for node in NODES {
        node.make(&part);
        assert_refused(dir.path().to_path_buf(), &part, node);
    }
}

fn write_shard(path: &Path, names: &[&str]) {
    let specs =
        names.iter().map(|n| TensorSpec { name: (*n).into(), dtype: Dtype::U8, shape: vec![2] }).collect();
    let layout = SafetensorsLayout::new(specs, BTreeMap::new()).unwrap();
    write_safetensors(path, &layout, |_, out| out.write_all(&[1, 2])).unwrap();
}

#[test]
fn an_hf_index_a_listed_shard_or_a_lone_file_that_is_special_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_shard(&dir.path().join("a.safetensors"), &["x"]);
    write_shard(&dir.path().join("b.safetensors"), &["y"]);
    let index = dir.path().join("model.safetensors.index.json");
    let text = r#"{"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}"#;
    let shard = dir.path().join("b.safetensors");
    for node in NODES {
        node.make(&index);
        assert_refused(dir.path().to_path_buf(), &index, node);
        std::fs::remove_file(&index).unwrap();
        std::fs::write(&index, text).unwrap();
        node.make(&shard);
        assert_refused(dir.path().to_path_buf(), &shard, node);
        assert_refused(shard.clone(), &shard, node);
        // Without an index, a special `*.safetensors` entry is refused too, never skipped.
        std::fs::remove_file(&index).unwrap();
        assert_refused(dir.path().to_path_buf(), &shard, node);
        std::fs::remove_file(&shard).unwrap();
        write_shard(&shard, &["y"]);
    }
    assert_eq!(tensora_format::open(dir.path()).unwrap().tensors().len(), 2);
}

#[test]
fn the_regular_file_primitives_refuse_each_special_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tensor_index.json");
    for node in NODES {
        node.make(&path);
        let p = path.clone();
        let err = returns(move || tensora_format::read_capped(&p, 1 << 30).map(|b| b.len())).unwrap_err();
        assert_eq!(err.path(), path);
        assert!(matches!(err.kind(), ErrorKind::NotRegularFile { found } if *found == node.found()), "{err}");
        let p = path.clone();
        let err = returns(move || tensora_format::open_regular(&p).map(|(_, m)| m.len())).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::NotRegularFile { found } if *found == node.found()), "{err}");
    }
}
