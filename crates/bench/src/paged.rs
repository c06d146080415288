//! `bench paged`: seed 004's paged log buffer (Tables 1 and 2).
//!
//! A workload computes and sends messages: before each message it does
//! `--compute-us` of real CPU work, then builds a record of `--size` bytes
//! of payload and appends it to a `wal::Log` opened in this process (no
//! network). It runs in these modes:
//!
//! - no logging: compute and build the record only (the seed's base case);
//! - buffering only: the paged log over [`DiscardStorage`], which copies
//!   every record into pages and hands full pages to the I/O thread but
//!   writes nothing, the seed's "buffering-only" control;
//! - paged with 1, 2 and 3 pages of `--page-size` on the real disk; with
//!   one page every page write is synchronous.
//!
//! A buffer-full wait is an append that found no free page and had to wait
//! for a page write to finish. The seed's buffer-full rate is the share of
//! page switches that waited (100% with one page).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use clap::Parser;
use indicatif::ProgressBar;
use proto::RECORD_HEADER_LEN;
use report::plot::{Chart, Series};
use report::Table;
use wal::{AppendError, Durability, FileStorage, Log, LogConfig, Storage};

use crate::compute::{self, Calibration};
use crate::discard::DiscardStorage;
use crate::output::{Output, OutputArgs};
use crate::progress;
use crate::units::{fixed, format_bytes, parse_bytes};

/// Messages between two progress bar updates, so the bar costs nothing
/// next to the work it counts.
const PROGRESS_STEP: u64 = 1024;

/// Options of `bench paged`.
#[derive(Parser, Debug, Clone)]
#[command(name = "paged")]
pub struct PagedArgs {
    /// Messages computed and sent in each mode.
    #[arg(long, default_value_t = 100_000)]
    pub messages: u64,
    /// Payload bytes of each message (units B, KB, KiB, MB, MiB).
    #[arg(long, value_parser = parse_bytes, default_value = "1KiB")]
    pub size: usize,
    /// Microseconds of CPU work before each message.
    #[arg(long, default_value_t = 20.0)]
    pub compute_us: f64,
    /// Bytes of one page of the log buffer.
    #[arg(long, value_parser = parse_bytes, default_value = "1MiB")]
    pub page_size: usize,
    /// Page counts of the paged modes, comma separated (1 is synchronous
    /// writing). The buffering-only mode uses the largest.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub pages: Vec<usize>,
    /// A partly filled page is written after waiting this long. Long
    /// enough by default that pages are written full, as in the seed.
    #[arg(long, default_value_t = 100)]
    pub flush_interval_ms: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for PagedArgs {
    fn default() -> Self {
        PagedArgs::parse_from(["paged"])
    }
}

/// One mode of the experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    NoLogging,
    BufferingOnly { pages: usize },
    Paged { pages: usize },
}

impl Mode {
    pub fn label(&self, page_size: usize) -> String {
        match self {
            Mode::NoLogging => "no logging".to_string(),
            Mode::BufferingOnly { .. } => "buffering only".to_string(),
            Mode::Paged { pages } => format!("{}x{pages}", format_bytes(page_size)),
        }
    }
}

/// The figures of one mode.
#[derive(Clone, Debug)]
pub struct ModeFigures {
    pub mode: Mode,
    pub label: String,
    /// From the first computation to the last record written (the log's
    /// close writes its last page).
    pub run_seconds: f64,
    /// Run time over the no-logging run time, minus one, in percent.
    pub overhead_vs_no_logging_percent: f64,
    /// Run time over the buffering-only run time, minus one, in percent.
    pub overhead_vs_buffering_percent: f64,
    pub appends: u64,
    /// Times the writer needed a new page because the current one was full.
    pub page_switches: u64,
    /// Appends that found no free page and waited.
    pub buffer_full_waits: u64,
    /// Failed append attempts as the log counts them (a wait may retry).
    pub buffer_full_attempts: u64,
    /// Waits over page switches, in percent (the seed's Table 2).
    pub buffer_full_rate_percent: f64,
    /// Waits over appends, in percent.
    pub buffer_full_per_append_percent: f64,
    pub buffer_full_per_second: f64,
    pub waiting_seconds: f64,
    /// Pages written by the I/O thread before the log was closed.
    pub pages_written: u64,
    pub bytes_written: u64,
}

/// Everything `bench paged` measured.
#[derive(Clone, Debug)]
pub struct PagedFigures {
    pub modes: Vec<ModeFigures>,
    pub record_bytes: usize,
    pub steps_per_microsecond: f64,
}

/// Runs the experiment, prints its table, writes its files.
pub fn run(args: PagedArgs) -> anyhow::Result<PagedFigures> {
    let record_bytes = RECORD_HEADER_LEN + args.size;
    ensure!(args.messages > 0, "--messages must be at least 1");
    ensure!(!args.pages.is_empty(), "--pages needs at least one count");
    ensure!(
        record_bytes <= args.page_size,
        "a record of {record_bytes} bytes does not fit a page of {} bytes",
        args.page_size
    );
    let data = args.output.data_folder("paged")?;
    let modes = modes(&args.pages);
    let calibration = Calibration::measure();
    let bar = progress::bar(
        args.messages * modes.len() as u64,
        "paged",
        args.output.quiet,
    );
    let mut runs = Vec::new();
    for (index, mode) in modes.iter().enumerate() {
        bar.set_message(mode.label(args.page_size));
        let folder = data.path().join(format!("mode-{index}"));
        runs.push(run_mode(*mode, &args, &calibration, &folder, &bar)?);
        // Each mode's log is removed at once so the disk holds one at a time.
        if folder.exists() {
            std::fs::remove_dir_all(&folder)
                .with_context(|| format!("cannot remove {}", folder.display()))?;
        }
    }
    bar.finish_and_clear();
    let figures = PagedFigures {
        modes: figures_of(&runs, &args),
        record_bytes,
        steps_per_microsecond: calibration.steps_per_microsecond,
    };
    write_report(&args, &figures)?;
    Ok(figures)
}

fn modes(pages: &[usize]) -> Vec<Mode> {
    let largest = pages.iter().copied().max().unwrap_or(1);
    let mut modes = vec![Mode::NoLogging, Mode::BufferingOnly { pages: largest }];
    modes.extend(pages.iter().map(|&pages| Mode::Paged { pages }));
    modes
}

/// What one mode's run observed, before the comparisons.
struct ModeRun {
    mode: Mode,
    elapsed: Duration,
    appends: u64,
    waits: u64,
    waiting: Duration,
    metrics: wal::LogMetrics,
}

fn open_log(mode: Mode, args: &PagedArgs, folder: &Path) -> anyhow::Result<Option<Log>> {
    let (storage, pages): (Arc<dyn Storage>, usize) = match mode {
        Mode::NoLogging => return Ok(None),
        Mode::BufferingOnly { pages } => (Arc::new(DiscardStorage), pages),
        Mode::Paged { pages } => (Arc::new(FileStorage), pages),
    };
    let config = LogConfig {
        durability: Durability::Paged {
            pages,
            page_size: args.page_size,
        },
        // One segment for the whole run, so only full pages seal a page.
        segment_bytes_max: 1 << 40,
        page_flush_interval: Duration::from_millis(args.flush_interval_ms),
        ..LogConfig::default()
    };
    let log = Log::open(storage, folder, 1, config, &mut |_| {})
        .with_context(|| format!("cannot open a paged log in {}", folder.display()))?;
    Ok(Some(log))
}

fn run_mode(
    mode: Mode,
    args: &PagedArgs,
    calibration: &Calibration,
    folder: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<ModeRun> {
    let log = open_log(mode, args, folder)?;
    // Waiting for a free page uses the log's async notification; a small
    // runtime on this thread blocks on it.
    let waiter = tokio::runtime::Builder::new_current_thread().build()?;
    let steps = calibration.steps_for(args.compute_us);
    let mut payload = vec![0u8; args.size];
    let mut record = Vec::with_capacity(RECORD_HEADER_LEN + args.size);
    let (mut waits, mut waiting) = (0u64, Duration::ZERO);
    let started = Instant::now();
    for version in 1..=args.messages {
        let hash = compute::work(steps, version);
        fill_payload(&mut payload, hash);
        record.clear();
        encode(version, &payload, &mut record);
        std::hint::black_box(&record);
        if let Some(log) = &log {
            if let Some(waited) = append_waiting(log, version, &record, &waiter)? {
                waits += 1;
                waiting += waited;
            }
        }
        if version % PROGRESS_STEP == 0 {
            bar.inc(PROGRESS_STEP);
        }
    }
    let metrics = log.as_ref().map(Log::metrics).unwrap_or_default();
    if let Some(log) = log {
        check_health(&log)?;
        // Closing writes and syncs the last, partly filled page: part of
        // the run, as the seed's runs ended with their log on disk.
        drop(log);
    }
    let elapsed = started.elapsed();
    bar.inc(args.messages % PROGRESS_STEP);
    Ok(ModeRun {
        mode,
        elapsed,
        appends: if mode == Mode::NoLogging {
            0
        } else {
            metrics.appends
        },
        waits,
        waiting,
        metrics,
    })
}

fn check_health(log: &Log) -> anyhow::Result<()> {
    match log.failure() {
        Some(failure) => bail!("the log failed: {failure}"),
        None => Ok(()),
    }
}

/// Puts the computation's result into the message, so the work is part of
/// what is sent and cannot be skipped.
fn fill_payload(payload: &mut [u8], hash: u64) {
    let bytes = hash.to_le_bytes();
    let length = payload.len().min(bytes.len());
    payload[..length].copy_from_slice(&bytes[..length]);
}

fn encode(version: u64, payload: &[u8], out: &mut Vec<u8>) {
    wal::experiment::encode_record(1, version, 0, payload, out);
}

/// Appends, waiting for a free page when the buffer is full; returns how
/// long it waited, or `None` when it did not.
fn append_waiting(
    log: &Log,
    version: u64,
    record: &[u8],
    waiter: &tokio::runtime::Runtime,
) -> anyhow::Result<Option<Duration>> {
    match log.append(version, record) {
        Ok(()) => return Ok(None),
        Err(AppendError::Full) => {}
        Err(error) => return Err(error).context("append failed"),
    }
    let started = Instant::now();
    loop {
        // Created before the retry, so a page freed in between still wakes it.
        let notified = log.space_notified();
        match log.append(version, record) {
            Ok(()) => return Ok(Some(started.elapsed())),
            Err(AppendError::Full) => waiter.block_on(notified),
            Err(error) => return Err(error).context("append failed"),
        }
    }
}

fn figures_of(runs: &[ModeRun], args: &PagedArgs) -> Vec<ModeFigures> {
    let seconds_of = |wanted: fn(&Mode) -> bool| {
        runs.iter()
            .find(|run| wanted(&run.mode))
            .map_or(f64::NAN, |run| run.elapsed.as_secs_f64())
    };
    let base = seconds_of(|mode| *mode == Mode::NoLogging);
    let buffering = seconds_of(|mode| matches!(mode, Mode::BufferingOnly { .. }));
    let records_per_page = (args.page_size / (RECORD_HEADER_LEN + args.size)).max(1) as u64;
    runs.iter()
        .map(|run| {
            let seconds = run.elapsed.as_secs_f64();
            let page_switches = match run.mode {
                Mode::NoLogging => 0,
                _ => run.appends.div_ceil(records_per_page).saturating_sub(1),
            };
            ModeFigures {
                mode: run.mode,
                label: run.mode.label(args.page_size),
                run_seconds: seconds,
                overhead_vs_no_logging_percent: (seconds / base - 1.0) * 100.0,
                overhead_vs_buffering_percent: (seconds / buffering - 1.0) * 100.0,
                appends: run.appends,
                page_switches,
                buffer_full_waits: run.waits,
                buffer_full_attempts: run.metrics.buffer_full_waits,
                buffer_full_rate_percent: percent(run.waits, page_switches),
                buffer_full_per_append_percent: percent(run.waits, run.appends),
                buffer_full_per_second: run.waits as f64 / seconds,
                waiting_seconds: run.waiting.as_secs_f64(),
                pages_written: run.metrics.syncs,
                bytes_written: run.metrics.bytes_written,
            }
        })
        .collect()
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Tables 1 and 2 of the seed in one table.
pub fn table(figures: &PagedFigures, args: &PagedArgs) -> Table {
    let title = format!(
        "Paged logging: {} messages of {} with {} µs of compute each; run time and buffer-full rate",
        args.messages,
        format_bytes(args.size),
        args.compute_us
    );
    let mut table = Table::new(
        title,
        &[
            "mode",
            "run s",
            "vs no logging",
            "overhead vs no logging",
            "overhead vs buffering",
            "page switches",
            "buffer-full waits",
            "buffer-full rate",
            "waits per append",
            "waits/s",
            "waiting s",
        ],
    );
    for mode in &figures.modes {
        let logged = mode.mode != Mode::NoLogging;
        let when_logged = |text: String| if logged { text } else { "-".to_string() };
        table.row(vec![
            mode.label.clone(),
            fixed(mode.run_seconds, 3),
            format!(
                "{}x",
                fixed(mode.overhead_vs_no_logging_percent / 100.0 + 1.0, 3)
            ),
            format!("{}%", fixed(mode.overhead_vs_no_logging_percent, 1)),
            format!("{}%", fixed(mode.overhead_vs_buffering_percent, 1)),
            when_logged(mode.page_switches.to_string()),
            when_logged(mode.buffer_full_waits.to_string()),
            when_logged(format!("{}%", fixed(mode.buffer_full_rate_percent, 1))),
            when_logged(format!(
                "{}%",
                fixed(mode.buffer_full_per_append_percent, 3)
            )),
            when_logged(fixed(mode.buffer_full_per_second, 1)),
            when_logged(fixed(mode.waiting_seconds, 3)),
        ]);
    }
    table
}

fn write_report(args: &PagedArgs, figures: &PagedFigures) -> anyhow::Result<()> {
    let table = table(figures, args);
    print!("{}", table.render());
    let mut output = Output::new(args.output.out_folder("paged"))?;
    output.csv("paged", &table)?;
    output.png("paged", &overhead_chart(figures))?;
    output.png("paged-buffer-full", &buffer_full_chart(figures))?;
    let modes: Vec<serde_json::Value> = figures.modes.iter().map(mode_json).collect();
    let json = serde_json::json!({
        "experiment": "paged",
        "messages": args.messages,
        "size_bytes": args.size,
        "record_bytes": figures.record_bytes,
        "compute_us": args.compute_us,
        "page_size_bytes": args.page_size,
        "steps_per_microsecond": figures.steps_per_microsecond,
        "table": table.to_json(),
        "modes": modes,
    });
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}

fn mode_json(mode: &ModeFigures) -> serde_json::Value {
    serde_json::json!({
        "mode": mode.label,
        "run_seconds": mode.run_seconds,
        "overhead_vs_no_logging_percent": mode.overhead_vs_no_logging_percent,
        "overhead_vs_buffering_percent": mode.overhead_vs_buffering_percent,
        "appends": mode.appends,
        "page_switches": mode.page_switches,
        "buffer_full_waits": mode.buffer_full_waits,
        "buffer_full_attempts": mode.buffer_full_attempts,
        "buffer_full_rate_percent": mode.buffer_full_rate_percent,
        "buffer_full_per_append_percent": mode.buffer_full_per_append_percent,
        "buffer_full_per_second": mode.buffer_full_per_second,
        "waiting_seconds": mode.waiting_seconds,
        "pages_written": mode.pages_written,
        "bytes_written": mode.bytes_written,
    })
}

/// Table 1 as bars: overhead of each mode against both baselines.
fn overhead_chart(figures: &PagedFigures) -> Chart {
    let categories = figures.modes.iter().map(|mode| mode.label.clone());
    let mut chart = Chart::bars(
        "Overhead of logging on the run time",
        "mode",
        "overhead (%)",
        categories.collect(),
    );
    let points = |pick: fn(&ModeFigures) -> f64| {
        let modes = figures.modes.iter().enumerate();
        modes.map(|(i, mode)| (i as f64, pick(mode))).collect()
    };
    chart.add(Series::new(
        "vs no logging",
        points(|mode| mode.overhead_vs_no_logging_percent),
    ));
    chart.add(Series::new(
        "vs buffering only",
        points(|mode| mode.overhead_vs_buffering_percent),
    ));
    chart
}

/// Table 2 as bars: buffer-full rate of each logging mode.
fn buffer_full_chart(figures: &PagedFigures) -> Chart {
    let logged: Vec<&ModeFigures> = figures
        .modes
        .iter()
        .filter(|mode| mode.mode != Mode::NoLogging)
        .collect();
    let mut chart = Chart::bars(
        "Buffer-full rate",
        "mode",
        "waits (%)",
        logged.iter().map(|mode| mode.label.clone()).collect(),
    );
    let points = |pick: fn(&ModeFigures) -> f64| {
        let modes = logged.iter().enumerate();
        modes.map(|(i, mode)| (i as f64, pick(mode))).collect()
    };
    chart.add(Series::new(
        "per page switch",
        points(|mode| mode.buffer_full_rate_percent),
    ));
    chart.add(Series::new(
        "per append",
        points(|mode| mode.buffer_full_per_append_percent),
    ));
    chart
}
