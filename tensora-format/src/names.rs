//! Name lookups without copies of the names: [`NameTable`] holds only ids (`u32`), the names
//! stay in the caller's shared buffer and are fetched through a closure. The one name → entry map
//! of the crate: duplicate tensors in a header, an index's weight map and shard names, and a
//! [`crate::Checkpoint`]'s lookup by name.

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
const EMPTY: u32 = u32::MAX;

/// An open-addressing (linear probing) set of ids keyed by the names they stand for. At most one
/// id per name; load factor at most 1/2, so a table sized for `n` names takes `8 n` bytes.
#[derive(Clone)]
pub(crate) struct NameTable {
    seed: u64,
    slots: Vec<u32>,
    len: usize,
}

impl std::fmt::Debug for NameTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NameTable").field("len", &self.len).field("slots", &self.slots.len()).finish()
    }
}

impl NameTable {
    /// A table that holds `names` names without growing.
    pub fn with_capacity(names: usize) -> NameTable {
        let seed = RandomState::new().hash_one(0x0074_656e_736f_7261_u64);
        NameTable { seed, slots: vec![EMPTY; names.saturating_mul(2).max(2)], len: 0 }
    }

    /// Number of names held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Forget every name (keeps the slots).
    pub fn clear(&mut self) {
        self.slots.fill(EMPTY);
        self.len = 0;
    }

    fn home(&self, name: &str) -> usize {
        // Multiply-shift onto `0..slots` (any table size, no modulo).
        ((u128::from(name_hash(self.seed, name.as_bytes())) * self.slots.len() as u128) >> 64) as usize
    }

    /// The id stored for `name`, if any.
    pub fn get<'n>(&self, name: &str, name_of: impl Fn(u32) -> &'n str) -> Option<u32> {
        let mut at = self.home(name);
        loop {
            match self.slots[at] {
                EMPTY => return None,
                id if name_of(id) == name => return Some(id),
                _ => at = if at + 1 == self.slots.len() { 0 } else { at + 1 },
            }
        }
    }

    /// Store `id` for `name` unless the name is already present: then its id is returned and the
    /// table is unchanged. `id` must not be `u32::MAX`. Grows (doubling) past half full.
    pub fn insert<'n>(&mut self, name: &str, id: u32, name_of: impl Fn(u32) -> &'n str) -> Option<u32> {
        debug_assert_ne!(id, EMPTY);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow(&name_of);
        }
        let mut at = self.home(name);
        loop {
            match self.slots[at] {
                EMPTY => {
                    self.slots[at] = id;
                    self.len += 1;
                    return None;
                }
                existing if name_of(existing) == name => return Some(existing),
                _ => at = if at + 1 == self.slots.len() { 0 } else { at + 1 },
            }
        }
    }

    fn grow<'n>(&mut self, name_of: &impl Fn(u32) -> &'n str) {
        let bigger = vec![EMPTY; self.slots.len().saturating_mul(2).max(4)];
        let old = std::mem::replace(&mut self.slots, bigger);
        for id in old.into_iter().filter(|&id| id != EMPTY) {
            let mut at = self.home(name_of(id));
            while self.slots[at] != EMPTY {
                at = if at + 1 == self.slots.len() { 0 } else { at + 1 };
            }
            self.slots[at] = id;
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
