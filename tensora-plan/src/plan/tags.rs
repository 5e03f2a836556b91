//! [`TagIndex`]: tag → extent index, in the cheapest form the tags allow.

use crate::{Extent, PlanError};

/// Tag → extent index.
#[derive(Debug, Clone)]
pub(super) enum TagIndex {
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
    pub(super) fn new(extents: &[Extent]) -> Result<Self, PlanError> {
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

    pub(super) fn get(&self, tag: u32) -> Option<usize> {
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
