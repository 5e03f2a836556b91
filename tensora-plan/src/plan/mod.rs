//! `Plan::build`: extents in, per-file read queues out.
//!
//! [`sort`] validates the extents and orders them, [`layout`] turns the sorted extents into
//! groups, arena offsets, reads and pieces, and this module orders the reads into queues.

mod layout;
mod restrict;
mod sort;
mod tags;

use self::layout::{Cut, Groups};
use self::sort::{Item, Prepared, prepare};
use self::tags::TagIndex;
use crate::{Extent, FileQueue, Piece, PlanConfig, PlanError, Read, TagLocation};

/// Which reads go first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Order {
    /// Files by id, reads by offset: the throughput order.
    #[default]
    File,
    /// Tags, most urgent first. Reads carrying an earlier tag go earlier in their file's queue,
    /// and files are ordered by their most urgent tag. Tags not listed follow in file order.
    /// Every listed tag must belong to an extent; a tag listed twice keeps its first rank.
    Priority(Vec<u32>),
}

/// The most reads one plan may hold (a bound on memory for any input; raise `chunk_bytes`).
pub const READS_MAX: u64 = 1 << 25;
/// The most pieces one plan may hold.
pub const PIECES_MAX: u64 = 1 << 26;
/// The most extents one plan may take (indexes are `u32`).
pub const EXTENTS_MAX: usize = u32::MAX as usize;

/// Rank of a tag not named by `Order::Priority`.
const RANK_UNLISTED: u32 = u32::MAX;

/// A load plan: per-file queues of aligned reads into one arena, and where each extent lands.
/// See the crate docs for the rules and an example.
#[derive(Debug, Clone)]
pub struct Plan {
    config: PlanConfig,
    order: Order,
    file_lens_bytes: Option<Vec<u64>>,
    reads: Vec<Read>,
    pieces: Vec<Piece>,
    queues: Vec<FileQueue>,
    locations: Vec<TagLocation>,
    tags: TagIndex,
    arena_len_bytes: u64,
    bytes_selected: u64,
    bytes_read: u64,
}

impl Plan {
    /// Plans `extents` with no known file lengths: an aligned read's end is rounded up to
    /// `align_bytes` even past the last requested byte, so with `align_bytes > 1` the backend
    /// must accept a short final read at end of file. Prefer [`Plan::build_with_file_lens`] for
    /// `O_DIRECT`.
    ///
    /// ```
    /// use tensora_plan::{Extent, Order, Plan, PlanConfig};
    /// let extents = [
    ///     Extent { file: 0, offset_bytes: 0, len_bytes: 100, tag: 0 },
    ///     Extent { file: 0, offset_bytes: 150, len_bytes: 50, tag: 1 }, // 50-byte gap: read through
    ///     Extent { file: 1, offset_bytes: 8, len_bytes: 24, tag: 2 },
    /// ];
    /// let plan = Plan::build(&extents, &PlanConfig::default(), &Order::File).unwrap();
    /// assert_eq!(plan.queues().len(), 2);
    /// assert_eq!(plan.reads().len(), 2);
    /// assert_eq!((plan.bytes_selected(), plan.bytes_read()), (174, 224));
    /// let t1 = plan.location(1).unwrap();
    /// assert_eq!(t1.arena_offset_bytes % 4096, 150); // file alignment kept
    /// assert_eq!(t1.reads_total, 1);
    /// plan.check(&extents).unwrap();
    /// ```
    pub fn build(extents: &[Extent], config: &PlanConfig, order: &Order) -> Result<Plan, PlanError> {
        Self::build_inner(extents, config, order, None)
    }

    /// Like [`Plan::build`], with each file's length: `file_lens_bytes[file]`. Extents must lie
    /// inside their file; a final read ends at end of file rather than past it (so it may be
    /// shorter than a multiple of `align_bytes`, as `O_DIRECT` allows at EOF).
    pub fn build_with_file_lens(
        extents: &[Extent],
        config: &PlanConfig,
        order: &Order,
        file_lens_bytes: &[u64],
    ) -> Result<Plan, PlanError> {
        Self::build_inner(extents, config, order, Some(file_lens_bytes))
    }

    fn build_inner(
        extents: &[Extent],
        config: &PlanConfig,
        order: &Order,
        file_lens_bytes: Option<&[u64]>,
    ) -> Result<Plan, PlanError> {
        config.validate()?;
        let Prepared { items, ranks, tags } = prepare(extents, config, order, file_lens_bytes)?;
        let input = Input { extents, config, order, file_lens_bytes, ranks: &ranks };
        match &items {
            Some(items) => plan_sorted(items.as_slice(), &input, tags),
            None => plan_sorted(&InPlace(extents), &input, tags),
        }
    }

    /// Every read, grouped by queue (see [`Plan::queues`]), each queue in issue order.
    pub fn reads(&self) -> &[Read] {
        &self.reads
    }

    /// Every piece; [`Read::pieces`] indexes into this.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The pieces one read carries, in file order.
    pub fn read_pieces(&self, read: &Read) -> &[Piece] {
        &self.pieces[read.pieces.start as usize..read.pieces.end as usize]
    }

    /// One queue per file that has something to read, most urgent file first (file id order
    /// under [`Order::File`]). A backend may work on several queues at once; within a queue, issue
    /// reads in order to honour the priority.
    pub fn queues(&self) -> &[FileQueue] {
        &self.queues
    }

    /// The reads of one queue.
    pub fn queue_reads(&self, queue: &FileQueue) -> &[Read] {
        &self.reads[queue.reads.start as usize..queue.reads.end as usize]
    }

    /// One location per input extent, in input order.
    pub fn locations(&self) -> &[TagLocation] {
        &self.locations
    }

    /// The location of the extent tagged `tag`.
    pub fn location(&self, tag: u32) -> Option<&TagLocation> {
        self.tags.get(tag).map(|i| &self.locations[i])
    }

    /// Index of the extent tagged `tag` in the input (and in [`Plan::locations`]).
    pub fn extent_index(&self, tag: u32) -> Option<usize> {
        self.tags.get(tag)
    }

    /// Bytes the arena must hold. Arena ranges of reads never overlap.
    pub fn arena_len_bytes(&self) -> u64 {
        self.arena_len_bytes
    }

    /// Distinct requested bytes: the union of the extents per file. Bytes shared by tied
    /// (overlapping) extents count once, because they are read once.
    pub fn bytes_selected(&self) -> u64 {
        self.bytes_selected
    }

    /// Bytes the reads fetch: `bytes_selected` plus the gaps read through and the alignment
    /// padding.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// `bytes_read - bytes_selected`: gap and alignment overhead.
    pub fn bytes_overhead(&self) -> u64 {
        self.bytes_read - self.bytes_selected
    }

    /// The config the plan was built with.
    pub fn config(&self) -> &PlanConfig {
        &self.config
    }

    /// The order the plan was built with.
    pub fn order(&self) -> &Order {
        &self.order
    }

    /// The file lengths given to [`Plan::build_with_file_lens`], if any.
    pub fn file_lens_bytes(&self) -> Option<&[u64]> {
        self.file_lens_bytes.as_deref()
    }
}

/// The sorted, non-empty extents as the passes after [`prepare`] read them.
trait SortedView {
    fn len(&self) -> usize;
    fn get(&self, k: usize) -> Item;
}

impl SortedView for [Item] {
    fn len(&self) -> usize {
        <[Item]>::len(self)
    }
    #[inline]
    fn get(&self, k: usize) -> Item {
        self[k]
    }
}

/// Input already in `(file, offset)` order with no empty extent: read in place, no copy.
struct InPlace<'a>(&'a [Extent]);

impl SortedView for InPlace<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline]
    fn get(&self, k: usize) -> Item {
        let e = &self.0[k];
        Item {
            offset_bytes: e.offset_bytes,
            end_bytes: e.offset_bytes + e.len_bytes,
            file: e.file,
            index: k as u32,
        }
    }
}

/// The caller's arguments plus the priority ranks, as [`plan_sorted`] needs them.
#[derive(Clone, Copy)]
struct Input<'a> {
    extents: &'a [Extent],
    config: &'a PlanConfig,
    order: &'a Order,
    file_lens_bytes: Option<&'a [u64]>,
    ranks: &'a [u32],
}

/// Everything after [`prepare`]: spans merged into groups, the arena laid out, reads cut and
/// their pieces and the locations filled in, then the reads ordered into queues.
fn plan_sorted<V: SortedView + ?Sized>(
    items: &V,
    input: &Input<'_>,
    tags: TagIndex,
) -> Result<Plan, PlanError> {
    let Input { config, order, file_lens_bytes, .. } = *input;
    let read_max = config.read_bytes_max();
    let Groups { mut groups, bytes_selected } = layout::sweep_groups(items, config, file_lens_bytes)?;
    let arena = layout::lay_out_arena(&mut groups, config)?;
    let pieces_total = layout::count_pieces(items, &groups, read_max)?;
    let mut reads = layout::file_order_reads(&groups, read_max, arena.reads_total);
    let Cut { pieces, read_ranks, locations } =
        layout::cut_pieces(items, &groups, &mut reads, input, pieces_total);
    let (reads, queues) = order_reads(reads, &read_ranks, order);
    let plan = Plan {
        config: *config,
        order: order.clone(),
        file_lens_bytes: file_lens_bytes.map(<[u64]>::to_vec),
        reads,
        pieces,
        queues,
        locations,
        tags,
        arena_len_bytes: arena.arena_len_bytes,
        bytes_selected,
        bytes_read: arena.bytes_read,
    };
    #[cfg(debug_assertions)]
    if let Err(broken) = plan.check(input.extents) {
        panic!("tensora-plan internal invariant broken: {broken}");
    }
    Ok(plan)
}

/// Reorders reads (in file order) into queues per `order`.
fn order_reads(reads: Vec<Read>, read_ranks: &[u32], order: &Order) -> (Vec<Read>, Vec<FileQueue>) {
    // Per-file ranges of the file-ordered reads.
    let mut files: Vec<(u32, usize, usize, u32)> = Vec::new(); // (file, start, end, min rank)
    for (i, read) in reads.iter().enumerate() {
        match files.last_mut() {
            Some(f) if f.0 == read.file => {
                f.2 = i + 1;
                f.3 = f.3.min(read_ranks[i]);
            }
            _ => files.push((read.file, i, i + 1, read_ranks[i])),
        }
    }
    if matches!(order, Order::File) {
        let queues =
            files.iter().map(|&(file, s, e, _)| FileQueue { file, reads: s as u32..e as u32 }).collect();
        return (reads, queues);
    }
    files.sort_by_key(|&(file, _, _, rank)| (rank, file));
    let mut ordered: Vec<Read> = Vec::with_capacity(reads.len());
    let mut queues = Vec::with_capacity(files.len());
    let mut perm: Vec<u32> = Vec::new();
    for &(file, s, e, _) in &files {
        perm.clear();
        perm.extend(s as u32..e as u32);
        // Stable: equal ranks keep offset order.
        perm.sort_by_key(|&r| read_ranks[r as usize]);
        let first = ordered.len() as u32;
        ordered.extend(perm.iter().map(|&r| reads[r as usize].clone()));
        queues.push(FileQueue { file, reads: first..ordered.len() as u32 });
    }
    (ordered, queues)
}

/// `end` rounded up to `align`, but not past `file_len`. `None` on overflow with no file length.
pub(crate) fn aligned_end(end: u64, align: u64, file_len: Option<u64>) -> Option<u64> {
    match (end.checked_next_multiple_of(align), file_len) {
        (Some(up), Some(len)) => Some(up.min(len)),
        (Some(up), None) => Some(up),
        (None, Some(len)) => Some(len),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests;
