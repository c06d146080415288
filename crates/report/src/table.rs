//! Text tables for the terminal, with CSV and JSON renderings of the same cells.
//!
//! Benchmarks build one `Table` and emit it three ways, so the printed numbers,
//! the CSV a spreadsheet opens and the JSON a script reads can never disagree.

use std::io;
use std::path::Path;

/// A titled table of string cells with a fixed set of columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    title: String,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// How a column's cells line up: numbers on the right so digits align, text on the left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alignment {
    Left,
    Right,
}

impl Table {
    /// Creates an empty table with a title and column headers.
    pub fn new(title: impl Into<String>, columns: &[&str]) -> Table {
        Table {
            title: title.into(),
            columns: columns.iter().map(|column| column.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    ///
    /// # Panics
    ///
    /// Panics when the number of cells differs from the number of columns,
    /// because that is a bug in the benchmark rather than a runtime condition.
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(
            cells.len(),
            self.columns.len(),
            "table {:?}: row has {} cells but the table has {} columns {:?}",
            self.title,
            cells.len(),
            self.columns.len(),
            self.columns
        );
        self.rows.push(cells);
    }

    /// The table's title.
    pub fn title(&self) -> &str {
        &self.title
    }

    /// The column headers.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The rows added so far.
    pub fn rows(&self) -> &[Vec<String>] {
        &self.rows
    }

    /// Renders the table as aligned text: title, header, separator line, then rows.
    pub fn render(&self) -> String {
        let widths = self.column_widths();
        let alignments: Vec<Alignment> = (0..self.columns.len())
            .map(|index| self.column_alignment(index))
            .collect();
        let mut text = String::new();
        text.push_str(&self.title);
        text.push('\n');
        push_line(&mut text, &self.columns, &widths, &alignments);
        let separators: Vec<String> = widths.iter().map(|width| "-".repeat(*width)).collect();
        push_line(&mut text, &separators, &widths, &alignments);
        for row in &self.rows {
            push_line(&mut text, row, &widths, &alignments);
        }
        text
    }

    /// Renders the header and rows as CSV, quoting cells as RFC 4180 requires.
    pub fn to_csv(&self) -> String {
        let mut text = String::new();
        for line in std::iter::once(&self.columns).chain(self.rows.iter()) {
            let cells: Vec<String> = line.iter().map(|cell| quote_csv_cell(cell)).collect();
            text.push_str(&cells.join(","));
            text.push_str("\r\n");
        }
        text
    }

    /// Writes the CSV rendering to `path`, creating parent folders as needed.
    pub fn write_csv(&self, path: &Path) -> io::Result<()> {
        crate::write_file_atomically(path, self.to_csv().as_bytes())
    }

    /// Returns `{"title": ..., "columns": [...], "rows": [[...], ...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
        })
    }

    /// The display width of each column: the widest of its header and cells.
    fn column_widths(&self) -> Vec<usize> {
        (0..self.columns.len())
            .map(|index| {
                std::iter::once(&self.columns[index])
                    .chain(self.rows.iter().map(|row| &row[index]))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// A column is numeric when at least one cell is a number and none is plain text.
    fn column_alignment(&self, index: usize) -> Alignment {
        let mut saw_number = false;
        for row in &self.rows {
            match classify_cell(&row[index]) {
                CellKind::Number => saw_number = true,
                CellKind::Text => return Alignment::Left,
                CellKind::Neutral => {}
            }
        }
        if saw_number {
            Alignment::Right
        } else {
            Alignment::Left
        }
    }
}

/// Appends one line of padded cells separated by two spaces, without trailing blanks.
fn push_line(text: &mut String, cells: &[String], widths: &[usize], alignments: &[Alignment]) {
    let mut line = String::new();
    for (index, cell) in cells.iter().enumerate() {
        if index > 0 {
            line.push_str("  ");
        }
        let padding = " ".repeat(widths[index].saturating_sub(cell.chars().count()));
        match alignments[index] {
            Alignment::Left => {
                line.push_str(cell);
                line.push_str(&padding);
            }
            Alignment::Right => {
                line.push_str(&padding);
                line.push_str(cell);
            }
        }
    }
    text.push_str(line.trim_end());
    text.push('\n');
}

/// What a cell says about its column's alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CellKind {
    Number,
    Text,
    /// Placeholders such as "", "-" or "NaN" appear in numeric columns and should not flip them to text.
    Neutral,
}

/// Classifies a cell, accepting numbers with a unit suffix such as "12.5ms", "3%" or "40k/s".
fn classify_cell(cell: &str) -> CellKind {
    let trimmed = cell.trim();
    let lowercase = trimmed.to_ascii_lowercase();
    if matches!(
        lowercase.as_str(),
        "" | "-" | "n/a" | "nan" | "inf" | "-inf" | "+inf"
    ) {
        return CellKind::Neutral;
    }
    let numeric_part = trimmed.trim_end_matches(|character: char| {
        character.is_alphabetic() || matches!(character, '%' | '/' | 'µ' | '×')
    });
    let numeric_part = numeric_part.trim_end().replace('_', "");
    let starts_like_number = numeric_part
        .chars()
        .next()
        .is_some_and(|first| first.is_ascii_digit() || matches!(first, '-' | '+' | '.'));
    if starts_like_number && numeric_part.parse::<f64>().is_ok() {
        CellKind::Number
    } else {
        CellKind::Text
    }
}

/// Quotes a CSV cell when it contains a comma, quote, or line break, doubling inner quotes.
fn quote_csv_cell(cell: &str) -> String {
    if cell.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", cell.replace('"', "\"\""))
    } else {
        cell.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_table() -> Table {
        let mut table = Table::new("Append latency", &["mode", "ops", "p99"]);
        table.row(vec!["fsync".into(), "1200".into(), "3.5ms".into()]);
        table.row(vec!["group commit".into(), "98000".into(), "-".into()]);
        table
    }

    #[test]
    fn render_right_aligns_numbers_and_left_aligns_text() {
        let rendered = sample_table().render();
        let lines: Vec<&str> = rendered.lines().collect();
        assert_eq!(lines[0], "Append latency");
        assert_eq!(lines[1], "mode            ops    p99");
        assert_eq!(lines[2], "------------  -----  -----");
        assert_eq!(lines[3], "fsync          1200  3.5ms");
        assert_eq!(lines[4], "group commit  98000      -");
    }

    #[test]
    fn csv_quotes_cells_with_commas_quotes_and_newlines() {
        let mut table = Table::new("quoting", &["name", "note"]);
        table.row(vec!["a,b".into(), "say \"hi\"".into()]);
        table.row(vec!["two\nlines".into(), "plain".into()]);
        let csv = table.to_csv();
        assert_eq!(
            csv,
            "name,note\r\n\"a,b\",\"say \"\"hi\"\"\"\r\n\"two\nlines\",plain\r\n"
        );
    }

    #[test]
    fn json_lists_title_columns_and_rows() {
        let json = sample_table().to_json();
        assert_eq!(json["title"], "Append latency");
        assert_eq!(json["columns"][2], "p99");
        assert_eq!(json["rows"][1][0], "group commit");
    }

    #[test]
    #[should_panic(expected = "row has 1 cells but the table has 3 columns")]
    fn row_with_the_wrong_number_of_cells_panics() {
        sample_table().row(vec!["only one".into()]);
    }

    #[test]
    fn cells_with_units_count_as_numbers() {
        assert_eq!(classify_cell("12.5ms"), CellKind::Number);
        assert_eq!(classify_cell("40k/s"), CellKind::Number);
        assert_eq!(classify_cell("-3%"), CellKind::Number);
        assert_eq!(classify_cell("v1"), CellKind::Text);
        assert_eq!(classify_cell("NaN"), CellKind::Neutral);
    }

    #[test]
    fn write_csv_writes_the_csv_text() {
        let path = std::env::temp_dir()
            .join(format!("report-csv-{}", std::process::id()))
            .join("table.csv");
        sample_table().write_csv(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            sample_table().to_csv()
        );
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
