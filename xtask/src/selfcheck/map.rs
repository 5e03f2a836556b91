//! The second half of `cargo xtask selfcheck`: ARCHITECTURE.md is a true map.
//!
//! 1. **Paths.** Every code span (text in backticks) that is a path, one ending in `/` (a folder)
//!    or in `.rs`, `.py`, `.md`, `.sh` or `.toml` (a file), must name something that exists in the
//!    repository (tracked, or untracked and not ignored). A span is looked for, in order, at
//!    `CRATE/src/SPAN`, `CRATE/SPAN` and `SPAN` from the repository root, then as the end of any
//!    path under `CRATE` (so `entry.rs` in a line about `cache/` is found at `cache/entry.rs`),
//!    where `CRATE` is the crate whose heading (`### \`tensora-io\``, backticks optional) the line
//!    is under; outside a crate's section the whole repository is searched.
//!    A relative link (`[design](docs/design.md#anchor)`) must name a file or folder too.
//! 2. **Crates.** Every `tensora-NAME` (or `tensora_NAME`) in the text is a workspace crate.
//! 3. **The crate graph**, the fenced block marked `crates`: one line per workspace crate,
//!    `NAME -> DEP DEP ...  dev: DEP ...`, names without the `tensora-` prefix (`io` is
//!    `tensora-io`; `xtask` is itself). The deps before `dev:` must be exactly the crate's
//!    workspace `[dependencies]` (any target's, build dependencies included), those after it
//!    exactly its `[dev-dependencies]` that are not also normal ones (the crate itself left out),
//!    every crate of the workspace must have a line, and a crate may depend only on crates listed
//!    above it (the graph reads as layers).
//!
//! Every mistake is reported with its line in ARCHITECTURE.md and what to change.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use anyhow::{Context, Result};

/// The map, relative to the repository root.
pub const MAP_FILE: &str = "ARCHITECTURE.md";
/// The info string of the fenced block that holds the crate graph.
const GRAPH_FENCE: &str = "```crates";
/// What a crate's short name is prefixed with to give its package name.
const CRATE_PREFIX: &str = "tensora-";
/// File endings that make a code span a file path.
const FILE_ENDINGS: [&str; 5] = [".rs", ".py", ".md", ".sh", ".toml"];
/// Where the dev dependencies start on a graph line.
const DEV_MARK: &str = "dev:";

/// One mistake in the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapError {
    /// 1-based line of ARCHITECTURE.md (0: the file as a whole).
    pub line: usize,
    /// What is wrong and what to change.
    pub message: String,
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{MAP_FILE}:{}: {}", self.line, self.message)
    }
}

/// A workspace crate as its `Cargo.toml` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its directory, relative to the repository root.
    pub dir: String,
    /// Its package name.
    pub name: String,
    /// Workspace crates in `[dependencies]` (and build or target dependencies).
    pub normal: BTreeSet<String>,
    /// Workspace crates in `[dev-dependencies]` only (not also normal, not itself).
    pub dev: BTreeSet<String>,
}

/// The repository's files and folders (relative paths, folders without a trailing `/`).
#[derive(Debug, Default)]
pub struct Tree {
    files: BTreeSet<String>,
    dirs: BTreeSet<String>,
}

impl Tree {
    /// A tree of `files` and every folder above them.
    pub fn new<I: IntoIterator<Item = String>>(files: I) -> Tree {
        let mut tree = Tree::default();
        for f in files {
            let mut at = f.as_str();
            while let Some(i) = at.rfind('/') {
                at = &at[..i];
                tree.dirs.insert(at.to_owned());
            }
            tree.files.insert(f);
        }
        tree
    }

    fn set(&self, folder: bool) -> &BTreeSet<String> {
        if folder { &self.dirs } else { &self.files }
    }
}

/// The check on the repository at `root`: every mistake in its ARCHITECTURE.md.
pub fn check(root: &Path) -> Result<Vec<MapError>> {
    let doc =
        std::fs::read_to_string(root.join(MAP_FILE)).with_context(|| format!("cannot read {MAP_FILE}"))?;
    let members = members(root)?;
    Ok(check_text(&doc, &members, &tree(root)?))
}

/// Every file git tracks or would track (untracked and not ignored).
fn tree(root: &Path) -> Result<Tree> {
    let files = super::git_files(root, &["--cached", "--others", "--exclude-standard"])?;
    let present = files.into_iter().filter(|f| root.join(f).exists());
    Ok(Tree::new(present))
}

/// The workspace's crates: the root manifest's `members`, each with its workspace dependencies.
pub fn members(root: &Path) -> Result<Vec<Member>> {
    let read = |dir: &str| {
        let path = root.join(dir).join("Cargo.toml");
        std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
    };
    let dirs = workspace_members(&read("")?);
    let mut names = BTreeMap::new();
    let mut manifests = Vec::new();
    for dir in dirs {
        let text = read(&dir)?;
        let name = package_name(&text).with_context(|| format!("{dir}/Cargo.toml has no [package] name"))?;
        names.insert(name.clone(), dir.clone());
        manifests.push((dir, name, text));
    }
    Ok(manifests
        .into_iter()
        .map(|(dir, name, text)| {
            let (mut normal, mut dev) = dependencies(&text);
            normal.retain(|d| names.contains_key(d));
            dev.retain(|d| names.contains_key(d) && !normal.contains(d) && *d != name);
            Member { dir, name, normal, dev }
        })
        .collect())
}

/// The quoted strings of the root manifest's `members = [...]`.
fn workspace_members(text: &str) -> Vec<String> {
    let Some(start) = text.find("members") else { return Vec::new() };
    let rest = &text[start..];
    let list = rest.find('[').zip(rest.find(']')).map_or("", |(a, b)| &rest[a + 1..b.max(a + 1)]);
    list.split('"').skip(1).step_by(2).map(str::to_owned).collect()
}

/// `name = "..."` of the `[package]` table.
fn package_name(text: &str) -> Option<String> {
    let mut in_package = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "name"
        {
            return Some(value.trim().trim_matches('"').to_owned());
        }
    }
    None
}

/// Which table a manifest line is in, as far as dependencies go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    Normal,
    Dev,
    Other,
}

/// The kind of dependency table a header (`dependencies`, `target.'cfg(unix)'.dev-dependencies`,
/// `dependencies.serde`) opens, and the one dependency a `[dependencies.NAME]` header names.
fn table(header: &str) -> (Table, Option<String>) {
    for (word, kind) in [
        ("dev-dependencies", Table::Dev),
        ("build-dependencies", Table::Normal),
        ("dependencies", Table::Normal),
    ] {
        let at = header.find(word).filter(|&i| i == 0 || header[..i].ends_with('.'));
        if let Some(i) = at {
            let after = &header[i + word.len()..];
            let named = after.strip_prefix('.').map(|n| n.trim_matches('"').to_owned());
            return (kind, named);
        }
    }
    (Table::Other, None)
}

/// The dependency names (a `package = "..."` rename resolved) of a manifest: normal and dev.
fn dependencies(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
    let mut current = Table::Other;
    for line in text.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[') {
            let (kind, named) = table(header.trim_end_matches(']').trim());
            current = if named.is_some() { Table::Other } else { kind };
            match (kind, named) {
                (Table::Normal, Some(n)) => normal.insert(n),
                (Table::Dev, Some(n)) => dev.insert(n),
                _ => false,
            };
            continue;
        }
        if current == Table::Other || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let key = key.trim();
        let key = key.split_once('.').map_or(key, |(k, _)| k).trim_matches('"');
        let renamed = value.split_once("package").and_then(|(_, v)| v.split('"').nth(1));
        let name = renamed.unwrap_or(key).to_owned();
        if current == Table::Dev {
            dev.insert(name)
        } else {
            normal.insert(name)
        };
    }
    (normal, dev)
}

/// Every mistake in `doc` (the text of ARCHITECTURE.md) against `members` and `tree`.
pub fn check_text(doc: &str, members: &[Member], tree: &Tree) -> Vec<MapError> {
    let mut errors = Vec::new();
    let by_name: BTreeMap<&str, &Member> = members.iter().map(|m| (m.name.as_str(), m)).collect();
    let mut scope: Option<&Member> = None;
    let mut fence: Option<&str> = None;
    let mut graph = Vec::new();
    for (i, line) in doc.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fence = if fence.is_some() { None } else { Some(trimmed) };
            continue;
        }
        errors.extend(crate_names(line, n, &by_name));
        match fence {
            Some(GRAPH_FENCE) => graph.push((n, line)),
            Some(_) => {}
            None => {
                if trimmed.starts_with('#') {
                    scope = members.iter().find(|m| {
                        trimmed.split(|c: char| c == '`' || c.is_whitespace()).any(|w| w == m.name)
                    });
                }
                errors.extend(paths(line, n, scope, tree));
                errors.extend(links(line, n, tree));
            }
        }
    }
    errors.extend(check_graph(&graph, members));
    errors
}

/// The code spans of `line` that are paths.
fn path_spans(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2).filter(|s| {
        let chars = s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'));
        chars
            && s.chars().any(|c| c.is_ascii_alphanumeric())
            && (s.ends_with('/') || FILE_ENDINGS.iter().any(|e| s.ends_with(e)))
    })
}

/// The path spans of `line` (number `n`) that name nothing, as errors.
fn paths(line: &str, n: usize, scope: Option<&Member>, tree: &Tree) -> Vec<MapError> {
    let mut errors = Vec::new();
    for span in path_spans(line) {
        let folder = span.ends_with('/');
        let path = span.trim_end_matches('/');
        let set = tree.set(folder);
        let dir = scope.map_or("", |m| m.dir.as_str());
        let exact = [format!("{dir}/src/{path}"), format!("{dir}/{path}"), path.to_owned()];
        let under = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        let suffix = format!("/{path}");
        let found = exact.iter().any(|p| set.contains(p.trim_start_matches('/')))
            || set.iter().any(|p| p.starts_with(&under) && p.ends_with(&suffix));
        if !found {
            let what = if folder { "folder" } else { "file" };
            let place = scope.map_or_else(|| "the repository".to_owned(), |m| format!("{}/", m.dir));
            let looked = if dir.is_empty() {
                format!("{path} and any path ending in {suffix}")
            } else {
                format!("{}, {} and any path under {under} ending in {suffix}", exact[0], exact[1])
            };
            errors.push(MapError {
                line: n,
                message: format!(
                    "`{span}` names no {what} in {place} (looked for {looked}): correct the path or remove it"
                ),
            });
        }
    }
    errors
}

/// The relative link targets of `line` (`[text](docs/design.md#anchor)`) that name nothing in the
/// repository, as errors; web links and anchors within the page are not checked.
fn links(line: &str, n: usize, tree: &Tree) -> Vec<MapError> {
    let targets = line.split("](").skip(1).filter_map(|rest| rest.split_once(')').map(|(t, _)| t));
    targets
        .filter(|t| !t.contains("://") && !t.starts_with('#') && !t.starts_with("mailto:"))
        .filter_map(|target| {
            let path = target.split('#').next().unwrap_or(target).trim_end_matches('/');
            let found = tree.files.contains(path) || tree.dirs.contains(path);
            (!found).then(|| MapError {
                line: n,
                message: format!(
                    "the link to `{target}` names nothing in the repository: correct it or remove it"
                ),
            })
        })
        .collect()
}

/// Every `tensora-NAME` or `tensora_NAME` in `line` that is not a workspace crate, as errors.
fn crate_names(line: &str, n: usize, by_name: &BTreeMap<&str, &Member>) -> Vec<MapError> {
    let mut errors = Vec::new();
    for sep in ['-', '_'] {
        let needle = format!("tensora{sep}");
        for (at, _) in line.match_indices(&needle) {
            let word_start =
                at == 0 || !line[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
            let rest = &line[at + needle.len()..];
            let len = rest.find(|c: char| !c.is_ascii_lowercase()).unwrap_or(rest.len());
            if !word_start || len == 0 {
                continue;
            }
            let name = format!("{CRATE_PREFIX}{}", &rest[..len]);
            if !by_name.contains_key(name.as_str()) {
                let known: Vec<&str> = by_name.keys().copied().collect();
                errors.push(MapError {
                    line: n,
                    message: format!(
                        "`{}` is no workspace crate (the crates: {})",
                        &line[at..at + needle.len() + len],
                        known.join(", ")
                    ),
                });
            }
        }
    }
    errors
}

/// The package a graph name stands for.
fn resolve<'m>(short: &str, members: &'m [Member]) -> Option<&'m Member> {
    let prefixed = format!("{CRATE_PREFIX}{short}");
    members.iter().find(|m| m.name == prefixed).or_else(|| members.iter().find(|m| m.name == short))
}

/// The graph's name for a package.
fn short(name: &str) -> &str {
    name.strip_prefix(CRATE_PREFIX).unwrap_or(name)
}

/// The crate graph's lines (number, text) against the manifests.
fn check_graph(lines: &[(usize, &str)], members: &[Member]) -> Vec<MapError> {
    let mut errors = Vec::new();
    let err = |line: usize, message: String| MapError { line, message };
    if lines.is_empty() {
        let text = format!("no crate graph: add a fenced block `{GRAPH_FENCE}` with one line per crate");
        return vec![err(0, text)];
    }
    // Each crate's line and the crates listed before it.
    let mut above: BTreeMap<&str, usize> = BTreeMap::new();
    for &(n, line) in lines.iter().filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#')) {
        let Some((left, right)) = line.split_once("->") else {
            errors.push(err(n, format!("`{}` is not `NAME -> DEP ...  {DEV_MARK} DEP ...`", line.trim())));
            continue;
        };
        let Some(member) = resolve(left.trim(), members) else {
            errors.push(err(n, format!("`{}` is no workspace crate", left.trim())));
            continue;
        };
        if above.insert(&member.name, n).is_some() {
            errors.push(err(n, format!("{} has a second line", member.name)));
        }
        let (normal, dev) = right.split_once(DEV_MARK).unwrap_or((right, ""));
        let mut sets = [(normal, &member.normal, "[dependencies]"), (dev, &member.dev, "[dev-dependencies]")];
        for (text, want, table) in &mut sets {
            let mut said = BTreeSet::new();
            for dep in text.split_whitespace() {
                match resolve(dep, members) {
                    None => errors.push(err(n, format!("`{dep}` is no workspace crate"))),
                    Some(d) if !want.contains(&d.name) => errors.push(err(
                        n,
                        format!(
                            "the arrow {} -> {} is wrong: {}/Cargo.toml {table} has no {}",
                            member.name, d.name, member.dir, d.name
                        ),
                    )),
                    Some(d) => {
                        if *table == "[dependencies]" && !above.contains_key(d.name.as_str()) {
                            errors.push(err(
                                n,
                                format!(
                                    "{} depends on {}, which is not listed above it: reorder the lines",
                                    member.name, d.name
                                ),
                            ));
                        }
                        said.insert(d.name.clone());
                    }
                }
            }
            for missing in want.iter().filter(|d| !said.contains(*d)) {
                errors.push(err(
                    n,
                    format!(
                        "{}/Cargo.toml {table} has {missing}, which the line of {} leaves out: add `{}`{}",
                        member.dir,
                        member.name,
                        short(missing),
                        if *table == "[dependencies]" { " before `dev:`" } else { " after `dev:`" }
                    ),
                ));
            }
        }
    }
    let first = lines[0].0;
    for m in members.iter().filter(|m| !above.contains_key(m.name.as_str())) {
        errors.push(err(
            first,
            format!("the workspace crate {} ({}/) has no line in the crate graph", m.name, m.dir),
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, normal: &[&str], dev: &[&str]) -> Member {
        let set = |l: &[&str]| l.iter().map(|s| format!("{CRATE_PREFIX}{s}")).collect();
        Member {
            dir: format!("{CRATE_PREFIX}{name}"),
            name: format!("{CRATE_PREFIX}{name}"),
            normal: set(normal),
            dev: set(dev),
        }
    }

    fn world() -> (Vec<Member>, Tree) {
        let members = vec![member("a", &[], &["t"]), member("t", &["a"], &[]), member("b", &["a"], &[])];
        let files =
            ["tensora-a/src/lib.rs", "tensora-a/src/cache/entry.rs", "tensora-b/src/main.rs", "docs/x.md"];
        (members, Tree::new(files.map(String::from)))
    }

    const GOOD: &str = "# Map\n\nSee `docs/x.md` and `tensora-b`.\n\n```crates\na -> dev: t\nt -> a\nb -> a\n```\n\n\
                        ### `tensora-a`\n\n- `lib.rs`, `cache/` (`entry.rs`)\n\n### `tensora-b`\n\n- `main.rs`, `src/`\n";

    fn messages(doc: &str) -> Vec<String> {
        let (members, tree) = world();
        check_text(doc, &members, &tree).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_true_map_passes() {
        assert_eq!(messages(GOOD), Vec::<String>::new());
    }

    #[test]
    fn a_wrong_path_names_its_line_and_where_it_was_looked_for() {
        let doc = GOOD.replace("`cache/` (`entry.rs`)", "`cache/` (`entry.rs`, `arena.rs`)");
        assert_eq!(
            messages(&doc),
            [
                "ARCHITECTURE.md:13: `arena.rs` names no file in tensora-a/ (looked for tensora-a/src/arena.rs, \
              tensora-a/arena.rs and any path under tensora-a/ ending in /arena.rs): correct the path or remove it"
            ]
        );
        // A folder is not a file, and a file of another crate's section is not found.
        assert_eq!(messages(&GOOD.replace("`cache/`", "`cache/entry.rs/`")).len(), 1);
        assert_eq!(messages(&GOOD.replace("`main.rs`", "`lib.rs`")).len(), 1);
        assert_eq!(messages(&GOOD.replace("`docs/x.md`", "`docs/y.md`")).len(), 1);
        let link = GOOD.replace(
            "See `docs/x.md`",
            "See [x](docs/x.md#a), [web](https://e.invalid/y.md), [y](docs/y.md)",
        );
        assert_eq!(
            messages(&link),
            [
                "ARCHITECTURE.md:3: the link to `docs/y.md` names nothing in the repository: correct it or remove it"
            ]
        );
    }

    #[test]
    fn a_wrong_or_missing_arrow_and_an_unknown_crate_fail() {
        // (what the true map says, the mistake planted instead, the one error it must give)
        let cases = [
            (
                "b -> a",
                "b -> a t",
                "ARCHITECTURE.md:8: the arrow tensora-b -> tensora-t is wrong: tensora-b/Cargo.toml \
                 [dependencies] has no tensora-t",
            ),
            (
                "t -> a",
                "t ->",
                "ARCHITECTURE.md:7: tensora-t/Cargo.toml [dependencies] has tensora-a, which the line of \
                 tensora-t leaves out: add `a` before `dev:`",
            ),
            (
                "a -> dev: t",
                "a ->",
                "ARCHITECTURE.md:6: tensora-a/Cargo.toml [dev-dependencies] has tensora-t, which the line \
                 of tensora-a leaves out: add `t` after `dev:`",
            ),
            (
                "a -> dev: t\nt -> a\n",
                "t -> a\na -> dev: t\n",
                "ARCHITECTURE.md:6: tensora-t depends on tensora-a, which is not listed above it: reorder \
                 the lines",
            ),
            (
                "b -> a\n",
                "",
                "ARCHITECTURE.md:6: the workspace crate tensora-b (tensora-b/) has no line in the crate graph",
            ),
        ];
        for (truth, mistake, want) in cases {
            assert_eq!(messages(&GOOD.replace(truth, mistake)), [want], "{mistake:?}");
        }
        let unknown = messages(&GOOD.replace("`tensora-b`.", "`tensora-sys` and `tensora_sys::open`."));
        assert_eq!(unknown.len(), 2, "{unknown:?}");
        assert!(
            unknown[0].starts_with("ARCHITECTURE.md:3: `tensora-sys` is no workspace crate"),
            "{unknown:?}"
        );
        assert_eq!(
            messages(&GOOD.replace("```crates", "```text")),
            ["ARCHITECTURE.md:0: no crate graph: add a fenced block ````crates` with one line per crate"]
        );
    }

    #[test]
    fn manifests_are_read_as_cargo_reads_them() {
        let text = "[package]\nname = \"tensora-x\"\n\n[dependencies]\ntensora-a.workspace = true\n\
                    tensora-b = { path = \"../b\", default-features = false }\nserde = \"1\"\n\n\
                    [target.'cfg(unix)'.dependencies]\nlocal = { package = \"tensora-c\", path = \"../c\" }\n\n\
                    [dev-dependencies]\ntensora-x = { path = \".\", features = [\"f\"] }\n\"tensora-t\" = \"1\"\n\n\
                    [dev-dependencies.tensora-u]\npath = \"../u\"\n\n[features]\ntensora-z = []\n";
        assert_eq!(package_name(text).as_deref(), Some("tensora-x"));
        let (normal, dev) = dependencies(text);
        let set = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(normal, set(&["tensora-a", "tensora-b", "serde", "tensora-c"]));
        assert_eq!(dev, set(&["tensora-x", "tensora-t", "tensora-u"]));
        let root =
            "[workspace]\nresolver = \"3\"\nmembers = [\n    \"a\",\n    \"b/c\",\n]\nexclude = [\"fuzz\"]\n";
        assert_eq!(workspace_members(root), ["a", "b/c"]);
    }

    #[test]
    fn the_real_map_is_true_and_a_planted_mistake_in_it_fails() {
        let root = crate::workspace_root();
        let errors = check(&root).unwrap();
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(errors.is_empty(), "{}", shown.join("\n"));
        let doc = std::fs::read_to_string(root.join(MAP_FILE)).unwrap();
        let members = members(&root).unwrap();
        let tree = tree(&root).unwrap();
        // The old name of the arena's folder, and an arrow the manifests do not have.
        let planted =
            doc.replacen("`arena/`", "`arena.rs`", 1).replacen("plan     ->", "plan     -> format", 1);
        let found: Vec<String> =
            check_text(&planted, &members, &tree).iter().map(ToString::to_string).collect();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("`arena.rs` names no file in tensora-io/"), "{found:?}");
        assert!(found[1].contains("the arrow tensora-plan -> tensora-format is wrong"), "{found:?}");
    }
}
