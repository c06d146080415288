//! What readers saw, judged against the logs: every delivery is a
//! committed record, in order, once.

use std::collections::BTreeMap;

use crate::{Logged, ReplicaLog, EXAMPLES_MAX};

/// Everything one reader was delivered, in delivery order. A reader that
/// reconnects or moves to another server resumes after the last version
/// it got, so one history is one ordered sequence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReaderHistory {
    /// A name for the reader, used only in the examples.
    pub reader: String,
    pub delivered: Vec<Logged>,
}

/// The verdict of [`check_reads`]; every violation count must be 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Context: records delivered, over every reader.
    pub deliveries: u64,
    /// Deliveries whose version is not the one after the reader's previous
    /// delivery (a skipped version, or one going backwards), the first
    /// delivery of each reader excepted.
    pub out_of_order: u64,
    /// Deliveries of a version the reader had already been given.
    pub repeated: u64,
    /// Deliveries whose record is not the one the logs hold at that version
    /// (another message, or a version past every log's end): the reader saw
    /// something that was never committed, or that was lost since.
    pub not_in_log: u64,
    /// The first few violations, in words.
    pub examples: Vec<String>,
}

impl ReadReport {
    pub fn is_clean(&self) -> bool {
        self.out_of_order == 0 && self.repeated == 0 && self.not_in_log == 0
    }

    fn example(&mut self, line: String) {
        if self.examples.len() < EXAMPLES_MAX {
            self.examples.push(line);
        }
    }
}

impl std::fmt::Display for ReadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} deliveries: {} out of order, {} repeated, {} not in the log",
            self.deliveries, self.out_of_order, self.repeated, self.not_in_log
        )?;
        for line in &self.examples {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

/// Judges `readers` against `logs`, the replicas' logs read back after the
/// run (the reference record of a version is the first log's that holds
/// it; whether the logs agree is [`check`](crate::check)'s question).
pub fn check_reads(readers: &[ReaderHistory], logs: &[ReplicaLog]) -> ReadReport {
    let mut reference: BTreeMap<u64, Logged> = BTreeMap::new();
    for log in logs {
        for record in &log.records {
            reference.entry(record.version).or_insert(*record);
        }
    }
    let mut report = ReadReport::default();
    for reader in readers {
        let mut previous: Option<u64> = None;
        let mut seen = std::collections::BTreeSet::new();
        for record in &reader.delivered {
            report.deliveries += 1;
            let version = record.version;
            if !seen.insert(version) {
                report.repeated += 1;
                report.example(format!(
                    "{} was given version {version} twice",
                    reader.reader
                ));
            } else if previous.is_some_and(|p| version != p + 1) {
                report.out_of_order += 1;
                report.example(format!(
                    "{} was given version {version} after {}",
                    reader.reader,
                    previous.unwrap_or_default()
                ));
            }
            previous = Some(version);
            match reference.get(&version) {
                Some(logged) if logged == record => {}
                found => {
                    report.not_in_log += 1;
                    report.example(format!(
                        "{} read version {version} as {:?}; the logs hold {:?}",
                        reader.reader,
                        record.event,
                        found.map(|l| l.event)
                    ));
                }
            }
        }
    }
    report
}
