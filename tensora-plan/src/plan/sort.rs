//! Validating the extents and putting the non-empty ones in `(file, offset, index)` order: in
//! place, by merging sorted runs, or by a radix sort on packed keys.

use super::tags::TagIndex;
use super::{EXTENTS_MAX, Order, RANK_UNLISTED, aligned_end};
use crate::{Extent, PlanConfig, PlanError};

/// Validated, per-extent facts.
pub(super) struct Prepared {
    /// The non-empty extents, sorted by `(file, offset, index)`, or `None` when the input is
    /// already in that order with no empty extent (it is then read in place). Every later pass
    /// walks them in order, so a shuffled input is touched at random only once.
    pub items: Option<Vec<Item>>,
    /// Priority rank per extent, in input order (empty under `Order::File`).
    pub ranks: Vec<u32>,
    pub tags: TagIndex,
}

/// Validates extents and builds the sorted keys, the tag index and the priority ranks.
pub(super) fn prepare(
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

/// One non-empty extent, as the sweep needs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    pub offset_bytes: u64,
    pub end_bytes: u64,
    pub file: u32,
    /// Index in the input.
    pub index: u32,
}

/// Below this many items a comparison sort beats the radix sort's fixed costs.
pub(super) const RADIX_ITEMS_MIN: usize = 4096;
/// Bits per radix digit (2048 buckets: four passes cover 44-bit keys).
const RADIX_DIGIT_BITS: u32 = 11;
/// Input whose sorted runs average at least this many extents is merged (stable sort over
/// natural runs, no random access) instead of radix-sorted.
const RUN_LEN_MIN: usize = 16;

/// What pass 1 learns about the non-empty extents, for choosing a sort.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Shape {
    nonempty: usize,
    /// Places where `(file, offset)` decreases from one non-empty extent to the next (0: sorted).
    descents: usize,
    max_file: u32,
    max_offset: u64,
}

impl Shape {
    pub(super) fn add(&mut self, e: &Extent, prev: &mut (u32, u64)) {
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
pub(super) fn sorted_items(extents: &[Extent], shape: &Shape) -> Vec<Item> {
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
