//! Unknown fields in safetensors tensor entries.
//!
//! The strict parser accepts and skips fields other than `dtype`, `shape` and `data_offsets` in a
//! tensor entry (the format allows extensions), so it cannot report them. `verify` warns about
//! them: a writer that puts information there expects readers to honour it, and Tensora does not.
//! This re-reads only the header (at most [`HEADER_LEN_BYTES_MAX`] bytes) and walks it with a
//! visitor that keeps nothing but the names of unknown fields.

use std::fmt;
use std::io::Read;
use std::path::Path;

use serde::Deserializer as _;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use tensora_format::safetensors::{HEADER_LEN_BYTES_MAX, METADATA_KEY};

/// Bound on unknown fields reported per file (the rest are counted into the last one).
pub(crate) const UNKNOWN_FIELDS_MAX: usize = 1000;

/// The fields a tensor entry may have.
const KNOWN_FIELDS: [&str; 3] = ["dtype", "shape", "data_offsets"];

/// `(tensor, field)` for every unknown field of every tensor entry in the header of `path`, in
/// header order. Errors are strings naming the problem (the parser reports structure errors).
pub(crate) fn unknown_fields(path: &Path) -> Result<Vec<(String, String)>, String> {
    // The parser opened a regular file here, but the name may now be a FIFO (opening one for
    // reading waits for a writer): opened as the parser opens, refused without a wait.
    let (mut file, meta) = tensora_format::open_regular(path).map_err(|e| e.to_string())?;
    let file_len_bytes = meta.len();
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix).map_err(|e| format!("reading the header length: {e}"))?;
    let n = u64::from_le_bytes(prefix);
    if n > HEADER_LEN_BYTES_MAX || n > file_len_bytes.saturating_sub(8) {
        return Err(format!("header length {n} is out of range for a {file_len_bytes}-byte file"));
    }
    let mut json = Vec::with_capacity(n as usize);
    file.take(n).read_to_end(&mut json).map_err(|e| e.to_string())?;
    if json.len() as u64 != n {
        return Err(format!("header is {} bytes, the prefix says {n}", json.len()));
    }
    unknown_fields_in(&json).map_err(|e| format!("header: {e}"))
}

/// [`unknown_fields`] on the header JSON itself.
pub(crate) fn unknown_fields_in(json: &[u8]) -> Result<Vec<(String, String)>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let mut out = Vec::new();
    de.deserialize_map(HeaderVisitor { out: &mut out })?;
    de.end()?;
    Ok(out)
}

struct HeaderVisitor<'a> {
    out: &'a mut Vec<(String, String)>,
}

impl<'de> Visitor<'de> for HeaderVisitor<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a safetensors header object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            if name == METADATA_KEY {
                map.next_value::<IgnoredAny>()?;
            } else {
                map.next_value_seed(EntrySeed { tensor: &name, out: self.out })?;
            }
        }
        Ok(())
    }
}

struct EntrySeed<'a> {
    tensor: &'a str,
    out: &'a mut Vec<(String, String)>,
}

impl<'de> de::DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tensor entry")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(field) = map.next_key::<String>()? {
            map.next_value::<IgnoredAny>()?;
            if !KNOWN_FIELDS.contains(&field.as_str()) && self.out.len() < UNKNOWN_FIELDS_MAX {
                self.out.push((self.tensor.to_owned(), field));
            }
        }
        Ok(())
    }
    // Anything else is a structure error that the parser reports; ignore it here.
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_only_unknown_tensor_fields() {
        let json = br#"{"__metadata__":{"format":"pt","x":"y"},
            "a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"quant":{"deep":[1,[2]]}},
            "b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},
            "c":{"extra":null,"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
        let got = unknown_fields_in(json).unwrap();
        assert_eq!(got, [("a".to_owned(), "quant".to_owned()), ("c".to_owned(), "extra".to_owned())]);
    }

    #[test]
    fn reads_the_header_of_a_file_and_rejects_bad_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let json = br#"{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"note":"hi"}}"#;
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json);
        bytes.extend_from_slice(&[1, 2]);
        let p = dir.path().join("a.safetensors");
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(unknown_fields(&p).unwrap(), [("w".to_owned(), "note".to_owned())]);

        let mut lying = (u64::MAX).to_le_bytes().to_vec();
        lying.extend_from_slice(json);
        std::fs::write(&p, &lying).unwrap();
        assert!(unknown_fields(&p).unwrap_err().contains("out of range"));
        std::fs::write(&p, [1u8, 2]).unwrap();
        assert!(unknown_fields(&p).is_err());
    }

    /// A file replaced by a FIFO after the parser read it is refused at once, not waited on
    /// for a writer that never comes.
    #[test]
    fn a_fifo_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("a.safetensors");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let (done, result) = std::sync::mpsc::channel();
        let path = fifo.clone();
        // Detached: were the open to block, the test fails at the timeout below, not hangs.
        std::thread::spawn(move || done.send(unknown_fields(&path)));
        let got = result.recv_timeout(std::time::Duration::from_secs(10));
        let err = got.expect("unknown_fields waited on a FIFO").unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
    }
}
