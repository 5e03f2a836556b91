//! Name lookups without copies of the names: [`NameTable`] holds only ids (`u32`), the names
//! stay in the caller's shared buffer and are fetched through a closure. The one name → entry map
//! of the workspace: duplicate tensors in a header, an index's weight map and shard names, a
//! [`crate::Checkpoint`]'s lookup by name, and a loaded model's (`tensora_io::Loaded`).
//!
//! ```
//! use tensora_format::NameTable;
//! let names = ["a.weight", "b.weight"];
//! let mut table = NameTable::with_capacity(names.len());
//! for (id, name) in names.iter().enumerate() {
//!     assert_eq!(table.insert(name, id as u32, |i| names[i as usize]), None);
//! }
//! assert_eq!(table.insert("a.weight", 9, |i| names[i as usize]), Some(0)); // already present
//! assert_eq!(table.get("b.weight", |i| names[i as usize]), Some(1));
//! assert_eq!(table.get("c.weight", |i| names[i as usize]), None);
//! ```

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

/// A fast seeded 64-bit hash of a name: 8-byte words folded by multiply-xor, then a murmur3-style
/// finaliser. Tables stay correct whatever it returns (names are compared on every probe); the
/// per-table secret seed keeps slot positions unpredictable from the names.
pub(crate) fn name_hash(seed: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = seed ^ (bytes.len() as u64).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        h = (h ^ v).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A slot without an id.
const EMPTY: u64 = u64::MAX;

/// What [`NameTable::get_many`] gives for a name not held (no id is this: see [`NameTable::insert`]).
pub const NOT_FOUND: u32 = u32::MAX;

/// An open-addressing (linear probing) set of ids keyed by the names they stand for. At most one
/// id per name. Each slot keeps 32 bits of its name's hash beside the id, so a probe compares a
/// name only when those bits agree (on a hit, almost always once). Load factor at most 2/3: a
/// table sized for `n` names takes `12 n` bytes.
#[derive(Clone)]
pub struct NameTable {
    seed: u64,
    /// `tag << 32 | id`, or [`EMPTY`].
    slots: Vec<u64>,
    len: usize,
}

impl std::fmt::Debug for NameTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NameTable").field("len", &self.len).field("slots", &self.slots.len()).finish()
    }
}

/// Slots for `names` names at load factor 2/3.
fn slots_for(names: usize) -> usize {
    names.saturating_add(names.div_ceil(2)).max(2)
}

impl NameTable {
    /// A table that holds `names` names without growing.
    pub fn with_capacity(names: usize) -> NameTable {
        let seed = RandomState::new().hash_one(0x0074_656e_736f_7261_u64);
        NameTable { seed, slots: vec![EMPTY; slots_for(names)], len: 0 }
    }

    /// Number of names held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no name is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The name's home slot (multiply-shift of the hash's high bits onto `0..slots`) and its tag
    /// (the low bits).
    fn place(&self, name: &str) -> (usize, u64) {
        let h = name_hash(self.seed, name.as_bytes());
        (((u128::from(h) * self.slots.len() as u128) >> 64) as usize, h << 32)
    }

    fn next(&self, at: usize) -> usize {
        if at + 1 == self.slots.len() { 0 } else { at + 1 }
    }

    /// The id stored for `name`, if any.
    pub fn get<'n>(&self, name: &str, name_of: impl Fn(u32) -> &'n str) -> Option<u32> {
        let (mut at, tag) = self.place(name);
        loop {
            match self.slots[at] {
                EMPTY => return None,
                slot if slot & !0xffff_ffff == tag && name_of(slot as u32) == name => {
                    return Some(slot as u32);
                }
                _ => at = self.next(at),
            }
        }
    }

    /// [`NameTable::get`] for each of `names`, in order, appended to `out`, with [`NOT_FOUND`]
    /// for a name not held. Faster than one `get` after another on a table larger than the CPU's
    /// caches: a batch's home slots are fetched side by side, then the names they point to, so
    /// their cache misses overlap instead of following one another.
    pub fn get_many<'n>(&self, names: &[&str], name_of: impl Fn(u32) -> &'n str, out: &mut Vec<u32>) {
        /// Names looked up side by side: enough misses in flight to cover a memory latency.
        const BATCH: usize = 16;
        out.reserve(names.len());
        for batch in names.chunks(BATCH) {
            let mut places = [(0usize, 0u64); BATCH];
            for (place, name) in places.iter_mut().zip(batch) {
                *place = self.place(name);
            }
            let mut homes = [EMPTY; BATCH];
            for (home, &(at, _)) in homes.iter_mut().zip(&places) {
                *home = self.slots[at];
            }
            // A home slot with the name's tag almost always holds the name: fetch those names
            // (touching a byte of each starts its load) before comparing any.
            let tagged = |j: usize| homes[j] != EMPTY && homes[j] & !0xffff_ffff == places[j].1;
            let mut candidates = [""; BATCH];
            let mut touched = 0u8;
            for (j, candidate) in candidates.iter_mut().enumerate().take(batch.len()) {
                if tagged(j) {
                    *candidate = name_of(homes[j] as u32);
                    touched ^= candidate.as_bytes().first().copied().unwrap_or(0);
                }
            }
            std::hint::black_box(touched);
            for (j, &name) in batch.iter().enumerate() {
                let id = match homes[j] {
                    EMPTY => None,
                    home if tagged(j) && candidates[j] == name => Some(home as u32),
                    _ => self.get(name, &name_of), // Probes on from the home slot (now cached).
                };
                out.push(id.unwrap_or(NOT_FOUND));
            }
        }
    }

    /// Store `id` for `name` unless the name is already present: then its id is returned and the
    /// table is unchanged. `id` must not be `u32::MAX`. Grows (doubling) past 2/3 full.
    pub fn insert<'n>(&mut self, name: &str, id: u32, name_of: impl Fn(u32) -> &'n str) -> Option<u32> {
        debug_assert_ne!(id, u32::MAX);
        if (self.len + 1).saturating_mul(3) > self.slots.len().saturating_mul(2) {
            self.grow(&name_of);
        }
        let place = self.place(name);
        self.insert_at(place, name, id, &name_of)
    }

    /// [`NameTable::insert`] of each id of `ids` for the name `name_of` gives it, in order, up to
    /// the first whose name is already present: then `(that id, the present id)`. Faster than
    /// one `insert` after another on a table larger than the CPU's caches (the home slots of a
    /// batch are fetched side by side before any is written).
    pub fn insert_many<'n>(
        &mut self,
        ids: std::ops::Range<u32>,
        name_of: impl Fn(u32) -> &'n str,
    ) -> Option<(u32, u32)> {
        /// Slots fetched side by side.
        const BATCH: u32 = 16;
        debug_assert!(ids.end < u32::MAX || ids.is_empty());
        let mut start = ids.start;
        while start < ids.end {
            let end = ids.end.min(start.saturating_add(BATCH));
            let count = (end - start) as usize;
            while (self.len + count).saturating_mul(3) > self.slots.len().saturating_mul(2) {
                self.grow(&name_of);
            }
            let mut names = [""; BATCH as usize];
            let mut places = [(0usize, 0u64); BATCH as usize];
            let mut touched = 0u64;
            for ((name, place), id) in names.iter_mut().zip(&mut places).zip(start..end) {
                *name = name_of(id);
                *place = self.place(name);
                touched ^= self.slots[place.0];
            }
            std::hint::black_box(touched);
            for ((&name, &place), id) in names.iter().zip(&places).zip(start..end) {
                if let Some(present) = self.insert_at(place, name, id, &name_of) {
                    return Some((id, present));
                }
            }
            start = end;
        }
        None
    }

    /// Insert `id` for `name` from its place (the table has room).
    fn insert_at<'n>(
        &mut self,
        (mut at, tag): (usize, u64),
        name: &str,
        id: u32,
        name_of: &impl Fn(u32) -> &'n str,
    ) -> Option<u32> {
        loop {
            match self.slots[at] {
                EMPTY => {
                    self.slots[at] = tag | u64::from(id);
                    self.len += 1;
                    return None;
                }
                slot if slot & !0xffff_ffff == tag && name_of(slot as u32) == name => {
                    return Some(slot as u32);
                }
                _ => at = self.next(at),
            }
        }
    }

    fn grow<'n>(&mut self, name_of: &impl Fn(u32) -> &'n str) {
        let bigger = vec![EMPTY; self.slots.len().saturating_mul(2).max(4)];
        let old = std::mem::replace(&mut self.slots, bigger);
        for slot in old.into_iter().filter(|&s| s != EMPTY) {
            let (mut at, tag) = self.place(name_of(slot as u32));
            while self.slots[at] != EMPTY {
                at = self.next(at);
            }
            self.slots[at] = tag | (slot & 0xffff_ffff);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a plain map, from a table sized too small (so it grows and probes collide).
        #[test]
        fn behaves_like_a_map_of_names(names in proptest::collection::vec("[ab]{0,4}", 0..64), sized in 0usize..8) {
            let mut table = NameTable::with_capacity(sized);
            let mut reference = std::collections::HashMap::new();
            for (id, name) in names.iter().enumerate() {
                let expected = reference.get(name.as_str()).copied();
                prop_assert_eq!(table.insert(name, id as u32, |i| names[i as usize].as_str()), expected);
                reference.entry(name.as_str()).or_insert(id as u32);
            }
            prop_assert_eq!(table.len(), reference.len());
            for (name, &id) in &reference {
                prop_assert_eq!(table.get(name, |i| names[i as usize].as_str()), Some(id));
            }
            prop_assert_eq!(table.get("abcab", |i| names[i as usize].as_str()), None);
            // Looked up all at once (held names, then names not held), as one at a time.
            let mut queries: Vec<&str> = names.iter().map(String::as_str).collect();
            queries.extend(["abcab", "", "ba", "bbbbb"]);
            let mut many = Vec::new();
            table.get_many(&queries, |i| names[i as usize].as_str(), &mut many);
            let one_by_one: Vec<u32> = queries
                .iter()
                .map(|q| table.get(q, |i| names[i as usize].as_str()).unwrap_or(NOT_FOUND))
                .collect();
            prop_assert_eq!(many, one_by_one);
            // Inserted in batches, from the same starting size: the same first duplicate, and
            // the same table up to it.
            let mut batched = NameTable::with_capacity(sized);
            let first_duplicate = names.iter().enumerate().find_map(|(id, name)| {
                names[..id].iter().position(|n| n == name).map(|first| (id as u32, first as u32))
            });
            let name_of = |i: u32| names[i as usize].as_str();
            prop_assert_eq!(batched.insert_many(0..names.len() as u32, name_of), first_duplicate);
            let stored = first_duplicate.map_or(names.len(), |(id, _)| id as usize);
            for (id, name) in names.iter().enumerate().take(stored) {
                prop_assert_eq!(batched.get(name, name_of), Some(id as u32));
            }
        }
    }

    #[test]
    fn hashes_depend_on_every_byte_and_the_seed() {
        assert_ne!(name_hash(1, b"abcdefgh1"), name_hash(1, b"abcdefgh2"));
        assert_ne!(name_hash(1, b"x"), name_hash(2, b"x"));
        assert_ne!(name_hash(1, b""), name_hash(1, b"\0"));
    }
}
