//! Which tensors a partial load wants: all, exact names, glob patterns or a predicate
//! ([`Selection`]), compiled once ([`Matcher`]) and applied to a checkpoint with
//! [`Checkpoint::select`](crate::Checkpoint::select).

use std::collections::HashMap;
use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};

/// Why a selection was refused. Every variant names the offending input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectionError {
    /// A glob pattern does not parse.
    #[error("invalid glob pattern {pattern:?}: {reason}")]
    BadGlob {
        /// The pattern as given.
        pattern: String,
        /// What the glob parser said.
        reason: String,
    },
    /// Exact names in a selection that no tensor has (a typo should not silently load nothing).
    #[error("no tensor named {}", quote_list(names))]
    UnknownNames {
        /// The missing names, in the order given, each once.
        names: Vec<String>,
    },
    /// Glob patterns in a selection that match no tensor.
    #[error("no tensor matches {}", quote_list(patterns))]
    NoMatch {
        /// The patterns that matched nothing.
        patterns: Vec<String>,
    },
}

/// How many names an error message lists before it says "and N more".
const NAMES_SHOWN_MAX: usize = 8;

fn quote_list(names: &[String]) -> String {
    let mut out = String::new();
    for (i, name) in names.iter().take(NAMES_SHOWN_MAX).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!("{name:?}"));
    }
    if names.len() > NAMES_SHOWN_MAX {
        out.push_str(&format!(" and {} more", names.len() - NAMES_SHOWN_MAX));
    }
    out
}

/// A caller's choice of tensors, by name. Turn it into a [`Matcher`] with [`Selection::matcher`].
///
/// ```
/// use tensora_format::Selection;
/// let names = ["embed.weight", "layers.0.attn.q.weight", "layers.1.attn.q.weight", "lm_head.weight"];
/// let sel = Selection::Glob(vec!["layers.0.*".into(), "embed.*".into()]);
/// let picked = sel.matcher().unwrap().select(names).unwrap();
/// assert_eq!(picked, vec![0, 1]);
///
/// // A typo in an exact name is an error that names it, not an empty load.
/// let typo = Selection::Names(vec!["lm_head.weigth".into()]);
/// let err = typo.matcher().unwrap().select(names).unwrap_err();
/// assert!(err.to_string().contains("lm_head.weigth"));
/// ```
#[derive(Clone, Default)]
pub enum Selection {
    /// Every tensor.
    #[default]
    All,
    /// Exactly these names. Each must exist ([`Matcher::select`] fails naming those that do not).
    Names(Vec<String>),
    /// Tensors matching any of these glob patterns (`*`, `?`, `[..]`, `{a,b}`; `*` also matches
    /// `.` and `/`). Each pattern must match at least one tensor.
    Glob(Vec<String>),
    /// Tensors for which the predicate returns true. May select nothing.
    Predicate(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

impl std::fmt::Debug for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::All => f.write_str("All"),
            Self::Names(names) => f.debug_tuple("Names").field(names).finish(),
            Self::Glob(patterns) => f.debug_tuple("Glob").field(patterns).finish(),
            Self::Predicate(_) => f.write_str("Predicate(..)"),
        }
    }
}

impl Selection {
    /// Compiles the selection. Fails on a pattern that does not parse.
    pub fn matcher(&self) -> Result<Matcher, SelectionError> {
        let kind = match self {
            Self::All => Kind::All,
            Self::Names(names) => {
                let mut index = HashMap::with_capacity(names.len());
                for (i, name) in names.iter().enumerate() {
                    index.entry(name.clone()).or_insert(i);
                }
                Kind::Names { names: names.clone(), index }
            }
            Self::Glob(patterns) => {
                let mut builder = GlobSetBuilder::new();
                for pattern in patterns {
                    let glob = Glob::new(pattern).map_err(|e| SelectionError::BadGlob {
                        pattern: pattern.clone(),
                        reason: e.kind().to_string(),
                    })?;
                    builder.add(glob);
                }
                let set = builder.build().map_err(|e| SelectionError::BadGlob {
                    pattern: patterns.join(","),
                    reason: e.to_string(),
                })?;
                Kind::Glob { patterns: patterns.clone(), set, prefixes: literal_prefixes(patterns) }
            }
            Self::Predicate(pred) => Kind::Predicate(Arc::clone(pred)),
        };
        Ok(Matcher { kind })
    }
}

/// A compiled [`Selection`].
#[derive(Clone)]
pub struct Matcher {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    All,
    /// `index` maps each name to its first position in `names`.
    Names {
        names: Vec<String>,
        index: HashMap<String, usize>,
    },
    Glob {
        patterns: Vec<String>,
        set: GlobSet,
        /// When every pattern is `literal*` (the usual `model.layers.3.*`): the literals, matched
        /// with `starts_with` (what the glob means: `*` matches any rest, `.` and `/` included).
        prefixes: Option<Vec<String>>,
    },
    Predicate(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

impl Matcher {
    /// Whether `name` is selected.
    pub fn matches(&self, name: &str) -> bool {
        match &self.kind {
            Kind::All => true,
            Kind::Names { index, .. } => index.contains_key(name),
            Kind::Glob { prefixes: Some(prefixes), .. } => {
                prefixes.iter().any(|p| name.starts_with(p.as_str()))
            }
            Kind::Glob { set, .. } => set.is_match(name),
            Kind::Predicate(pred) => pred(name),
        }
    }

    /// The positions of the selected names among `names`, in order. Fails with
    /// [`SelectionError::UnknownNames`] if an exact name is missing from `names`, or with
    /// [`SelectionError::NoMatch`] if a glob pattern matches none of them, so a typo never silently
    /// loads nothing.
    pub fn select<'a, I>(&self, names: I) -> Result<Vec<usize>, SelectionError>
    where
        I: IntoIterator<Item = &'a str>,
    {
        let mut picked = Vec::new();
        match &self.kind {
            Kind::All => picked.extend(names.into_iter().enumerate().map(|(i, _)| i)),
            Kind::Names { names: wanted, index } => {
                let mut seen = vec![false; wanted.len()];
                for (i, name) in names.into_iter().enumerate() {
                    if let Some(&w) = index.get(name) {
                        seen[w] = true;
                        picked.push(i);
                    }
                }
                let missing = missing(wanted, &seen, |w| index.get(w.as_str()).is_some_and(|&f| seen[f]));
                if !missing.is_empty() {
                    return Err(SelectionError::UnknownNames { names: missing });
                }
            }
            Kind::Glob { patterns, set, prefixes } => {
                let mut seen = vec![false; patterns.len()];
                let mut hits = Vec::new();
                for (i, name) in names.into_iter().enumerate() {
                    match prefixes {
                        Some(prefixes) => {
                            hits.clear();
                            hits.extend(
                                prefixes
                                    .iter()
                                    .enumerate()
                                    .filter(|(_, p)| name.starts_with(p.as_str()))
                                    .map(|(k, _)| k),
                            );
                        }
                        None => set.matches_into(name, &mut hits),
                    }
                    if !hits.is_empty() {
                        picked.push(i);
                        for &h in &hits {
                            seen[h] = true;
                        }
                    }
                }
                let missing = missing(patterns, &seen, |_| false);
                if !missing.is_empty() {
                    return Err(SelectionError::NoMatch { patterns: missing });
                }
            }
            Kind::Predicate(pred) => {
                picked.extend(names.into_iter().enumerate().filter(|(_, n)| pred(n)).map(|(i, _)| i));
            }
        }
        Ok(picked)
    }
}

/// The literal before the one trailing `*` of each pattern, when every pattern is of that form
/// (no other glob syntax: `*`, `?`, `[`, `]`, `{`, `}`, `\\`).
fn literal_prefixes(patterns: &[String]) -> Option<Vec<String>> {
    patterns
        .iter()
        .map(|p| {
            let literal = p.strip_suffix('*')?;
            (!literal.contains(['*', '?', '[', ']', '{', '}', '\\'])).then(|| literal.to_owned())
        })
        .collect()
}

/// The entries of `wanted` not marked in `seen` (and not otherwise `found`), deduplicated.
fn missing(wanted: &[String], seen: &[bool], found: impl Fn(&String) -> bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (w, &hit) in wanted.iter().zip(seen) {
        if !hit && !found(w) && !out.contains(w) {
            out.push(w.clone());
        }
    }
    out
}

impl std::fmt::Debug for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::All => f.write_str("Matcher(All)"),
            Kind::Names { names, .. } => f.debug_tuple("Matcher::Names").field(names).finish(),
            Kind::Glob { patterns, .. } => f.debug_tuple("Matcher::Glob").field(patterns).finish(),
            Kind::Predicate(_) => f.write_str("Matcher::Predicate(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// `literal*` patterns, matched by prefix, select what the compiled glob selects.
        #[test]
        fn prefix_patterns_match_as_their_globs(
            literals in proptest::collection::vec("[a-c./]{0,4}", 1..4),
            names in proptest::collection::vec("[a-c./]{0,6}", 0..12),
        ) {
            let patterns: Vec<String> = literals.iter().map(|l| format!("{l}*")).collect();
            let fast = Selection::Glob(patterns.clone()).matcher().unwrap();
            let takes_prefix_path = matches!(&fast.kind, Kind::Glob { prefixes: Some(_), .. });
            prop_assert!(takes_prefix_path);
            let mut slow = fast.clone();
            if let Kind::Glob { prefixes, .. } = &mut slow.kind {
                *prefixes = None;
            }
            for n in &names {
                prop_assert_eq!(fast.matches(n), slow.matches(n), "{}", n);
            }
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            prop_assert_eq!(fast.select(refs.iter().copied()), slow.select(refs.iter().copied()));
        }
    }

    #[test]
    fn only_plain_trailing_star_patterns_take_the_prefix_path() {
        assert_eq!(literal_prefixes(&["a.*".into(), "*".into()]), Some(vec!["a.".into(), String::new()]));
        for other in ["a.*.b", "a?*", "[ab]*", "a", "{a,b}*", "a\\**"] {
            assert_eq!(literal_prefixes(&[other.into()]), None, "{other}");
        }
    }

    const NAMES: [&str; 6] = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.10.mlp.up_proj.weight",
        "lm_head.weight",
    ];

    #[test]
    fn unknown_names_are_listed_and_truncated() {
        let e = SelectionError::UnknownNames { names: vec!["a.weight".into(), "b".into()] };
        assert_eq!(e.to_string(), "no tensor named \"a.weight\", \"b\"");
        let many: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        let e = SelectionError::NoMatch { patterns: many };
        let msg = e.to_string();
        assert!(msg.ends_with(" and 2 more"), "{msg}");
        assert!(msg.contains("\"t7\"") && !msg.contains("\"t8\""), "{msg}");
    }

    #[test]
    fn all_selects_everything_and_matches_anything() {
        let m = Selection::All.matcher().unwrap();
        assert_eq!(m.select(NAMES).unwrap(), vec![0, 1, 2, 3, 4, 5]);
        assert!(m.matches("anything"));
        assert_eq!(m.select([]).unwrap(), Vec::<usize>::new());
    }

    #[test]
    fn exact_names_select_in_file_order_and_unknown_names_are_named() {
        let sel = Selection::Names(vec!["lm_head.weight".into(), "model.embed_tokens.weight".into()]);
        let m = sel.matcher().unwrap();
        assert_eq!(m.select(NAMES).unwrap(), vec![0, 5]);
        assert!(m.matches("lm_head.weight") && !m.matches("lm_head"));
        let typo = Selection::Names(vec![
            "lm_head.weight".into(),
            "lm_head.wieght".into(),
            "model.layers.0".into(),
            "lm_head.wieght".into(),
        ]);
        assert_eq!(
            typo.matcher().unwrap().select(NAMES).unwrap_err(),
            SelectionError::UnknownNames { names: vec!["lm_head.wieght".into(), "model.layers.0".into()] }
        );
        // A name listed twice that exists is fine.
        let twice = Selection::Names(vec!["lm_head.weight".into(), "lm_head.weight".into()]);
        assert_eq!(twice.matcher().unwrap().select(NAMES).unwrap(), vec![5]);
    }

    #[test]
    fn globs_match_across_dots_and_patterns_matching_nothing_are_errors() {
        let sel = Selection::Glob(vec!["model.layers.1.*".into(), "*.mlp.*".into()]);
        assert_eq!(sel.matcher().unwrap().select(NAMES).unwrap(), vec![2, 3, 4]);
        let sel = Selection::Glob(vec!["model.layers.{0,10}.mlp.*".into()]);
        assert_eq!(sel.matcher().unwrap().select(NAMES).unwrap(), vec![2, 4]);
        let sel = Selection::Glob(vec!["*".into(), "decoder.*".into()]);
        assert_eq!(
            sel.matcher().unwrap().select(NAMES).unwrap_err(),
            SelectionError::NoMatch { patterns: vec!["decoder.*".into()] }
        );
        let bad = Selection::Glob(vec!["layers.[0-".into()]);
        assert!(
            matches!(bad.matcher(), Err(SelectionError::BadGlob { pattern, .. }) if pattern == "layers.[0-")
        );
    }

    #[test]
    fn predicates_may_select_nothing() {
        let sel = Selection::Predicate(Arc::new(|n: &str| n.ends_with("q_proj.weight")));
        assert_eq!(sel.matcher().unwrap().select(NAMES).unwrap(), vec![1, 3]);
        let none = Selection::Predicate(Arc::new(|_: &str| false));
        assert_eq!(none.matcher().unwrap().select(NAMES).unwrap(), Vec::<usize>::new());
        assert_eq!(format!("{none:?}"), "Predicate(..)");
    }

    fn arb_name() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(vec!["a", "b", "ab", "0", "1"]), 1..4)
            .prop_map(|p| p.join("."))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// `Names` selects exactly the listed names present, or names every missing one.
        #[test]
        fn names_select_exactly_or_name_the_missing(
            names in prop::collection::vec(arb_name(), 0..20),
            wanted in prop::collection::vec(arb_name(), 0..6),
        ) {
            let m = Selection::Names(wanted.clone()).matcher().unwrap();
            let result = m.select(names.iter().map(String::as_str));
            let mut missing: Vec<String> = wanted.iter().filter(|w| !names.contains(w)).cloned().collect();
            missing.dedup_by(|a, b| a == b);
            let mut uniq = Vec::new();
            for n in missing { if !uniq.contains(&n) { uniq.push(n); } }
            if uniq.is_empty() {
                let expect: Vec<usize> = (0..names.len()).filter(|&i| wanted.contains(&names[i])).collect();
                prop_assert_eq!(result.unwrap(), expect);
            } else {
                prop_assert_eq!(result.unwrap_err(), SelectionError::UnknownNames { names: uniq });
            }
        }

        /// A `prefix*` glob selects the names with that prefix, and `matches` agrees with `select`.
        #[test]
        fn prefix_globs_match_prefixes(names in prop::collection::vec(arb_name(), 1..20), prefix in arb_name()) {
            let m = Selection::Glob(vec![format!("{prefix}*")]).matcher().unwrap();
            let expect: Vec<usize> = (0..names.len()).filter(|&i| names[i].starts_with(&prefix)).collect();
            for n in &names {
                prop_assert_eq!(m.matches(n), n.starts_with(&prefix));
            }
            match m.select(names.iter().map(String::as_str)) {
                Ok(got) => prop_assert_eq!(got, expect),
                Err(e) => {
                    prop_assert!(expect.is_empty());
                    prop_assert_eq!(e, SelectionError::NoMatch { patterns: vec![format!("{prefix}*")] });
                }
            }
        }
    }
}
