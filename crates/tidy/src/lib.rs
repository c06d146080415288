//! Reading the workspace's Rust sources for the house rules that `cargo
//! test` checks (`tests/it`): which files there are and of which crate,
//! their code with comments and string contents blanked, the functions in
//! them with their lengths, and the modules each top-level module of a
//! crate refers to. A rough reader, not a parser: it knows braces, comments
//! and string literals, which is all the rules need.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The workspace's root folder.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// Where a file sits in its crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// `src/`, not a test module file.
    Source,
    /// `src/**/tests.rs` (a `#[cfg(test)] mod tests;`), `tests/`,
    /// `benches/` or `examples/`.
    Test,
}

/// One Rust source file of the workspace.
#[derive(Debug)]
pub struct SourceFile {
    /// The path from the workspace root, with `/` separators.
    pub path: String,
    /// The crate's folder name under `crates/`.
    pub krate: String,
    pub place: Place,
    pub text: String,
}

impl SourceFile {
    /// The code with comments removed and string and character literals
    /// emptied, line for line (so line numbers stay).
    pub fn code(&self) -> String {
        strip(&self.text)
    }

    /// Lines (1-based, inclusive) of `#[cfg(test)]` items in this file.
    pub fn test_lines(&self) -> Vec<(usize, usize)> {
        let code = self.code();
        let lines: Vec<&str> = code.lines().collect();
        let mut spans = Vec::new();
        for (index, line) in lines.iter().enumerate() {
            if line.trim() == "#[cfg(test)]" {
                if let Some(end) = item_end(&lines, index + 1) {
                    spans.push((index + 1, end + 1));
                }
            }
        }
        spans
    }
}

/// Every Rust file under `crates/*/{src,tests,benches,examples}`, sorted.
pub fn rust_files() -> Vec<SourceFile> {
    let root = workspace_root();
    let mut files = Vec::new();
    let mut crates: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .expect("crates/ is readable")
        .map(|entry| entry.expect("a folder entry").path())
        .filter(|path| path.join("Cargo.toml").exists())
        .collect();
    crates.sort();
    for folder in crates {
        let krate = folder
            .file_name()
            .and_then(|name| name.to_str())
            .expect("a crate folder name")
            .to_string();
        for (part, place) in [
            ("src", Place::Source),
            ("tests", Place::Test),
            ("benches", Place::Test),
            ("examples", Place::Test),
        ] {
            let mut paths = Vec::new();
            collect(&folder.join(part), &mut paths);
            paths.sort();
            for path in paths {
                let relative = path
                    .strip_prefix(&root)
                    .expect("under the root")
                    .to_string_lossy()
                    .replace('\\', "/");
                let test_file = path.file_name().is_some_and(|name| name == "tests.rs");
                files.push(SourceFile {
                    path: relative,
                    krate: krate.clone(),
                    place: if test_file { Place::Test } else { place },
                    text: fs::read_to_string(&path).expect("a readable source file"),
                });
            }
        }
    }
    files
}

fn collect(folder: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(folder) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// `text` with comments removed and the contents of string and character
/// literals blanked; newlines are kept so line numbers stay.
pub fn strip(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut index = 0;
    while index < bytes.len() {
        let rest = &text[index..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            index += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |at| at + 2);
            out.extend(rest[..end].chars().filter(|c| *c == '\n'));
            index += end;
        } else if let Some(length) = raw_string_length(rest) {
            out.push_str("\"\"");
            out.extend(rest[..length].chars().filter(|c| *c == '\n'));
            index += length;
        } else if rest.starts_with('"') {
            let length = quoted_length(rest, b'"');
            out.push_str("\"\"");
            out.extend(rest[..length].chars().filter(|c| *c == '\n'));
            index += length;
        } else if let Some(length) = char_literal_length(rest) {
            out.push_str("' '");
            index += length;
        } else {
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            index += c.len_utf8();
        }
    }
    out
}

/// The length of a raw string literal (`r"..."`, `r#"..."#`, `br"..."`)
/// at the start of `text`.
fn raw_string_length(text: &str) -> Option<usize> {
    let start = if text.starts_with("br") {
        2
    } else if text.starts_with('r') {
        1
    } else {
        return None;
    };
    let hashes = text[start..].bytes().take_while(|b| *b == b'#').count();
    if text.as_bytes().get(start + hashes) != Some(&b'"') {
        return None;
    }
    let closing = format!("\"{}", "#".repeat(hashes));
    let body = start + hashes + 1;
    text[body..]
        .find(&closing)
        .map(|at| body + at + closing.len())
}

fn quoted_length(text: &str, quote: u8) -> usize {
    let bytes = text.as_bytes();
    let mut index = 1;
    while index < bytes.len() {
        match bytes[index] {
            b'\\' => index += 2,
            b if b == quote => return index + 1,
            _ => index += 1,
        }
    }
    bytes.len()
}

/// A character literal (`'a'`, `'\n'`, `'\''`) at the start of `text`;
/// `None` for a lifetime or label.
fn char_literal_length(text: &str) -> Option<usize> {
    let mut chars = text.char_indices();
    if chars.next()?.1 != '\'' {
        return None;
    }
    let (_, first) = chars.next()?;
    if first == '\\' {
        let length = quoted_length(text, b'\'');
        return (length <= 12).then_some(length);
    }
    let (at, next) = chars.next()?;
    (next == '\'').then_some(at + 1)
}

/// The index of the line that closes the item starting at `start` (the
/// first line at or after it whose braces balance back to zero).
fn item_end(lines: &[&str], start: usize) -> Option<usize> {
    let mut depth = 0i64;
    let mut opened = false;
    for (index, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                ';' if !opened && depth == 0 => return Some(index),
                _ => {}
            }
        }
        if opened && depth == 0 {
            return Some(index);
        }
    }
    None
}

/// A function with a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    pub name: String,
    /// The line of its `fn` (1-based).
    pub line: usize,
    /// From the `fn` line to the closing brace, inclusive.
    pub lines: usize,
}

/// The functions with bodies in `code` (already [`strip`]ped), nested
/// ones included.
pub fn functions(code: &str) -> Vec<Function> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        let Some(end) = item_end(&lines, index) else {
            continue;
        };
        let body = lines[index..=end].iter().any(|l| l.contains('{'));
        if body {
            found.push(Function {
                name,
                line: index + 1,
                lines: end - index + 1,
            });
        }
    }
    found
}

/// The name of the function whose signature starts on `line`.
fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(word) = words.next() {
        let qualifier = word.starts_with("pub")
            || matches!(word, "async" | "const" | "unsafe" | "extern" | "default")
            || word.starts_with('"');
        if word == "fn" {
            let next = words.next()?;
            let name: String = next
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            return (!name.is_empty()).then_some(name);
        }
        if !qualifier {
            return None;
        }
    }
    None
}

/// The top-level module a file of `krate`'s `src/` belongs to (`lib` for
/// `src/lib.rs`, `a` for `src/a.rs` and `src/a/**`).
pub fn top_module(path: &str) -> String {
    let inside = path.split("/src/").nth(1).unwrap_or(path);
    let first = inside.split('/').next().unwrap_or(inside);
    first.trim_end_matches(".rs").to_string()
}

/// For each top-level module of a crate's `src/`, the other top-level
/// modules its code names through `crate::`. Names of items that `lib.rs`
/// re-exports (`pub use a::Item`) count as naming the module that holds
/// them.
pub fn module_references(files: &[&SourceFile]) -> BTreeMap<String, BTreeSet<String>> {
    let mut exported: BTreeMap<String, String> = BTreeMap::new();
    for file in files.iter().filter(|f| top_module(&f.path) == "lib") {
        for statement in file.code().split(';') {
            let statement = statement.trim();
            let Some(rest) = statement
                .strip_prefix("pub use ")
                .or_else(|| statement.strip_prefix("pub(crate) use "))
            else {
                continue;
            };
            let Some((module, items)) = rest.split_once("::") else {
                continue;
            };
            for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
                let name = item.split_whitespace().last().unwrap_or("");
                if !name.is_empty() {
                    exported.insert(name.to_string(), module.trim().to_string());
                }
            }
        }
    }
    let mut references: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let from = top_module(&file.path);
        let entry = references.entry(from.clone()).or_default();
        for name in crate_paths(&file.code()) {
            let to = exported.get(&name).cloned().unwrap_or(name);
            if to != from && to != "lib" {
                entry.insert(to);
            }
        }
    }
    references
}

/// The first segment of every `crate::` path in `code`, grouped imports
/// (`crate::{a::X, b}`) included.
fn crate_paths(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = matching_brace(group);
            for part in split_top(&group[..end]) {
                let name = identifier(part.trim());
                if !name.is_empty() {
                    names.push(name);
                }
            }
        } else {
            let name = identifier(rest);
            if !name.is_empty() {
                names.push(name);
            }
        }
    }
    names
}

fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn matching_brace(text: &str) -> usize {
    let mut depth = 1;
    for (index, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return index;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// `text` split at the commas outside braces.
fn split_top(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (index, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// A cycle in `graph` (the modules on it, the first again at the end), if
/// there is one.
pub fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(cycle);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_strings_are_blanked_and_lines_kept() {
        let text =
            "let a = \"{ // }\"; // a { comment\n/* {\n} */ let b = '{';\nlet c = r#\"}\"#;\n";
        let code = strip(text);
        assert_eq!(code.lines().count(), text.lines().count());
        assert!(!code.contains("comment"));
        assert_eq!(code.matches('{').count(), 0, "{code}");
        assert_eq!(code.matches('}').count(), 0, "{code}");
    }

    #[test]
    fn functions_are_measured_from_fn_to_closing_brace() {
        let code = strip("pub(crate) async fn a(x: u8) -> u8 {\n    x\n}\n\nfn b();\nfn c<'a>(s: &'a str) {\n}\n");
        let found = functions(&code);
        let names: Vec<(&str, usize)> = found.iter().map(|f| (f.name.as_str(), f.lines)).collect();
        assert_eq!(names, vec![("a", 3), ("c", 2)]);
    }

    #[test]
    fn grouped_crate_imports_and_reexports_name_their_modules() {
        let lib = SourceFile {
            path: "crates/x/src/lib.rs".into(),
            krate: "x".into(),
            place: Place::Source,
            text: "mod a;\nmod b;\npub use a::{Alpha, Beta};\n".into(),
        };
        let b = SourceFile {
            path: "crates/x/src/b/inner.rs".into(),
            krate: "x".into(),
            place: Place::Source,
            text: "use crate::{Alpha, c::{D, E}};\n// crate::z\n".into(),
        };
        let graph = module_references(&[&lib, &b]);
        let named: Vec<&String> = graph["b"].iter().collect();
        assert_eq!(named, vec!["a", "c"]);
    }

    #[test]
    fn a_cycle_is_found_and_a_tree_has_none() {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        graph.insert("a".into(), ["b".to_string()].into());
        graph.insert("b".into(), ["c".to_string()].into());
        graph.insert("c".into(), BTreeSet::new());
        assert_eq!(find_cycle(&graph), None);
        graph.insert("c".into(), ["a".to_string()].into());
        assert_eq!(
            find_cycle(&graph),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
    }
}
