//! The disk's write roofline for the cache cells: the bytes a cold cache writes, written with
//! `O_DIRECT` in 8 MiB pieces, each from its own place in one faulted-in buffer of that size (as
//! the cache's lane writes each range from where it landed in the arena), into eight new
//! preallocated files (a cold cache's copies are 8 × 128 MiB, preallocated), by as many threads
//! as the lane has. No `fsync`, as the cold cell makes its copies durable behind the load.

use std::fs::File;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tensora_io::{Arena, ArenaConfig, Prefault};

const PIECE_BYTES: u64 = 8 << 20;
const FILES: u64 = 8;

/// A buffer and files ready to be written (set up outside the timed region); the directory is
/// removed on drop.
pub struct WriteRoofline {
    dir: PathBuf,
    buf: Arena,
    files: Vec<File>,
    file_bytes: u64,
}

impl WriteRoofline {
    /// Fault in a buffer of `bytes` (rounded up to whole pieces) and create the files in `dir`.
    pub fn prepare(dir: &Path, bytes: u64) -> Result<WriteRoofline, String> {
        let err = |e: std::io::Error| format!("write roofline in {}: {e}", dir.display());
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(err)?;
        let file_bytes = bytes.div_ceil(FILES).next_multiple_of(PIECE_BYTES);
        let config = ArenaConfig { len_bytes: file_bytes * FILES, prefault: Prefault::PopulateWrite };
        let mut buf = Arena::new(&config).map_err(|e| format!("write roofline buffer: {e}"))?;
        buf.as_mut_slice().fill(0x5a);
        let files = (0..FILES)
            .map(|i| {
                let file = File::options()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(dir.join(format!("f{i}")))?;
                tensora_sys::preallocate(&file, file_bytes)?;
                Ok(file)
            })
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(err)?;
        Ok(WriteRoofline { dir: dir.to_path_buf(), buf, files, file_bytes })
    }

    /// Bytes one run writes.
    pub fn bytes(&self) -> u64 {
        self.file_bytes * FILES
    }

    /// Write every piece once: the seconds it took.
    pub fn run(&mut self) -> Result<f64, String> {
        let threads = tensora_remote::LANE_THREADS;
        let WriteRoofline { dir, buf, files, file_bytes } = self;
        let (files, file_bytes) = (&*files, *file_bytes);
        let pieces: Vec<(usize, u64)> = (0..FILES as usize)
            .flat_map(|f| (0..file_bytes / PIECE_BYTES).map(move |k| (f, k * PIECE_BYTES)))
            .collect();
        let buf: &[u8] = buf.as_slice();
        let t = Instant::now();
        let written: std::io::Result<()> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|k| {
                    let pieces = &pieces;
                    s.spawn(move || {
                        pieces.iter().skip(k).step_by(threads).try_for_each(|&(f, at)| {
                            let from = (f as u64 * file_bytes + at) as usize;
                            files[f].write_all_at(&buf[from..from + PIECE_BYTES as usize], at)
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .try_for_each(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("panicked"))))
        });
        let seconds = t.elapsed().as_secs_f64();
        written.map_err(|e| format!("write roofline in {}: {e}", dir.display()))?;
        Ok(seconds)
    }
}

impl Drop for WriteRoofline {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
