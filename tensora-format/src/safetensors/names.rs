//! Duplicate tensor names, found with one keyed 64-bit hash per name.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use super::Entry;

/// A pass-through hasher for keys that are already 64-bit hashes.
#[derive(Debug, Default)]
pub(super) struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(b) ^ (self.0 >> 56);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A fast seeded 64-bit hash of a name: 8-byte words folded by multiply-xor, then a murmur3-style
/// finaliser. Only used by [`NameSet`], which stays correct (and O(1)) even when two names collide.
pub(super) fn name_hash(seed: u64, bytes: &[u8]) -> u64 {
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

/// Detects duplicate tensor names with one 64-bit hash per name (keyed per parse), falling back
/// to a set of owned names for the rare names whose hash collides with a different name.
#[derive(Debug)]
pub(super) struct NameSet {
    /// The per-parse key of [`name_hash`].
    pub(super) seed: u64,
    /// The first tensor (an index into the entries) seen with each hash.
    pub(super) first_by_hash: HashMap<u64, u32, BuildHasherDefault<PrehashedHasher>>,
    collided: HashSet<String>,
}

impl NameSet {
    pub(super) fn new() -> NameSet {
        // A per-parse secret seed, so bucket positions cannot be predicted from the names.
        let seed = RandomState::new().hash_one(0x0074_656e_736f_7261_u64);
        NameSet { seed, first_by_hash: HashMap::default(), collided: HashSet::new() }
    }
    /// Forget every name (keeps the allocation).
    pub(super) fn clear(&mut self) {
        self.first_by_hash.clear();
        self.collided.clear();
    }
    /// Insert `name` (the tensor at `index`); returns false if the name was already present.
    pub(super) fn insert(&mut self, name: &str, index: u32, entries: &[Entry], names: &str) -> bool {
        let hash = name_hash(self.seed, name.as_bytes());
        match self.first_by_hash.entry(hash) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(index);
                true
            }
            std::collections::hash_map::Entry::Occupied(o) => {
                if entries[*o.get() as usize].name(names) == name {
                    false
                } else {
                    self.collided.insert(name.to_string())
                }
            }
        }
    }
}
