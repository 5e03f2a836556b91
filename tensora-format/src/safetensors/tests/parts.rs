//! A header parsed in parts on several threads against the same header on one.

use proptest::prelude::*;

use super::super::chunks::speculative_segments;
use super::super::*;
use super::{check_parse_result, entry, image};

/// One member of a generated header for [`parts_parse_like_one_thread`].
#[derive(Debug, Clone)]
enum Member {
    Tensor,
    /// A name used earlier again.
    Duplicate(prop::sample::Index),
    Metadata,
    /// A member with a bad shape.
    Bad,
}

fn member() -> impl Strategy<Value = Member> {
    prop_oneof![
        400 => Just(Member::Tensor),
        1 => any::<prop::sample::Index>().prop_map(Member::Duplicate),
        1 => Just(Member::Metadata),
        1 => Just(Member::Bad),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A header parsed in parts on several threads gives what one thread gives: the same header,
    /// or the same error naming the same tensor, whatever the members and wherever the parts
    /// split (duplicates across parts, `__metadata__` twice, a bad entry in any part).
    #[test]
    fn parts_parse_like_one_thread(members in proptest::collection::vec(member(), 600..2400), threads in 2usize..6) {
        let mut names: Vec<String> = Vec::new();
        let mut text = Vec::with_capacity(members.len());
        let mut offset = 0u64;
        for (i, m) in members.iter().enumerate() {
            let name = match m {
                Member::Duplicate(at) if !names.is_empty() => names[at.index(names.len())].clone(),
                _ => format!("model.layers.{i}.w"),
            };
            text.push(match m {
                Member::Metadata => r#""__metadata__":{"format":"pt"}"#.to_owned(),
                Member::Bad => entry(&name, "U8", "[-1]", offset, offset + 1),
                _ => entry(&name, "U8", "[1]", offset, offset + 1),
            });
            if !matches!(m, Member::Metadata) {
                names.push(name);
                offset += 1;
            }
        }
        let json = format!("{{{}}}", text.join(","));
        let f = image(&json, offset as usize);
        let path = Path::new(MEMORY_PATH);
        let one = parse_header_split(&f, f.len() as u64, path, (1, 1));
        let parts = parse_header_split(&f, f.len() as u64, path, (threads, 1));
        match (&one, &parts) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(a), Err(b)) => {
                prop_assert_eq!(a.to_string(), b.to_string());
                prop_assert_eq!(a.tensor(), b.tensor());
            }
            _ => prop_assert!(false, "one thread {:?}, {} threads {:?}", one, threads, parts),
        }
        check_parse_result(&f, f.len() as u64, &parts)?;
        let clean = members.iter().all(|m| matches!(m, Member::Tensor));
        prop_assert_eq!(parts.is_ok(), clean || (members.iter().filter(|m| matches!(m, Member::Metadata)).count() == 1
            && members.iter().all(|m| matches!(m, Member::Tensor | Member::Metadata))));
    }
}

/// The parts really do run: a header of several chunks parsed with a small part size gives the
/// whole, in order.
#[test]
fn a_large_header_is_parsed_in_parts() {
    let count = 4 * CHUNK_BYTES_TARGET / 40;
    let parts: Vec<String> =
        (0..count).map(|i| entry(&format!("t{i}"), "U8", "[1]", i as u64, i as u64 + 1)).collect();
    let json = format!("{{{}}}", parts.join(","));
    let f = image(&json, count);
    assert!(speculative_segments(json.as_bytes(), 0).unwrap().len() >= 4);
    let h = parse_header_split(&f, f.len() as u64, Path::new("x"), (4, 1)).unwrap();
    assert_eq!(h, parse_header(&f, f.len() as u64).unwrap());
    assert_eq!(
        h.tensors().map(|t| t.name().to_owned()).collect::<Vec<_>>(),
        (0..count).map(|i| format!("t{i}")).collect::<Vec<_>>()
    );
}
