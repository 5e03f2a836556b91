//! Name lookups without copies of the names: [`NameTable`] holds only ids (`u32`), the names
//! stay in the caller's shared buffer and are fetched through a closure. The one name → entry map
//! of the workspace: duplicate tensors in a header, an index's weight map and shard names, a
//! [`crate::Checkpoint`]'s lookup by name, and a loaded model's (`tensora_io::Loaded`).
//!
//! ```
//! use tensora_format::names::NameTable;
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

    /// Store `id` for `name` unless the name is already present: then its id is returned and the
    /// table is unchanged. `id` must not be `u32::MAX`. Grows (doubling) past 2/3 full.
    pub fn insert<'n>(&mut self, name: &str, id: u32, name_of: impl Fn(u32) -> &'n str) -> Option<u32> {
        debug_assert_ne!(id, u32::MAX);
        if (self.len + 1).saturating_mul(3) > self.slots.len().saturating_mul(2) {
            self.grow(&name_of);
        }
        let (mut at, tag) = self.place(name);
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
        }
    }

    #[test]
    fn hashes_depend_on_every_byte_and_the_seed() {
        assert_ne!(name_hash(1, b"abcdefgh1"), name_hash(1, b"abcdefgh2"));
        assert_ne!(name_hash(1, b"x"), name_hash(2, b"x"));
        assert_ne!(name_hash(1, b""), name_hash(1, b"\0"));
    }
}
