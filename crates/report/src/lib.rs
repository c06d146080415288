//! Reporting machinery for stamplog's experiments: text tables, CSV, JSON, summary statistics and PNG plots.
//!
//! Every benchmark prints a table for the terminal and leaves machine-readable files behind,
//! so the same numbers can be compared across runs and plotted without a second tool.

pub mod plot;
pub mod stats;
pub mod table;

pub use table::Table;

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `value` as pretty-printed JSON to `path`, creating parent folders as needed.
pub fn write_json(path: &Path, value: &serde_json::Value) -> io::Result<()> {
    let mut text = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    text.push('\n');
    write_file_atomically(path, text.as_bytes())
}

/// Writes `contents` to `path.tmp` and renames it over `path`.
///
/// A reader (or a crashed benchmark) therefore never sees a half-written report file.
/// Parent folders are created first because result folders are usually per-run and new.
pub fn write_file_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    create_parent_folder(path)?;
    let temporary = temporary_path(path);
    let mut file = fs::File::create(&temporary)?;
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temporary, path)
}

/// Creates the folder that will hold `path`, if there is one to create.
pub(crate) fn create_parent_folder(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => fs::create_dir_all(parent),
        _ => Ok(()),
    }
}

/// Returns `path` with `.tmp` appended to its full file name, keeping the original extension visible.
pub(crate) fn temporary_path(path: &Path) -> PathBuf {
    let mut name: OsString = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_json_creates_parent_folders_and_pretty_prints() {
        let folder = std::env::temp_dir().join(format!("report-json-{}", std::process::id()));
        let path = folder.join("nested").join("result.json");
        let value = serde_json::json!({"name": "logging", "values": [1, 2, 3]});
        write_json(&path, &value).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\n  \"name\""),
            "expected indentation in {text}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed, value);
        assert!(!temporary_path(&path).exists());
        fs::remove_dir_all(&folder).unwrap();
    }

    #[test]
    fn temporary_path_appends_tmp_to_the_whole_name() {
        let path = temporary_path(Path::new("out/plot.png"));
        assert_eq!(path, PathBuf::from("out/plot.png.tmp"));
    }
}
