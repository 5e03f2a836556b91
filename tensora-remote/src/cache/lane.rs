//! How a load's fetched ranges go into the copies: written from where they land in the load's
//! destination, in [`PIECE_BYTES`] pieces as each body arrives. No copy of the bytes
//! is made; with reads planned on 4 KiB blocks (`Caching::read_align_bytes`, `super::source`)
//! each piece goes to the disk with `O_DIRECT` when the load's copies are written around the page
//! cache (`Pages::Around`), so neither a buffer nor the page cache holds a second copy, and
//! through the page cache when they fit in it (`Pages::Kept`), so the next load reads memory.
//! Where the pieces go ([`PiecesTo`]) depends on whether the destination outlives the load:
//!
//! - **Behind the load** (an owned load: its arena becomes the model and is kept mapped, see
//!   `tensora_io::KeepMapped`): each piece goes to the session's writers as a
//!   `tensora_io::HeldPiece` and the range lands as soon as it has arrived, so the load waits for
//!   no disk and takes no checksum. A writer writes the piece, reads it back and records it with
//!   the CRC-32C of what the disk holds (`Entry::write_held`), unless the piece was sealed
//!   before and the disk holds other bytes: the caller may rewrite the tensors once it owns them
//!   for writing, and every piece not written by then is sealed first ([`super::seal`]).
//! - **In the lane** (a streamed load, whose window is reused for the next batch once the
//!   consumer has it): the pieces and then the range go to one of [`LANE_THREADS`] threads
//!   scoped to the load's run, in order, and the range lands (is handed to the consumer) only
//!   once every piece is written and recorded. Bounds: a range's pieces and its landing wait
//!   here while it holds its budget permit (given back when it lands), so what waits never
//!   passes the load's in-flight budget, and a disk slower than the network slows the fetches to
//!   its pace with no memory of its own. Each piece carries the CRC-32C of its bytes, taken as
//!   they were copied in (while still in the CPU's caches).
//!
//! Either way each piece is recorded on its own, so an interrupted load keeps every piece written.

use std::sync::Arc;
use std::sync::mpsc::Sender;

use tensora_io::{Filled, Permit, ReadTarget};

use super::{CacheSession, Entry};
use crate::crc::Crc32c;
use crate::fetch::Fill;

/// Threads writing a load's ranges into the copies.
pub const LANE_THREADS: usize = 4;
/// A fetched range goes to the disk in pieces of this many bytes (a multiple of the direct-write
/// block), each as soon as its bytes have arrived.
pub const PIECE_BYTES: usize = 1 << 20;

/// What a lane thread is given, in order for each range: its pieces, then the range itself.
pub(crate) enum LaneWork<'j> {
    /// A filled piece of a range: write it into the copy at `offset_bytes` and record it.
    Piece { entry: Arc<Entry>, offset_bytes: u64, crc32c: u32, bytes: Filled<'j> },
    /// The whole range, every piece sent before it: land it, then give back its budget.
    Land { target: ReadTarget<'j>, permit: Permit },
}

impl<'j> LaneWork<'j> {
    /// Do the work: write a piece (a failure is counted in `session`'s tally, never fatal: the
    /// copy stays partial), or hand back the range to land and its permit.
    pub fn run(self, session: &CacheSession) -> Option<(ReadTarget<'j>, Permit)> {
        match self {
            LaneWork::Piece { entry, offset_bytes, crc32c, bytes } => {
                let written = entry.write(offset_bytes, bytes.bytes(), crc32c);
                session.writers.record(&entry.description.url, bytes.bytes().len(), written);
                None
            }
            LaneWork::Land { target, permit } => Some((target, permit)),
        }
    }
}

/// Where a range's pieces go as they fill.
#[derive(Clone, Copy)]
pub(crate) enum PiecesTo<'t, 'j> {
    /// A lane thread of the run, which writes each piece and then lands the range (the load's
    /// memory does not outlive the run: a streaming window).
    Lane(&'t Sender<LaneWork<'j>>),
    /// The session's writers, as held pieces written behind the load (an owned load's arena,
    /// kept mapped): the range lands as soon as it has arrived.
    Behind(&'t CacheSession),
}

/// A range's body filled into its claimed read, each [`PIECE_BYTES`] sent on (`to`) as soon as
/// they are in (to the lane with the CRC-32C of its bytes as they arrived).
pub(crate) struct LaneFill<'t, 'j> {
    target: &'t mut ReadTarget<'j>,
    entry: Arc<Entry>,
    /// The object offset of the range's first byte.
    offset_bytes: u64,
    to: PiecesTo<'t, 'j>,
    /// In the lane: the CRC-32C of the piece being filled (the bytes from
    /// `target.handed_out_bytes()` on). `None` behind the load (see [`super::seal`]).
    crc: Option<Crc32c>,
}

impl<'t, 'j> LaneFill<'t, 'j> {
    pub fn new(
        target: &'t mut ReadTarget<'j>,
        entry: Arc<Entry>,
        offset_bytes: u64,
        to: PiecesTo<'t, 'j>,
    ) -> LaneFill<'t, 'j> {
        debug_assert_eq!(target.handed_out_bytes(), 0, "a range is filled from its start");
        let crc = matches!(to, PiecesTo::Lane(_)).then(Crc32c::new);
        LaneFill { target, entry, offset_bytes, to, crc }
    }

    /// Send the filled bytes not sent yet (`len_bytes` of them) as one piece. A lane thread that
    /// is gone leaves the piece out of the copy (the landing, sent later, then fails the load);
    /// a job whose memory is not kept mapped sends no held piece (the copy stays partial).
    fn send_piece(&mut self, len_bytes: usize) {
        let offset_bytes = self.offset_bytes + self.target.handed_out_bytes() as u64;
        let entry = Arc::clone(&self.entry);
        match self.to {
            PiecesTo::Lane(to) => {
                let crc32c = self.crc.as_mut().map_or(0, Crc32c::take);
                let Some(bytes) = self.target.hand_out(len_bytes) else { return };
                let _ = to.send(LaneWork::Piece { entry, offset_bytes, crc32c, bytes });
            }
            PiecesTo::Behind(session) => {
                let Some(piece) = self.target.hand_out_held(len_bytes) else { return };
                session.writers.queue_held(entry, offset_bytes, piece);
            }
        }
    }
}

impl Fill for LaneFill<'_, '_> {
    fn len_bytes(&self) -> usize {
        self.target.read().len_bytes as usize
    }

    fn put(&mut self, at: usize, chunk: &[u8]) {
        let sent = self.target.handed_out_bytes();
        self.target.buf()[at - sent..at - sent + chunk.len()].copy_from_slice(chunk);
        // Extend the piece's CRC over the chunk, sending each piece that fills (the last one,
        // shorter, when the range is complete).
        let len_bytes = self.len_bytes();
        let (mut pos, mut rest) = (at, chunk);
        while !rest.is_empty() {
            let piece_start = self.target.handed_out_bytes();
            let piece_end = (piece_start + PIECE_BYTES).min(len_bytes);
            let take = rest.len().min(piece_end - pos);
            if let Some(crc) = self.crc.as_mut() {
                crc.append(&rest[..take]);
            }
            (pos, rest) = (pos + take, &rest[take..]);
            if pos == piece_end {
                self.send_piece(piece_end - piece_start);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;
    use std::sync::Mutex;

    use proptest::prelude::*;
    use tensora_io::{BackendChoice, CompletionSink, IoBackend, IoStats, Job, LoadOptions, ReadError};

    use super::*;
    use crate::cache::entry::{Description, Pages};

    /// A backend that fills each read through a [`LaneFill`], the file's bytes put in chunks of
    /// `cuts` (cycled), and checks what the lane is sent: pieces that tile the range front to
    /// back, each [`PIECE_BYTES`] but the last, each with its bytes' CRC-32C and object offset.
    struct Chunked {
        cuts: Vec<usize>,
        dir: tempfile::TempDir,
        /// Pieces seen, over all reads.
        pieces: Mutex<usize>,
    }

    impl IoBackend for Chunked {
        fn name(&self) -> &'static str {
            "chunked"
        }

        fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
            let file = &job.files[0];
            let description = Description {
                url: "http://h/x".into(),
                path: "x".into(),
                size_bytes: file.len_bytes,
                etag: Some("e".into()),
                last_modified_ns: 0,
            };
            let entry = Arc::new(Entry::create(self.dir.path(), &description, Pages::Around).unwrap());
            let mut stats = IoStats::default();
            for index in 0..job.plan.reads().len() as u32 {
                let mut target = job.claim(index)?;
                let read = target.read().clone();
                let mut body = vec![0u8; read.len_bytes as usize];
                file.buffered.read_exact_at(&mut body, read.offset_bytes).unwrap();
                let (to, work) = std::sync::mpsc::channel();
                let mut fill =
                    LaneFill::new(&mut target, Arc::clone(&entry), read.offset_bytes, PiecesTo::Lane(&to));
                assert_eq!(fill.len_bytes(), body.len());
                let (mut at, mut k) = (0, 0);
                while at < body.len() {
                    let n = self.cuts[k % self.cuts.len()].clamp(1, body.len() - at);
                    fill.put(at, &body[at..at + n]);
                    (at, k) = (at + n, k + 1);
                }
                drop(to);
                let mut next = 0usize;
                for item in work {
                    let LaneWork::Piece { offset_bytes, crc32c, bytes, .. } = item else {
                        panic!("a fill sends pieces only")
                    };
                    let piece = bytes.bytes();
                    assert_eq!(offset_bytes, read.offset_bytes + next as u64);
                    assert_eq!(piece, &body[next..next + piece.len()]);
                    assert_eq!(crc32c, crc32c::crc32c(piece), "piece at {next}");
                    assert!(
                        piece.len() == PIECE_BYTES || next + piece.len() == body.len(),
                        "{}",
                        piece.len()
                    );
                    next += piece.len();
                    *self.pieces.lock().unwrap() += 1;
                }
                assert_eq!(next, body.len(), "the pieces tile the range");
                target.land(sink)?;
                stats.reads += 1;
                stats.bytes_read += read.len_bytes;
            }
            Ok(stats)
        }
    }

    /// Load a one-tensor file of `len` bytes through [`Chunked`]: the tensor holds the file's
    /// bytes, and the number of pieces sent.
    fn load_in_chunks(len: usize, cuts: &[usize]) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let mut header = format!(r#"{{"t":{{"dtype":"U8","shape":[{len}],"data_offsets":[0,{len}]}}}}"#);
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend_from_slice(&data);
        std::fs::write(&path, file).unwrap();
        let backend = Arc::new(Chunked {
            cuts: cuts.to_vec(),
            dir: tempfile::tempdir().unwrap(),
            pieces: Mutex::new(0),
        });
        let opts = LoadOptions {
            backend: BackendChoice::Custom(Arc::clone(&backend) as Arc<dyn IoBackend>),
            chunk_bytes: 4 * PIECE_BYTES as u64,
            ..LoadOptions::default()
        };
        let loaded = tensora_io::load_path(&path, &opts).unwrap();
        assert!(loaded.tensor("t").unwrap().bytes() == &data[..]);
        *backend.pieces.lock().unwrap()
    }

    #[test]
    fn a_range_goes_out_in_whole_pieces_and_a_last_short_one() {
        assert_eq!(load_in_chunks(PIECE_BYTES * 2 + 5000, &[65536]), 3);
        assert_eq!(load_in_chunks(PIECE_BYTES, &[PIECE_BYTES]), 1);
        assert_eq!(load_in_chunks(100, &[1]), 1);
        // A chunk that spans several pieces.
        assert_eq!(load_in_chunks(PIECE_BYTES * 3 + 1, &[PIECE_BYTES * 3]), 4);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// However the body is cut into chunks, the pieces tile each range and carry their CRCs.
        #[test]
        fn any_chunking_sends_whole_pieces(
            len in 1usize..(PIECE_BYTES * 5 / 2),
            cuts in proptest::collection::vec(1usize..(PIECE_BYTES / 2), 1..6),
        ) {
            prop_assert!(load_in_chunks(len, &cuts) >= len.div_ceil(PIECE_BYTES));
        }
    }
}
