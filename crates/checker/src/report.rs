//! The checker's verdict: violation counts, context counts and examples.

use std::fmt;

/// How many examples a [`Report`] keeps: enough to start debugging a failed
/// run, few enough to print in a test failure message.
pub const EXAMPLES_MAX: usize = 10;

/// The verdict of [`check`](crate::check): one count per kind of violation
/// (the crate docs define each precisely), two context counts, and the first
/// few violations in words.
///
/// Every violation count must be 0 for a run to pass; [`Report::is_clean`]
/// says whether they all are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Acknowledged event ids missing from the log (guarantee 1).
    pub lost: u64,
    /// Event ids logged at more than one version (guarantee 3).
    pub duplicated: u64,
    /// Versions holding two different messages anywhere (guarantee 2).
    pub conflicting_versions: u64,
    /// Versions missing inside a replica's log (guarantee 2).
    pub gaps: u64,
    /// Places where a replica's log does not go up in version (guarantee 4).
    pub reordered: u64,
    /// Versions on which the replicas disagree (guarantee 2).
    pub divergent: u64,
    /// Acknowledgements whose version does not hold their message.
    pub misplaced_acks: u64,
    /// Logged messages that no client sent (event id or content).
    pub unknown_events: u64,
    /// Context, not a violation: distinct event ids the clients saw acknowledged.
    pub acknowledged: u64,
    /// Context, not a violation: distinct versions in the checked logs.
    pub logged_versions: u64,
    /// Up to [`EXAMPLES_MAX`] lines describing the first violations found,
    /// with versions, replicas and event ids, for test failure messages.
    pub examples: Vec<String>,
}

impl Report {
    /// True when every violation count is 0 (the context counts and the
    /// examples do not matter): the history meets the guarantees.
    pub fn is_clean(&self) -> bool {
        self.violations().iter().all(|(_, count)| *count == 0)
    }

    /// The violation counts with their names, in a fixed order, so callers
    /// and the printers can iterate over them.
    pub fn violations(&self) -> [(&'static str, u64); 8] {
        [
            ("lost", self.lost),
            ("duplicated", self.duplicated),
            ("conflicting_versions", self.conflicting_versions),
            ("gaps", self.gaps),
            ("reordered", self.reordered),
            ("divergent", self.divergent),
            ("misplaced_acks", self.misplaced_acks),
            ("unknown_events", self.unknown_events),
        ]
    }

    /// The counts as people read them in a table: the versions checked,
    /// then every violation with a phrase for it.
    pub fn table_rows(&self) -> [(&'static str, u64); 9] {
        [
            ("versions checked on every replica", self.logged_versions),
            ("versions the replicas disagree on", self.divergent),
            ("lost acknowledged messages", self.lost),
            ("duplicated messages in the log", self.duplicated),
            ("versions holding two messages", self.conflicting_versions),
            (
                "acks whose version holds another message",
                self.misplaced_acks,
            ),
            ("gaps in versions", self.gaps),
            ("records out of order", self.reordered),
            ("records nobody sent", self.unknown_events),
        ]
    }

    /// The report as one JSON object (counts as numbers, `clean` as a
    /// boolean, `examples` as strings), for result files and tools; written
    /// by hand so the crate needs no serde.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        out.push_str(&format!("\"clean\":{}", self.is_clean()));
        for (name, count) in self.violations() {
            out.push_str(&format!(",\"{name}\":{count}"));
        }
        out.push_str(&format!(
            ",\"acknowledged\":{},\"logged_versions\":{},\"examples\":[",
            self.acknowledged, self.logged_versions
        ));
        for (i, example) in self.examples.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_string(&mut out, example);
        }
        out.push_str("]}");
        out
    }

    /// Records one example line unless [`EXAMPLES_MAX`] are already kept.
    /// Takes a closure so the line is only formatted when it is kept.
    pub(crate) fn example(&mut self, line: impl FnOnce() -> String) {
        if self.examples.len() < EXAMPLES_MAX {
            self.examples.push(line());
        }
    }
}

fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A small table: the verdict, each violation count, the context counts,
/// then the examples, one per line. Meant for test failure messages and
/// the terminal.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.is_clean() {
            "clean"
        } else {
            "VIOLATIONS"
        };
        writeln!(f, "history check: {verdict}")?;
        for (name, count) in self.violations() {
            let mark = if count == 0 { "" } else { "  <-" };
            writeln!(f, "  {name:<22}{count:>12}{mark}")?;
        }
        writeln!(f, "  {:<22}{:>12}", "acknowledged", self.acknowledged)?;
        writeln!(f, "  {:<22}{:>12}", "logged_versions", self.logged_versions)?;
        if !self.examples.is_empty() {
            writeln!(f, "first violations:")?;
            for example in &self.examples {
                writeln!(f, "  - {example}")?;
            }
        }
        Ok(())
    }
}
