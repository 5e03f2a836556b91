//! Cutting the header object into chunks of whole top-level entries: a fast guess at entry
//! boundaries, and the exact string- and depth-aware scan it falls back to.

use super::CHUNK_BYTES_TARGET;

/// Where the top-level object ends, and the chunk boundaries.
#[derive(Debug)]
pub(super) struct TopLevel {
    /// Index of the closing `}`.
    pub close: usize,
    /// Runs of whole members, split at top-level commas (which are excluded), about
    /// [`CHUNK_BYTES_TARGET`] bytes each. At least one, possibly empty.
    pub segments: Vec<std::ops::Range<usize>>,
}

/// Chunk boundaries guessed without scanning: from about every [`CHUNK_BYTES_TARGET`] bytes, the
/// next `},"` (how one tensor entry ends and the next begins), splitting at its comma. `None` when
/// the header does not end in `}` (the exact path then reports the error). The guesses may be wrong
/// (e.g. inside a string); the caller falls back to [`scan_top_level`] if any chunk fails.
pub(super) fn speculative_segments(json: &[u8], open: usize) -> Option<Vec<std::ops::Range<usize>>> {
    let close = json.iter().rposition(|&b| !is_json_ws(b))?;
    if json[close] != b'}' || close <= open {
        return None;
    }
    let mut segments = Vec::with_capacity(json.len() / CHUNK_BYTES_TARGET + 1);
    let mut start = open + 1;
    loop {
        let from = start + CHUNK_BYTES_TARGET;
        let split =
            json.get(from..close).and_then(|tail| memchr::memmem::find(tail, b"},\"")).map(|k| from + k + 1);
        match split {
            Some(comma) => {
                segments.push(start..comma);
                start = comma + 1;
            }
            None => {
                segments.push(start..close);
                return Some(segments);
            }
        }
    }
}

/// Byte classes for [`scan_top_level`]: 0 for bytes it does not care about.
const CLASS_QUOTE: u8 = 1;
const CLASS_OPEN: u8 = 2;
const CLASS_CLOSE: u8 = 3;
const CLASS_COMMA: u8 = 4;
const CLASS_BACKSLASH: u8 = 5;

const fn byte_classes() -> [u8; 256] {
    let mut t = [0u8; 256];
    t[b'"' as usize] = CLASS_QUOTE;
    t[b'{' as usize] = CLASS_OPEN;
    t[b'[' as usize] = CLASS_OPEN;
    t[b'}' as usize] = CLASS_CLOSE;
    t[b']' as usize] = CLASS_CLOSE;
    t[b',' as usize] = CLASS_COMMA;
    t[b'\\' as usize] = CLASS_BACKSLASH;
    t
}
static BYTE_CLASS: [u8; 256] = byte_classes();

/// Linear scan of the object starting at `json[open] == b'{'`: tracks strings and nesting depth
/// (iteratively, so depth costs nothing) to find the closing brace and the top-level commas. It
/// validates nothing else; simd-json validates every chunk.
pub(super) fn scan_top_level(json: &[u8], open: usize) -> std::result::Result<TopLevel, String> {
    let len = json.len();
    let mut segments = Vec::with_capacity(len / CHUNK_BYTES_TARGET + 1);
    let mut depth: usize = 1;
    let mut content_start = open + 1;
    let mut i = open + 1;
    loop {
        // Skip uninteresting bytes (digits, letters, whitespace, ':').
        while i < len && BYTE_CLASS[usize::from(json[i])] == 0 {
            i += 1;
        }
        if i >= len {
            return Err("unterminated object (header ends inside the JSON)".into());
        }
        let b = json[i];
        match BYTE_CLASS[usize::from(b)] {
            CLASS_QUOTE => {
                // Skip the string, stepping over escapes.
                i += 1;
                loop {
                    while i < len && json[i] != b'"' && json[i] != b'\\' {
                        i += 1;
                    }
                    match json.get(i) {
                        None => return Err("unterminated string".into()),
                        Some(b'"') => break,
                        _ => i += 2,
                    }
                }
            }
            CLASS_OPEN => depth += 1,
            CLASS_CLOSE => {
                depth -= 1;
                if depth == 0 {
                    if b != b'}' {
                        return Err(format!("mismatched ']' at byte {i}"));
                    }
                    segments.push(content_start..i);
                    return Ok(TopLevel { close: i, segments });
                }
            }
            CLASS_COMMA if depth == 1 && i - content_start >= CHUNK_BYTES_TARGET => {
                segments.push(content_start..i);
                content_start = i + 1;
            }
            _ => {} // A comma below the top level, or a backslash outside a string (invalid JSON, left to simd-json).
        }
        i += 1;
    }
}

/// JSON whitespace: space, tab, line feed, carriage return.
pub(super) fn is_json_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}
