//! A small validating JSON reader for the HF shard index (and the ServerlessLLM index's sizing
//! pass): the caller pulls members and elements one at a time, strings come back as ranges of
//! the input (decoded only when asked), and any value the caller does not want is skipped and
//! validated without recursion. Its working memory is one bit per open container of the value
//! being skipped, whatever the input holds: no tape, no tree, no per-value allocation.
//!
//! Strict RFC 8259: UTF-8 only, no comments, no trailing commas, no NaN, escapes checked
//! (surrogates must pair), no control characters in strings, numbers by the grammar. Numbers are
//! handed out as their text, so any magnitude is valid here (the caller decides what fits).

use std::fmt;

/// Where and why the input is not JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonError {
    /// What was wrong.
    pub what: &'static str,
    /// Byte offset in the input.
    pub at: usize,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.what, self.at)
    }
}

type Result<T> = std::result::Result<T, JsonError>;

/// The kind of the next value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

/// A string of the input: the bytes between its quotes, and whether they hold an escape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawStr {
    start: usize,
    end: usize,
    escaped: bool,
}

impl RawStr {
    /// Bytes of the string as written (an upper bound of its decoded length).
    pub fn raw_len(self) -> usize {
        self.end - self.start
    }
    /// Whether it holds an escape (so its decoded text differs from its raw text).
    pub fn is_escaped(self) -> bool {
        self.escaped
    }
    /// Where its raw text lies in the input: `(start, end)`.
    pub fn range(self) -> (usize, usize) {
        (self.start, self.end)
    }
}

/// Receives a value's tokens while [`Reader::walk`] reads it.
pub(crate) trait Sink {
    /// An object key.
    fn key(&mut self, reader: &Reader<'_>, key: RawStr);
    /// A scalar value: its text as written, and the string when it is one.
    fn scalar(&mut self, reader: &Reader<'_>, text: &str, string: Option<RawStr>);
    /// `{` or `[`.
    fn open(&mut self, is_object: bool);
    /// `}` or `]`.
    fn close(&mut self, is_object: bool);
}

/// Skips without looking.
struct Skip;

impl Sink for Skip {
    fn key(&mut self, _: &Reader<'_>, _: RawStr) {}
    fn scalar(&mut self, _: &Reader<'_>, _: &str, _: Option<RawStr>) {}
    fn open(&mut self, _: bool) {}
    fn close(&mut self, _: bool) {}
}

/// Re-emits a value as compact JSON text: no whitespace, strings decoded and re-escaped, numbers
/// and literals as written.
#[derive(Debug)]
pub(crate) struct Compact<'o> {
    out: &'o mut Vec<u8>,
    /// The previous token ended a value or member: the next one needs a comma.
    need_comma: bool,
    /// Scratch for decoding escaped strings.
    decoded: String,
}

impl<'o> Compact<'o> {
    pub fn new(out: &'o mut Vec<u8>) -> Compact<'o> {
        Compact { out, need_comma: false, decoded: String::new() }
    }
    fn separate(&mut self) {
        if self.need_comma {
            self.out.push(b',');
        }
    }
    fn string(&mut self, reader: &Reader<'_>, s: RawStr) {
        self.decoded.clear();
        reader.decode_into(s, &mut self.decoded);
        crate::write::json_string(self.out, &self.decoded);
    }
}

impl Sink for Compact<'_> {
    fn key(&mut self, reader: &Reader<'_>, key: RawStr) {
        self.separate();
        self.string(reader, key);
        self.out.push(b':');
        self.need_comma = false;
    }
    fn scalar(&mut self, reader: &Reader<'_>, text: &str, string: Option<RawStr>) {
        self.separate();
        match string {
            Some(s) => self.string(reader, s),
            None => self.out.extend_from_slice(text.as_bytes()),
        }
        self.need_comma = true;
    }
    fn open(&mut self, is_object: bool) {
        self.separate();
        self.out.push(if is_object { b'{' } else { b'[' });
        self.need_comma = false;
    }
    fn close(&mut self, is_object: bool) {
        self.out.push(if is_object { b'}' } else { b']' });
        self.need_comma = true;
    }
}

/// The pull reader over one JSON document.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    text: &'a str,
    at: usize,
    /// After `{` or `[` and before the first member or element.
    first: bool,
    /// While walking a value: one bit per open container (set: object), deepest last.
    stack: Vec<u64>,
    /// Containers open in the walk.
    depth: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`, which must be UTF-8.
    pub fn new(bytes: &'a [u8]) -> Result<Reader<'a>> {
        let text =
            std::str::from_utf8(bytes).map_err(|e| JsonError { what: "not UTF-8", at: e.valid_up_to() })?;
        Ok(Reader::over(text))
    }

    /// A reader over text already known to be UTF-8 (another reader's [`Reader::text`]).
    pub fn over(text: &'a str) -> Reader<'a> {
        Reader { text, at: 0, first: false, stack: Vec::new(), depth: 0 }
    }

    /// The whole input.
    pub fn text(&self) -> &'a str {
        self.text
    }

    fn err<T>(&self, what: &'static str) -> Result<T> {
        Err(JsonError { what, at: self.at })
    }

    fn byte(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_ws(&mut self) {
        let bytes = self.text.as_bytes();
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = bytes.get(self.at) {
            self.at += 1;
        }
    }

    fn expect(&mut self, b: u8, what: &'static str) -> Result<()> {
        self.skip_ws();
        if self.byte() == Some(b) {
            self.at += 1;
            Ok(())
        } else {
            self.err(what)
        }
    }

    /// The kind of the next value (whitespace skipped).
    pub fn peek(&mut self) -> Result<Kind> {
        self.skip_ws();
        Ok(match self.byte() {
            Some(b'{') => Kind::Object,
            Some(b'[') => Kind::Array,
            Some(b'"') => Kind::String,
            Some(b'-' | b'0'..=b'9') => Kind::Number,
            Some(b't' | b'f') => Kind::Bool,
            Some(b'n') => Kind::Null,
            Some(_) => return self.err("expected a value"),
            None => return self.err("unexpected end of input"),
        })
    }

    /// Consume the `{` of an object; then call [`Reader::next_key`] until it returns `None`.
    pub fn begin_object(&mut self) -> Result<()> {
        self.expect(b'{', "expected '{'")?;
        self.first = true;
        Ok(())
    }

    /// The next member's key (its `:` consumed, its value next), or `None` after the closing `}`.
    pub fn next_key(&mut self) -> Result<Option<RawStr>> {
        self.skip_ws();
        match self.byte() {
            Some(b'}') => {
                self.at += 1;
                self.first = false;
                return Ok(None);
            }
            Some(b',') if !self.first => self.at += 1,
            Some(b'"') if self.first => {}
            _ => return self.err(if self.first { "expected a key or '}'" } else { "expected ',' or '}'" }),
        }
        self.first = false;
        self.skip_ws();
        if self.byte() != Some(b'"') {
            return self.err("expected a string key");
        }
        let key = self.string()?;
        self.expect(b':', "expected ':'")?;
        Ok(Some(key))
    }

    /// Consume the `[` of an array; then call [`Reader::next_element`] until it returns `false`.
    pub fn begin_array(&mut self) -> Result<()> {
        self.expect(b'[', "expected '['")?;
        self.first = true;
        Ok(())
    }

    /// Whether another element follows (then read or skip it), or `false` after the closing `]`.
    pub fn next_element(&mut self) -> Result<bool> {
        self.skip_ws();
        match self.byte() {
            Some(b']') => {
                self.at += 1;
                self.first = false;
                Ok(false)
            }
            Some(b',') if !self.first => {
                self.at += 1;
                Ok(true)
            }
            _ if self.first => {
                self.first = false;
                Ok(true)
            }
            _ => self.err("expected ',' or ']'"),
        }
    }

    /// Read a string value (the reader is at its opening quote, after whitespace).
    pub fn string(&mut self) -> Result<RawStr> {
        self.expect(b'"', "expected a string")?;
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut escaped = false;
        loop {
            self.at = find_special(bytes, self.at);
            match self.byte() {
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    self.escape()?;
                }
                Some(_) => return self.err("control character in a string"),
                None => return self.err("unterminated string"),
            }
        }
        let end = self.at;
        self.at += 1;
        Ok(RawStr { start, end, escaped })
    }

    /// Check one escape at `self.at` (a backslash) and step over it.
    fn escape(&mut self) -> Result<()> {
        let bytes = self.text.as_bytes();
        match bytes.get(self.at + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.at += 2;
                Ok(())
            }
            Some(b'u') => {
                let at = self.at;
                let unpaired = JsonError { what: "unpaired surrogate in a \\u escape", at };
                let unit = self.hex4(at + 2)?;
                match unit {
                    0xD800..=0xDBFF => {
                        let low = (bytes.get(at + 6..at + 8) == Some(b"\\u"))
                            .then(|| self.hex4(at + 8))
                            .transpose()?;
                        if !matches!(low, Some(0xDC00..=0xDFFF)) {
                            return Err(unpaired);
                        }
                        self.at += 12;
                        Ok(())
                    }
                    0xDC00..=0xDFFF => Err(unpaired),
                    _ => {
                        self.at += 6;
                        Ok(())
                    }
                }
            }
            _ => self.err("invalid escape"),
        }
    }

    fn hex4(&self, at: usize) -> Result<u32> {
        let digits = self.text.as_bytes().get(at..at + 4);
        let value = digits.and_then(|d| std::str::from_utf8(d).ok()).and_then(|d| {
            d.bytes().all(|b| b.is_ascii_hexdigit()).then(|| u32::from_str_radix(d, 16).ok()).flatten()
        });
        value.ok_or(JsonError { what: "invalid \\u escape", at })
    }

    /// Read a number and return its text.
    pub fn number(&mut self) -> Result<&'a str> {
        self.skip_ws();
        let bytes = self.text.as_bytes();
        let start = self.at;
        let digits = |at: &mut usize| {
            let from = *at;
            while bytes.get(*at).is_some_and(u8::is_ascii_digit) {
                *at += 1;
            }
            *at > from
        };
        let mut at = start;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        match bytes.get(at) {
            Some(b'0') => at += 1,
            Some(b'1'..=b'9') => {
                digits(&mut at);
            }
            _ => return Err(JsonError { what: "invalid number", at }),
        }
        if bytes.get(at) == Some(&b'.') {
            at += 1;
            if !digits(&mut at) {
                return Err(JsonError { what: "invalid number: no digit after '.'", at });
            }
        }
        if let Some(b'e' | b'E') = bytes.get(at) {
            at += 1;
            if let Some(b'+' | b'-') = bytes.get(at) {
                at += 1;
            }
            if !digits(&mut at) {
                return Err(JsonError { what: "invalid number: no digit in the exponent", at });
            }
        }
        self.at = at;
        Ok(&self.text[start..at])
    }

    /// Read `true`, `false` or `null` and return its text.
    fn literal(&mut self) -> Result<&'a str> {
        self.skip_ws();
        let rest = &self.text[self.at..];
        for word in ["true", "false", "null"] {
            if rest.starts_with(word) {
                self.at += word.len();
                return Ok(word);
            }
        }
        self.err("invalid literal")
    }

    /// The text of a string exactly as written (escapes undecoded).
    pub fn raw(&self, s: RawStr) -> &'a str {
        &self.text[s.start..s.end]
    }

    /// The string without its escapes: borrowed when it has none.
    pub fn str_of(&self, s: RawStr) -> std::borrow::Cow<'a, str> {
        if s.escaped {
            let mut out = String::with_capacity(s.raw_len());
            self.decode_into(s, &mut out);
            std::borrow::Cow::Owned(out)
        } else {
            std::borrow::Cow::Borrowed(self.raw(s))
        }
    }

    /// Whether string `s` is `word` once decoded.
    pub fn str_is(&self, s: RawStr, word: &str) -> bool {
        if s.escaped { self.str_of(s) == word } else { self.raw(s) == word }
    }

    /// Append the decoded string to `out`. `s` was validated when it was read.
    pub fn decode_into(&self, s: RawStr, out: &mut String) {
        let raw = self.raw(s);
        if !s.escaped {
            out.push_str(raw);
            return;
        }
        let mut rest = raw;
        while let Some(k) = rest.find('\\') {
            out.push_str(&rest[..k]);
            let esc = &rest[k + 1..];
            let (c, used) = match esc.as_bytes()[0] {
                b'b' => ('\u{8}', 1),
                b'f' => ('\u{c}', 1),
                b'n' => ('\n', 1),
                b'r' => ('\r', 1),
                b't' => ('\t', 1),
                b'u' => {
                    let unit = u32::from_str_radix(&esc[1..5], 16).unwrap_or(0xFFFD);
                    if (0xD800..0xDC00).contains(&unit) {
                        let low = u32::from_str_radix(&esc[7..11], 16).unwrap_or(0xDC00);
                        let c = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                        (char::from_u32(c).unwrap_or('\u{FFFD}'), 11)
                    } else {
                        (char::from_u32(unit).unwrap_or('\u{FFFD}'), 5)
                    }
                }
                other => (char::from(other), 1),
            };
            out.push(c);
            rest = &esc[used..];
        }
        out.push_str(rest);
    }

    /// Skip the next value, validating it, whatever its depth.
    pub fn skip(&mut self) -> Result<()> {
        self.walk(&mut Skip)
    }

    /// Read the next value, validating it, and hand its tokens to `sink`. Iterative: depth costs
    /// one bit of memory per level.
    pub fn walk(&mut self, sink: &mut impl Sink) -> Result<()> {
        let base = self.depth;
        loop {
            if self.walk_value(sink)? {
                continue; // A container opened: its first value is next.
            }
            // After a value: close containers until one continues, or the walk is over.
            loop {
                if self.depth == base {
                    return Ok(());
                }
                let in_object = self.top_is_object();
                self.skip_ws();
                match self.byte() {
                    Some(b',') => {
                        self.at += 1;
                        if in_object {
                            self.walk_key(sink)?;
                        }
                        break;
                    }
                    Some(b'}') if in_object => self.close(sink, true),
                    Some(b']') if !in_object => self.close(sink, false),
                    _ => {
                        return self.err(if in_object {
                            "expected ',' or '}'"
                        } else {
                            "expected ',' or ']'"
                        });
                    }
                }
            }
        }
    }

    /// One value: a scalar (`false` returned), or the opening of a container: an empty one is
    /// closed at once (`false`), otherwise its first key is read and `true` says a value is next.
    fn walk_value(&mut self, sink: &mut impl Sink) -> Result<bool> {
        let kind = self.peek()?;
        match kind {
            Kind::Object | Kind::Array => {
                let is_object = kind == Kind::Object;
                self.at += 1;
                self.push(is_object);
                sink.open(is_object);
                self.skip_ws();
                let closing = if is_object { b'}' } else { b']' };
                if self.byte() == Some(closing) {
                    self.close(sink, is_object);
                    return Ok(false);
                }
                if is_object {
                    self.walk_key(sink)?;
                }
                Ok(true)
            }
            Kind::String => {
                let s = self.string()?;
                sink.scalar(self, self.raw(s), Some(s));
                Ok(false)
            }
            Kind::Number => {
                let n = self.number()?;
                sink.scalar(self, n, None);
                Ok(false)
            }
            Kind::Bool | Kind::Null => {
                let word = self.literal()?;
                sink.scalar(self, word, None);
                Ok(false)
            }
        }
    }

    fn walk_key(&mut self, sink: &mut impl Sink) -> Result<()> {
        self.skip_ws();
        if self.byte() != Some(b'"') {
            return self.err("expected a string key");
        }
        let key = self.string()?;
        sink.key(self, key);
        self.expect(b':', "expected ':'")
    }

    fn close(&mut self, sink: &mut impl Sink, is_object: bool) {
        self.at += 1;
        self.pop();
        sink.close(is_object);
    }

    /// Only whitespace may follow the document.
    pub fn finish(&mut self) -> Result<()> {
        self.skip_ws();
        if self.at == self.text.len() { Ok(()) } else { self.err("trailing characters after the JSON value") }
    }

    // The walk's container stack: bit `d % 64` of word `d / 64` is set when level `d` is an object.
    fn push(&mut self, is_object: bool) {
        let bit = self.depth % 64;
        if bit == 0 {
            self.stack.push(0);
        }
        if let Some(word) = self.stack.last_mut() {
            *word = (*word & !(1 << bit)) | (u64::from(is_object) << bit);
        }
        self.depth += 1;
    }

    fn pop(&mut self) {
        self.depth -= 1;
        if self.depth.is_multiple_of(64) {
            self.stack.pop();
        }
    }

    fn top_is_object(&self) -> bool {
        let level = self.depth - 1;
        self.stack.get(level / 64).is_some_and(|w| w >> (level % 64) & 1 == 1)
    }
}

/// The first index at or after `from` of a byte that ends or escapes a string run: `"`, `\` or a
/// control character (below 0x20); `bytes.len()` if none. Eight bytes at a time: each test below
/// sets the high bit of every matching byte and, through borrows, possibly of bytes above a
/// match but never below one, so the lowest set bit is exactly the first match.
fn find_special(bytes: &[u8], from: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut at = from;
    while let Some(word) = bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        let w = u64::from_le_bytes(*word);
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let hits = ((quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(ONES * 0x20) & !w))
            & HIGHS;
        if hits != 0 {
            return at + (hits.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let tail = bytes.get(at..).unwrap_or_default();
    at + tail.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20).unwrap_or(tail.len())
}

#[cfg(test)]
pub(crate) mod tests;
