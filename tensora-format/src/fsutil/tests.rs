//! The regular-file open: each kind of special file refused with its typed error, through both
//! ways of opening, and the path resolved once (a swap after the check is not seen).
//! Blocking cases (FIFOs, terminals) live in `tests/special_files.rs`, behind a hang guard.

use super::*;

fn refused(path: &Path, how: Reopen) -> NonRegular {
    match open_with(path, how) {
        Ok(_) => panic!("{} was opened", path.display()),
        Err(e) => {
            assert_eq!(e.path(), path);
            match e.into_kind() {
                ErrorKind::NotRegularFile { found } => found,
                other => panic!("expected NotRegularFile, got {other:?}"),
            }
        }
    }
}

#[test]
fn a_directory_is_not_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    for how in [Reopen::Auto, Reopen::NonBlocking] {
        assert_eq!(refused(dir.path(), how), NonRegular::Directory);
    }
    let err = open_regular(dir.path()).unwrap_err();
    assert!(err.to_string().ends_with("not a regular file (a directory)"), "{err}");
}

#[cfg(unix)]
#[test]
fn a_symlink_to_dev_null_is_a_character_device_by_either_open() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("model.safetensors");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    for how in [Reopen::Auto, Reopen::NonBlocking] {
        assert_eq!(refused(&link, how), NonRegular::CharDevice);
    }
}

#[test]
fn a_regular_file_opens_by_either_way_with_its_fstat() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.json");
    std::fs::write(&path, b"{\"a\": 1}").unwrap();
    for how in [Reopen::Auto, Reopen::NonBlocking] {
        let (mut file, meta) = open_with(&path, how).unwrap();
        assert_eq!(meta.len(), 8);
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "{\"a\": 1}");
    }
}

#[test]
fn missing_files_are_io_errors_naming_the_path() {
    let err = read_capped(Path::new("/nonexistent/tensora/index.json"), 10).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Io(e) if e.kind() == std::io::ErrorKind::NotFound));
    assert!(err.to_string().contains("/nonexistent/tensora/index.json"));
}

#[test]
fn read_capped_refuses_a_file_over_the_cap_and_reads_one_at_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tensor_index.json");
    std::fs::write(&path, [b'x'; 10]).unwrap();
    assert_eq!(read_capped(&path, 10).unwrap().len(), 10);
    let err = read_capped(&path, 9).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::IndexTooLarge { len_bytes: 10, limit_bytes: 9 }), "{err}");
}

/// The path is resolved once: after the `O_PATH` check, the path is replaced by a symlink to a
/// character device. The `/proc/self/fd` open still reads the inode that was checked (a second
/// resolution of the path would have found the device); the non-blocking fallback, which must
/// resolve the path again, notices the swap and refuses.
#[cfg(target_os = "linux")]
#[test]
fn a_path_swapped_after_the_check_is_never_opened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tensor_index.json");
    let swap = |path: &Path| {
        std::fs::write(path, b"checked").unwrap();
        let checked = linux::Checked::open(path).unwrap();
        std::fs::remove_file(path).unwrap();
        std::os::unix::fs::symlink("/dev/null", path).unwrap();
        checked
    };

    let (mut file, meta) = swap(&path).open_for_reading(&path, Reopen::Auto).unwrap();
    let mut text = String::new();
    file.read_to_string(&mut text).unwrap();
    assert_eq!((text.as_str(), meta.len()), ("checked", 7));

    std::fs::remove_file(&path).unwrap();
    let err = swap(&path).open_for_reading(&path, Reopen::NonBlocking).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotRegularFile { found: NonRegular::CharDevice }), "{err}");

    // Swapped for another regular file: same type, different inode.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"checked").unwrap();
    let checked = linux::Checked::open(&path).unwrap();
    std::fs::rename(dir.path().join("tensor_index.json"), dir.path().join("old")).unwrap();
    std::fs::write(&path, b"other").unwrap();
    let err = checked.open_for_reading(&path, Reopen::NonBlocking).unwrap_err();
    assert!(err.to_string().contains("replaced while it was being opened"), "{err}");
}
