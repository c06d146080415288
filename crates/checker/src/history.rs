//! The text form of a [`ClientHistory`], so a test or the demo can write
//! what its clients did and `stamplog check` can judge it later, in another
//! process.
//!
//! One line per event, fields separated by single spaces, numbers in
//! decimal except the client id (32 hex digits) and the digest (16 hex
//! digits):
//!
//! ```text
//! sent <client> <session> <sequence> <digest>
//! acked <client> <session> <sequence> <version> <duplicate: 0 or 1>
//! ```
//!
//! Empty lines and lines starting with `#` are ignored.

use proto::EventId;

use crate::{Acked, ClientHistory, Sent};

impl ClientHistory {
    /// The history as text lines (see the module docs).
    pub fn to_lines(&self) -> String {
        let mut text = String::with_capacity(64 * (self.sent.len() + self.acked.len()));
        for sent in &self.sent {
            let EventId {
                client,
                session,
                sequence,
            } = sent.event;
            text.push_str(&format!(
                "sent {client:032x} {session} {sequence} {:016x}\n",
                sent.digest
            ));
        }
        for acked in &self.acked {
            let EventId {
                client,
                session,
                sequence,
            } = acked.event;
            let duplicate = u8::from(acked.duplicate);
            text.push_str(&format!(
                "acked {client:032x} {session} {sequence} {} {duplicate}\n",
                acked.version
            ));
        }
        text
    }

    /// Reads text lines back; an error names the line and what is wrong.
    pub fn parse_lines(text: &str) -> Result<ClientHistory, HistoryError> {
        let mut history = ClientHistory::default();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            parse_line(line, &mut history).map_err(|problem| HistoryError {
                line: number + 1,
                problem,
                text: line.to_string(),
            })?;
        }
        Ok(history)
    }
}

/// A line of a history that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}: {text:?}")]
pub struct HistoryError {
    pub line: usize,
    pub problem: LineProblem,
    pub text: String,
}

/// What is wrong with one line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineProblem {
    #[error("{field}: {reason}")]
    Field { field: &'static str, reason: String },
    #[error("duplicate must be 0 or 1, not {0:?}")]
    Duplicate(String),
    #[error("expected `sent` with 4 fields or `acked` with 5")]
    Shape,
}

fn field(field: &'static str) -> impl Fn(std::num::ParseIntError) -> LineProblem {
    move |error| LineProblem::Field {
        field,
        reason: error.to_string(),
    }
}

fn parse_line(line: &str, history: &mut ClientHistory) -> Result<(), LineProblem> {
    let fields: Vec<&str> = line.split(' ').collect();
    let event = |fields: &[&str]| -> Result<EventId, LineProblem> {
        Ok(EventId {
            client: u128::from_str_radix(fields[1], 16).map_err(field("client id"))?,
            session: fields[2].parse().map_err(field("session"))?,
            sequence: fields[3].parse().map_err(field("sequence"))?,
        })
    };
    match fields.as_slice() {
        ["sent", _, _, _, digest] => history.sent.push(Sent {
            event: event(&fields)?,
            digest: u64::from_str_radix(digest, 16).map_err(field("digest"))?,
        }),
        ["acked", _, _, _, version, duplicate] => history.acked.push(Acked {
            event: event(&fields)?,
            version: version.parse().map_err(field("version"))?,
            duplicate: match *duplicate {
                "0" => false,
                "1" => true,
                other => return Err(LineProblem::Duplicate(other.to_string())),
            },
        }),
        _ => return Err(LineProblem::Shape),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_survives_its_text_form() {
        let event = EventId {
            client: u128::MAX - 5,
            session: 3,
            sequence: 9,
        };
        let history = ClientHistory {
            sent: vec![Sent {
                event,
                digest: 0xdead_beef,
            }],
            acked: vec![Acked {
                event,
                version: 42,
                duplicate: true,
            }],
        };
        let text = history.to_lines();
        assert_eq!(ClientHistory::parse_lines(&text), Ok(history));
    }

    #[test]
    fn a_bad_line_is_named() {
        let error = ClientHistory::parse_lines("# a comment\n\nsent 1 2 x 3\n").unwrap_err();
        assert!(error.to_string().starts_with("line 3: sequence"), "{error}");
        assert!(ClientHistory::parse_lines("acked 1 2 3 4 5\n")
            .unwrap_err()
            .to_string()
            .contains("0 or 1"));
        assert!(ClientHistory::parse_lines("received 1 2 3\n").is_err());
    }
}
