//! The third part of `cargo xtask selfcheck`: the prose that lists what the provisioning installs
//! names exactly the tools of [`TOOLS`] (`xtask/src/provision/mod.rs`).
//!
//! Four places list them by hand ([`PLACES`]): README's provisioning paragraph, the tool table of
//! docs/fresh-machine.md, the header comment of `.ci/run` and the `provision` entry of
//! `cargo xtask`'s help. In each place:
//!
//! 1. **Every tool is named**: its prose name ([`Tool::prose`], `GCS emulator`) or its name
//!    ([`Tool::name`], `gcp-storage-emulator`), case-insensitively. A tool added to `TOOLS` fails
//!    until every place says it is installed.
//! 2. **Nothing else is named as a tool**: a directory under `target/` that looks like a tool's
//!    (`target/tensora-remote-…`, `target/…venv`, braces expanded) is a tool's [`Tool::dir`], an
//!    `X emulator` is a tool's prose name, and a plain name (one word, perhaps with a version:
//!    `minio`, `minio 2024.1.1`) in a list that names two tools or more is a tool ([`listed_names`]).
//!    A tool removed from `TOOLS` fails where the prose still names it that way.
//!
//! Each mistake is reported with the file, the place's first line and what to change.

use std::fmt;
use std::path::Path;

use anyhow::{Context, Result};

use crate::provision::{TOOLS, Tool};

/// Where in its file a place's prose is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// The first paragraph (lines between blank lines) containing this text.
    Paragraph { containing: &'static str },
    /// The first Markdown table (consecutive lines starting with `|`).
    FirstTable,
    /// The comment block at the top of a script (lines starting with `#` after the `#!` line).
    LeadingComment,
    /// A help entry: the line indented by two spaces that starts with `command`, and its
    /// continuation lines (indented deeper), up to the next entry.
    HelpEntry { command: &'static str },
}

/// One place in the prose that lists the tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The file, relative to the repository root.
    pub file: &'static str,
    /// The place, as a mistake names it.
    pub what: &'static str,
    /// How to find it in the file.
    pub region: Region,
}

/// The places that list the tools by hand.
pub const PLACES: [Place; 4] = [
    Place {
        file: "README.md",
        what: "the provisioning paragraph",
        region: Region::Paragraph { containing: "`cargo xtask provision`" },
    },
    Place { file: "docs/fresh-machine.md", what: "the tool table", region: Region::FirstTable },
    Place { file: ".ci/run", what: "the header comment", region: Region::LeadingComment },
    Place {
        file: "xtask/src/main.rs",
        what: "the help of `provision`",
        region: Region::HelpEntry { command: "provision " },
    },
];

/// One mistake: a place that misses a tool, names one `TOOLS` does not have, or is not found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProseError {
    /// The file, relative to the repository root.
    pub file: &'static str,
    /// 1-based first line of the place (0: the place was not found).
    pub line: usize,
    /// What is wrong and what to change.
    pub message: String,
}

impl fmt::Display for ProseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// The check on the repository at `root`: every mistake in the places of [`PLACES`].
pub fn check(root: &Path) -> Result<Vec<ProseError>> {
    let mut errors = Vec::new();
    for place in &PLACES {
        let path = root.join(place.file);
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        errors.extend(check_place(place, &text, &TOOLS));
    }
    Ok(errors)
}

/// Every mistake of `place` (its file's text is `text`) against `tools`.
pub fn check_place(place: &Place, text: &str, tools: &[Tool]) -> Vec<ProseError> {
    let error = |line: usize, message: String| ProseError { file: place.file, line, message };
    let Some((line, region)) = find(place.region, text) else {
        return vec![error(0, format!("{} is not found (looked for {:?})", place.what, place.region))];
    };
    let lower = region.to_lowercase();
    let mut errors = Vec::new();
    for tool in tools {
        if !lower.contains(&tool.prose.to_lowercase()) && !lower.contains(&tool.name.to_lowercase()) {
            errors.push(error(
                line,
                format!(
                    "{} does not name the tool {} ({:?} in TOOLS, xtask/src/provision/mod.rs): say that it is \
                     installed, or remove it from TOOLS",
                    place.what, tool.prose, tool.name
                ),
            ));
        }
    }
    for dir in tool_dirs(&region) {
        if !tools.iter().any(|t| t.dir == dir) {
            errors.push(error(
                line,
                format!(
                    "{} names target/{dir}, the directory of no tool in TOOLS (xtask/src/provision/mod.rs): \
                     remove it, or add its tool to TOOLS",
                    place.what
                ),
            ));
        }
    }
    for name in listed_names(&region, tools) {
        errors.push(error(
            line,
            format!(
                "{} names {name} among the tools, the name of no tool in TOOLS (xtask/src/provision/mod.rs): \
                 remove it, or add its tool to TOOLS",
                place.what
            ),
        ));
    }
    for name in emulators(&region) {
        if !tools.iter().any(|t| t.prose == name) {
            errors.push(error(
                line,
                format!(
                    "{} names the {name}, the prose name of no tool in TOOLS (xtask/src/provision/mod.rs): \
                     remove it, or add its tool to TOOLS",
                    place.what
                ),
            ));
        }
    }
    errors
}

/// The 1-based first line and the text of `region` in `text`.
fn find(region: Region, text: &str) -> Option<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let (start, end) = match region {
        Region::Paragraph { containing } => {
            let hit = lines.iter().position(|l| l.contains(containing))?;
            let start = lines[..hit].iter().rposition(|l| l.trim().is_empty()).map_or(0, |b| b + 1);
            let end = lines[hit..].iter().position(|l| l.trim().is_empty()).map_or(lines.len(), |n| hit + n);
            (start, end)
        }
        Region::FirstTable => {
            let start = lines.iter().position(|l| l.starts_with('|'))?;
            let n = lines[start..].iter().take_while(|l| l.starts_with('|')).count();
            (start, start + n)
        }
        Region::LeadingComment => {
            let start = usize::from(lines.first().is_some_and(|l| l.starts_with("#!")));
            let n = lines[start..].iter().take_while(|l| l.starts_with('#')).count();
            if n == 0 {
                return None;
            }
            (start, start + n)
        }
        Region::HelpEntry { command } => {
            let is_entry = |l: &str| l.starts_with("  ") && !l[2..].starts_with(' ');
            let start = lines.iter().position(|l| is_entry(l) && l[2..].starts_with(command))?;
            let n = lines[start + 1..].iter().take_while(|l| !is_entry(l) && !l.trim().is_empty()).count();
            (start, start + 1 + n)
        }
    };
    Some((start + 1, lines[start..end].join("\n")))
}

/// The directories under `target/` in `text` that look like a tool's: `tensora-remote-…` or ending
/// in `venv`, with one level of braces expanded (`target/tensora-remote-{s3rver,azurite}`).
fn tool_dirs(text: &str) -> Vec<String> {
    let mut dirs = Vec::new();
    for (at, _) in text.match_indices("target/") {
        let rest = &text[at + "target/".len()..];
        let len =
            rest.find(|c: char| !(c.is_ascii_alphanumeric() || "-_.{},".contains(c))).unwrap_or(rest.len());
        let spelled = rest[..len].trim_end_matches(['.', ',']);
        for dir in expand_braces(spelled) {
            if dir.starts_with("tensora-remote-") || dir.ends_with("venv") {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// `a{b,c}d` as `abd`, `acd`; a name without (balanced) braces as itself.
fn expand_braces(name: &str) -> Vec<String> {
    match (name.find('{'), name.find('}')) {
        (Some(open), Some(close)) if open < close => {
            let (head, tail) = (&name[..open], &name[close + 1..]);
            name[open + 1..close].split(',').map(|alt| format!("{head}{alt}{tail}")).collect()
        }
        _ => vec![name.to_owned()],
    }
}

/// The plain names that `text` lists among tools but that name none of `tools`. A list is a run of
/// comma-separated items in one clause (clauses end at `.`, `:`, `;`, a table cell's `|`, and a
/// parenthesis, whose content is clauses of its own), up to the item its `and` starts; a list
/// names tools when two of its items or more each contain a tool's prose name, name or directory.
/// In such a list, an item that is one word, after an article and before a version
/// (`the minio`, `` `minio` ``, `minio 2024.1.1`), is a plain name; longer items (`system
/// packages`) are prose.
fn listed_names(text: &str, tools: &[Tool]) -> Vec<String> {
    let names_a_tool = |item: &str| {
        let lower = item.to_lowercase();
        tools.iter().any(|t| [t.prose, t.name, t.dir].iter().any(|n| lower.contains(&n.to_lowercase())))
    };
    let mut names = Vec::new();
    for clause in clauses(text) {
        let items = list_items(&clause);
        if items.iter().filter(|i| names_a_tool(i)).count() < 2 {
            continue;
        }
        names.extend(items.iter().filter(|i| !names_a_tool(i)).filter_map(|i| plain_name(i)));
    }
    names
}

/// `text`'s clauses: each line's leading `#` (a script comment) dropped, lines joined, the content
/// of each parenthesis taken out as clauses of its own, the rest split at `.` before a space,
/// `:`, `;` and `|`.
fn clauses(text: &str) -> Vec<String> {
    let joined: Vec<&str> = text.lines().map(|l| l.trim().trim_start_matches('#').trim()).collect();
    let joined = joined.join(" ");
    // Parentheses nest: each level's text apart, the outermost (depth 0) first.
    let mut levels: Vec<String> = vec![String::new()];
    let mut parts: Vec<String> = Vec::new();
    for c in joined.chars() {
        match c {
            '(' => levels.push(String::new()),
            ')' if levels.len() > 1 => parts.extend(levels.pop()),
            _ => levels.last_mut().map_or((), |l| l.push(c)),
        }
    }
    parts.extend(levels);
    let mut clauses = Vec::new();
    for part in &parts {
        let spaced = part.replace(". ", ";");
        clauses.extend(spaced.split([':', ';', '|']).map(|c| c.trim().trim_end_matches('.').to_owned()));
    }
    clauses
}

/// The items of the list in `clause`: split at commas, up to and with the item after its first
/// `and` (what follows is no longer the list: `…, A and B under target/, cached`).
fn list_items(clause: &str) -> Vec<String> {
    let mut items = Vec::new();
    for item in clause.split(',') {
        let padded = format!(" {} ", item.trim());
        if let Some(at) = padded.find(" and ") {
            items.push(padded[..at].trim().to_owned());
            items.push(padded[at + " and ".len()..].trim().to_owned());
            break;
        }
        items.push(item.trim().to_owned());
    }
    items.retain(|i| !i.is_empty());
    items
}

/// The name `item` is when it is one word: backticks, a leading article and a trailing version
/// (`2024.1.1`, `v2`, `@1.2`, `==1.2`) aside, no space and no `/`, with a letter.
fn plain_name(item: &str) -> Option<String> {
    let mut words: Vec<&str> = item.split_whitespace().map(|w| w.trim_matches('`')).collect();
    if words.len() > 1 && ["the", "a", "an", "one"].contains(&words[0].to_lowercase().as_str()) {
        words.remove(0);
    }
    let is_version = |w: &str| w.trim_start_matches('v').starts_with(|c: char| c.is_ascii_digit());
    if words.len() == 2 && is_version(words[1]) {
        words.pop();
    }
    let [word] = words[..] else { return None };
    let name = word.split(['@', '=']).next().unwrap_or(word);
    let plain = name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.chars().any(|c| c.is_ascii_alphabetic());
    plain.then(|| name.to_owned())
}

/// Every `X emulator` in `text` (`X` the word before it, `GCS emulator`).
fn emulators(text: &str) -> Vec<String> {
    text.match_indices(" emulator")
        .filter_map(|(at, _)| {
            let word = text[..at].rsplit(|c: char| c.is_whitespace() || c == '(').next()?;
            (!word.is_empty()).then(|| format!("{word} emulator"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(place: &Place, text: &str, tools: &[Tool]) -> Vec<String> {
        check_place(place, text, tools).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_real_places_name_every_tool_and_no_other() {
        let errors = check(&crate::workspace_root()).unwrap();
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(errors.is_empty(), "{}", shown.join("\n"));
    }

    #[test]
    fn a_tool_left_out_of_each_real_place_fails_there() {
        let root = crate::workspace_root();
        for place in &PLACES {
            let real = std::fs::read_to_string(root.join(place.file)).unwrap();
            let (line, region) = find(place.region, &real).unwrap();
            // The place with every mention of Azurite taken out of it (the rest of the file kept).
            let cut = region.replace(",azurite", "").replace("Azurite", "");
            assert!(!cut.to_lowercase().contains("azurite"), "{}: {cut}", place.file);
            let text = real.replacen(&region, &cut, 1);
            assert_eq!(
                messages(place, &text, &TOOLS),
                [format!(
                    "{}:{line}: {} does not name the tool Azurite (\"azurite\" in TOOLS, xtask/src/provision/mod.rs): \
                     say that it is installed, or remove it from TOOLS",
                    place.file, place.what
                )],
                "{}",
                place.file
            );
        }
    }

    #[test]
    fn a_tool_named_in_the_prose_but_not_in_tools_fails() {
        let gcs = TOOLS.iter().position(|t| t.name == "gcp-storage-emulator").unwrap();
        let mut fewer = TOOLS.to_vec();
        fewer.remove(gcs);
        let root = crate::workspace_root();
        let table = &PLACES[1];
        let real = std::fs::read_to_string(root.join(table.file)).unwrap();
        let line = find(table.region, &real).unwrap().0;
        assert_eq!(
            messages(table, &real, &fewer),
            [format!(
                "docs/fresh-machine.md:{line}: the tool table names target/tensora-remote-gcs, the directory of no tool in \
                 TOOLS (xtask/src/provision/mod.rs): remove it, or add its tool to TOOLS"
            )]
        );
        let readme = &PLACES[0];
        let real = std::fs::read_to_string(root.join(readme.file)).unwrap();
        let line = find(readme.region, &real).unwrap().0;
        assert_eq!(
            messages(readme, &real, &fewer),
            [format!(
                "README.md:{line}: the provisioning paragraph names the GCS emulator, the prose name of no tool in \
                 TOOLS (xtask/src/provision/mod.rs): remove it, or add its tool to TOOLS"
            )]
        );
    }

    /// A plain name among the tools a place lists, such as a retired `minio`, fails there, with or
    /// without a version, in every place's spelling of its list.
    #[test]
    fn a_plain_name_listed_among_the_tools_fails() {
        let root = crate::workspace_root();
        let inserted = [
            (&PLACES[0], "Then it installs s3rver, Azurite,", "Then it installs s3rver, minio, Azurite,"),
            (
                &PLACES[1],
                "| s3rver 3.7.1, Azurite 3.35.0 |",
                "| s3rver 3.7.1, Azurite 3.35.0, minio 2024.1.1 |",
            ),
            (&PLACES[2], "s3rver, Azurite, the GCS emulator,", "s3rver, Azurite, `minio`, the GCS emulator,"),
            (&PLACES[3], "s3rver,", "s3rver, minio,"),
        ];
        for (place, real, with_minio) in inserted {
            let text = std::fs::read_to_string(root.join(place.file)).unwrap();
            let (line, region) = find(place.region, &text).unwrap();
            assert!(region.contains(real), "{}: {real:?} is not in {region}", place.file);
            let text = text.replacen(real, with_minio, 1);
            assert_eq!(
                messages(place, &text, &TOOLS),
                [format!(
                    "{}:{line}: {} names minio among the tools, the name of no tool in TOOLS \
                     (xtask/src/provision/mod.rs): remove it, or add its tool to TOOLS",
                    place.file, place.what
                )],
                "{}",
                place.file
            );
        }
    }

    #[test]
    fn lists_end_with_their_and_and_only_one_word_items_are_names() {
        assert_eq!(list_items("x, A, B and C under target/, cached"), ["x", "A", "B", "C under target/"]);
        assert_eq!(list_items("A and, without B, C"), ["A"]);
        for (item, name) in [("the minio", "minio"), ("`minio` 2024.1.1", "minio"), ("minio@1.2", "minio")] {
            assert_eq!(plain_name(item).as_deref(), Some(name), "{item}");
        }
        for prose in ["system packages", "`target/x`", "3.7.1", "the GCS emulator"] {
            assert_eq!(plain_name(prose), None, "{prose}");
        }
        // A package list in parentheses is a clause of its own (no tool in it); a name after the
        // list's `and` is in it.
        assert_eq!(listed_names("installs s3rver, Azurite (torch, numpy) and curl", &TOOLS), ["curl"]);
        assert!(listed_names("installs curl, npm and s3rver", &TOOLS).is_empty(), "one tool: no tool list");
    }

    #[test]
    fn regions_end_where_their_kind_ends() {
        let text = "intro\n\nfirst line `cargo xtask provision`\nsecond\n\nafter s3rver\n";
        let found = find(Region::Paragraph { containing: "`cargo xtask provision`" }, text);
        assert_eq!(found, Some((3, "first line `cargo xtask provision`\nsecond".to_owned())));
        let script = "#!/usr/bin/env bash\n# one\n# two\nset -e\n# later\n";
        assert_eq!(find(Region::LeadingComment, script), Some((2, "# one\n# two".to_owned())));
        let help = "  test   a\n  provision [--python] b\n                       c\n  selfcheck  d\n";
        let entry = find(Region::HelpEntry { command: "provision " }, help);
        assert_eq!(entry, Some((2, "  provision [--python] b\n                       c".to_owned())));
        let doc = "text\n| a | b |\n|---|---|\n\n| other |\n";
        assert_eq!(find(Region::FirstTable, doc), Some((2, "| a | b |\n|---|---|".to_owned())));
        assert_eq!(find(Region::FirstTable, "no table\n"), None);
    }

    #[test]
    fn a_missing_place_is_a_mistake_not_a_pass() {
        let errors = messages(&PLACES[1], "no table here\n", &TOOLS);
        assert_eq!(errors, ["docs/fresh-machine.md:0: the tool table is not found (looked for FirstTable)"]);
    }

    #[test]
    fn braces_expand_and_other_target_paths_are_not_tools() {
        let dirs = tool_dirs("`target/tensora-remote-{s3rver,azurite}`, target/py-venv. target/release/x");
        assert_eq!(dirs, ["tensora-remote-s3rver", "tensora-remote-azurite", "py-venv"]);
        assert_eq!(emulators("the GCS emulator and (Azure emulator"), ["GCS emulator", "Azure emulator"]);
    }
}
