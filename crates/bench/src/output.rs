//! Options every experiment shares (output folder, JSON file, data folder,
//! quiet), and the helpers that write its files.

use std::path::{Path, PathBuf};

use anyhow::Context;
use report::plot::Chart;
use report::Table;

/// Width and height of every PNG, in pixels.
pub const CHART_WIDTH: u32 = 960;
pub const CHART_HEIGHT: u32 = 600;

/// Where an experiment writes its results and its logs.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OutputArgs {
    /// Folder for the CSV and PNG files [default: bench-out/<experiment>].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also write the figures as JSON to FILE, for scripts.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Folder in which a fresh data folder for the logs is created (and
    /// removed at the end) [default: the current directory]. It must be on
    /// the disk you mean to measure: /tmp is often a tmpfs, where fdatasync
    /// costs nothing.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

impl OutputArgs {
    /// The output folder, `bench-out/<experiment>` unless `--out` says.
    pub fn out_folder(&self, experiment: &str) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| Path::new("bench-out").join(experiment))
    }

    /// Creates the data folder: a new temporary folder under `--data` (or
    /// the current directory), deleted when the returned guard drops.
    pub fn data_folder(&self, experiment: &str) -> anyhow::Result<tempfile::TempDir> {
        let parent = self.data.clone().unwrap_or_else(|| PathBuf::from("."));
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("cannot create the data folder {}", parent.display()))?;
        tempfile::Builder::new()
            .prefix(&format!("stamplog-bench-{experiment}-"))
            .tempdir_in(&parent)
            .with_context(|| format!("cannot create a data folder in {}", parent.display()))
    }
}

/// Collects the files one experiment writes, so it can list them at the end.
pub struct Output {
    folder: PathBuf,
    written: Vec<PathBuf>,
}

impl Output {
    pub fn new(folder: PathBuf) -> anyhow::Result<Output> {
        std::fs::create_dir_all(&folder)
            .with_context(|| format!("cannot create the output folder {}", folder.display()))?;
        Ok(Output {
            folder,
            written: Vec::new(),
        })
    }

    /// Writes `table` as `<name>.csv` in the output folder.
    pub fn csv(&mut self, name: &str, table: &Table) -> anyhow::Result<PathBuf> {
        let path = self.folder.join(format!("{name}.csv"));
        table
            .write_csv(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        self.written.push(path.clone());
        Ok(path)
    }

    /// Renders `chart` as `<name>.png` in the output folder.
    pub fn png(&mut self, name: &str, chart: &Chart) -> anyhow::Result<PathBuf> {
        let path = self.folder.join(format!("{name}.png"));
        report::plot::render_png(chart, &path, CHART_WIDTH, CHART_HEIGHT)
            .with_context(|| format!("cannot write {}", path.display()))?;
        self.written.push(path.clone());
        Ok(path)
    }

    /// Writes `value` to the `--json` file, when one was asked for.
    pub fn json(&mut self, path: Option<&Path>, value: &serde_json::Value) -> anyhow::Result<()> {
        if let Some(path) = path {
            report::write_json(path, value)
                .with_context(|| format!("cannot write {}", path.display()))?;
            self.written.push(path.to_path_buf());
        }
        Ok(())
    }

    /// Prints the list of files written, on stderr so stdout stays the table.
    pub fn announce(&self) {
        for path in &self.written {
            eprintln!("wrote {}", path.display());
        }
    }
}

/// A multi-threaded runtime with two workers: the machines these run on
/// have two cores, and more workers would only add switching.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}
