//! The simulation's only source of randomness: the workspace's one seeded
//! generator (`proto::Rng`, splitmix64), so one seed replays a whole run.

pub use proto::Rng;
