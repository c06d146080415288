//! The house rules, checked on every `cargo test`: each test reads the
//! workspace's sources (see the `tidy` library) and names every place that
//! breaks its rule.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use tidy::{find_cycle, functions, module_references, rust_files, Place, SourceFile};

/// Crates that are programs or tools rather than libraries: the binary
/// (its output is its job) and the experiments (their tables are the
/// binary's output; errors there are `anyhow`'s, as in the binary).
const TOOL_CRATES: [&str; 2] = ["cli", "bench"];

/// A function longer than this must be listed in `long-functions.txt`.
const FUNCTION_LINES_MAX: usize = 70;

/// A library file longer than this is a folder waiting to happen.
const FILE_LINES_MAX: usize = 1_000;

fn library_code(file: &SourceFile) -> Option<Vec<(usize, String)>> {
    if file.place != Place::Source || TOOL_CRATES.contains(&file.krate.as_str()) {
        return None;
    }
    Some(outside_tests(file))
}

/// The file's code lines (1-based numbers) outside `#[cfg(test)]` items.
fn outside_tests(file: &SourceFile) -> Vec<(usize, String)> {
    let spans = file.test_lines();
    file.code()
        .lines()
        .enumerate()
        .map(|(index, line)| (index + 1, line.to_string()))
        .filter(|(number, _)| !spans.iter().any(|(a, b)| (a..=b).contains(&number)))
        .collect()
}

#[test]
fn every_module_opens_with_a_doc_line() {
    let missing: Vec<String> = rust_files()
        .into_iter()
        .filter(|file| !file.text.starts_with("//!"))
        .map(|file| file.path)
        .collect();
    assert!(
        missing.is_empty(),
        "files that do not open with a `//!` line: {missing:#?}"
    );
}

#[test]
fn library_crates_do_not_print() {
    let mut found = Vec::new();
    for file in rust_files() {
        let Some(lines) = library_code(&file) else {
            continue;
        };
        for (number, line) in lines {
            for mac in ["println!", "eprintln!", "print!", "eprint!", "dbg!"] {
                let at = line.find(mac);
                let whole = at.is_some_and(|at| {
                    !line[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
                });
                if whole {
                    found.push(format!("{}:{number}: {}", file.path, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "library crates log through `tracing`, not by printing: {found:#?}"
    );
}

#[test]
fn library_crates_return_typed_errors() {
    let mut found = Vec::new();
    for file in rust_files() {
        let Some(lines) = library_code(&file) else {
            continue;
        };
        let code: String = lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        let code: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
        for signature in string_errors(&code) {
            found.push(format!("{}: {signature}", file.path));
        }
    }
    assert!(
        found.is_empty(),
        "library crates return `thiserror` types, not `String`: {found:#?}"
    );
}

/// Every `Result<_, String>` and `type Err = String` in `code`.
fn string_errors(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("Result<") {
        let generics = &rest[at + "Result<".len()..];
        let mut depth = 1;
        let mut last_comma = None;
        let mut end = generics.len();
        for (index, c) in generics.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => {
                    depth -= 1;
                    if depth == 0 {
                        end = index;
                        break;
                    }
                }
                ',' if depth == 1 => last_comma = Some(index),
                _ => {}
            }
        }
        if let Some(comma) = last_comma {
            if generics[comma + 1..end].trim() == "String" {
                found.push(format!("Result<{}>", &generics[..end]));
            }
        }
        rest = &rest[at + "Result<".len()..];
    }
    if code.contains("type Err = String") {
        found.push("type Err = String".to_string());
    }
    found
}

#[test]
fn functions_stay_within_the_ratchet() {
    let listed = read_ratchet();
    let mut measured: BTreeMap<String, usize> = BTreeMap::new();
    for file in rust_files() {
        if file.place != Place::Source {
            continue;
        }
        let spans = file.test_lines();
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for function in functions(&file.code()) {
            let in_test = spans
                .iter()
                .any(|(a, b)| (*a..=*b).contains(&function.line));
            let ordinal = seen.entry(function.name.clone()).or_insert(0);
            *ordinal += 1;
            if in_test || function.lines <= FUNCTION_LINES_MAX {
                continue;
            }
            let key = match *ordinal {
                1 => format!("{} {}", file.path, function.name),
                n => format!("{} {}#{n}", file.path, function.name),
            };
            measured.insert(key, function.lines);
        }
    }
    let mut problems = Vec::new();
    for (key, lines) in &measured {
        match listed.get(key) {
            None => problems.push(format!(
                "{key} has {lines} lines (more than {FUNCTION_LINES_MAX}): split it"
            )),
            Some(allowed) if lines > allowed => problems.push(format!(
                "{key} grew to {lines} lines (it may have {allowed} at most): split it"
            )),
            Some(allowed) if lines < allowed => problems.push(format!(
                "{key} shrank to {lines} lines: lower its line in long-functions.txt from {allowed}"
            )),
            Some(_) => {}
        }
    }
    for key in listed.keys().filter(|key| !measured.contains_key(*key)) {
        problems.push(format!(
            "{key} is {FUNCTION_LINES_MAX} lines or less now (or gone): remove it from long-functions.txt"
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// `long-functions.txt`: the functions over the limit today, each with the
/// lines it may keep (`<lines> <path> <name>`); `#` starts a comment.
fn read_ratchet() -> BTreeMap<String, usize> {
    let path = tidy::workspace_root().join("crates/tidy/long-functions.txt");
    let text = std::fs::read_to_string(&path).expect("long-functions.txt is readable");
    let mut listed = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (lines, key) = line.split_once(' ').expect("<lines> <path> <name>");
        let lines: usize = lines.parse().expect("a line count");
        assert!(
            listed.insert(key.to_string(), lines).is_none(),
            "{key} listed twice"
        );
    }
    listed
}

#[test]
fn no_file_of_a_crate_imports_one_that_imports_it_back() {
    let files = rust_files();
    let crates: BTreeSet<&str> = files.iter().map(|f| f.krate.as_str()).collect();
    let mut loops = Vec::new();
    for krate in crates {
        let sources: Vec<&SourceFile> = files
            .iter()
            .filter(|f| f.krate == krate && f.path.contains("/src/"))
            .collect();
        let graph = module_references(&sources);
        if let Some(cycle) = find_cycle(&graph) {
            loops.push(format!("{krate}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        loops.is_empty(),
        "modules that import each other in a loop: {loops:#?}"
    );
}

#[test]
fn no_library_file_reaches_a_thousand_lines() {
    let long: Vec<String> = rust_files()
        .into_iter()
        .filter(|f| f.place == Place::Source && !TOOL_CRATES.contains(&f.krate.as_str()))
        .filter(|f| ["engine", "server"].contains(&f.krate.as_str()))
        .filter(|f| f.text.lines().count() >= FILE_LINES_MAX)
        .map(|f| format!("{}: {} lines", f.path, f.text.lines().count()))
        .collect();
    assert!(long.is_empty(), "files to split by job: {long:#?}");
}

#[test]
fn the_engine_depends_on_no_runtime() {
    let manifest = std::fs::read_to_string(tidy::workspace_root().join("crates/engine/Cargo.toml"))
        .expect("engine's manifest");
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    let names: BTreeSet<&str> = dependencies
        .lines()
        .filter_map(|line| line.split(['.', '=', ' ']).next())
        .filter(|name| !name.is_empty())
        .collect();
    let allowed: BTreeSet<&str> = ["bytes", "crc32c", "proto", "thiserror"].into();
    assert!(
        names.is_subset(&allowed),
        "the engine is pure (no I/O, no clock, no runtime); it depends on {names:?}"
    );
}

/// ARCHITECTURE.md names a test for each invariant and a file for each
/// feature: each must exist, so the map cannot drift from the code.
#[test]
fn architecture_names_only_tests_and_files_that_exist() {
    let root = tidy::workspace_root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let files = rust_files();
    let functions: BTreeSet<String> = files
        .iter()
        .flat_map(|file| functions(&file.code()))
        .map(|function| function.name)
        .collect();
    let invariants = text
        .split("## Invariants")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("an Invariants section");
    let mut missing = Vec::new();
    let mut named = 0;
    for quoted in invariants.split('`').skip(1).step_by(2) {
        let is_test_name = quoted.len() > 20
            && quoted
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if is_test_name {
            named += 1;
            if !functions.contains(quoted) {
                missing.push(format!("test {quoted}"));
            }
        }
    }
    assert!(
        named >= 20,
        "the invariants name their tests ({named} found)"
    );
    let features = text
        .split("## Where each feature lives")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a feature table");
    for quoted in features.split('`').skip(1).step_by(2) {
        if quoted.ends_with(".rs") || quoted.ends_with('/') {
            let suffix = quoted.trim_end_matches('/');
            let found = files.iter().any(|file| {
                file.path.ends_with(suffix) || file.path.contains(&format!("{suffix}/"))
            });
            if !found {
                missing.push(format!("file {quoted}"));
            }
        }
    }
    for feature in 1..=17 {
        if !features.contains(&format!("| F{feature} ")) {
            missing.push(format!("feature F{feature}"));
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what is not there: {missing:#?}"
    );
}

/// The simulator, the crash images and the tests draw from one seeded
/// generator, `proto::Rng`: no file carries a generator of its own.
#[test]
fn one_seeded_generator_serves_the_simulator_and_the_tests() {
    let mixers = ["0xbf58476d1ce4e5b9", "0x94d049bb133111eb"];
    let copies: Vec<String> = rust_files()
        .into_iter()
        .filter(|file| file.path != "crates/proto/src/random.rs" && file.krate != "tidy")
        .filter(|file| {
            let plain = file.text.to_lowercase().replace('_', "");
            mixers.iter().any(|mixer| plain.contains(mixer))
                || plain.contains("x ^= x << 13")
                || plain.contains("self.0 ^= self.0 << 13")
        })
        .map(|file| file.path)
        .collect();
    assert!(
        copies.is_empty(),
        "use proto::Rng instead of a copy: {copies:#?}"
    );
}
