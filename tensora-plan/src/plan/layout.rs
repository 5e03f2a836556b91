//! The passes after sorting, each over the sorted items in order: spans merged into groups, the
//! groups laid out in the arena, the groups cut into reads, and the pieces each read carries.

use super::sort::Item;
use super::{Input, PIECES_MAX, RANK_UNLISTED, READS_MAX, SortedView, aligned_end};
use crate::{Piece, PlanConfig, PlanError, Read, TagLocation};

/// A contiguous file range read into contiguous arena bytes (one or more reads).
#[derive(Debug, Clone, Copy)]
pub(super) struct Group {
    file: u32,
    start_bytes: u64,
    end_bytes: u64,
    arena_offset_bytes: u64,
    /// Range of sorted items (extents) inside this group.
    items: (usize, usize),
    /// First read (file order) of this group.
    first_read: u32,
}

impl Group {
    /// Bytes the group reads (requested bytes, gaps read through and alignment padding).
    fn len_bytes(&self) -> u64 {
        self.end_bytes - self.start_bytes
    }

    /// The first and last read (relative to the group) that a non-empty extent touches.
    fn read_span(&self, item: &Item, read_max: u64) -> (u32, u32) {
        let first = (item.offset_bytes - self.start_bytes) / read_max;
        let last = (item.end_bytes - 1 - self.start_bytes) / read_max;
        (first as u32, last as u32)
    }
}

/// The sweep's result: groups in file order, and the distinct requested bytes they cover.
pub(super) struct Groups {
    pub groups: Vec<Group>,
    /// The union of the extents per file, in bytes.
    pub bytes_selected: u64,
}

/// Sweep the sorted items: each span (a union of overlapping extents) is aligned and merged into
/// the current group of its file when the gap to it is below the effective coalesce gap.
pub(super) fn sweep_groups<V: SortedView + ?Sized>(
    items: &V,
    config: &PlanConfig,
    file_lens_bytes: Option<&[u64]>,
) -> Result<Groups, PlanError> {
    let align = config.align_bytes;
    let gap_max = config.coalesce_gap_effective_bytes();
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
                    groups.extend(group.take());
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
        groups.extend(group.take());
    }
    Ok(Groups { groups, bytes_selected })
}

/// The arena and read totals of laid-out groups.
pub(super) struct ArenaLayout {
    /// Bytes the arena must hold.
    pub arena_len_bytes: u64,
    /// Reads the groups are cut into.
    pub reads_total: u64,
    /// Bytes those reads fetch.
    pub bytes_read: u64,
}

/// Place each group in the arena after the previous one, shifted so that its arena offset is its
/// file offset modulo the arena period, and number its reads. Refuses more than [`READS_MAX`]
/// reads.
pub(super) fn lay_out_arena(groups: &mut [Group], config: &PlanConfig) -> Result<ArenaLayout, PlanError> {
    let period = config.arena_period_bytes();
    let read_max = config.read_bytes_max();
    let mut arena_cursor: u64 = 0;
    let mut reads_total: u64 = 0;
    let mut bytes_read: u64 = 0;
    for g in groups {
        let delta = g.start_bytes.wrapping_sub(arena_cursor) & (period - 1);
        g.arena_offset_bytes = arena_cursor.checked_add(delta).ok_or(PlanError::ArenaOverflow)?;
        let len = g.len_bytes();
        arena_cursor = g.arena_offset_bytes.checked_add(len).ok_or(PlanError::ArenaOverflow)?;
        bytes_read += len; // <= arena_cursor, so it cannot overflow
        g.first_read = u32::try_from(reads_total).unwrap_or(u32::MAX);
        reads_total += len.div_ceil(read_max);
        if reads_total > READS_MAX {
            return Err(PlanError::TooManyReads { reads: reads_total, max: READS_MAX });
        }
    }
    Ok(ArenaLayout { arena_len_bytes: arena_cursor, reads_total, bytes_read })
}

/// The number of pieces the groups' reads will carry, counted before any is allocated. Refuses
/// more than [`PIECES_MAX`].
pub(super) fn count_pieces<V: SortedView + ?Sized>(
    items: &V,
    groups: &[Group],
    read_max: u64,
) -> Result<u64, PlanError> {
    let mut pieces_total: u64 = 0;
    for g in groups {
        for k in g.items.0..g.items.1 {
            let (first, last) = g.read_span(&items.get(k), read_max);
            pieces_total += u64::from(last - first) + 1;
        }
        if pieces_total > PIECES_MAX {
            return Err(PlanError::TooManyPieces { pieces: pieces_total, max: PIECES_MAX });
        }
    }
    Ok(pieces_total)
}

/// The reads of every group, in file order: each group cut into reads of `read_max` bytes (the
/// last one shorter). Their pieces are filled in by [`cut_pieces`].
pub(super) fn file_order_reads(groups: &[Group], read_max: u64, reads_total: u64) -> Vec<Read> {
    let mut reads: Vec<Read> = Vec::with_capacity(reads_total as usize);
    for g in groups {
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
    reads
}

/// What cutting the reads into pieces yields.
pub(super) struct Cut {
    pub pieces: Vec<Piece>,
    /// The most urgent priority rank each read (file order) carries.
    pub read_ranks: Vec<u32>,
    /// One location per input extent, in input order.
    pub locations: Vec<TagLocation>,
}

/// Which of an item's reads carries a piece: the first places the item in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carry {
    First,
    Continued,
}

/// Pieces and locations being built, read by read.
struct Cutter<'a> {
    /// Priority rank per extent (empty under `Order::File`).
    ranks: &'a [u32],
    pieces: Vec<Piece>,
    locations: Vec<TagLocation>,
    /// The sweep line of [`Cutter::cut_group`], kept to reuse its allocation.
    active: Vec<usize>,
}

impl Cutter<'_> {
    /// Push the piece of `item` that the read `read_start..read_end` of `g` carries, count it in
    /// the item's location, and return the item's priority rank.
    fn emit(&mut self, item: &Item, g: &Group, (read_start, read_end): (u64, u64), carry: Carry) -> u32 {
        let from = item.offset_bytes.max(read_start);
        let loc = &mut self.locations[item.index as usize];
        loc.reads_total += 1;
        if carry == Carry::First {
            loc.arena_offset_bytes = g.arena_offset_bytes + (item.offset_bytes - g.start_bytes);
        }
        self.pieces.push(Piece {
            tag: loc.tag,
            read_offset_bytes: from - read_start,
            extent_offset_bytes: from - item.offset_bytes,
            len_bytes: item.end_bytes.min(read_end) - from,
        });
        self.ranks.get(item.index as usize).copied().unwrap_or(RANK_UNLISTED)
    }

    /// The pieces of one group's reads, with a sweep line over the group's sorted items:
    /// `active` holds the items that started in an earlier read and go on past the current one
    /// (ties, or extents longer than a read), in start order. Pieces of a read are thus in file
    /// order. Sets each read's piece range and its rank in `read_ranks`.
    fn cut_group<V: SortedView + ?Sized>(
        &mut self,
        items: &V,
        g: &Group,
        reads: &mut [Read],
        read_ranks: &mut [u32],
        read_max: u64,
    ) {
        let (group_first, group_end) = g.items;
        let first_read = g.first_read as usize;
        let group_reads = g.len_bytes().div_ceil(read_max) as usize;
        let mut next = group_first;
        let mut active = std::mem::take(&mut self.active);
        active.clear();
        for ri in first_read..first_read + group_reads {
            let read = (reads[ri].offset_bytes, reads[ri].offset_bytes + reads[ri].len_bytes);
            let first_piece = self.pieces.len() as u32;
            let mut rank = RANK_UNLISTED;
            active.retain(|&a| {
                let item = items.get(a);
                rank = rank.min(self.emit(&item, g, read, Carry::Continued));
                item.end_bytes > read.1
            });
            while next < group_end && items.get(next).offset_bytes < read.1 {
                let item = items.get(next);
                rank = rank.min(self.emit(&item, g, read, Carry::First));
                if item.end_bytes > read.1 {
                    active.push(next);
                }
                next += 1;
            }
            reads[ri].pieces = first_piece..self.pieces.len() as u32;
            read_ranks[ri] = rank;
        }
        self.active = active;
    }
}

/// Fill in the pieces of every read (file order) and every extent's location.
pub(super) fn cut_pieces<V: SortedView + ?Sized>(
    items: &V,
    groups: &[Group],
    reads: &mut [Read],
    input: &Input<'_>,
    pieces_total: u64,
) -> Cut {
    let read_max = input.config.read_bytes_max();
    let mut cutter = Cutter {
        ranks: input.ranks,
        pieces: Vec::with_capacity(pieces_total as usize),
        locations: input
            .extents
            .iter()
            .map(|e| TagLocation {
                tag: e.tag,
                arena_offset_bytes: 0,
                len_bytes: e.len_bytes,
                reads_total: 0,
            })
            .collect(),
        active: Vec::new(),
    };
    let mut read_ranks: Vec<u32> = vec![RANK_UNLISTED; reads.len()];
    for g in groups {
        cutter.cut_group(items, g, reads, &mut read_ranks, read_max);
    }
    Cut { pieces: cutter.pieces, read_ranks, locations: cutter.locations }
}
