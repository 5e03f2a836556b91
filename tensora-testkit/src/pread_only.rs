//! What crossing some files' page cache costs alone: every byte read with `pread` into one
//! reused buffer per thread, nothing kept, nothing converted. The cast pairs' memory bound
//! (`tensora-bench`'s `casts`) and `tensora-io/examples/cast_cost.rs` both measure it here.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How [`pread_only`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreadOnly {
    /// Reader threads, each with its own buffer (at least 1).
    pub threads: usize,
    /// Bytes of one `pread` and of each thread's buffer (at least 1; the bench's 1 MiB fits a
    /// core's L2, so the copy's writes stay in the cache).
    pub chunk_bytes: usize,
}

impl PreadOnly {
    /// The bench's reading: 2 threads (one per core here), 1 MiB reads.
    pub const TWO_THREADS_1_MIB: PreadOnly = PreadOnly { threads: 2, chunk_bytes: 1 << 20 };
}

/// Read every byte of `paths`, one file after the other, each by `config.threads` threads taking
/// the next `config.chunk_bytes` of the file in turn and reading it into their own buffer (reused
/// for every chunk and file), nothing kept. Returns the bytes read. Warm files make this the cost
/// of crossing their page cache; cold ones add the device's.
///
/// A file that cannot be opened or that ends before its length (read at the start) is an error
/// naming it and the offset.
pub fn pread_only(paths: &[PathBuf], config: PreadOnly) -> io::Result<u64> {
    if config.threads == 0 || config.chunk_bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{config:?}: nothing would be read"),
        ));
    }
    let chunk = config.chunk_bytes as u64;
    // Allocated and touched once, outside the reads.
    let mut buffers: Vec<Vec<u8>> = (0..config.threads).map(|_| vec![1u8; config.chunk_bytes]).collect();
    let mut total = 0u64;
    for path in paths {
        let named =
            |e: io::Error, what: String| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()));
        let file = File::open(path).map_err(|e| named(e, "open".into()))?;
        let len = file.metadata().map_err(|e| named(e, "stat".into()))?.len();
        let next = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<(u64, io::Error)>> = Mutex::new(None);
        std::thread::scope(|s| {
            for buf in &mut buffers {
                let (file, next, failed, first_error) = (&file, &next, &failed, &first_error);
                s.spawn(move || {
                    loop {
                        let at = next.fetch_add(chunk, Ordering::Relaxed);
                        if at >= len || failed.load(Ordering::Relaxed) {
                            return;
                        }
                        // At most `chunk`, which is a usize.
                        let n = chunk.min(len - at) as usize;
                        if let Err(e) = file.read_exact_at(&mut buf[..n], at) {
                            failed.store(true, Ordering::Relaxed);
                            if let Ok(mut first) = first_error.lock() {
                                first.get_or_insert((at, e));
                            }
                            return;
                        }
                        std::hint::black_box(&buf);
                    }
                });
            }
        });
        if let Some((at, e)) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(named(e, format!("read at offset {at} of")));
        }
        total += len;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_byte_of_every_file_and_names_what_fails() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Vec::new();
        for (i, len) in [3 * 4096 + 17usize, 1 << 20, 0, 5].into_iter().enumerate() {
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, vec![7u8; len]).unwrap();
            paths.push(p);
        }
        let want: u64 = 3 * 4096 + 17 + (1 << 20) + 5;
        for config in [PreadOnly::TWO_THREADS_1_MIB, PreadOnly { threads: 3, chunk_bytes: 4096 }] {
            assert_eq!(pread_only(&paths, config).unwrap(), want, "{config:?}");
        }
        assert_eq!(pread_only(&[], PreadOnly::TWO_THREADS_1_MIB).unwrap(), 0);
        for bad in [PreadOnly { threads: 0, chunk_bytes: 1 }, PreadOnly { threads: 1, chunk_bytes: 0 }] {
            let e = pread_only(&paths, bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
        let missing = dir.path().join("missing");
        let e = pread_only(&[missing], PreadOnly::TWO_THREADS_1_MIB).unwrap_err();
        assert!(e.to_string().contains("open") && e.to_string().contains("missing"), "{e}");
        // A directory opens but cannot be read: the error names the offset and the path.
        // A directory of a non-zero length (most file systems) opens but cannot be read.
        let dir_len = std::fs::metadata(dir.path()).unwrap().len();
        match pread_only(&[dir.path().to_path_buf()], PreadOnly::TWO_THREADS_1_MIB) {
            Err(e) => assert!(dir_len > 0 && e.to_string().contains("offset 0"), "{e}"),
            Ok(read) => assert_eq!((read, dir_len), (0, 0)),
        }
    }
}
