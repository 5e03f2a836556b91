//! How to read a strided slice of a tensor ([`SliceRead::choose`]): its rows one by one, a
//! covering range narrowed in memory, or anything between, decided from measured facts about the
//! source ([`SourceCost`]), with the bytes that choice reads.
//!
//! The rule: a gap between two rows is read through when it costs less than one more request,
//! that is when its block-aligned length is at most [`SourceCost::request_cost_bytes`]. With a
//! cost of `request × request_cost + bytes read`, each gap's decision is independent of the others,
//! so this greedy rule is the cheapest plan. Rows that touch are always one run.
//!
//! A cold source read through the page cache is weighed twice ([`DeviceCost`]): the copies
//! still take only the runs (the cached side: [`SourceCost`], what a `pread` of a cached row
//! costs), but the device reads a gap between two reads along with them when skipping it saves
//! less than one more device request: it transfers whole pages, so a gap saves only the pages
//! wholly inside it, and a small request costs the device what it transfers in several pages.

use std::ops::Range;

/// A tensor slice's rows in its file: `rows` ranges of `width_bytes`, the first at
/// `offset_bytes`, each `stride_bytes` after the previous (`stride_bytes ≥ width_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridedRows {
    /// File offset of the first row.
    pub offset_bytes: u64,
    /// Number of rows.
    pub rows: u64,
    /// Bytes of one row.
    pub width_bytes: u64,
    /// Distance between the starts of consecutive rows.
    pub stride_bytes: u64,
}

/// What one more request costs on the source, and the block its reads are rounded to: measured
/// by the caller (page-cache residency, `O_DIRECT` alignment, a remote store's per-request cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceCost {
    /// Reads start and end on multiples of this (a power of two; 1 for buffered reads, the
    /// logical block size for `O_DIRECT`).
    pub align_bytes: u64,
    /// The bytes the source transfers in the time one request's fixed cost takes (latency ×
    /// bandwidth): a gap up to this long is cheaper to read through than to skip.
    pub request_cost_bytes: u64,
}

/// What a cold source's device costs, for what to read ahead of the copies through the page
/// cache: its transfer unit and one more request's fixed cost, measured by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCost {
    /// The unit a read from the device fills (the page, for reads through the page cache): a
    /// gap saves the device only the granules wholly inside it. A power of two.
    pub granule_bytes: u64,
    /// The bytes the device transfers in the time one more request's fixed cost takes.
    pub request_cost_bytes: u64,
}

impl DeviceCost {
    /// Whether the device should read the gap `gap` (the end of one read to the start of the next
    /// one, in file order) along with the reads around it: the granules wholly inside it, what
    /// skipping it saves, cost at most one request. A gap that runs backwards (reads out of file
    /// order) is never read through.
    ///
    /// ```
    /// use tensora_plan::DeviceCost;
    /// let cold = DeviceCost { granule_bytes: 4096, request_cost_bytes: 8192 };
    /// // A TP=2 row-parallel F16 gap of TinyLlama's down_proj: at most one whole page inside.
    /// assert!(cold.reads_through(&(5632..11264)));
    /// assert!(cold.reads_through(&(1..3 * 4096))); // two whole pages: 8 KiB, one request
    /// assert!(!cold.reads_through(&(0..3 * 4096 + 1))); // three whole pages
    /// assert!(!cold.reads_through(&(0..64 << 10)));
    /// ```
    pub fn reads_through(&self, gap: &Range<u64>) -> bool {
        let g = self.granule_bytes.max(1);
        if gap.end < gap.start {
            return false;
        }
        align_down(gap.end, g).saturating_sub(align_up(gap.start, g)) <= self.request_cost_bytes
    }

    /// The file range the device should read ahead for each of `reads` (`(offset, len)`, in the
    /// order they are read): each read's own range, widened back to the previous read's end where
    /// [`reads_through`](Self::reads_through) says the gap between them is read with it. The
    /// ranges are disjoint when the reads are; their union holds every read.
    pub fn ahead_ranges(&self, reads: impl IntoIterator<Item = (u64, u64)>) -> Vec<Range<u64>> {
        let mut out: Vec<Range<u64>> = Vec::new();
        let mut prev_end: Option<u64> = None;
        for (offset, len) in reads {
            let end = offset.saturating_add(len);
            let start = match prev_end {
                Some(p) if p < offset && self.reads_through(&(p..offset)) => p,
                _ => offset,
            };
            out.push(start..end);
            prev_end = Some(end);
        }
        out
    }
}

/// The most runs a strided read may have; a slice with more rows is read as one covering range
/// (each run is one extent of a plan, so this bounds the plan's memory per tensor).
pub const STRIDED_RUNS_MAX: u64 = 1 << 20;

/// How a slice is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceKind {
    /// The slice is one range of the file (a slice of dimension 0): read exactly.
    Contiguous,
    /// Rows, or runs of rows whose gaps are cheaper to read than to skip: the slice's bytes plus
    /// those gaps.
    Strided,
    /// One range from the first row to the last, narrowed in memory.
    Covering,
}

impl SliceKind {
    /// `contiguous`, `strided` or `covering`, as reports print it.
    pub const fn as_str(self) -> &'static str {
        match self {
            SliceKind::Contiguous => "contiguous",
            SliceKind::Strided => "strided",
            SliceKind::Covering => "covering",
        }
    }
}

/// One range the slice's read asks for: rows `first_row .. first_row + rows`, which lie in
/// `file_bytes` (the first row's start to the last row's end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The file range to read (unaligned: the planner aligns it).
    pub file_bytes: Range<u64>,
    /// The first row the range carries.
    pub first_row: u64,
    /// How many rows it carries.
    pub rows: u64,
}

/// The decision for one slice: its kind, its runs (the extents to plan, in file order) and the
/// bytes they read once aligned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceRead {
    /// Which of the three shapes the runs have.
    pub kind: SliceKind,
    /// The ranges to read, in file order, disjoint, each starting and ending on a row boundary.
    pub runs: Vec<Run>,
    /// The bytes the runs read, each widened to `align_bytes` (aligned spans of different runs
    /// never overlap).
    pub bytes_read: u64,
}

fn align_down(x: u64, align: u64) -> u64 {
    x - x % align
}

fn align_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align).saturating_mul(align)
}

impl SliceRead {
    /// Decides how to read `s` from a source that costs `cost`. An empty slice has no runs.
    ///
    /// ```
    /// use tensora_plan::{SliceKind, SliceRead, SourceCost, StridedRows};
    /// // A [2048, 5632] F16 weight, the second of four column blocks (1408 columns).
    /// let s = StridedRows { offset_bytes: 2816, rows: 2048, width_bytes: 2816, stride_bytes: 11264 };
    /// let page_cache = SourceCost { align_bytes: 1, request_cost_bytes: 4096 };
    /// let read = SliceRead::choose(&s, &page_cache);
    /// assert_eq!((read.kind, read.bytes_read), (SliceKind::Strided, 2048 * 2816));
    /// let remote = SourceCost { align_bytes: 1, request_cost_bytes: 4 << 20 };
    /// assert_eq!(SliceRead::choose(&s, &remote).kind, SliceKind::Covering);
    /// ```
    pub fn choose(s: &StridedRows, cost: &SourceCost) -> SliceRead {
        let align = cost.align_bytes.max(1);
        if s.rows == 0 || s.width_bytes == 0 {
            return SliceRead { kind: SliceKind::Contiguous, runs: Vec::new(), bytes_read: 0 };
        }
        let row_end = |r: u64| s.offset_bytes + r * s.stride_bytes + s.width_bytes;
        let covering = Run { file_bytes: s.offset_bytes..row_end(s.rows - 1), first_row: 0, rows: s.rows };
        let aligned_len = |r: &Range<u64>| align_up(r.end, align) - align_down(r.start, align);
        let gap_aligned =
            align_down(s.offset_bytes + s.stride_bytes, align).saturating_sub(align_up(row_end(0), align));
        let contiguous = s.rows == 1 || s.width_bytes == s.stride_bytes;
        // Every gap has the same aligned length only when the stride is a multiple of the block;
        // otherwise they differ by at most one block, so each is decided on its own.
        let every_gap_read = gap_aligned.saturating_add(align) <= cost.request_cost_bytes;
        if contiguous || every_gap_read || s.rows > STRIDED_RUNS_MAX {
            let bytes_read = aligned_len(&covering.file_bytes);
            let kind = if contiguous { SliceKind::Contiguous } else { SliceKind::Covering };
            return SliceRead { kind, runs: vec![covering], bytes_read };
        }
        let mut runs: Vec<Run> = Vec::new();
        let mut current = Run { file_bytes: s.offset_bytes..row_end(0), first_row: 0, rows: 1 };
        for r in 1..s.rows {
            let start = s.offset_bytes + r * s.stride_bytes;
            let gap = align_down(start, align).saturating_sub(align_up(current.file_bytes.end, align));
            // Aligned spans that overlap have a gap of 0: always one run.
            if gap <= cost.request_cost_bytes {
                current.file_bytes.end = row_end(r);
                current.rows += 1;
            } else {
                let next = Run { file_bytes: start..row_end(r), first_row: r, rows: 1 };
                runs.push(std::mem::replace(&mut current, next));
            }
        }
        runs.push(current);
        let bytes_read = runs.iter().map(|r| aligned_len(&r.file_bytes)).sum();
        let kind = if runs.len() == 1 { SliceKind::Covering } else { SliceKind::Strided };
        SliceRead { kind, runs, bytes_read }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn rows_of(s: &StridedRows) -> Vec<Range<u64>> {
        (0..s.rows)
            .map(|r| {
                let a = s.offset_bytes + r * s.stride_bytes;
                a..a + s.width_bytes
            })
            .collect()
    }

    #[test]
    fn dim_zero_is_contiguous_and_costly_requests_cover() {
        let one = StridedRows { offset_bytes: 100, rows: 4, width_bytes: 64, stride_bytes: 64 };
        let read = SliceRead::choose(&one, &SourceCost { align_bytes: 1, request_cost_bytes: 0 });
        assert_eq!(read.kind, SliceKind::Contiguous);
        assert_eq!((read.runs.len(), read.bytes_read), (1, 256));
        let direct = SourceCost { align_bytes: 4096, request_cost_bytes: 0 };
        assert_eq!(SliceRead::choose(&one, &direct).bytes_read, 4096);
        // Rows narrower than a block, one per block, under O_DIRECT: the blocks touch, one read.
        let narrow = StridedRows { offset_bytes: 0, rows: 8, width_bytes: 1024, stride_bytes: 4096 };
        let read = SliceRead::choose(&narrow, &direct);
        assert_eq!((read.kind, read.runs.len(), read.bytes_read), (SliceKind::Covering, 1, 8 * 4096));
        // Two blocks between rows: skipped while a request costs less than two blocks.
        let apart = StridedRows { stride_bytes: 3 * 4096, ..narrow };
        let read = SliceRead::choose(&apart, &SourceCost { align_bytes: 4096, request_cost_bytes: 4096 });
        assert_eq!((read.kind, read.runs.len(), read.bytes_read), (SliceKind::Strided, 8, 8 * 4096));
        let read = SliceRead::choose(&apart, &SourceCost { align_bytes: 4096, request_cost_bytes: 8192 });
        assert_eq!((read.kind, read.runs.len(), read.bytes_read), (SliceKind::Covering, 1, 22 * 4096));
        let empty = StridedRows { offset_bytes: 0, rows: 0, width_bytes: 8, stride_bytes: 16 };
        assert!(SliceRead::choose(&empty, &direct).runs.is_empty());
    }

    #[test]
    fn too_many_rows_are_one_covering_read() {
        let s = StridedRows {
            offset_bytes: 0,
            rows: STRIDED_RUNS_MAX + 1,
            width_bytes: 1,
            stride_bytes: 1 << 20,
        };
        let read = SliceRead::choose(&s, &SourceCost { align_bytes: 1, request_cost_bytes: 0 });
        assert_eq!((read.kind, read.runs.len()), (SliceKind::Covering, 1));
    }

    #[test]
    fn a_cold_device_reads_through_gaps_of_few_pages_and_a_cached_source_still_skips_them() {
        let cold = DeviceCost { granule_bytes: 4096, request_cost_bytes: 8 << 10 };
        // TinyLlama's row-parallel F16 slices: TP=2 down_proj (5632 of 11264), TP=4 down_proj
        // (2816 of 11264) and o_proj (1024 of 4096).
        for (width, stride) in [(5632u64, 11264u64), (2816, 11264), (1024, 4096)] {
            let s = StridedRows { offset_bytes: 640, rows: 64, width_bytes: width, stride_bytes: stride };
            // The cached side: each row its own run, only the rows read.
            let cached = SliceRead::choose(&s, &SourceCost { align_bytes: 1, request_cost_bytes: 2 << 10 });
            assert_eq!(
                (cached.kind, cached.runs.len(), cached.bytes_read),
                (SliceKind::Strided, 64, 64 * width)
            );
            // The cold side: the device reads every gap along, one range from the first row's
            // start to the last row's end.
            let ahead = cold.ahead_ranges(
                cached.runs.iter().map(|r| (r.file_bytes.start, r.file_bytes.end - r.file_bytes.start)),
            );
            assert_eq!(ahead.len(), 64);
            assert_eq!(ahead[0], 640..640 + width);
            for (a, b) in ahead.windows(2).map(|w| (&w[0], &w[1])) {
                assert_eq!(a.end, b.start, "width {width} stride {stride}");
            }
            assert_eq!(ahead[63].end, 640 + 63 * stride + width);
        }
        // Gaps of many pages (a 1/8 slice of a wide F32 row) are skipped by the device too.
        let wide = StridedRows { offset_bytes: 0, rows: 4, width_bytes: 8192, stride_bytes: 65536 };
        let runs = SliceRead::choose(&wide, &SourceCost { align_bytes: 1, request_cost_bytes: 2 << 10 }).runs;
        let ahead = cold
            .ahead_ranges(runs.iter().map(|r| (r.file_bytes.start, r.file_bytes.end - r.file_bytes.start)));
        assert_eq!(ahead, runs.iter().map(|r| r.file_bytes.clone()).collect::<Vec<_>>());
        // Reads out of file order, or touching, are advised as they are.
        assert_eq!(cold.ahead_ranges([(8192, 100), (0, 100), (100, 50)]), vec![8192..8292, 0..100, 100..150]);
    }

    proptest! {
        /// The device's ranges hold every read, stay disjoint for disjoint reads in file order,
        /// and widen a read only over a gap whose whole granules cost at most one request.
        #[test]
        fn ahead_ranges_hold_every_read_and_widen_only_over_cheap_gaps(
            gaps in prop::collection::vec((0u64..40_000, 1u64..20_000), 0..32),
            granule_log in 0u32..14,
            request_cost_bytes in prop::sample::select(vec![0u64, 4096, 8192, 65_536]),
        ) {
            let cold = DeviceCost { granule_bytes: 1 << granule_log, request_cost_bytes };
            let mut reads = Vec::new();
            let mut at = 0;
            for (gap, len) in gaps {
                reads.push((at + gap, len));
                at += gap + len;
            }
            let ahead = cold.ahead_ranges(reads.iter().copied());
            prop_assert_eq!(ahead.len(), reads.len());
            for (k, (r, (offset, len))) in ahead.iter().zip(&reads).enumerate() {
                prop_assert_eq!(r.end, offset + len);
                prop_assert!(r.start <= *offset);
                if r.start < *offset {
                    let prev_end = reads[k - 1].0 + reads[k - 1].1;
                    prop_assert_eq!(r.start, prev_end);
                    let g = cold.granule_bytes;
                    prop_assert!(align_down(*offset, g).saturating_sub(align_up(prev_end, g)) <= request_cost_bytes);
                }
                if k > 0 {
                    prop_assert!(ahead[k - 1].end <= r.start);
                }
            }
        }

        /// The runs carry every row exactly once, in order, start and end on row boundaries, read
        /// only gaps cheaper than a request, and with a free request read exactly the slice.
        #[test]
        fn runs_cover_exactly_the_rows(
            offset_bytes in 0u64..100_000,
            rows in 0u64..64,
            width_bytes in 1u64..5000,
            extra in 0u64..20_000,
            align_log in 0u32..13,
            request_cost_bytes in prop::sample::select(vec![0u64, 1, 512, 4096, 65_536, 1 << 22]),
        ) {
            let s = StridedRows { offset_bytes, rows, width_bytes, stride_bytes: width_bytes + extra };
            let cost = SourceCost { align_bytes: 1 << align_log, request_cost_bytes };
            let read = SliceRead::choose(&s, &cost);
            let want = rows_of(&s);
            let mut next_row = 0;
            let mut prev_aligned_end = 0;
            for run in &read.runs {
                prop_assert_eq!(run.first_row, next_row);
                let first = &want[run.first_row as usize];
                let last = &want[(run.first_row + run.rows - 1) as usize];
                prop_assert_eq!(run.file_bytes.clone(), first.start..last.end);
                let aligned_start = align_down(run.file_bytes.start, cost.align_bytes);
                prop_assert!(aligned_start >= prev_aligned_end, "aligned runs overlap");
                prev_aligned_end = align_up(run.file_bytes.end, cost.align_bytes);
                next_row += run.rows;
            }
            prop_assert_eq!(next_row, if want.is_empty() { 0 } else { rows });
            let requested: u64 = read.runs.iter().map(|r| r.file_bytes.end - r.file_bytes.start).sum();
            if cost.align_bytes == 1 && request_cost_bytes == 0 {
                prop_assert_eq!(requested, rows * width_bytes);
                prop_assert_eq!(read.bytes_read, rows * width_bytes);
            }
            prop_assert!(read.bytes_read >= rows * width_bytes);
            if read.kind == SliceKind::Strided {
                prop_assert!(read.runs.len() > 1);
            }
        }
    }
}
