//! `Plan::build`: extents in, per-file read queues out.

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

/// A contiguous file range read into contiguous arena bytes (one or more reads).
#[derive(Debug, Clone, Copy)]
struct Group {
    file: u32,
    start_bytes: u64,
    end_bytes: u64,
    arena_offset_bytes: u64,
    /// Range of sorted items (extents) inside this group.
    items: (usize, usize),
    /// First read (file order) of this group.
    first_read: u32,
}

/// Validated, per-extent facts.
struct Prepared {
    /// The non-empty extents, sorted by `(file, offset, index)`, or `None` when the input is
    /// already in that order with no empty extent (it is then read in place). Every later pass
    /// walks them in order, so a shuffled input is touched at random only once.
    items: Option<Vec<Item>>,
    ranks: Vec<u32>,
    tags: TagIndex,
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

/// Everything after [`prepare`]: spans, groups, arena, reads, pieces, locations, queues.
fn plan_sorted<V: SortedView + ?Sized>(
    items: &V,
    input: &Input<'_>,
    tags: TagIndex,
) -> Result<Plan, PlanError> {
    let Input { extents, config, order, file_lens_bytes, ranks } = *input;
    let align = config.align_bytes;
    let gap_max = config.coalesce_gap_effective_bytes();
    let read_max = config.read_bytes_max();
    let period = config.arena_period_bytes();

    // Sweep: spans (unions of overlapping extents) merged into groups.
    let mut groups: Vec<Group> = Vec::new();
    let mut bytes_selected: u64 = 0;
    let mut k = 0;
    while k < items.len() {
        let file = items.get(k).file;
        let file_len = file_lens_bytes.map(|lens| lens[file as usize]);
        let mut group: Option<Group> = None;
        while k < items.len() && items.get(k).file == file {
            // One span: extents overlapping the running union.
            let span_first = k;
            let span_start = items.get(k).offset_bytes;
            let mut span_end = items.get(k).end_bytes;
            k += 1;
            while k < items.len() && items.get(k).file == file && items.get(k).offset_bytes < span_end {
                span_end = span_end.max(items.get(k).end_bytes);
                k += 1;
            }
            bytes_selected =
                bytes_selected.checked_add(span_end - span_start).ok_or(PlanError::ArenaOverflow)?;
            let aligned_start = span_start - span_start % align;
            // Validated in `prepare`: this cannot fail there, so it cannot fail here.
            let aligned_end = aligned_end(span_end, align, file_len).ok_or(PlanError::ArenaOverflow)?;
            match group.as_mut() {
                Some(g) if aligned_start <= g.end_bytes || aligned_start - g.end_bytes < gap_max => {
                    g.end_bytes = g.end_bytes.max(aligned_end);
                    g.items.1 = k;
                }
                _ => {
                    if let Some(g) = group.take() {
                        groups.push(g);
                    }
                    group = Some(Group {
                        file,
                        start_bytes: aligned_start,
                        end_bytes: aligned_end,
                        arena_offset_bytes: 0,
                        items: (span_first, k),
                        first_read: 0,
                    });
                }
            }
        }
        if let Some(g) = group.take() {
            groups.push(g);
        }
    }

    // Arena layout and read counts.
    let mut arena_cursor: u64 = 0;
    let mut reads_total: u64 = 0;
    let mut bytes_read: u64 = 0;
    for g in &mut groups {
        let delta = g.start_bytes.wrapping_sub(arena_cursor) & (period - 1);
        g.arena_offset_bytes = arena_cursor.checked_add(delta).ok_or(PlanError::ArenaOverflow)?;
        let len = g.end_bytes - g.start_bytes;
        arena_cursor = g.arena_offset_bytes.checked_add(len).ok_or(PlanError::ArenaOverflow)?;
        bytes_read += len; // <= arena_cursor, so it cannot overflow
        g.first_read = u32::try_from(reads_total).unwrap_or(u32::MAX);
        reads_total += len.div_ceil(read_max);
        if reads_total > READS_MAX {
            return Err(PlanError::TooManyReads { reads: reads_total, max: READS_MAX });
        }
    }

    // Count pieces before allocating them.
    let mut pieces_total: u64 = 0;
    for g in &groups {
        for k in g.items.0..g.items.1 {
            let item = &items.get(k);
            let (first, last) = read_span(item, g, read_max);
            pieces_total += u64::from(last - first) + 1;
        }
        if pieces_total > PIECES_MAX {
            return Err(PlanError::TooManyPieces { pieces: pieces_total, max: PIECES_MAX });
        }
    }

    // Reads in file order.
    let mut reads: Vec<Read> = Vec::with_capacity(reads_total as usize);
    for g in &groups {
        let mut offset = g.start_bytes;
        while offset < g.end_bytes {
            let len = read_max.min(g.end_bytes - offset);
            reads.push(Read {
                file: g.file,
                offset_bytes: offset,
                len_bytes: len,
                arena_offset_bytes: g.arena_offset_bytes + (offset - g.start_bytes),
                pieces: 0..0,
            });
            offset += len;
        }
    }

    // Pieces, generated read by read with a sweep line over the sorted items: `active` holds the
    // items that started in an earlier read and go on past the current one (ties, or extents
    // longer than a read), in start order. Pieces of a read are thus in file order.
    let mut pieces: Vec<Piece> = Vec::with_capacity(pieces_total as usize);
    let mut read_ranks: Vec<u32> = vec![RANK_UNLISTED; reads.len()];
    let mut locations: Vec<TagLocation> = extents
        .iter()
        .map(|e| TagLocation { tag: e.tag, arena_offset_bytes: 0, len_bytes: e.len_bytes, reads_total: 0 })
        .collect();
    let mut active: Vec<usize> = Vec::new();
    for g in &groups {
        let (group_first, group_end) = g.items;
        let group_reads = (g.end_bytes - g.start_bytes).div_ceil(read_max) as usize;
        let mut next = group_first;
        active.clear();
        for ri in g.first_read as usize..g.first_read as usize + group_reads {
            let (read_start, read_end) =
                (reads[ri].offset_bytes, reads[ri].offset_bytes + reads[ri].len_bytes);
            let first_piece = pieces.len() as u32;
            let mut rank = RANK_UNLISTED;
            // `first`: this is the item's first read; place it in the arena.
            let mut emit = |item: &Item, first: bool| {
                let from = item.offset_bytes.max(read_start);
                let loc = &mut locations[item.index as usize];
                loc.reads_total += 1;
                if first {
                    loc.arena_offset_bytes = g.arena_offset_bytes + (item.offset_bytes - g.start_bytes);
                }
                pieces.push(Piece {
                    tag: loc.tag,
                    read_offset_bytes: from - read_start,
                    extent_offset_bytes: from - item.offset_bytes,
                    len_bytes: item.end_bytes.min(read_end) - from,
                });
                if let Some(&r) = ranks.get(item.index as usize) {
                    rank = rank.min(r);
                }
            };
            let mut kept = 0;
            for a in 0..active.len() {
                let item = &items.get(active[a]);
                emit(item, false);
                if item.end_bytes > read_end {
                    active[kept] = active[a];
                    kept += 1;
                }
            }
            active.truncate(kept);
            while next < group_end && items.get(next).offset_bytes < read_end {
                let item = &items.get(next);
                emit(item, true);
                if item.end_bytes > read_end {
                    active.push(next);
                }
                next += 1;
            }
            reads[ri].pieces = first_piece..pieces.len() as u32;
            read_ranks[ri] = rank;
        }
    }

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
        arena_len_bytes: arena_cursor,
        bytes_selected,
        bytes_read,
    };
    #[cfg(debug_assertions)]
    if let Err(broken) = plan.check(extents) {
        panic!("tensora-plan internal invariant broken: {broken}");
    }
    Ok(plan)
}

/// Validates extents and builds the sorted keys, the tag index and the priority ranks.
fn prepare(
    extents: &[Extent],
    config: &PlanConfig,
    order: &Order,
    file_lens_bytes: Option<&[u64]>,
) -> Result<Prepared, PlanError> {
    if extents.len() > EXTENTS_MAX {
        return Err(PlanError::TooManyExtents { extents: extents.len(), max: EXTENTS_MAX });
    }
    // Pass 1: validate, and learn what the sort needs.
    let mut shape = Shape::default();
    let mut prev: (u32, u64) = (0, 0);
    for e in extents {
        let overflow = || PlanError::Overflow {
            tag: e.tag,
            file: e.file,
            offset_bytes: e.offset_bytes,
            len_bytes: e.len_bytes,
        };
        let end = e.offset_bytes.checked_add(e.len_bytes).ok_or_else(overflow)?;
        let file_len = match file_lens_bytes {
            Some(lens) => {
                let len = *lens.get(e.file as usize).ok_or(PlanError::UnknownFile {
                    tag: e.tag,
                    file: e.file,
                    files: lens.len(),
                })?;
                if end > len {
                    return Err(PlanError::ExtentPastEof {
                        tag: e.tag,
                        file: e.file,
                        end_bytes: end,
                        file_len_bytes: len,
                    });
                }
                Some(len)
            }
            None => None,
        };
        aligned_end(end, config.align_bytes, file_len).ok_or_else(overflow)?;
        if e.len_bytes > 0 {
            shape.add(e, &mut prev);
        }
    }
    let items = if shape.descents == 0 && shape.nonempty == extents.len() {
        None
    } else {
        Some(sorted_items(extents, &shape))
    };
    let tags = TagIndex::new(extents)?;
    // Empty under `Order::File`: every rank is then `RANK_UNLISTED`.
    let mut ranks = Vec::new();
    if let Order::Priority(urgent) = order {
        ranks = vec![RANK_UNLISTED; extents.len()];
        for (rank, &tag) in urgent.iter().enumerate() {
            let idx = tags.get(tag).ok_or(PlanError::UnknownPriorityTag { tag })?;
            let rank = u32::try_from(rank).unwrap_or(RANK_UNLISTED - 1).min(RANK_UNLISTED - 1);
            ranks[idx] = ranks[idx].min(rank);
        }
    }
    Ok(Prepared { items, ranks, tags })
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

/// The first and last read (relative to the group) that a non-empty extent touches.
fn read_span(item: &Item, g: &Group, read_max: u64) -> (u32, u32) {
    let first = (item.offset_bytes - g.start_bytes) / read_max;
    let last = (item.end_bytes - 1 - g.start_bytes) / read_max;
    (first as u32, last as u32)
}

/// One non-empty extent, as the sweep needs it.
#[derive(Debug, Clone, Copy)]
struct Item {
    offset_bytes: u64,
    end_bytes: u64,
    file: u32,
    /// Index in the input.
    index: u32,
}

/// Below this many items a comparison sort beats the radix sort's fixed costs.
const RADIX_ITEMS_MIN: usize = 4096;
/// Bits per radix digit (2048 buckets: four passes cover 44-bit keys).
const RADIX_DIGIT_BITS: u32 = 11;
/// Input whose sorted runs average at least this many extents is merged (stable sort over
/// natural runs, no random access) instead of radix-sorted.
const RUN_LEN_MIN: usize = 16;

/// What pass 1 learns about the non-empty extents, for choosing a sort.
#[derive(Debug, Clone, Copy, Default)]
struct Shape {
    nonempty: usize,
    /// Places where `(file, offset)` decreases from one non-empty extent to the next (0: sorted).
    descents: usize,
    max_file: u32,
    max_offset: u64,
}

impl Shape {
    fn add(&mut self, e: &Extent, prev: &mut (u32, u64)) {
        let key = (e.file, e.offset_bytes);
        if self.nonempty > 0 && key < *prev {
            self.descents += 1;
        }
        *prev = key;
        self.nonempty += 1;
        self.max_file = self.max_file.max(e.file);
        self.max_offset = self.max_offset.max(e.offset_bytes);
    }
}

/// The non-empty extents as [`Item`]s sorted by `(file, offset, index)`.
///
/// Input already in order (common: tensors listed in file order) is copied in one pass; input
/// made of a few long sorted runs (e.g. priority tensors first, then file order) is merged by a
/// stable sort. Otherwise, when `(file, offset, index)` packs into 64 bits (files × offsets ×
/// extents < 2^64: every real checkpoint), the packed keys are radix-sorted (linear, 8 bytes per
/// element moved) and the items gathered once; else the items are pdqsorted.
fn sorted_items(extents: &[Extent], shape: &Shape) -> Vec<Item> {
    let Shape { nonempty, descents, max_file, max_offset } = *shape;
    let item = |i: usize| {
        let e = &extents[i];
        Item {
            offset_bytes: e.offset_bytes,
            end_bytes: e.offset_bytes + e.len_bytes,
            file: e.file,
            index: i as u32,
        }
    };
    let nonempty_indexes = || extents.iter().enumerate().filter(|(_, e)| e.len_bytes > 0).map(|(i, _)| i);
    if descents == 0 {
        return nonempty_indexes().map(item).collect();
    }
    if descents <= nonempty / RUN_LEN_MIN {
        let mut items: Vec<Item> = nonempty_indexes().map(item).collect();
        // Stable, so ties keep input (index) order.
        items.sort_by_key(|i| (i.file, i.offset_bytes));
        return items;
    }
    let bits = |x: u64| u64::BITS - x.leading_zeros();
    let index_bits = bits(extents.len() as u64);
    let offset_bits = bits(max_offset);
    let key_bits = index_bits + offset_bits + bits(u64::from(max_file));
    if nonempty < RADIX_ITEMS_MIN || key_bits > u64::BITS {
        let mut items: Vec<Item> = nonempty_indexes().map(item).collect();
        items.sort_unstable_by_key(|i| (i.file, i.offset_bytes, i.index));
        return items;
    }
    let mut keys: Vec<u64> = nonempty_indexes()
        .map(|i| {
            let e = &extents[i];
            (((u64::from(e.file) << offset_bits) | e.offset_bytes) << index_bits) | i as u64
        })
        .collect();
    // The keys start in index order and LSD radix sort is stable, so the index bits need no pass.
    radix_sort(&mut keys, index_bits, key_bits);
    let index_mask = (1u64 << index_bits) - 1;
    keys.iter().map(|&k| item((k & index_mask) as usize)).collect()
}

/// Stable LSD radix sort of `keys` on bits `low_bit..high_bit`.
fn radix_sort(keys: &mut Vec<u64>, low_bit: u32, high_bit: u32) {
    let buckets = 1usize << RADIX_DIGIT_BITS;
    let mask = (buckets - 1) as u64;
    let passes = (high_bit.saturating_sub(low_bit)).div_ceil(RADIX_DIGIT_BITS) as usize;
    let shift = |pass: usize| low_bit + pass as u32 * RADIX_DIGIT_BITS;
    // All histograms in one scan.
    let mut counts = vec![0usize; passes * buckets];
    for &k in keys.iter() {
        for (pass, hist) in counts.chunks_exact_mut(buckets).enumerate() {
            hist[((k >> shift(pass)) & mask) as usize] += 1;
        }
    }
    let mut scratch: Vec<u64> = vec![0; keys.len()];
    for (pass, hist) in counts.chunks_exact_mut(buckets).enumerate() {
        if hist.contains(&keys.len()) {
            continue; // every key has the same digit here
        }
        let mut at = 0;
        for c in hist.iter_mut() {
            let n = *c;
            *c = at;
            at += n;
        }
        for &k in keys.iter() {
            let slot = &mut hist[((k >> shift(pass)) & mask) as usize];
            scratch[*slot] = k;
            *slot += 1;
        }
        std::mem::swap(keys, &mut scratch);
    }
}

/// Tag → extent index.
#[derive(Debug, Clone)]
enum TagIndex {
    /// Tag `i` is extent `i` (tags are the input positions; no table needed). Holds the count.
    Identity(usize),
    /// `slots[tag]` = index, or `u32::MAX`. Used when tags are dense (bounded by the input size).
    Dense(Vec<u32>),
    /// Sorted `(tag << 32) | index`.
    Sorted(Vec<u64>),
}

/// Dense tag tables may be this many times the extent count (plus a constant).
const DENSE_TAGS_PER_EXTENT_MAX: usize = 4;
const DENSE_TAGS_SLACK: usize = 1024;

impl TagIndex {
    fn new(extents: &[Extent]) -> Result<Self, PlanError> {
        if extents.iter().enumerate().all(|(i, e)| e.tag as usize == i) {
            return Ok(Self::Identity(extents.len()));
        }
        let max_tag = extents.iter().map(|e| e.tag as usize).max().unwrap_or(0);
        if max_tag < extents.len() * DENSE_TAGS_PER_EXTENT_MAX + DENSE_TAGS_SLACK {
            let mut slots = vec![u32::MAX; if extents.is_empty() { 0 } else { max_tag + 1 }];
            for (i, e) in extents.iter().enumerate() {
                let slot = &mut slots[e.tag as usize];
                if *slot != u32::MAX {
                    return Err(PlanError::DuplicateTag { tag: e.tag });
                }
                *slot = i as u32;
            }
            Ok(Self::Dense(slots))
        } else {
            let mut sorted: Vec<u64> =
                extents.iter().enumerate().map(|(i, e)| (u64::from(e.tag) << 32) | i as u64).collect();
            sorted.sort_unstable();
            if let Some(w) = sorted.windows(2).find(|w| w[0] >> 32 == w[1] >> 32) {
                return Err(PlanError::DuplicateTag { tag: (w[0] >> 32) as u32 });
            }
            Ok(Self::Sorted(sorted))
        }
    }

    fn get(&self, tag: u32) -> Option<usize> {
        match self {
            Self::Identity(len) => Some(tag as usize).filter(|&i| i < *len),
            Self::Dense(slots) => slots.get(tag as usize).filter(|&&s| s != u32::MAX).map(|&s| s as usize),
            Self::Sorted(sorted) => {
                let pos = sorted.partition_point(|&k| (k >> 32) < u64::from(tag));
                sorted.get(pos).filter(|&&k| (k >> 32) == u64::from(tag)).map(|&k| (k as u32) as usize)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ext(file: u32, offset_bytes: u64, len_bytes: u64, tag: u32) -> Extent {
        Extent { file, offset_bytes, len_bytes, tag }
    }

    fn cfg(align_bytes: u64, chunk_bytes: u64, coalesce_gap_bytes: u64, budget_bytes: u64) -> PlanConfig {
        PlanConfig { align_bytes, chunk_bytes, coalesce_gap_bytes, budget_bytes }
    }

    /// Deterministic file contents: byte `offset` of `file`.
    fn file_byte(file: u32, offset: u64) -> u8 {
        (offset.wrapping_mul(0x9E37_79B9).wrapping_add(u64::from(file) * 131) >> 7) as u8
    }

    /// Executes the plan against synthetic files, in queue order, and checks that every extent's
    /// bytes land where its location says. Independent of `Plan::check`.
    fn simulate(plan: &Plan, extents: &[Extent]) -> Result<(), String> {
        let mut arena = vec![0u8; plan.arena_len_bytes() as usize];
        let mut landed = vec![0u32; extents.len()];
        for q in plan.queues() {
            for r in plan.queue_reads(q) {
                for i in 0..r.len_bytes {
                    arena[(r.arena_offset_bytes + i) as usize] = file_byte(r.file, r.offset_bytes + i);
                }
                for p in plan.read_pieces(r) {
                    landed[plan.extent_index(p.tag).ok_or("unknown tag")?] += 1;
                }
            }
        }
        for (i, e) in extents.iter().enumerate() {
            let loc = plan.locations()[i];
            if landed[i] != loc.reads_total {
                return Err(format!("{e:?}: {} of {} reads landed", landed[i], loc.reads_total));
            }
            for j in 0..e.len_bytes {
                if arena[(loc.arena_offset_bytes + j) as usize] != file_byte(e.file, e.offset_bytes + j) {
                    return Err(format!("{e:?}: wrong byte {j}"));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn empty_input_is_an_empty_plan() {
        let plan = Plan::build(&[], &PlanConfig::default(), &Order::File).unwrap();
        assert!(plan.reads().is_empty() && plan.queues().is_empty() && plan.pieces().is_empty());
        assert_eq!((plan.arena_len_bytes(), plan.bytes_selected(), plan.bytes_read()), (0, 0, 0));
        assert_eq!(plan.location(0), None);
        plan.check(&[]).unwrap();
    }

    #[test]
    fn zero_length_extents_get_a_location_and_no_reads() {
        let extents = [ext(0, 100, 0, 7), ext(0, 10, 5, 8), ext(3, 0, 0, 9)];
        let plan = Plan::build(&extents, &PlanConfig::default(), &Order::File).unwrap();
        let empty = plan.location(7).unwrap();
        assert_eq!((empty.len_bytes, empty.reads_total), (0, 0));
        assert_eq!(plan.location(9).unwrap().reads_total, 0);
        assert_eq!(plan.reads().len(), 1);
        assert_eq!(plan.queues(), &[FileQueue { file: 0, reads: 0..1 }]);
        assert_eq!(plan.bytes_selected(), 5);
        simulate(&plan, &extents).unwrap();
    }

    #[test]
    fn one_extent_larger_than_the_budget_is_split_into_budget_sized_reads() {
        let extents = [ext(0, 4096, 10_000, 1)];
        let plan = Plan::build(&extents, &cfg(1, 1 << 20, 0, 4096), &Order::File).unwrap();
        let lens: Vec<u64> = plan.reads().iter().map(|r| r.len_bytes).collect();
        assert_eq!(lens, vec![4096, 4096, 1808]);
        assert_eq!(plan.location(1).unwrap().reads_total, 3);
        assert_eq!(plan.bytes_read(), 10_000);
        simulate(&plan, &extents).unwrap();
    }

    #[test]
    fn align_4096_rounds_unaligned_extents_out_and_keeps_their_alignment() {
        let extents = [ext(0, 5000, 100, 0), ext(0, 9000, 8, 1), ext(1, 123, 10, 2)];
        let config = cfg(4096, 1 << 20, 0, 1 << 30);
        let plan = Plan::build(&extents, &config, &Order::File).unwrap();
        // 5000..5100 and 9000..9008 share aligned block 8192..12288 with 4096..8192: one run.
        assert_eq!(plan.reads()[0].offset_bytes, 4096);
        assert_eq!(plan.reads()[0].len_bytes, 8192);
        assert_eq!(plan.bytes_selected(), 118);
        assert_eq!(plan.bytes_read(), 8192 + 4096);
        for (e, loc) in extents.iter().zip(plan.locations()) {
            assert_eq!(loc.arena_offset_bytes % 4096, e.offset_bytes % 4096);
        }
        for r in plan.reads() {
            assert_eq!((r.offset_bytes % 4096, r.len_bytes % 4096, r.arena_offset_bytes % 4096), (0, 0, 0));
        }
        simulate(&plan, &extents).unwrap();
    }

    #[test]
    fn file_lengths_end_the_final_read_at_eof() {
        let extents = [ext(0, 4000, 1000, 0)];
        let config = cfg(4096, 1 << 20, 0, 1 << 30);
        let plan = Plan::build_with_file_lens(&extents, &config, &Order::File, &[6000]).unwrap();
        assert_eq!(plan.reads()[0].offset_bytes, 0);
        assert_eq!(plan.reads()[0].len_bytes, 6000);
        let unbounded = Plan::build(&extents, &config, &Order::File).unwrap();
        assert_eq!(unbounded.reads()[0].len_bytes, 8192);
        assert_eq!(
            Plan::build_with_file_lens(&extents, &config, &Order::File, &[4999]).unwrap_err(),
            PlanError::ExtentPastEof { tag: 0, file: 0, end_bytes: 5000, file_len_bytes: 4999 }
        );
        assert_eq!(
            Plan::build_with_file_lens(&[ext(2, 0, 1, 5)], &config, &Order::File, &[10]).unwrap_err(),
            PlanError::UnknownFile { tag: 5, file: 2, files: 1 }
        );
    }

    #[test]
    fn offsets_near_u64_max_are_errors_not_panics() {
        let config = PlanConfig::default();
        let overflow = [ext(0, u64::MAX - 10, 11, 3)];
        assert!(matches!(
            Plan::build(&overflow, &config, &Order::File),
            Err(PlanError::Overflow { tag: 3, .. })
        ));
        // Ends exactly at u64::MAX: fine with align 1.
        let edge = [ext(0, u64::MAX - 10, 10, 3)];
        let plan = Plan::build(&edge, &config, &Order::File).unwrap();
        assert_eq!(plan.location(3).unwrap().arena_offset_bytes % 4096, (u64::MAX - 10) % 4096);
        // ...but aligned to 4096 its end would overflow, unless the file length bounds it.
        let direct = cfg(4096, 1 << 20, 0, 1 << 30);
        assert!(matches!(Plan::build(&edge, &direct, &Order::File), Err(PlanError::Overflow { .. })));
        let plan = Plan::build_with_file_lens(&edge, &direct, &Order::File, &[u64::MAX]).unwrap();
        assert_eq!(plan.reads()[0].offset_bytes + plan.reads()[0].len_bytes, u64::MAX);
        // Offset 0.
        let plan = Plan::build(&[ext(0, 0, 1, 0)], &direct, &Order::File).unwrap();
        assert_eq!((plan.reads()[0].offset_bytes, plan.reads()[0].len_bytes), (0, 4096));
    }

    #[test]
    fn an_oversized_arena_is_an_error() {
        let extents = [ext(0, 0, u64::MAX / 2 + 1, 0), ext(1, 0, u64::MAX / 2 + 1, 1)];
        let config = cfg(1, u64::MAX, 0, u64::MAX);
        assert_eq!(Plan::build(&extents, &config, &Order::File).unwrap_err(), PlanError::ArenaOverflow);
    }

    #[test]
    fn read_and_piece_counts_are_bounded_before_allocating() {
        let config = cfg(1, 1, 0, 1 << 30);
        let err = Plan::build(&[ext(0, 0, 1 << 40, 0)], &config, &Order::File).unwrap_err();
        assert_eq!(err, PlanError::TooManyReads { reads: 1 << 40, max: READS_MAX });
        // Many tied copies of one extent: few reads, too many pieces.
        let config = cfg(1, 64, 0, 1 << 30);
        let tied: Vec<Extent> = (0..5000).map(|t| ext(0, 0, 1 << 20, t)).collect();
        assert!(matches!(
            Plan::build(&tied, &config, &Order::File),
            Err(PlanError::TooManyPieces { max: PIECES_MAX, .. })
        ));
    }

    #[test]
    fn bad_configs_and_inputs_are_typed_errors() {
        for bad in [cfg(3, 8, 0, 8), cfg(0, 8, 0, 8), cfg(4096, 1024, 0, 1 << 20), cfg(4096, 8192, 0, 100)] {
            assert!(matches!(Plan::build(&[], &bad, &Order::File), Err(PlanError::InvalidConfig { .. })));
        }
        let dup = [ext(0, 0, 4, 1), ext(0, 8, 4, 1)];
        assert_eq!(
            Plan::build(&dup, &PlanConfig::default(), &Order::File).unwrap_err(),
            PlanError::DuplicateTag { tag: 1 }
        );
        let sparse_dup = [ext(0, 0, 4, u32::MAX), ext(0, 8, 4, u32::MAX)];
        assert_eq!(
            Plan::build(&sparse_dup, &PlanConfig::default(), &Order::File).unwrap_err(),
            PlanError::DuplicateTag { tag: u32::MAX }
        );
        assert_eq!(
            Plan::build(&[ext(0, 0, 4, 1)], &PlanConfig::default(), &Order::Priority(vec![2])).unwrap_err(),
            PlanError::UnknownPriorityTag { tag: 2 }
        );
    }

    #[test]
    fn tied_extents_are_read_once_and_share_arena_bytes() {
        let extents = [ext(0, 0, 100, 0), ext(0, 0, 100, 1), ext(0, 50, 100, 2)];
        let plan = Plan::build(&extents, &PlanConfig::default(), &Order::File).unwrap();
        assert_eq!((plan.bytes_selected(), plan.bytes_read()), (150, 150));
        assert_eq!(
            plan.location(0).unwrap().arena_offset_bytes,
            plan.location(1).unwrap().arena_offset_bytes
        );
        assert_eq!(
            plan.location(2).unwrap().arena_offset_bytes,
            plan.location(0).unwrap().arena_offset_bytes + 50
        );
        assert_eq!(plan.read_pieces(&plan.reads()[0]).len(), 3);
        simulate(&plan, &extents).unwrap();
    }

    #[test]
    fn gaps_are_read_through_only_below_the_coalesce_gap() {
        let extents = [ext(0, 0, 10, 0), ext(0, 20, 10, 1), ext(0, 100, 10, 2)];
        let plan = Plan::build(&extents, &cfg(1, 1 << 20, 11, 1 << 30), &Order::File).unwrap();
        let spans: Vec<(u64, u64)> = plan.reads().iter().map(|r| (r.offset_bytes, r.len_bytes)).collect();
        assert_eq!(spans, vec![(0, 30), (100, 10)]);
        assert_eq!(plan.bytes_overhead(), 10);
        // Gap exactly the coalesce gap: not read through.
        let plan = Plan::build(&extents, &cfg(1, 1 << 20, 10, 1 << 30), &Order::File).unwrap();
        assert_eq!(plan.reads().len(), 3);
        // A gap larger than a whole read is never read through.
        let plan = Plan::build(&extents, &cfg(1, 16, 1 << 20, 1 << 30), &Order::File).unwrap();
        assert_eq!(plan.bytes_read(), 40);
        // Adjacent extents share reads even with coalescing off.
        let adjacent = [ext(0, 0, 10, 0), ext(0, 10, 10, 1)];
        let plan = Plan::build(&adjacent, &cfg(1, 1 << 20, 0, 1 << 30), &Order::File).unwrap();
        assert_eq!(plan.reads().len(), 1);
    }

    #[test]
    fn priority_orders_reads_within_and_across_files() {
        let extents = [ext(0, 0, 10, 0), ext(0, 1000, 10, 1), ext(1, 0, 10, 2), ext(1, 1000, 10, 3)];
        let config = cfg(1, 1 << 20, 0, 1 << 30);
        let plan = Plan::build(&extents, &config, &Order::Priority(vec![3, 1])).unwrap();
        let order: Vec<(u32, u64)> = plan.reads().iter().map(|r| (r.file, r.offset_bytes)).collect();
        assert_eq!(order, vec![(1, 1000), (1, 0), (0, 1000), (0, 0)]);
        assert_eq!(plan.queues(), &[FileQueue { file: 1, reads: 0..2 }, FileQueue { file: 0, reads: 2..4 }]);
        let file_order = Plan::build(&extents, &config, &Order::File).unwrap();
        let order: Vec<(u32, u64)> = file_order.reads().iter().map(|r| (r.file, r.offset_bytes)).collect();
        assert_eq!(order, vec![(0, 0), (0, 1000), (1, 0), (1, 1000)]);
    }

    #[test]
    fn tag_indexes_fit_the_tags() {
        let extents = [ext(0, 0, 4, 4_000_000_000), ext(0, 8, 4, 17), ext(0, 16, 0, 99_999)];
        let plan = Plan::build(&extents, &PlanConfig::default(), &Order::Priority(vec![17])).unwrap();
        assert!(matches!(plan.tags, TagIndex::Sorted(_)));
        assert_eq!(plan.extent_index(4_000_000_000), Some(0));
        assert_eq!(plan.extent_index(17), Some(1));
        assert_eq!(plan.extent_index(99_999), Some(2));
        assert_eq!(plan.extent_index(18), None);
        let identity = [ext(0, 0, 4, 0), ext(0, 8, 4, 1), ext(1, 0, 4, 2)];
        let plan = Plan::build(&identity, &PlanConfig::default(), &Order::Priority(vec![2])).unwrap();
        assert!(matches!(plan.tags, TagIndex::Identity(3)));
        assert_eq!((plan.extent_index(2), plan.extent_index(3)), (Some(2), None));
        assert_eq!(
            Plan::build(&identity, &PlanConfig::default(), &Order::Priority(vec![3])).unwrap_err(),
            PlanError::UnknownPriorityTag { tag: 3 }
        );
        let dense = [ext(0, 0, 4, 1), ext(0, 8, 4, 0)];
        let plan = Plan::build(&dense, &PlanConfig::default(), &Order::File).unwrap();
        assert!(matches!(plan.tags, TagIndex::Dense(_)));
        assert_eq!(plan.extent_index(0), Some(1));
    }

    /// `check` must be able to fail: corrupt a good plan in each way it guards against.
    #[test]
    fn check_rejects_corrupted_plans() {
        let extents = [ext(0, 0, 100, 0), ext(0, 5000, 100, 1), ext(1, 0, 50, 2)];
        let config = cfg(1, 64, 16, 1 << 30);
        let good = Plan::build(&extents, &config, &Order::File).unwrap();
        good.check(&extents).unwrap();
        type Corruption = (&'static str, Box<dyn Fn(&mut Plan)>);
        let corruptions: Vec<Corruption> = vec![
            ("overlapping reads", Box::new(|p| p.reads[1].offset_bytes -= 1)),
            ("shifted arena", Box::new(|p| p.reads[0].arena_offset_bytes += 1)),
            ("too long", Box::new(|p| p.reads[0].len_bytes = 65)),
            ("lost piece", Box::new(|p| p.reads[0].pieces.end -= 1)),
            ("wrong count", Box::new(|p| p.locations[0].reads_total += 1)),
            ("selected", Box::new(|p| p.bytes_selected += 1)),
            ("read", Box::new(|p| p.bytes_read -= 1)),
            ("arena", Box::new(|p| p.arena_len_bytes += 1)),
            ("queue order", Box::new(|p| p.queues.reverse())),
            ("read order", Box::new(|p| p.reads.swap(0, 1))),
            (
                "extra read",
                Box::new(|p| {
                    let mut r = p.reads[1].clone();
                    r.offset_bytes += 4096;
                    r.arena_offset_bytes = p.arena_len_bytes + 4096;
                    p.arena_len_bytes = r.arena_offset_bytes + r.len_bytes;
                    p.reads.push(r);
                }),
            ),
        ];
        for (what, corrupt) in corruptions {
            let mut bad = good.clone();
            corrupt(&mut bad);
            assert!(bad.check(&extents).is_err(), "check missed: {what}");
        }
        let mut missing = extents.to_vec();
        missing[1].len_bytes += 1;
        assert!(good.check(&missing).is_err(), "check missed an uncovered byte");
        // Foreign extents give an error, not a panic.
        let mut foreign = extents.to_vec();
        foreign[0].offset_bytes = u64::MAX;
        assert!(good.check(&foreign).is_err());
        assert!(good.check(&extents[..2]).is_err());
        let with_lens = Plan::build_with_file_lens(&extents, &config, &Order::File, &[6000, 50]).unwrap();
        let mut other_file = extents.to_vec();
        other_file[2].file = 7;
        assert!(with_lens.check(&other_file).is_err());
    }

    fn sort_by_comparison(extents: &[Extent]) -> Vec<(u32, u64, u64, u32)> {
        let mut want: Vec<(u32, u64, u64, u32)> = extents
            .iter()
            .enumerate()
            .filter(|(_, e)| e.len_bytes > 0)
            .map(|(i, e)| (e.file, e.offset_bytes, e.offset_bytes + e.len_bytes, i as u32))
            .collect();
        want.sort_unstable_by_key(|&(file, offset, _, index)| (file, offset, index));
        want
    }

    /// The first position where two sorted lists differ (short failure messages).
    fn first_difference<T: PartialEq>(a: &[T], b: &[T]) -> Option<usize> {
        (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))
    }

    fn sorted_items_of(extents: &[Extent]) -> Vec<(u32, u64, u64, u32)> {
        let mut shape = Shape::default();
        let mut prev = (0, 0);
        for e in extents.iter().filter(|e| e.len_bytes > 0) {
            shape.add(e, &mut prev);
        }
        sorted_items(extents, &shape).iter().map(|i| (i.file, i.offset_bytes, i.end_bytes, i.index)).collect()
    }

    #[test]
    fn large_shuffled_inputs_take_the_radix_path_and_plan_correctly() {
        let n = RADIX_ITEMS_MIN * 2 + 17;
        let mut x: u64 = 0x1234_5678;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut extents: Vec<Extent> =
            (0..n as u32).map(|t| ext((next() % 5) as u32, next() % (1 << 34), next() % 70_000, t)).collect();
        extents[3] = ext(2, extents[2].offset_bytes, 9, 3); // a duplicate offset somewhere
        assert_eq!(first_difference(&sorted_items_of(&extents), &sort_by_comparison(&extents)), None);
        let config = cfg(4096, 1 << 20, 1 << 16, 1 << 30);
        let plan = Plan::build(&extents, &config, &Order::File).unwrap();
        plan.check(&extents).unwrap();
        // Same plan from the sorted input (the in-place path).
        let mut sorted = extents.clone();
        sorted.sort_by_key(|e| (e.file, e.offset_bytes));
        let in_place = Plan::build(&sorted, &config, &Order::File).unwrap();
        same_plan(&plan, &in_place, &extents).unwrap();
    }

    /// Two plans of the same extents in different input orders agree on everything but the order
    /// of `locations` and of tied pieces inside one read.
    fn same_plan(a: &Plan, b: &Plan, extents: &[Extent]) -> Result<(), String> {
        let totals = |p: &Plan| (p.arena_len_bytes(), p.bytes_selected(), p.bytes_read());
        if a.queues() != b.queues() || totals(a) != totals(b) || a.reads().len() != b.reads().len() {
            return Err("queues or totals differ".into());
        }
        for (ra, rb) in a.reads().iter().zip(b.reads()) {
            let key = |r: &Read| (r.file, r.offset_bytes, r.len_bytes, r.arena_offset_bytes);
            let mut pa = a.read_pieces(ra).to_vec();
            let mut pb = b.read_pieces(rb).to_vec();
            pa.sort_by_key(|p| p.tag);
            pb.sort_by_key(|p| p.tag);
            if key(ra) != key(rb) || pa != pb {
                return Err(format!("reads differ: {ra:?} vs {rb:?}"));
            }
        }
        match extents.iter().find(|e| a.location(e.tag) != b.location(e.tag)) {
            Some(e) => Err(format!("locations of {e:?} differ")),
            None => Ok(()),
        }
    }

    fn arb_config() -> impl Strategy<Value = PlanConfig> {
        (0u32..=12, 0u64..6, 0u64..3000, 0u64..6, any::<bool>()).prop_map(
            |(align_pow, chunk_x, gap, budget_x, small)| {
                let align = 1u64 << align_pow;
                let chunk =
                    if small { align * (chunk_x + 1) } else { align * (chunk_x + 1) * 64 + align * chunk_x };
                PlanConfig {
                    align_bytes: align,
                    chunk_bytes: chunk + chunk_x % 3, // sometimes not a multiple of align
                    coalesce_gap_bytes: gap,
                    budget_bytes: align * (budget_x + 1) * 3,
                }
            },
        )
    }

    /// Extents clustered in small files, so overlaps, ties, touching and gaps all happen.
    fn arb_extents() -> impl Strategy<Value = Vec<Extent>> {
        prop::collection::vec((0u32..3, 0u64..20_000, 0u64..3000, 0u8..8), 0..40).prop_map(|raw| {
            let mut out: Vec<Extent> = Vec::with_capacity(raw.len());
            for (i, (file, offset, len, kind)) in raw.into_iter().enumerate() {
                let (offset, len) = match (kind, out.last()) {
                    // Tied with the previous extent.
                    (0, Some(prev)) if prev.file == file => (prev.offset_bytes, prev.len_bytes),
                    // Touching the previous extent.
                    (1, Some(prev)) if prev.file == file => (prev.offset_bytes + prev.len_bytes, len),
                    (2, _) => (offset, 0),
                    _ => (offset, len),
                };
                out.push(Extent { file, offset_bytes: offset, len_bytes: len, tag: (i as u32) * 3 + 1 });
            }
            out
        })
    }

    fn arb_order(n: usize) -> impl Strategy<Value = Order> {
        prop_oneof![
            Just(Order::File),
            prop::collection::vec(0..n.max(1), 0..n + 2).prop_map(move |picks| {
                Order::Priority(picks.into_iter().filter(|&i| i < n).map(|i| (i as u32) * 3 + 1).collect())
            })
        ]
    }

    fn arb_case() -> impl Strategy<Value = (Vec<Extent>, PlanConfig, Order)> {
        (arb_extents(), arb_config()).prop_flat_map(|(extents, config)| {
            let n = extents.len();
            (Just(extents), Just(config), arb_order(n))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Every invariant (`Plan::check`) and the end-to-end byte check hold for random inputs.
        #[test]
        fn random_plans_satisfy_every_invariant((extents, config, order) in arb_case()) {
            let plan = Plan::build(&extents, &config, &order).unwrap();
            prop_assert_eq!(plan.check(&extents), Ok(()));
            prop_assert_eq!(simulate(&plan, &extents), Ok(()));
        }

        /// With file lengths, no read passes EOF, and reads not ending at EOF stay aligned.
        #[test]
        fn random_plans_with_file_lengths((extents, config, order) in arb_case(), slack in 0u64..5000) {
            let mut lens = vec![0u64; 3];
            for e in &extents {
                let end = e.offset_bytes + e.len_bytes;
                lens[e.file as usize] = lens[e.file as usize].max(end);
            }
            for len in &mut lens {
                *len += slack;
            }
            let plan = Plan::build_with_file_lens(&extents, &config, &order, &lens).unwrap();
            prop_assert_eq!(plan.check(&extents), Ok(()));
            prop_assert_eq!(simulate(&plan, &extents), Ok(()));
            for r in plan.reads() {
                prop_assert!(r.offset_bytes + r.len_bytes <= lens[r.file as usize]);
            }
        }

        /// The arena is bounded by the selected bytes plus a documented slack per extent.
        #[test]
        fn arena_slack_is_bounded((extents, config, order) in arb_case()) {
            let plan = Plan::build(&extents, &config, &order).unwrap();
            let nonempty = extents.iter().filter(|e| e.len_bytes > 0).count() as u64;
            let bound = plan.bytes_selected() + nonempty * config.arena_slack_per_extent_bytes();
            prop_assert!(plan.arena_len_bytes() <= bound, "{} > {}", plan.arena_len_bytes(), bound);
        }

        /// Overhead is reported and bounded: per requested run, alignment padding on both sides,
        /// and each gap read through is below the effective coalesce gap.
        #[test]
        fn overhead_is_bounded((extents, config, order) in arb_case()) {
            let plan = Plan::build(&extents, &config, &order).unwrap();
            let runs = extents.iter().filter(|e| e.len_bytes > 0).count() as u64;
            let pad = 2 * (config.align_bytes - 1);
            let bound = runs * pad + runs.saturating_sub(1) * config.coalesce_gap_effective_bytes();
            prop_assert!(plan.bytes_overhead() <= bound, "{} > {}", plan.bytes_overhead(), bound);
            prop_assert_eq!(plan.bytes_read(), plan.bytes_selected() + plan.bytes_overhead());
        }

        /// The most urgent tag is carried by the very first read of the plan.
        #[test]
        fn the_most_urgent_tag_is_read_first((extents, config, order) in arb_case()) {
            let plan = Plan::build(&extents, &config, &order).unwrap();
            if let Order::Priority(tags) = &order
                && let Some(&first) = tags.iter().find(|&&t| plan.location(t).is_some_and(|l| l.len_bytes > 0))
            {
                let carried = plan.read_pieces(&plan.reads()[0]).iter().any(|p| p.tag == first);
                prop_assert!(carried, "tag {} not in the first read", first);
            }
        }

        /// Partial loads of a packed, safetensors-like layout: the plan reads every selected byte,
        /// counts each once, and stays within the overhead rules.
        #[test]
        fn random_selections_of_a_packed_layout(
            lens in prop::collection::vec(0u64..5000, 1..60),
            mask in prop::collection::vec(any::<bool>(), 60),
            config in arb_config(),
            header_bytes in 8u64..300,
        ) {
            let mut offset = header_bytes;
            let mut all = Vec::with_capacity(lens.len());
            for (i, &len) in lens.iter().enumerate() {
                all.push(Extent { file: 0, offset_bytes: offset, len_bytes: len, tag: i as u32 });
                offset += len;
            }
            let selected: Vec<Extent> = all.iter().zip(&mask).filter(|(_, m)| **m).map(|(e, _)| *e).collect();
            let plan = Plan::build_with_file_lens(&selected, &config, &Order::File, &[offset]).unwrap();
            prop_assert_eq!(plan.check(&selected), Ok(()));
            prop_assert_eq!(simulate(&plan, &selected), Ok(()));
            prop_assert_eq!(plan.bytes_selected(), selected.iter().map(|e| e.len_bytes).sum::<u64>());
            prop_assert!(plan.bytes_read() <= offset);
            if selected.len() == all.len() && config.align_bytes == 1 {
                // Everything selected, unaligned: exactly the tensor bytes are read.
                prop_assert_eq!(plan.bytes_read(), offset - header_bytes);
            }
        }

        /// The plan does not depend on the input order (in-place, sorted and radix paths agree),
        /// apart from the order of `locations` and of tied pieces inside one read.
        #[test]
        fn input_order_does_not_change_the_plan((extents, config, order) in arb_case(), seed in any::<u64>()) {
            let mut sorted = extents.clone();
            sorted.sort_by_key(|e| (e.file, e.offset_bytes));
            let mut shuffled = sorted.clone();
            let mut x = seed | 1;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                shuffled.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let a = Plan::build(&sorted, &config, &order).unwrap();
            let b = Plan::build(&shuffled, &config, &order).unwrap();
            prop_assert_eq!(same_plan(&a, &b, &extents), Ok(()));
        }

        /// The radix and merge paths sort exactly like a comparison sort (ties by input position).
        #[test]
        fn radix_sort_matches_a_comparison_sort(
            seed in any::<u64>(),
            offset_bits in 1u32..48,
            files in 1u32..1000,
            n in RADIX_ITEMS_MIN..RADIX_ITEMS_MIN + 600,
            runs in 0usize..4,
        ) {
            let mut x = seed | 1;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut extents: Vec<Extent> = (0..n as u32)
                .map(|t| ext((next() % u64::from(files)) as u32, next() % (1 << offset_bits), next() % 3, t))
                .collect();
            if runs > 0 {
                // A few long sorted runs: the merge path.
                for chunk in extents.chunks_mut(n.div_ceil(runs)) {
                    chunk.sort_by_key(|e| (e.file, e.offset_bytes));
                }
            }
            prop_assert_eq!(first_difference(&sorted_items_of(&extents), &sort_by_comparison(&extents)), None);
        }

        /// Overflowing inputs give typed errors, never panics; valid ones still pass the check.
        #[test]
        fn huge_offsets_never_panic(
            raw in prop::collection::vec((0u32..2, u64::MAX - 100_000..=u64::MAX, 0u64..200_000), 1..8),
            config in arb_config(),
        ) {
            let extents: Vec<Extent> = raw.iter().enumerate().map(|(i, &(file, offset_bytes, len_bytes))| {
                Extent { file, offset_bytes, len_bytes, tag: i as u32 }
            }).collect();
            match Plan::build(&extents, &config, &Order::File) {
                Ok(plan) => prop_assert_eq!(plan.check(&extents), Ok(())),
                Err(PlanError::Overflow { .. } | PlanError::ArenaOverflow | PlanError::TooManyReads { .. }) => {}
                Err(other) => prop_assert!(false, "unexpected error {}", other),
            }
        }
    }
}
