//! How often a replica repeats its report: a primary's `Commit` to its
//! backups, a backup's `Progress` to its primary. A report that tells
//! something new leaves at once (the data path sends it) and is repeated
//! `heartbeat_ms` later, so that one lost on a link is replaced; a repeat
//! that tells nothing new doubles the wait before the next, up to
//! `heartbeat_max_ms`, and ends on a multiple of itself, so that a
//! server's resting streams send their repeats together. A quiet stream's
//! replicas then exchange a report about once a `heartbeat_max_ms` rather
//! than every `heartbeat_ms`, while a lost report is still replaced
//! `heartbeat_ms` after it left. A new view starts the waits again from
//! `heartbeat_ms`: a replica the view names may need the report it
//! already had.

use super::ReplicaSettings;

/// One report's heartbeat: when it last left, what it said, and the wait
/// before it is repeated.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Heartbeat {
    /// When the report last left (`None`: not yet in this epoch, so it is
    /// due now).
    sent_at: Option<u64>,
    /// What it said: a `Commit`'s committed and last versions, a
    /// `Progress`'s logged and last versions.
    told: Option<(u64, u64)>,
    /// The wait before the next repeat (0: `heartbeat_ms`).
    wait: u64,
}

impl Heartbeat {
    /// The report left at `now` saying `told`: the wait is `heartbeat_ms`
    /// after news, twice the last wait (up to `heartbeat_max_ms`) after a
    /// repeat.
    pub(super) fn sent(&mut self, now: u64, told: (u64, u64), settings: &ReplicaSettings) {
        let base = settings.heartbeat_ms;
        self.wait = if self.told == Some(told) {
            self.wait
                .saturating_mul(2)
                .clamp(base, settings.heartbeat_max_ms.max(base))
        } else {
            base
        };
        self.told = Some(told);
        self.sent_at = Some(now);
    }

    /// When the report is next due (0: now). A repeat's longer wait ends
    /// on a multiple of itself, so that the repeats of a server's resting
    /// streams leave together (the clocks' beats share the replicas'
    /// zero, `Replica::on_tick`'s `now`) rather than each on a beat of
    /// its own.
    pub(super) fn due_at(&self, settings: &ReplicaSettings) -> u64 {
        let base = settings.heartbeat_ms;
        let wait = self.wait.max(base);
        let Some(at) = self.sent_at else {
            return 0;
        };
        let due = at.saturating_add(wait);
        match wait > base {
            true => due.checked_next_multiple_of(wait).unwrap_or(u64::MAX),
            false => due,
        }
    }

    pub(super) fn is_due(&self, now: u64, settings: &ReplicaSettings) -> bool {
        now >= self.due_at(settings)
    }

    /// A rejoining primary's `Probe` left at `now`: not a report, so it
    /// is asked again `heartbeat_ms` later, whatever went before.
    pub(super) fn probed(&mut self, now: u64) {
        self.renew();
        self.sent_at = Some(now);
    }

    /// A new view: the next report counts as news, `heartbeat_ms` after
    /// the last one left.
    pub(super) fn renew(&mut self) {
        self.told = None;
        self.wait = 0;
    }

    /// A new epoch: the report is due now.
    pub(super) fn restart(&mut self) {
        *self = Heartbeat::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ReplicaSettings {
        ReplicaSettings {
            heartbeat_ms: 50,
            heartbeat_max_ms: 400,
            ..ReplicaSettings::default()
        }
    }

    #[test]
    fn a_repeat_doubles_the_wait_up_to_the_cap_and_news_or_a_view_starts_it_again() {
        let settings = settings();
        let mut beat = Heartbeat::default();
        assert_eq!(beat.due_at(&settings), 0, "never sent: due now");
        let mut now = 7;
        let mut dues = Vec::new();
        for _ in 0..6 {
            beat.sent(now, (3, 3), &settings);
            now = beat.due_at(&settings);
            dues.push(now);
            assert!(!beat.is_due(now - 1, &settings));
            assert!(beat.is_due(now, &settings));
        }
        // The base wait after news; then 100, 200 and 400 ms at least,
        // each ending on a multiple of itself.
        assert_eq!(dues, [57, 200, 400, 800, 1200, 1600]);
        beat.sent(now, (4, 4), &settings);
        assert_eq!(beat.due_at(&settings), now + 50, "news: the base wait");
        beat.sent(now + 50, (4, 4), &settings);
        assert_eq!(beat.due_at(&settings), now + 200, "a repeat: 100 ms on");
        beat.renew();
        assert_eq!(beat.due_at(&settings), now + 100, "a view: the base wait");
        beat.sent(now + 100, (4, 4), &settings);
        assert_eq!(beat.due_at(&settings), now + 150, "counted as news");
        beat.restart();
        assert_eq!(beat.due_at(&settings), 0, "an epoch: due now");
    }

    #[test]
    fn a_cap_below_the_base_keeps_the_base() {
        let settings = ReplicaSettings {
            heartbeat_ms: 50,
            heartbeat_max_ms: 0,
            ..ReplicaSettings::default()
        };
        let mut beat = Heartbeat::default();
        for now in [0, 50, 100] {
            beat.sent(now, (1, 1), &settings);
            assert_eq!(beat.due_at(&settings), now + 50);
        }
    }
}
