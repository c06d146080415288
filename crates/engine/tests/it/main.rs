//! The engine's behaviour through its public API: events go in, effects
//! come out.

mod commit_interval;
mod producer;
mod sender;
