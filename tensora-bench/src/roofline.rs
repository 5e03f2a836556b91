//! The machine's limits, measured on the same files in the same run as the loaders.
//!
//! - warm: every file read with 2 threads of `pread` into a fresh `tensora_io::Arena` (2 MiB
//!   aligned, `MADV_HUGEPAGE`) mapped for each run, the files laid end to end: one copy from the
//!   page cache plus the huge-page faults that any load into new memory pays. This is the same work
//!   an owned load does (Tensora's loads map a fresh arena by default, `ArenaReuse::Fresh`), so the
//!   ratio compares like with like. Mapping the arena and the one-byte-per-page touch that every
//!   loader and peer does are timed; unmapping the previous arena is not (nor for the loaders).
//! - cold, direct: `O_DIRECT` reads of 8 MiB blocks, 32 in flight on one io_uring ring
//!   (`tensora_testkit::direct_read_roofline`), into an arena faulted in by the warm-up;
//! - cold, buffered: 2 threads of buffered `pread` in 8 MiB blocks.
//!
//! The device roofline is the better of the two cold figures.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use anyhow::{Context, Result, bail};
use tensora_io::Arena;

use crate::cells::RooflinePages;

/// Size of one roofline read.
pub const BLOCK_BYTES: usize = 8 << 20;
/// Reads in flight for the O_DIRECT roofline.
pub const DIRECT_QUEUE_DEPTH: usize = 32;
/// Threads for the warm and the buffered cold roofline (one per core here).
pub const COPY_THREADS: usize = 2;
/// Buffer alignment for O_DIRECT (covers every logical block size up to 4 KiB).
pub const DIRECT_ALIGN_BYTES: usize = 4096;

/// Per-reader block buffers aligned for O_DIRECT, allocated and touched once, outside any timing.
#[derive(Debug)]
pub struct ReadBuffers {
    raw: Vec<Vec<u8>>,
}

impl ReadBuffers {
    /// `count` buffers of [`BLOCK_BYTES`] each.
    pub fn new(count: usize) -> ReadBuffers {
        // Filled with a non-zero byte so every page is faulted in now, not during a timed read.
        ReadBuffers { raw: (0..count).map(|_| vec![1u8; BLOCK_BYTES + DIRECT_ALIGN_BYTES]).collect() }
    }

    /// One aligned block per reader.
    fn blocks(&mut self) -> Vec<&mut [u8]> {
        self.raw
            .iter_mut()
            .map(|raw| {
                let skip = raw.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
                &mut raw[skip..skip + BLOCK_BYTES]
            })
            .collect()
    }
}

/// Open `path` for buffered reads; the file and its length.
fn open_len(path: &PathBuf) -> Result<(File, u64)> {
    let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let len = file.metadata()?.len();
    Ok((file, len))
}

/// Warm roofline: read every file with [`COPY_THREADS`] threads into `arena`, the files laid end
/// to end from the arena's start. Returns the bytes read.
pub fn warm_pread(files: &[PathBuf], arena: &mut Arena) -> Result<u64> {
    let mut total = 0u64;
    for path in files {
        let (file, len) = open_len(path)?;
        let start = usize::try_from(total).context("arena offset")?;
        let len = usize::try_from(len).ok().filter(|&l| (start + l) as u64 <= arena.len_bytes());
        let len = len.with_context(|| format!("{} does not fit the arena", path.display()))?;
        let dest = &mut arena.as_mut_slice()[start..start + len];
        let next = Mutex::new(dest.chunks_mut(BLOCK_BYTES).enumerate());
        let errors: Mutex<Vec<std::io::Error>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..COPY_THREADS {
                s.spawn(|| {
                    loop {
                        let item = next.lock().map(|mut it| it.next()).unwrap_or(None);
                        let Some((k, block)) = item else { break };
                        if let Err(e) = file.read_exact_at(block, (k * BLOCK_BYTES) as u64) {
                            errors.lock().map(|mut v| v.push(e)).unwrap_or(());
                            break;
                        }
                    }
                });
            }
        });
        if let Some(e) = errors.into_inner().unwrap_or_default().into_iter().next() {
            return Err(e).with_context(|| format!("read {}", path.display()));
        }
        total += len as u64;
    }
    Ok(total)
}

/// Read every file through the page cache block by block with one thread per buffer, each keeping
/// one read of [`BLOCK_BYTES`] in flight into its own buffer. The blocks of all files form one
/// queue, so the readers never drain at a file boundary. Returns the bytes read; fails if a file
/// was not read whole.
fn parallel_blocks(files: &[PathBuf], buffers: &mut ReadBuffers) -> Result<u64> {
    let opened = files.iter().map(open_len).collect::<Result<Vec<_>>>()?;
    // `first_block[i]`: index of file i's first block in the shared queue.
    let mut first_block = Vec::with_capacity(opened.len() + 1);
    let mut blocks_total = 0u64;
    for (_, len) in &opened {
        first_block.push(blocks_total);
        blocks_total += len.div_ceil(BLOCK_BYTES as u64);
    }
    first_block.push(blocks_total);
    let next = AtomicU64::new(0);
    let done_bytes: Vec<AtomicU64> = opened.iter().map(|_| AtomicU64::new(0)).collect();
    let failures = AtomicUsize::new(0);
    let first_error: Mutex<Option<(usize, std::io::Error)>> = Mutex::new(None);
    std::thread::scope(|s| {
        for buf in buffers.blocks() {
            let (opened, first_block, next, done_bytes, failures, first_error) =
                (&opened, &first_block, &next, &done_bytes, &failures, &first_error);
            s.spawn(move || {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= blocks_total || failures.load(Ordering::Relaxed) > 0 {
                        break;
                    }
                    // The file holding block k: the last one whose first block is <= k.
                    let f = first_block.partition_point(|&b| b <= k) - 1;
                    let (file, len) = (&opened[f].0, opened[f].1);
                    let offset = (k - first_block[f]) * BLOCK_BYTES as u64;
                    let want = (len - offset).min(BLOCK_BYTES as u64) as usize;
                    let error = match file.read_at(&mut buf[..want], offset) {
                        Ok(n) if n >= want => {
                            done_bytes[f].fetch_add(want as u64, Ordering::Relaxed);
                            continue;
                        }
                        Ok(n) => std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("short read of {n} of {want} bytes at offset {offset}"),
                        ),
                        Err(e) => e,
                    };
                    failures.fetch_add(1, Ordering::Relaxed);
                    first_error.lock().map(|mut g| *g = g.take().or(Some((f, error)))).unwrap_or(());
                }
            });
        }
    });
    let how = "buffered";
    if let Some((f, e)) = first_error.into_inner().ok().flatten() {
        return Err(e).with_context(|| format!("read {} ({how})", files[f].display()));
    }
    let mut total = 0u64;
    for ((path, (_, len)), done) in files.iter().zip(&opened).zip(done_bytes) {
        let done = done.into_inner();
        if done != *len {
            bail!("read {done} of {len} bytes of {} ({how})", path.display());
        }
        total += len;
    }
    Ok(total)
}

/// Read `files` once through the page cache (one thread, one [`BLOCK_BYTES`] buffer), so that a
/// warm cell starts warm whatever the previous cell did (a cold cell, or an `O_DIRECT` load that
/// bypassed the cache). Returns the bytes read.
pub fn read_through_cache(files: &[PathBuf], buffers: &mut ReadBuffers) -> Result<u64> {
    let buf = buffers.blocks().into_iter().next().context("no read buffer")?;
    let mut total = 0u64;
    for path in files {
        let (file, len) = open_len(path)?;
        let mut offset = 0u64;
        while offset < len {
            let n = file.read_at(buf, offset).with_context(|| format!("read {}", path.display()))?;
            if n == 0 {
                bail!("{} ended at {offset} of {len} bytes", path.display());
            }
            offset += n as u64;
        }
        total += len;
    }
    Ok(total)
}

/// [`read_through_cache`] for the files that a residency sample (`mincore`, see
/// `tensora_sys::residency_sample`) does not find wholly in the page cache. Returns
/// the bytes read.
pub fn ensure_cached(files: &[PathBuf], buffers: &mut ReadBuffers) -> Result<u64> {
    let mut cold = Vec::new();
    for path in files {
        let (file, len) = open_len(path)?;
        let sample = tensora_sys::residency_sample(&file, len)
            .with_context(|| format!("residency of {}", path.display()))?;
        if sample.resident_pages < sample.sampled_pages {
            cold.push(path.clone());
        }
    }
    read_through_cache(&cold, buffers)
}

/// Warm roofline with the arena's cost included: map a fresh arena for all of `files` (with
/// `pages`), then [`warm_pread`] into it. Returns (seconds, bytes, the arena), so the caller unmaps
/// it untimed.
pub fn warm_pread_fresh(files: &[PathBuf], pages: RooflinePages) -> Result<(f64, u64, Arena)> {
    let total_bytes = files.iter().map(|f| std::fs::metadata(f).map(|m| m.len())).sum::<Result<u64, _>>()?;
    let t = std::time::Instant::now();
    let mut arena = Arena::with_len(total_bytes).context("map the roofline arena")?;
    if pages == RooflinePages::Base {
        arena.use_base_pages().context("advise base pages")?;
    }
    let bytes = warm_pread(files, &mut arena)?;
    // The same one-byte-per-page touch every loader and peer does after loading.
    let len = usize::try_from(bytes).context("arena length")?;
    std::hint::black_box(crate::peers::touch(&arena.as_mut_slice()[..len]));
    Ok((t.elapsed().as_secs_f64(), bytes, arena))
}

/// Cold direct roofline: `O_DIRECT` reads of [`BLOCK_BYTES`], [`DIRECT_QUEUE_DEPTH`] in flight on
/// one io_uring ring, then the one-byte-per-page touch, into `arena` (sized with `tensora_testkit::direct_roofline_arena_bytes`).
/// Fails where the filesystem has no O_DIRECT or io_uring is unavailable.
pub fn cold_direct(files: &[PathBuf], arena: &mut Arena) -> Result<u64> {
    let config = tensora_testkit::DirectRooflineConfig {
        queue_depth: DIRECT_QUEUE_DEPTH as u32,
        block_bytes: BLOCK_BYTES as u64,
    };
    let bytes =
        tensora_testkit::direct_read_roofline(files, config, arena).context("O_DIRECT io_uring roofline")?;
    // The same one-byte-per-page touch every loader and peer does after loading.
    let len = usize::try_from(bytes).context("arena length")?.min(arena.as_slice().len());
    std::hint::black_box(crate::peers::touch(&arena.as_mut_slice()[..len]));
    Ok(bytes)
}

/// The arena [`cold_direct`] needs for `files`.
#[cfg(test)]
pub fn direct_arena(files: &[PathBuf]) -> Result<Arena> {
    let lens = files.iter().map(|f| std::fs::metadata(f).map(|m| m.len())).collect::<Result<Vec<_>, _>>()?;
    Ok(Arena::with_len(tensora_testkit::direct_roofline_arena_bytes(&lens))?)
}

/// Cold buffered roofline: [`COPY_THREADS`] threads of buffered `pread`. `buffers` must hold that
/// many buffers.
pub fn cold_buffered(files: &[PathBuf], buffers: &mut ReadBuffers) -> Result<u64> {
    parallel_blocks(files, buffers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &std::path::Path) -> Vec<PathBuf> {
        // Sizes around the block size and not a multiple of 4 KiB.
        [(BLOCK_BYTES * 2 + 12_345), 100, 0]
            .iter()
            .enumerate()
            .map(|(k, &len)| {
                let p = dir.join(format!("f{k}"));
                let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
                std::fs::write(&p, data).unwrap();
                p
            })
            .collect()
    }

    #[test]
    fn warm_reads_every_byte_into_the_arena() {
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path());
        let mut arena = Arena::with_len(BLOCK_BYTES as u64 * 3).unwrap();
        let total = warm_pread(&files[..1], &mut arena).unwrap();
        assert_eq!(total, (BLOCK_BYTES * 2 + 12_345) as u64);
        assert_eq!(&arena.as_mut_slice()[..total as usize], &std::fs::read(&files[0]).unwrap()[..]);
        assert_eq!(warm_pread(&files, &mut arena).unwrap(), total + 100);
        let mut small = Arena::with_len(1).unwrap();
        assert!(warm_pread(&files[..1], &mut small).is_err());
    }

    #[test]
    fn buffered_and_direct_read_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path());
        let expected = (BLOCK_BYTES * 2 + 12_345 + 100) as u64;
        assert_eq!(cold_buffered(&files, &mut ReadBuffers::new(COPY_THREADS)).unwrap(), expected);
        // tmpfs has no O_DIRECT: accept EINVAL there, but never a wrong count.
        let mut arena = direct_arena(&files).unwrap();
        match cold_direct(&files, &mut arena) {
            Ok(n) => assert_eq!(n, expected),
            Err(e) => assert!(format!("{e:#}").contains("O_DIRECT"), "{e:#}"),
        }
        for pages in [RooflinePages::Arena, RooflinePages::Base] {
            let (seconds, bytes, mut fresh) = warm_pread_fresh(&files, pages).unwrap();
            assert!(seconds > 0.0);
            assert_eq!(bytes, expected);
            assert_eq!(&fresh.as_slice()[..BLOCK_BYTES * 2 + 12_345], &std::fs::read(&files[0]).unwrap()[..]);
            assert!(!(fresh.huge_pages_advised() && pages == RooflinePages::Base), "base pages asked for");
        }
        assert!(cold_buffered(&[dir.path().join("missing")], &mut ReadBuffers::new(1)).is_err());
        assert_eq!(read_through_cache(&files, &mut ReadBuffers::new(1)).unwrap(), expected);
        // Now cached: nothing left to read (the empty file has no page to sample).
        assert_eq!(ensure_cached(&files, &mut ReadBuffers::new(1)).unwrap(), 0);
        tensora_sys::evict_file_cache(&std::fs::File::open(&files[1]).unwrap()).unwrap();
        let again = ensure_cached(&files, &mut ReadBuffers::new(1)).unwrap();
        assert!(again == 0 || again == 100, "reads only what is not cached: {again}");
        assert!(read_through_cache(&files, &mut ReadBuffers::new(0)).is_err());
    }
}
