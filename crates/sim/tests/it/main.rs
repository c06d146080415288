//! The simulator's seeds across every protocol, server crashes and
//! failover, replay of one seed, and the tests that prove the harness can
//! fail.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

mod failover;
mod seeds;

use sim::SimConfig;

/// Runs `config` with a trace, prints the config, the last `lines` trace
/// lines and the outcome, and fails when the run fails.
fn replay_with_trace(mut config: SimConfig, lines: usize, label: &str) {
    config.trace = true;
    println!("{config:#?}");
    let outcome = sim::run(&config);
    let skip = outcome.trace.len().saturating_sub(lines);
    println!(
        "trace: {} events, {} lines, showing the last {}:",
        outcome.counters.events,
        outcome.trace.len(),
        outcome.trace.len() - skip
    );
    for line in &outcome.trace[skip..] {
        println!("{line}");
    }
    println!("\n{outcome}");
    assert!(outcome.passed(), "{label} failed (see above)");
}
