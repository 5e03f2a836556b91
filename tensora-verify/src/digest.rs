//! Digest algorithms and a streaming [`Hasher`].
//!
//! The digest of a tensor covers exactly [`TensorInfo::nbytes`](tensora_format::TensorInfo::nbytes)
//! bytes from its file offset: its raw stored bytes, little-endian, as on disk.

use std::fmt;
use std::str::FromStr;

use sha2::Digest as _;

/// A digest algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Algo {
    /// CRC-32C (Castagnoli), hardware accelerated (SSE 4.2 / ARMv8 CRC). The default: cheap enough
    /// to leave on for every load. Detects corruption, not tampering.
    #[default]
    Crc32c,
    /// XXH3 with a 128-bit result: fast, with a much lower collision rate than CRC-32C.
    Xxh3,
    /// SHA-256: for interop (the `*.expected.json` fixtures) and audits.
    Sha256,
}

impl Algo {
    /// Every algorithm, fastest first.
    pub const ALL: [Algo; 3] = [Algo::Crc32c, Algo::Xxh3, Algo::Sha256];

    /// Canonical name, used on the command line, in manifests and as the digest's JSON key.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algo::Crc32c => "crc32c",
            Algo::Xxh3 => "xxh3",
            Algo::Sha256 => "sha256",
        }
    }

    /// Length of a digest in bytes (4, 16 or 32).
    pub const fn digest_len_bytes(self) -> usize {
        match self {
            Algo::Crc32c => 4,
            Algo::Xxh3 => 16,
            Algo::Sha256 => 32,
        }
    }

    /// Length of a digest as lowercase hex (twice [`Algo::digest_len_bytes`]).
    pub const fn hex_len(self) -> usize {
        self.digest_len_bytes() * 2
    }

    /// Start a streaming digest.
    pub fn hasher(self) -> Hasher {
        Hasher::new(self)
    }

    /// Digest of `bytes` in one call (the same result as one [`Hasher::update`] then
    /// [`Hasher::finish`]).
    pub fn digest(self, bytes: &[u8]) -> Digest {
        match self {
            Algo::Crc32c => Digest::from_crc32c(crc32c::crc32c(bytes)),
            Algo::Xxh3 => Digest::from_xxh3(xxhash_rust::xxh3::xxh3_128(bytes)),
            Algo::Sha256 => Digest::from_sha256(&sha2::Sha256::digest(bytes)),
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The CRC-32C polynomial, bit-reflected (as the `crc32c` crate computes it).
const CRC32C_POLY_REFLECTED: u32 = 0x82F6_3B78;

/// `X_POW_2K[k]` is `x^(2^k) mod P` in the reflected representation (bit 31 is `x^0`): the factors
/// that shift a CRC past `2^(k-3)` bytes. 67 entries cover every `u64` byte count (`8 * 2^63` bits).
const X_POW_2K: [u32; 67] = {
    let mut table = [0u32; 67];
    table[0] = 1 << 30; // x^1
    let mut k = 1;
    while k < table.len() {
        table[k] = gf2_mul_mod_p(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `a * b mod P` for two polynomials in the reflected representation, without branches on the data.
const fn gf2_mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0u32;
    let mut i = 0;
    while i < 32 {
        // Term x^i of `a` is bit 31 - i; `b` holds b * x^i mod P at this step.
        product ^= b & 0u32.wrapping_sub((a >> (31 - i)) & 1);
        b = (b >> 1) ^ (CRC32C_POLY_REFLECTED & 0u32.wrapping_sub(b & 1));
        i += 1;
    }
    product
}

/// The CRC-32C of `A` followed by `B`, from `crc1 = crc32c(A)`, `crc2 = crc32c(B)` and the length of
/// `B`. This is what lets fused loads digest each read's bytes as they land (in any order, on any
/// worker) and still produce the one-shot digest of the whole tensor.
///
/// It computes the same value as `crc32c::crc32c_combine`, which squares 32x32 bit matrices once per
/// bit of `len2_bytes` (about 75 µs per call for 1 MiB here, more than the CRC of that MiB itself);
/// this one multiplies by the precomputed factors `x^(8 * 2^j) mod P` for the set bits of
/// `len2_bytes`: at most 64 multiplications of 32 steps, about 1 µs.
///
/// ```
/// use tensora_verify::crc32c_combine;
///
/// let (a, b) = (b"1234".as_slice(), b"56789".as_slice());
/// let combined = crc32c_combine(crc32c::crc32c(a), crc32c::crc32c(b), b.len() as u64);
/// assert_eq!(combined, crc32c::crc32c(b"123456789"));
/// ```
///
/// With `len2_bytes == 0` it returns `crc1` (as the crate does; `crc2` can only be the CRC of
/// nothing, 0, then).
pub fn crc32c_combine(crc1: u32, crc2: u32, len2_bytes: u64) -> u32 {
    if len2_bytes == 0 {
        return crc1;
    }
    // crc(A || B) = crc(A) * x^(8 * len(B)) mod P  xor  crc(B): the pre- and post-conditioning
    // terms cancel, so only crc1 needs shifting.
    let mut factor = 1u32 << 31; // x^0
    let mut bits = len2_bytes;
    let mut k = 3; // one byte is x^8 = x^(2^3)
    while bits != 0 {
        if bits & 1 == 1 {
            factor = gf2_mul_mod_p(factor, X_POW_2K[k]);
        }
        bits >>= 1;
        k += 1;
    }
    gf2_mul_mod_p(factor, crc1) ^ crc2
}

/// An algorithm name that is not one of [`Algo::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown digest algorithm {name:?} (expected crc32c, xxh3 or sha256)")]
pub struct UnknownAlgo {
    /// The name as given.
    pub name: String,
}

impl FromStr for Algo {
    type Err = UnknownAlgo;

    /// Accepts the canonical names and the aliases `xxh3-128`, `xxh3_128`, `sha-256`, `crc32-c`
    /// (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Algo, UnknownAlgo> {
        match s.to_ascii_lowercase().as_str() {
            "crc32c" | "crc32-c" => Ok(Algo::Crc32c),
            "xxh3" | "xxh3-128" | "xxh3_128" => Ok(Algo::Xxh3),
            "sha256" | "sha-256" => Ok(Algo::Sha256),
            _ => Err(UnknownAlgo { name: s.to_owned() }),
        }
    }
}

/// A finished digest. Displayed (and serialized in manifests) as lowercase hex; the integer
/// results (CRC-32C, XXH3-128) are written big-endian, so the hex reads as the number.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest {
    algo: Algo,
    bytes: [u8; 32],
}

impl Digest {
    pub(crate) fn from_crc32c(crc: u32) -> Digest {
        let mut bytes = [0; 32];
        bytes[..4].copy_from_slice(&crc.to_be_bytes());
        Digest { algo: Algo::Crc32c, bytes }
    }

    fn from_xxh3(h: u128) -> Digest {
        let mut bytes = [0; 32];
        bytes[..16].copy_from_slice(&h.to_be_bytes());
        Digest { algo: Algo::Xxh3, bytes }
    }

    fn from_sha256(h: &[u8]) -> Digest {
        let mut bytes = [0; 32];
        bytes.copy_from_slice(h);
        Digest { algo: Algo::Sha256, bytes }
    }

    /// Parse lowercase or uppercase hex of exactly [`Algo::hex_len`] digits.
    pub fn from_hex(algo: Algo, hex_str: &str) -> Result<Digest, BadDigest> {
        let bad = || BadDigest { algo, text: hex_str.chars().take(80).collect() };
        if hex_str.len() != algo.hex_len() {
            return Err(bad());
        }
        let mut bytes = [0; 32];
        hex::decode_to_slice(hex_str, &mut bytes[..algo.digest_len_bytes()]).map_err(|_| bad())?;
        Ok(Digest { algo, bytes })
    }

    /// The algorithm that computed this digest.
    pub(crate) fn algo(&self) -> Algo {
        self.algo
    }

    /// The digest bytes ([`Algo::digest_len_bytes`] of them).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.algo.digest_len_bytes()]
    }

    /// Lowercase hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.as_bytes())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algo, self.to_hex())
    }
}

/// Text that is not a valid hex digest for its algorithm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a {algo} digest ({} hex digits)", algo.hex_len())]
pub struct BadDigest {
    /// The algorithm whose digest the text should be.
    pub algo: Algo,
    /// The offending text (at most 80 characters of it).
    pub text: String,
}

/// A streaming digest: feed bytes in any split with [`Hasher::update`], then [`Hasher::finish`].
/// The result does not depend on how the input was split.
///
/// ```
/// use tensora_verify::Algo;
///
/// let mut h = Algo::Crc32c.hasher();
/// h.update(b"1234");
/// h.update(b"56789");
/// assert_eq!(h.finish().to_hex(), "e3069283"); // the CRC-32C check value
/// assert_eq!(Algo::Crc32c.digest(b"123456789").to_hex(), "e3069283");
/// ```
pub struct Hasher {
    state: State,
    len_bytes: u64,
}

enum State {
    Crc32c(u32),
    Xxh3(Box<xxhash_rust::xxh3::Xxh3Default>),
    Sha256(Box<sha2::Sha256>),
}

impl Hasher {
    /// A hasher that has seen no bytes yet (as [`Algo::hasher`]).
    pub(crate) fn new(algo: Algo) -> Hasher {
        let state = match algo {
            Algo::Crc32c => State::Crc32c(0),
            Algo::Xxh3 => State::Xxh3(Box::new(xxhash_rust::xxh3::Xxh3Default::new())),
            Algo::Sha256 => State::Sha256(Box::new(sha2::Sha256::new())),
        };
        Hasher { state, len_bytes: 0 }
    }

    /// The algorithm this hasher computes.
    pub(crate) fn algo(&self) -> Algo {
        match self.state {
            State::Crc32c(_) => Algo::Crc32c,
            State::Xxh3(_) => Algo::Xxh3,
            State::Sha256(_) => Algo::Sha256,
        }
    }

    /// Bytes fed so far.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Feed the next bytes of the input.
    pub fn update(&mut self, bytes: &[u8]) {
        self.len_bytes += bytes.len() as u64;
        match &mut self.state {
            State::Crc32c(crc) => *crc = crc32c::crc32c_append(*crc, bytes),
            State::Xxh3(h) => h.update(bytes),
            State::Sha256(h) => h.update(bytes),
        }
    }

    /// The digest of every byte fed, in order.
    pub fn finish(self) -> Digest {
        match self.state {
            State::Crc32c(crc) => Digest::from_crc32c(crc),
            State::Xxh3(h) => Digest::from_xxh3(h.digest128()),
            State::Sha256(h) => Digest::from_sha256(&h.finalize()),
        }
    }
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hasher").field("algo", &self.algo()).field("len_bytes", &self.len_bytes).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_answers() {
        // Published check values / test vectors.
        assert_eq!(Algo::Crc32c.digest(b"123456789").to_hex(), "e3069283");
        assert_eq!(Algo::Crc32c.digest(b"").to_hex(), "00000000");
        assert_eq!(
            Algo::Sha256.digest(b"").to_hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            Algo::Sha256.digest(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // XXH3-128 of the empty input, seed 0 (xxHash reference).
        assert_eq!(Algo::Xxh3.digest(b"").to_hex(), "99aa06d3014798d86001c324468d497f");
    }

    #[test]
    fn names_round_trip_and_aliases_parse() {
        for a in Algo::ALL {
            assert_eq!(a.as_str().parse::<Algo>(), Ok(a));
            assert_eq!(a.to_string(), a.as_str());
            assert_eq!(a.digest(b"x").to_hex().len(), a.hex_len());
        }
        assert_eq!("XXH3-128".parse::<Algo>(), Ok(Algo::Xxh3));
        assert_eq!("SHA-256".parse::<Algo>(), Ok(Algo::Sha256));
        let err = "md5".parse::<Algo>().unwrap_err();
        assert_eq!(err.name, "md5");
        assert!(err.to_string().contains("md5"));
    }

    #[test]
    fn from_hex_rejects_wrong_length_and_non_hex() {
        assert!(Digest::from_hex(Algo::Crc32c, "e306928").is_err());
        assert!(Digest::from_hex(Algo::Crc32c, "e30692833").is_err());
        assert!(Digest::from_hex(Algo::Crc32c, "e306928g").is_err());
        assert!(Digest::from_hex(Algo::Sha256, "e3069283").is_err());
        let d = Digest::from_hex(Algo::Crc32c, "E3069283").unwrap();
        assert_eq!(d, Algo::Crc32c.digest(b"123456789"));
    }

    #[test]
    fn crc32c_combine_matches_the_crate_at_edge_lengths() {
        for len2 in [0u64, 1, 2, 7, 8, 4095, 4096, 1 << 20, (1 << 20) + 3, u32::MAX as u64] {
            for (crc1, crc2) in [(0, 0), (0xFFFF_FFFF, 1), (0xE306_9283, 0x1234_5678)] {
                let ours = crc32c_combine(crc1, crc2, len2);
                let crate_value = crc32c::crc32c_combine(crc1, crc2, len2 as usize);
                assert_eq!(ours, crate_value, "len2 {len2}");
            }
        }
        // Zero-length second part: the first CRC unchanged.
        assert_eq!(crc32c_combine(0xDEAD_BEEF, 0, 0), 0xDEAD_BEEF);
        assert_eq!(crc32c_combine(0, crc32c::crc32c(b"abc"), 3), crc32c::crc32c(b"abc"));
        // Byte counts past 2^32 use the upper table entries: shifting by 2^40 bytes must equal
        // shifting by 2^39 bytes twice (entry 43 against entry 42).
        let once = crc32c_combine(crc32c_combine(0x89AB_CDEF, 0, 1 << 39), 0, 1 << 39);
        assert_eq!(crc32c_combine(0x89AB_CDEF, 0, 1 << 40), once);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn streaming_equals_one_shot_for_any_split(
            data in proptest::collection::vec(any::<u8>(), 0..4096),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
            points.sort_unstable();
            for algo in Algo::ALL {
                let mut h = algo.hasher();
                let mut start = 0;
                for &p in &points {
                    h.update(&data[start..p]);
                    start = p;
                }
                h.update(&data[start..]);
                prop_assert_eq!(h.len_bytes(), data.len() as u64);
                let streamed = h.finish();
                prop_assert_eq!(streamed, algo.digest(&data));
                prop_assert_eq!(Digest::from_hex(algo, &streamed.to_hex()), Ok(streamed));
            }
        }

        #[test]
        fn crc32c_of_pieces_combined_equals_one_shot(
            data in proptest::collection::vec(any::<u8>(), 0..8192),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
            points.push(0);
            points.push(data.len());
            points.sort_unstable();
            let mut combined = 0u32; // the CRC of nothing
            for w in points.windows(2) {
                let piece = &data[w[0]..w[1]];
                let crc = crc32c::crc32c(piece);
                prop_assert_eq!(
                    crc32c_combine(combined, crc, piece.len() as u64),
                    crc32c::crc32c_combine(combined, crc, piece.len())
                );
                combined = crc32c_combine(combined, crc, piece.len() as u64);
            }
            prop_assert_eq!(combined, crc32c::crc32c(&data));
        }

        #[test]
        fn any_single_bit_flip_changes_every_digest(
            data in proptest::collection::vec(any::<u8>(), 1..2048),
            at in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let mut flipped = data.clone();
            flipped[at.index(data.len())] ^= 1 << bit;
            for algo in Algo::ALL {
                prop_assert_ne!(algo.digest(&data), algo.digest(&flipped));
            }
        }
    }
}
