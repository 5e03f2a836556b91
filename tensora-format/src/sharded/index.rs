//! The HF index, `{"metadata": {...}, "weight_map": {tensor: shard file}}`, read in two passes
//! of the crate's JSON reader: the first validates the whole document (any depth, any junk in
//! keys that are not ours, in O(1) memory) and measures the weight map; the second fills buffers
//! sized from those measures: 12 bytes per tensor, a name table of 12 bytes per tensor, and each
//! shard name once. Tensor names stay where they are in the text (those with escapes are
//! decoded aside) and are then moved to its front, which becomes the names' buffer: no second
//! copy of the names lives beside the text. No JSON tree or tape is built, nothing grows by
//! doubling, and no per-tensor string is allocated: peak memory stays under 4× the index bytes
//! whatever the index holds (measured in `tests/index_memory.rs`).

use std::collections::BTreeMap;

use crate::ErrorKind;
use crate::json::{Compact, Kind, Reader};
use crate::names::NameTable;

/// The largest index file accepted, in bytes (an index for a 1,000-shard, million-tensor model is
/// well under this).
pub const INDEX_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// The most keys an index's `metadata` may hold (real indexes hold one or two; each key costs a
/// map node, so the cap keeps memory proportional to the index).
pub const INDEX_METADATA_KEYS_MAX: usize = 4096;

/// One `weight_map` member: the tensor's name in [`ShardIndex::names`] and its shard's id (an
/// index into the sorted shard names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MapEntry {
    name_start: u32,
    name_len: u32,
    shard: u32,
}

/// A parsed sharded-checkpoint index: tensor names unique, shard names plain file names.
#[derive(Debug, Clone)]
pub struct ShardIndex {
    metadata: BTreeMap<String, String>,
    total_size: Option<std::result::Result<u64, String>>,
    /// Every tensor name, back to back, in index order.
    names: String,
    /// One per tensor, in index order.
    entries: Vec<MapEntry>,
    /// Every distinct shard name, back to back (in first-seen order).
    shard_text: String,
    /// `(start, len)` in `shard_text` of each shard, sorted by name: a shard's id is its place here.
    shards: Vec<(u32, u32)>,
    /// Tensor name → entry.
    by_name: NameTable,
}

impl PartialEq for ShardIndex {
    fn eq(&self, other: &ShardIndex) -> bool {
        self.metadata == other.metadata
            && self.total_size == other.total_size
            && self.weight_map().eq(other.weight_map())
    }
}

impl Eq for ShardIndex {}

impl ShardIndex {
    /// `metadata`, flattened: strings as they are, every other value as compact JSON text
    /// (numbers as written).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
    /// `metadata.total_size` when present and a non-negative integer.
    pub fn total_size_bytes(&self) -> Option<u64> {
        self.total_size.as_ref().and_then(|r| r.as_ref().ok().copied())
    }
    /// `metadata.total_size` when present: the integer, or its text when it is not one.
    pub(crate) fn total_size(&self) -> Option<&std::result::Result<u64, String>> {
        self.total_size.as_ref()
    }
    /// Number of tensors in `weight_map`.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Whether `weight_map` is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// `(tensor, shard file)` in index order. Tensor names are unique.
    pub fn weight_map(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.entries.iter().map(|e| (self.entry_name(e), self.shard_name(e.shard)))
    }
    /// The distinct shard file names, sorted.
    pub fn shard_names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.shards.len() as u32).map(|id| self.shard_name(id))
    }
    /// The shard file `weight_map` names for `tensor`.
    pub fn shard_of(&self, tensor: &str) -> Option<&str> {
        self.entry_of(tensor).map(|i| self.shard_name(self.entries[i].shard))
    }
    /// Whether `shard` is one of the shard names.
    pub fn has_shard(&self, shard: &str) -> bool {
        self.shard_id(shard).is_some()
    }

    /// The id of shard `shard`, if the index names it.
    pub(crate) fn shard_id(&self, shard: &str) -> Option<u32> {
        self.shards.binary_search_by(|&span| self.span(span).cmp(shard)).ok().map(|id| id as u32)
    }
    /// The name of shard `id`.
    pub(crate) fn shard_name(&self, id: u32) -> &str {
        self.span(self.shards[id as usize])
    }
    /// The entry (index order) of `tensor`.
    pub(crate) fn entry_of(&self, tensor: &str) -> Option<usize> {
        self.by_name.get(tensor, |i| self.entry_name(&self.entries[i as usize])).map(|i| i as usize)
    }
    /// The entry of each of `tensors`, in order, appended to `out`:
    /// [`crate::names::NOT_FOUND`] for a tensor the index does not map.
    pub(crate) fn entries_of(&self, tensors: &[&str], out: &mut Vec<u32>) {
        self.by_name.get_many(tensors, |i| self.entry_name(&self.entries[i as usize]), out);
    }
    /// Entry `i`: the tensor's name and its shard id.
    pub(crate) fn entry(&self, i: usize) -> (&str, u32) {
        let e = &self.entries[i];
        (self.entry_name(e), e.shard)
    }
    fn entry_name(&self, e: &MapEntry) -> &str {
        &self.names[e.name_start as usize..(e.name_start + e.name_len) as usize]
    }
    fn span(&self, (start, len): (u32, u32)) -> &str {
        &self.shard_text[start as usize..(start + len) as usize]
    }
}

fn bad_index(message: impl Into<String>) -> ErrorKind {
    ErrorKind::BadIndex { message: message.into() }
}

/// A JSON error as the index's error.
fn not_json(e: crate::json::JsonError) -> ErrorKind {
    bad_index(format!("not valid JSON: {e}"))
}

/// Parse an index from its bytes, which it takes: the tensor names are moved to the front of
/// them (their own buffer, without a second copy of the names beside the text). The whole text
/// must be strict JSON (checked first, so a JSON error is reported before any other); then
/// duplicate top-level keys, duplicate metadata keys and duplicate tensors in `weight_map` are
/// errors, as are shard names that are not plain file names.
pub fn parse_index(bytes: Vec<u8>) -> std::result::Result<ShardIndex, ErrorKind> {
    if bytes.len() as u64 > INDEX_BYTES_MAX {
        return Err(ErrorKind::IndexTooLarge { len_bytes: bytes.len() as u64, limit_bytes: INDEX_BYTES_MAX });
    }
    let (builder, metadata) = read_index(&bytes)?;
    let (metadata, total_size) = metadata.unwrap_or_default();
    builder.finish(bytes, metadata, total_size)
}

/// Both passes over the text: the built weight map (names still in place in `bytes`) and
/// `metadata` if present.
fn read_index(bytes: &[u8]) -> std::result::Result<(Builder, Option<Metadata>), ErrorKind> {
    let text = Reader::new(bytes).map_err(not_json)?.text(); // UTF-8 checked once, here.
    let sizes = measure(text).map_err(not_json)?;
    let mut r = Reader::over(text);
    if r.peek().map_err(not_json)? != Kind::Object {
        return Err(bad_index("not a JSON object"));
    }
    let mut builder = Builder::new(&sizes);
    let mut metadata = None;
    let mut weight_map_seen = false;
    r.begin_object().map_err(not_json)?;
    while let Some(key) = r.next_key().map_err(not_json)? {
        if r.str_is(key, "metadata") {
            if metadata.is_some() {
                return Err(bad_index("duplicate key \"metadata\""));
            }
            metadata = Some(read_metadata(&mut r)?);
        } else if r.str_is(key, "weight_map") {
            if weight_map_seen {
                return Err(bad_index("duplicate key \"weight_map\""));
            }
            weight_map_seen = true;
            builder.weight_map(&mut r)?;
        } else {
            r.skip().map_err(not_json)?; // Other top-level keys are not ours to judge.
        }
    }
    if !weight_map_seen {
        return Err(bad_index("missing \"weight_map\""));
    }
    Ok((builder, metadata))
}

/// What the first pass measures: upper bounds of what the second pass stores.
#[derive(Debug, Default)]
struct Sizes {
    entries: usize,
    /// Raw bytes of the tensor names that hold escapes (decoded aside while building).
    escaped_name_bytes: usize,
    /// Distinct shard names (each escaped one counted as new).
    shards: usize,
    /// Bytes of the distinct shard names.
    shard_bytes: usize,
}

/// Validate the whole document and measure its `weight_map` (every member of every top-level
/// `weight_map` object: an upper bound when the key repeats, which the second pass refuses).
/// Distinct shard names are counted with a table of their places in `bytes`; it is dropped
/// before the second pass allocates.
fn measure(text: &str) -> Result<Sizes, crate::json::JsonError> {
    let mut r = Reader::over(text);
    let mut sizes = Sizes::default();
    if r.peek()? != Kind::Object {
        r.skip()?;
        r.finish()?;
        return Ok(sizes);
    }
    let text = r.text();
    // Places in the text (under INDEX_BYTES_MAX, so u32): half the memory of usize pairs.
    let mut seen: Vec<(u32, u32)> = Vec::new();
    let mut table = NameTable::with_capacity(0);
    let mut last: Option<(usize, usize)> = None;
    r.begin_object()?;
    while let Some(key) = r.next_key()? {
        if !(r.str_is(key, "weight_map") && r.peek()? == Kind::Object) {
            r.skip()?;
            continue;
        }
        r.begin_object()?;
        while let Some(name) = r.next_key()? {
            sizes.entries += 1;
            if name.is_escaped() {
                sizes.escaped_name_bytes += name.raw_len();
            }
            if r.peek()? != Kind::String {
                r.skip()?;
                continue;
            }
            let shard = r.string()?;
            if last.is_some_and(|l| text[l.0..l.1] == *r.raw(shard)) {
                continue; // The same shard as the previous entry (the common case).
            }
            last = (!shard.is_escaped()).then(|| shard.range());
            let new = shard.is_escaped() || {
                let span = |(start, end): (u32, u32)| &text[start as usize..end as usize];
                let name_of = |i: u32| span(seen[i as usize]);
                let id = seen.len() as u32;
                let raw = r.raw(shard);
                table.get(raw, name_of).is_none() && {
                    let (start, end) = shard.range();
                    seen.push((start as u32, end as u32));
                    let name_of = |i: u32| span(seen[i as usize]);
                    table.insert(raw, id, name_of);
                    true
                }
            };
            if new {
                sizes.shards += 1;
                sizes.shard_bytes += shard.raw_len();
            }
        }
    }
    r.finish()?;
    Ok(sizes)
}

type Metadata = (BTreeMap<String, String>, Option<std::result::Result<u64, String>>);

/// `metadata`: `null`, or an object whose values are kept as strings (a string as it is, any
/// other value as compact JSON text), `total_size` also read as an integer when it is one.
fn read_metadata(r: &mut Reader<'_>) -> std::result::Result<Metadata, ErrorKind> {
    match r.peek().map_err(not_json)? {
        Kind::Null => {
            r.skip().map_err(not_json)?;
            return Ok(Metadata::default());
        }
        Kind::Object => {}
        _ => return Err(bad_index("\"metadata\" is not an object")),
    }
    let mut map = BTreeMap::new();
    let mut total_size = None;
    r.begin_object().map_err(not_json)?;
    while let Some(key) = r.next_key().map_err(not_json)? {
        let key = r.str_of(key).into_owned();
        let kind = r.peek().map_err(not_json)?;
        let text = if kind == Kind::String {
            let s = r.string().map_err(not_json)?;
            r.str_of(s).into_owned()
        } else {
            let mut out = Vec::new();
            r.walk(&mut Compact::new(&mut out)).map_err(not_json)?;
            String::from_utf8(out).map_err(|_| bad_index("metadata value is not UTF-8"))?
        };
        if key == "total_size" {
            let integer = kind == Kind::Number && text.bytes().all(|b| b.is_ascii_digit());
            total_size =
                Some(integer.then(|| text.parse::<u64>().ok()).flatten().ok_or_else(|| text.clone()));
        }
        if map.contains_key(&key) {
            return Err(bad_index(format!("duplicate metadata key {key:?}")));
        }
        if map.len() == INDEX_METADATA_KEYS_MAX {
            return Err(bad_index(format!("metadata has more than {INDEX_METADATA_KEYS_MAX} keys")));
        }
        map.insert(key, text);
    }
    Ok((map, total_size))
}

/// Marks a [`MapEntry::name_start`] (while building) as a place in [`Builder::escaped`] rather
/// than in the index text. Places are under [`INDEX_BYTES_MAX`], far below this bit.
const ESCAPED: u32 = 1 << 31;

/// An entry's name while building: in `text` (the index) or decoded in `escaped`.
fn building_name<'t>(text: &'t str, escaped: &'t str, e: &MapEntry) -> &'t str {
    let (start, len) = ((e.name_start & !ESCAPED) as usize, e.name_len as usize);
    if e.name_start & ESCAPED == 0 { &text[start..start + len] } else { &escaped[start..start + len] }
}

/// The second pass's buffers, sized by [`measure`]. An entry's name is where it is in the index
/// text, or, when it holds escapes, decoded in `escaped`; [`Builder::finish`] moves every name
/// to the front of the text.
struct Builder {
    escaped: String,
    entries: Vec<MapEntry>,
    by_name: NameTable,
    shard_text: String,
    /// Distinct shards in first-seen order.
    shards: Vec<(u32, u32)>,
    shard_ids: NameTable,
    /// The shard of the previous entry (consecutive entries mostly share one).
    last_shard: Option<u32>,
}

impl Builder {
    fn new(sizes: &Sizes) -> Builder {
        Builder {
            escaped: String::with_capacity(sizes.escaped_name_bytes),
            entries: Vec::with_capacity(sizes.entries),
            by_name: NameTable::with_capacity(sizes.entries),
            shard_text: String::with_capacity(sizes.shard_bytes),
            shards: Vec::with_capacity(sizes.shards),
            shard_ids: NameTable::with_capacity(sizes.shards),
            last_shard: None,
        }
    }

    /// The `weight_map` object: each tensor's place and its shard interned. Names go into the
    /// name table in batches ([`NameTable::insert_many`]), every batch inserted before any other
    /// error is returned, so the first error in document order is the one reported.
    fn weight_map(&mut self, r: &mut Reader<'_>) -> std::result::Result<(), ErrorKind> {
        /// Entries parsed before their names are inserted, at most.
        const PENDING_MAX: usize = 64;
        if r.peek().map_err(not_json)? != Kind::Object {
            return Err(bad_index("\"weight_map\" is not an object"));
        }
        r.begin_object().map_err(not_json)?;
        let mut inserted = self.entries.len();
        loop {
            let member = match r.next_key().map_err(not_json) {
                Ok(Some(key)) => self.member(r, key),
                Ok(None) => break,
                Err(e) => Err(e),
            };
            if member.is_err() || self.entries.len() - inserted == PENDING_MAX {
                self.insert_names(r.text(), inserted)?;
                inserted = self.entries.len();
            }
            member?;
        }
        self.insert_names(r.text(), inserted)
    }

    /// One `weight_map` member, its key read: its entry stored (its name not yet in the table).
    fn member(&mut self, r: &mut Reader<'_>, key: crate::json::RawStr) -> std::result::Result<(), ErrorKind> {
        let too_many = || bad_index("index too large to hold");
        // Both places are under INDEX_BYTES_MAX, so below ESCAPED.
        let (name_start, name_len) = if key.is_escaped() {
            let start = self.escaped.len();
            r.decode_into(key, &mut self.escaped);
            (start as u32 | ESCAPED, (self.escaped.len() - start) as u32)
        } else {
            let (start, end) = key.range();
            (start as u32, (end - start) as u32)
        };
        if r.peek().map_err(not_json)? != Kind::String {
            let name = building_name(r.text(), &self.escaped, &MapEntry { name_start, name_len, shard: 0 });
            return Err(bad_index(format!("weight_map value for {name:?} is not a string")));
        }
        let shard = r.string().map_err(not_json)?;
        let shard = self.intern(&r.str_of(shard))?;
        u32::try_from(self.entries.len()).ok().filter(|&id| id < u32::MAX).ok_or_else(too_many)?;
        self.entries.push(MapEntry { name_start, name_len, shard });
        Ok(())
    }

    /// Insert the names of entries `from..` into the name table: a name already there is an error.
    fn insert_names(&mut self, text: &str, from: usize) -> std::result::Result<(), ErrorKind> {
        let Builder { entries, by_name, escaped, .. } = self;
        let name_of = |i: u32| building_name(text, escaped, &entries[i as usize]);
        // Entry ids fit u32 below u32::MAX (checked as each was stored).
        match by_name.insert_many(from as u32..entries.len() as u32, name_of) {
            None => Ok(()),
            Some((id, _)) => Err(bad_index(format!("tensor {:?} appears twice in weight_map", name_of(id)))),
        }
    }

    /// The id (first-seen order) of `shard`, adding it if new: then it must be a plain file name
    /// (checked once per distinct shard).
    fn intern(&mut self, shard: &str) -> std::result::Result<u32, ErrorKind> {
        let (text, spans) = (&self.shard_text, &self.shards);
        let name_of = |i: u32| {
            let (start, len) = spans[i as usize];
            &text[start as usize..(start + len) as usize]
        };
        if let Some(last) = self.last_shard.filter(|&last| name_of(last) == shard) {
            return Ok(last);
        }
        let id = match self.shard_ids.get(shard, name_of) {
            Some(id) => id,
            None => {
                crate::sharded::check_shard_name(shard)?;
                // Both fit u32: the shard text is at most the index's size.
                let id = self.shards.len() as u32;
                self.shards.push((self.shard_text.len() as u32, shard.len() as u32));
                self.shard_text.push_str(shard);
                let (text, spans) = (&self.shard_text, &self.shards);
                self.shard_ids.insert(shard, id, |i| {
                    let (start, len) = spans[i as usize];
                    &text[start as usize..(start + len) as usize]
                });
                id
            }
        };
        self.last_shard = Some(id);
        Ok(id)
    }

    /// Move every tensor name, in entry order, to the front of `bytes` (the index text: a name
    /// never lands past where its key was, so no later key is overwritten) and keep them there;
    /// sort the shards by name and renumber the entries' shard ids to match.
    fn finish(
        self,
        mut bytes: Vec<u8>,
        metadata: BTreeMap<String, String>,
        total_size: Option<Result<u64, String>>,
    ) -> std::result::Result<ShardIndex, ErrorKind> {
        let Builder { escaped, mut entries, by_name, mut shard_text, shards, shard_ids, .. } = self;
        drop(shard_ids);
        let mut names_len = 0usize;
        for e in &mut entries {
            let (start, len) = ((e.name_start & !ESCAPED) as usize, e.name_len as usize);
            if e.name_start & ESCAPED == 0 {
                bytes.copy_within(start..start + len, names_len);
            } else {
                bytes[names_len..names_len + len].copy_from_slice(&escaped.as_bytes()[start..start + len]);
            }
            e.name_start = names_len as u32; // At most the key's place, below INDEX_BYTES_MAX.
            names_len += len;
        }
        drop(escaped);
        bytes.truncate(names_len);
        bytes.shrink_to_fit();
        // Whole names, each a `str`, back to back: never refused.
        let names = String::from_utf8(bytes).map_err(|_| bad_index("tensor names are not UTF-8"))?;
        let name = |(start, len): (u32, u32)| &shard_text[start as usize..(start + len) as usize];
        let mut order: Vec<u32> = (0..shards.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| name(shards[a as usize]).cmp(name(shards[b as usize])));
        let mut rank = vec![0u32; shards.len()];
        for (new, &old) in order.iter().enumerate() {
            rank[old as usize] = new as u32;
        }
        for e in &mut entries {
            e.shard = rank[e.shard as usize];
        }
        drop(rank);
        let sorted: Vec<(u32, u32)> = order.iter().map(|&old| shards[old as usize]).collect();
        drop((order, shards));
        shard_text.shrink_to_fit(); // Escaped names were counted at their raw length.
        Ok(ShardIndex { metadata, total_size, names, entries, shard_text, shards: sorted, by_name })
    }
}
