//! `Plan::check`: an independent re-derivation of every plan invariant, used by the debug
//! assertions in `Plan::build` and by the property tests.

use std::collections::HashMap;

use crate::plan::aligned_end;
use crate::{Extent, Order, Plan, Read};

/// Returns `Err(description)` at the first broken invariant.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

impl Plan {
    /// Checks every invariant of this plan against the extents it was built from:
    ///
    /// - one location per extent, in input order, with the extent's tag and length;
    /// - every read is non-empty, at most `read_bytes_max()` long, its file offset, length and
    ///   arena offset are multiples of `align_bytes` (a read may end at end of file instead), and
    ///   its arena offset ≡ its file offset (mod `arena_period_bytes()`);
    /// - reads of one file never overlap, and arena ranges of all reads never overlap;
    /// - pieces tile every extent exactly once, each inside its read, consistently in file and
    ///   arena coordinates; `reads_total` counts them; every read carries a piece;
    /// - every byte read beyond the requested ones is alignment padding of a requested range or
    ///   lies in a gap smaller than `coalesce_gap_effective_bytes()`, and gaps not read through
    ///   are not smaller than that;
    /// - `bytes_selected`, `bytes_read` and `arena_len_bytes` are the sums they claim to be;
    /// - queues: one per file with reads, covering [`Plan::reads`] in order, ordered by the
    ///   [`Order`] (priority first, then file id; within a file, priority then offset).
    pub fn check(&self, extents: &[Extent]) -> Result<(), String> {
        let cfg = self.config();
        cfg.validate().map_err(|e| e.to_string())?;
        // The extents themselves first, so the sums below cannot overflow.
        self.check_extents(extents)?;
        let by_tag = self.check_locations(extents)?;
        self.check_reads()?;
        self.check_pieces(extents, &by_tag)?;
        // Per file: no overlap, and every unrequested byte justified.
        self.check_files(extents)?;
        // Queues and order.
        self.check_queues(&by_tag)?;
        Ok(())
    }

    /// The length of `file`, when the plan was built with file lengths that cover it.
    fn file_len(&self, file: u32) -> Option<u64> {
        self.file_lens_bytes().and_then(|lens| lens.get(file as usize).copied())
    }

    /// Every extent's end fits in a `u64` and, with file lengths, lies inside its file.
    fn check_extents(&self, extents: &[Extent]) -> Result<(), String> {
        for e in extents {
            let end = e.offset_bytes.checked_add(e.len_bytes).ok_or(format!("extent {e:?} overflows"))?;
            if let Some(lens) = self.file_lens_bytes() {
                let len = lens.get(e.file as usize).ok_or(format!("extent {e:?} names an unknown file"))?;
                ensure!(end <= *len, "extent {e:?} ends past EOF {len}");
            }
        }
        Ok(())
    }

    /// One location per extent, in input order, with its tag and length, found by
    /// [`Plan::location`]; a non-empty extent keeps its file alignment and lies inside the arena.
    /// Returns tag → extent index.
    fn check_locations(&self, extents: &[Extent]) -> Result<HashMap<u32, usize>, String> {
        let period = self.config().arena_period_bytes();
        let locations = self.locations();
        ensure!(
            locations.len() == extents.len(),
            "{} locations for {} extents",
            locations.len(),
            extents.len()
        );
        let mut by_tag: HashMap<u32, usize> = HashMap::with_capacity(extents.len());
        for (i, (e, loc)) in extents.iter().zip(locations).enumerate() {
            ensure!(
                loc.tag == e.tag && loc.len_bytes == e.len_bytes,
                "location {i} {loc:?} does not match {e:?}"
            );
            ensure!(by_tag.insert(e.tag, i).is_none(), "duplicate tag {}", e.tag);
            ensure!(self.location(e.tag) == Some(loc), "location({}) is not location {i}", e.tag);
            if e.len_bytes == 0 {
                ensure!(loc.reads_total == 0, "empty extent {e:?} has {} reads", loc.reads_total);
            } else {
                ensure!(
                    loc.arena_offset_bytes % period == e.offset_bytes % period,
                    "extent {e:?} lands at arena offset {} (period {period})",
                    loc.arena_offset_bytes
                );
                ensure!(
                    loc.arena_offset_bytes
                        .checked_add(e.len_bytes)
                        .is_some_and(|end| end <= self.arena_len_bytes()),
                    "extent {e:?} at arena {} overruns the arena",
                    loc.arena_offset_bytes
                );
            }
        }
        Ok(by_tag)
    }

    /// Each read on its own (length, alignment, end of file, arena period and bounds, a piece
    /// carried), then `bytes_read` and `arena_len_bytes` as sums, and no two arena ranges
    /// overlapping.
    fn check_reads(&self) -> Result<(), String> {
        let cfg = self.config();
        let align = cfg.align_bytes;
        let period = cfg.arena_period_bytes();
        let read_max = cfg.read_bytes_max();
        let reads = self.reads();
        let mut bytes_read: u64 = 0;
        let mut arena_end_max: u64 = 0;
        for (i, r) in reads.iter().enumerate() {
            let end = r.offset_bytes.checked_add(r.len_bytes).ok_or(format!("read {i} {r:?} overflows"))?;
            ensure!(
                r.len_bytes > 0 && r.len_bytes <= read_max,
                "read {i} {r:?}: length not in 1..={read_max}"
            );
            ensure!(r.len_bytes <= cfg.chunk_bytes && r.len_bytes <= cfg.budget_bytes, "read {i} too long");
            ensure!(r.offset_bytes % align == 0, "read {i} {r:?}: offset not aligned to {align}");
            ensure!(r.arena_offset_bytes % align == 0, "read {i} {r:?}: arena offset not aligned to {align}");
            ensure!(
                r.len_bytes % align == 0 || self.file_len(r.file) == Some(end),
                "read {i} {r:?}: length not aligned to {align} and not ending at EOF"
            );
            if let Some(len) = self.file_len(r.file) {
                ensure!(end <= len, "read {i} {r:?} goes past EOF {len}");
            }
            ensure!(r.arena_offset_bytes % period == r.offset_bytes % period, "read {i} {r:?}: arena period");
            let arena_end =
                r.arena_offset_bytes.checked_add(r.len_bytes).ok_or(format!("read {i} arena overflow"))?;
            ensure!(arena_end <= self.arena_len_bytes(), "read {i} {r:?} overruns the arena");
            arena_end_max = arena_end_max.max(arena_end);
            bytes_read += r.len_bytes;
            ensure!(r.pieces.start < r.pieces.end, "read {i} {r:?} carries no piece");
            ensure!(r.pieces.end as usize <= self.pieces().len(), "read {i} pieces out of range");
        }
        ensure!(
            bytes_read == self.bytes_read(),
            "bytes_read {} != sum of reads {bytes_read}",
            self.bytes_read()
        );
        ensure!(
            arena_end_max == self.arena_len_bytes(),
            "arena_len {} != {arena_end_max}",
            self.arena_len_bytes()
        );

        // Arena ranges never overlap.
        let mut arena: Vec<(u64, u64)> = reads.iter().map(|r| (r.arena_offset_bytes, r.len_bytes)).collect();
        arena.sort_unstable();
        for w in arena.windows(2) {
            ensure!(w[0].0 + w[0].1 <= w[1].0, "arena ranges {:?} and {:?} overlap", w[0], w[1]);
        }
        Ok(())
    }

    /// The reads' piece ranges tile [`Plan::pieces`]; each piece lies inside its read and its
    /// extent at consistent file and arena offsets; together they cover every extent exactly
    /// once, and `reads_total` counts them.
    fn check_pieces(&self, extents: &[Extent], by_tag: &HashMap<u32, usize>) -> Result<(), String> {
        let reads = self.reads();
        let locations = self.locations();
        let mut piece_ranges: Vec<(u32, u32)> =
            reads.iter().map(|r| (r.pieces.start, r.pieces.end)).collect();
        piece_ranges.sort_unstable();
        let mut next: u32 = 0;
        for (s, e) in piece_ranges {
            ensure!(s == next, "piece ranges do not tile the pieces at {s}");
            next = e;
        }
        ensure!(
            next as usize == self.pieces().len(),
            "pieces {}..{} belong to no read",
            next,
            self.pieces().len()
        );
        // (extent, offset in extent, length) of every piece; sorted, they must tile each extent.
        let mut covered: Vec<(usize, u64, u64)> = Vec::with_capacity(self.pieces().len());
        for (i, r) in reads.iter().enumerate() {
            for p in self.read_pieces(r) {
                let x = *by_tag.get(&p.tag).ok_or(format!("read {i} carries unknown tag {}", p.tag))?;
                let e = &extents[x];
                ensure!(p.len_bytes > 0, "read {i} has an empty piece {p:?}");
                ensure!(e.file == r.file, "read {i} of file {} carries {e:?}", r.file);
                ensure!(
                    p.read_offset_bytes.checked_add(p.len_bytes).is_some_and(|end| end <= r.len_bytes),
                    "piece {p:?} overruns read {i}"
                );
                ensure!(
                    p.extent_offset_bytes.checked_add(p.len_bytes).is_some_and(|end| end <= e.len_bytes),
                    "piece {p:?} overruns {e:?}"
                );
                ensure!(
                    r.offset_bytes + p.read_offset_bytes == e.offset_bytes + p.extent_offset_bytes,
                    "piece {p:?} of read {i} is at the wrong file offset"
                );
                ensure!(
                    r.arena_offset_bytes + p.read_offset_bytes
                        == locations[x].arena_offset_bytes + p.extent_offset_bytes,
                    "piece {p:?} of read {i} disagrees with its location"
                );
                covered.push((x, p.extent_offset_bytes, p.len_bytes));
            }
        }
        covered.sort_unstable();
        let mut c = 0;
        for (x, e) in extents.iter().enumerate() {
            let mut at = 0;
            let mut count = 0u32;
            while c < covered.len() && covered[c].0 == x {
                ensure!(covered[c].1 == at, "extent {e:?} is not covered exactly once at byte {at}");
                at += covered[c].2;
                count += 1;
                c += 1;
            }
            ensure!(at == e.len_bytes, "extent {e:?} covered only up to byte {at}");
            ensure!(
                count == locations[x].reads_total,
                "extent {e:?}: reads_total {} but {count} pieces",
                locations[x].reads_total
            );
        }
        Ok(())
    }

    /// Per file: the union of the extents is `bytes_selected`; reads never overlap; every read
    /// run (a chain of touching reads) carries requested bytes, starts and ends at their
    /// alignment, reads through only gaps below the effective coalesce gap, and is at least that
    /// gap away from the previous run.
    fn check_files(&self, extents: &[Extent]) -> Result<(), String> {
        let align = self.config().align_bytes;
        let gap_max = self.config().coalesce_gap_effective_bytes();
        let mut spans: Vec<(u32, u64, u64)> = extents
            .iter()
            .filter(|e| e.len_bytes > 0)
            .map(|e| (e.file, e.offset_bytes, e.offset_bytes + e.len_bytes))
            .collect();
        spans.sort_unstable();
        // Union overlapping extents per file.
        let mut union: Vec<(u32, u64, u64)> = Vec::new();
        for s in spans {
            match union.last_mut() {
                Some(u) if u.0 == s.0 && s.1 < u.2 => u.2 = u.2.max(s.2),
                _ => union.push(s),
            }
        }
        let selected: u64 = union.iter().map(|u| u.2 - u.1).sum();
        ensure!(
            selected == self.bytes_selected(),
            "bytes_selected {} != union {selected}",
            self.bytes_selected()
        );

        let mut sorted: Vec<&Read> = self.reads().iter().collect();
        sorted.sort_unstable_by_key(|r| (r.file, r.offset_bytes));
        // Runs: maximal chains of touching reads.
        let mut runs: Vec<(u32, u64, u64)> = Vec::new();
        for r in sorted {
            let end = r.offset_bytes + r.len_bytes;
            match runs.last_mut() {
                Some(run) if run.0 == r.file => {
                    ensure!(
                        r.offset_bytes >= run.2,
                        "reads of file {} overlap at {}",
                        r.file,
                        r.offset_bytes
                    );
                    if r.offset_bytes == run.2 {
                        run.2 = end;
                    } else {
                        runs.push((r.file, r.offset_bytes, end));
                    }
                }
                _ => runs.push((r.file, r.offset_bytes, end)),
            }
        }
        let mut u = 0;
        for (i, run) in runs.iter().enumerate() {
            // The spans inside this run.
            let first = u;
            while u < union.len() && (union[u].0, union[u].2) <= (run.0, run.2) && union[u].0 == run.0 {
                ensure!(union[u].1 >= run.1, "requested bytes {:?} not inside read run {run:?}", union[u]);
                u += 1;
            }
            ensure!(u > first, "read run {run:?} carries no requested byte");
            let len = self.file_len(run.0);
            let (head, tail) = (union[first], union[u - 1]);
            ensure!(run.1 == head.1 - head.1 % align, "run {run:?} starts beyond the alignment of {head:?}");
            ensure!(
                Some(run.2) == aligned_end(tail.2, align, len),
                "run {run:?} ends beyond the alignment of {tail:?}"
            );
            for w in union[first..u].windows(2) {
                let gap_start = aligned_end(w[0].2, align, len).unwrap_or(u64::MAX);
                let gap_end = w[1].1 - w[1].1 % align;
                ensure!(
                    gap_end <= gap_start || gap_end - gap_start < gap_max,
                    "run {run:?} reads through a gap of {} bytes (limit {gap_max})",
                    gap_end - gap_start
                );
            }
            if let Some(prev) = i.checked_sub(1).map(|p| runs[p]).filter(|p| p.0 == run.0) {
                ensure!(run.1 - prev.2 >= gap_max, "runs {prev:?} and {run:?} should have been coalesced");
            }
        }
        ensure!(u == union.len(), "requested bytes {:?} are not read", union.get(u));
        Ok(())
    }

    /// One queue per file with reads, together covering [`Plan::reads`] in order, each holding
    /// only its file's reads in (priority, offset) order, the queues in (priority, file) order.
    fn check_queues(&self, by_tag: &HashMap<u32, usize>) -> Result<(), String> {
        let ranks: HashMap<u32, u32> = match self.order() {
            Order::File => HashMap::new(),
            Order::Priority(tags) => {
                let mut m = HashMap::new();
                for (rank, &tag) in tags.iter().enumerate() {
                    ensure!(by_tag.contains_key(&tag), "priority tag {tag} has no extent");
                    m.entry(tag).or_insert(rank as u32);
                }
                m
            }
        };
        let read_rank = |r: &Read| {
            self.read_pieces(r).iter().map(|p| ranks.get(&p.tag).copied().unwrap_or(u32::MAX)).min()
        };
        let mut next = 0u32;
        let mut files_seen: Vec<u32> = Vec::new();
        let mut prev_queue: Option<(u32, u32)> = None;
        for q in self.queues() {
            ensure!(
                q.reads.start == next && q.reads.start < q.reads.end,
                "queue {q:?} does not continue at {next}"
            );
            next = q.reads.end;
            ensure!(!files_seen.contains(&q.file), "file {} has two queues", q.file);
            files_seen.push(q.file);
            let mut prev: Option<(u32, u64)> = None;
            let mut queue_rank = u32::MAX;
            for r in self.queue_reads(q) {
                ensure!(r.file == q.file, "queue of file {} holds a read of file {}", q.file, r.file);
                let key = (read_rank(r).unwrap_or(u32::MAX), r.offset_bytes);
                ensure!(prev.is_none_or(|p| p < key), "queue of file {} is out of order at {r:?}", q.file);
                prev = Some(key);
                queue_rank = queue_rank.min(key.0);
            }
            let key = (queue_rank, q.file);
            ensure!(prev_queue.is_none_or(|p| p < key), "queue of file {} is out of order", q.file);
            prev_queue = Some(key);
        }
        ensure!(next as usize == self.reads().len(), "reads {next}.. belong to no queue");
        Ok(())
    }
}
