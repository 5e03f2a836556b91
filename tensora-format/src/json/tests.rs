//! The reader against serde_json: the same documents valid, the same values read.

use proptest::prelude::*;
use serde_json::Value;

use super::*;

fn validate(text: &[u8]) -> Result<()> {
    let mut r = Reader::new(text)?;
    r.skip()?;
    r.finish()
}

fn compact(text: &str) -> Result<String> {
    let mut r = Reader::new(text.as_bytes())?;
    let mut out = Vec::new();
    r.walk(&mut Compact::new(&mut out))?;
    r.finish()?;
    Ok(String::from_utf8(out).unwrap())
}

#[test]
fn valid_documents() {
    for text in [
        "0",
        "-0.5e+10",
        "1E3",
        " true ",
        "null",
        "\"\"",
        r#""a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00""#,
        "[]",
        "{}",
        r#"{"a": [1, {"b": null}, []], "c": {}}"#,
        "123456789012345678901234567890",
    ] {
        assert_eq!(validate(text.as_bytes()), Ok(()), "{text}");
    }
}

#[test]
fn invalid_documents_say_where() {
    for (text, at) in [
        ("", 0),
        ("[1,]", 3),
        ("{\"a\":1,}", 7),
        ("{\"a\" 1}", 5),
        ("{1: 2}", 1),
        ("[1 2]", 3),
        ("01", 1),
        ("1.", 2),
        ("1e", 2),
        ("-", 1),
        ("tru", 0),
        ("NaN", 0),
        ("\"\\x\"", 1),
        ("\"\\ud800\"", 1),
        ("\"\\udc00x\"", 1),
        ("\"a\u{1}\"", 2),
        ("\"abc", 4),
        ("[[]", 3),
        ("{} {}", 3),
        ("[1]]", 3),
        ("{\"a\":1]", 6),
        ("/* */ 1", 0),
    ] {
        let e = validate(text.as_bytes()).expect_err(text);
        assert_eq!(e.at, at, "{text}: {e}");
        assert!(serde_json::from_str::<Value>(text).is_err(), "{text}");
    }
    assert_eq!(validate(b"\"\xff\"").unwrap_err(), JsonError { what: "not UTF-8", at: 1 });
}

#[test]
fn depth_costs_a_bit_per_level_and_no_recursion() {
    let depth = 1_000_000;
    let deep = format!("{}0{}", "[{\"k\":".repeat(depth), "}]".repeat(depth));
    assert_eq!(validate(deep.as_bytes()), Ok(()));
    assert_eq!(compact(&deep).unwrap().len(), deep.len());
    let unclosed = "[".repeat(depth);
    assert_eq!(validate(unclosed.as_bytes()).unwrap_err().at, depth);
}

#[test]
fn compact_re_emits_values() {
    assert_eq!(
        compact(r#" { "a" : [ 1 , -2.50e3 , "x\ny" ] , "b" : { } , "\u00e9" : null } "#).unwrap(),
        r#"{"a":[1,-2.50e3,"x\u000ay"],"b":{},"é":null}"#
    );
    assert_eq!(compact("[[],[[]],{}]").unwrap(), "[[],[[]],{}]");
}

#[test]
fn pull_api_reads_members_and_elements() {
    let text = br#"{"k\u0031": [1, "s"], "z": {}}"#;
    let mut r = Reader::new(text).unwrap();
    r.begin_object().unwrap();
    let k = r.next_key().unwrap().unwrap();
    assert!(r.str_is(k, "k1"));
    assert_eq!(r.raw(k), "k\\u0031");
    assert_eq!(r.peek().unwrap(), Kind::Array);
    r.begin_array().unwrap();
    assert!(r.next_element().unwrap());
    assert_eq!(r.number().unwrap(), "1");
    assert!(r.next_element().unwrap());
    let s = r.string().unwrap();
    assert_eq!(r.str_of(s), "s");
    assert!(!r.next_element().unwrap());
    let z = r.next_key().unwrap().unwrap();
    assert!(r.str_is(z, "z"));
    r.skip().unwrap();
    assert_eq!(r.next_key().unwrap(), None);
    r.finish().unwrap();
}

/// Arbitrary JSON values (shallow enough for serde_json's recursion limit); strings hold quotes,
/// backslashes, control characters and non-ASCII text. Also the index tests' values.
pub(crate) fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Floats that print and parse exactly (serde_json's own float parsing rounds).
        (-4096i32..4096).prop_map(|i| Value::from(f64::from(i) / 8.0)),
        "\\PC{0,8}".prop_map(Value::from),
        "[\"\\\\\u{0}-\u{1f}\u{7f}é😀]{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map("\\PC{0,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any text over a JSON-ish alphabet: valid here exactly when serde_json says so.
    #[test]
    fn agrees_with_serde_json_on_validity(text in "[{}\\[\\]\",:0-9a-z\\\\ .eE+\\-\u{1}é]{0,60}") {
        let theirs = serde_json::from_str::<Value>(&text);
        // serde_json refuses numbers whose f64 would be infinite; JSON does not.
        prop_assume!(!theirs.as_ref().is_err_and(|e| e.to_string().contains("number out of range")));
        prop_assert_eq!(validate(text.as_bytes()).is_ok(), theirs.is_ok(), "{:?}", text);
    }

    /// Serialised values (compact and pretty) are valid and re-emit as the same value.
    #[test]
    fn reads_back_what_serde_json_writes(v in arb_value()) {
        for text in [serde_json::to_string(&v).unwrap(), serde_json::to_string_pretty(&v).unwrap()] {
            let again: Value = serde_json::from_str(&compact(&text).unwrap()).unwrap();
            prop_assert_eq!(&again, &v);
        }
    }

    /// The string scan finds the same first special byte as a plain loop.
    #[test]
    fn find_special_is_the_first_quote_backslash_or_control(bytes in proptest::collection::vec(any::<u8>(), 0..40), from in 0usize..40) {
        let from = from.min(bytes.len());
        let expected = bytes[from..].iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20).map_or(bytes.len(), |k| from + k);
        prop_assert_eq!(find_special(&bytes, from), expected);
    }
}
