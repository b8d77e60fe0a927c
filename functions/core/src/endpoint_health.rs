//! Endpoint health as a pure state machine: what one attempt's outcome does to an
//! endpoint's health record, and which notices follow.
//!
//! Two stretches are tracked. `failing_since` is the start of the current unbroken run
//! of failures: the disable rule ("failing every attempt for N days") reads it, and any
//! success ends it. An *outage* is declared only once such a run has lasted
//! [`OUTAGE_AFTER`], and it ends only when successes have held for [`RECOVERY_AFTER`]
//! without a failure in between. That hysteresis is why a flapping endpoint (one in
//! five requests failing, a hundred a second) announces no recovery at all: its
//! failure runs never last a minute, so it is never in an outage to recover from.
//!
//! Writes happen only at transitions, never per attempt: a healthy endpoint costs no
//! health write at all.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A run of failures this long is an outage (and its end is announced).
pub const OUTAGE_AFTER: Duration = Duration::from_secs(60);
/// After an outage, successes must hold this long, with no failure between, before
/// the endpoint counts as recovered.
pub const RECOVERY_AFTER: Duration = Duration::from_secs(60);

/// An attempt that runs this long marks its endpoint slow: half the default timeout,
/// far beyond what a receiver that answers at once takes.
pub const SLOW_ATTEMPT: Duration = Duration::from_secs(5);
/// How long an endpoint stays slow after its last slow attempt: long enough that an
/// endpoint that hangs is not let out of the slow share between its attempts (each
/// lasts a timeout, and a hidden message comes back within a minute).
pub const SLOW_FOR: Duration = Duration::from_secs(600);

/// A slow mark at least this old is cleared by a success answered in time, so an
/// endpoint that recovered is not held to the slow share for the rest of its mark;
/// one whose requests hang now and then flips at most once a minute.
pub const SLOW_MARK_HOLD: Duration = Duration::from_secs(60);

/// The health record of one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointHealth {
    /// Start of the current unbroken run of failed attempts; `None` after a success.
    #[serde(default)]
    pub failing_since: Option<DateTime<Utc>>,
    /// Start of the declared outage, kept until recovery is confirmed.
    #[serde(default)]
    pub outage_since: Option<DateTime<Utc>>,
    /// The first success of a recovery still being confirmed.
    #[serde(default)]
    pub recovering_since: Option<DateTime<Utc>>,
    /// Until when the endpoint counts as slow: an attempt at it ran
    /// [`SLOW_ATTEMPT`] or more (or timed out) within [`SLOW_FOR`] before this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_until: Option<DateTime<Utc>>,
    /// Optimistic-concurrency version of this record alone.
    #[serde(default)]
    pub version: u64,
}

/// What a health transition asks the runtime to do besides writing the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthEvent {
    /// The outage that started at `since` is over: announce the recovery.
    Recovered { since: DateTime<Utc> },
    /// Every attempt has failed for longer than the disable limit.
    FailingTooLong { days: u64 },
}

/// The next health record after an attempt that `succeeded` (or not) at `now`, and what
/// follows. `None` as the record: nothing changed, nothing to write.
pub fn observe(
    health: &EndpointHealth,
    succeeded: bool,
    now: DateTime<Utc>,
    unhealthy_after: Duration,
) -> (Option<EndpointHealth>, Vec<HealthEvent>) {
    let mut next = health.clone();
    let mut events = Vec::new();
    if succeeded {
        next.failing_since = None;
        if let Some(since) = health.outage_since {
            match health.recovering_since {
                None => next.recovering_since = Some(now),
                Some(first) if elapsed(first, now) >= RECOVERY_AFTER => {
                    next.outage_since = None;
                    next.recovering_since = None;
                    events.push(HealthEvent::Recovered { since });
                }
                Some(_) => {}
            }
        }
    } else {
        // A failure while a recovery is being confirmed: it was not one.
        next.recovering_since = None;
        let since = *next.failing_since.get_or_insert(now);
        let failing = elapsed(since, now);
        if next.outage_since.is_none() && failing >= OUTAGE_AFTER {
            next.outage_since = Some(since);
        }
        if failing > unhealthy_after {
            events.push(HealthEvent::FailingTooLong {
                days: unhealthy_after.as_secs() / 86_400,
            });
        }
    }
    let changed = next != *health;
    (changed.then_some(next), events)
}

impl EndpointHealth {
    /// Whether the endpoint counts as slow at `now`.
    pub fn is_slow(&self, now: DateTime<Utc>) -> bool {
        self.slow_until.is_some_and(|until| until > now)
    }
}

/// The record after a slow attempt at `now`: slow for [`SLOW_FOR`] from now. `None`
/// (nothing to write) while the mark still has more than half of that to run, so an
/// endpoint that hangs costs a health write every five minutes, not every attempt.
pub fn mark_slow(health: &EndpointHealth, now: DateTime<Utc>) -> Option<EndpointHealth> {
    let half = chrono::Duration::from_std(SLOW_FOR / 2).unwrap_or(chrono::Duration::MAX);
    if health.slow_until.is_some_and(|until| until - now > half) {
        return None;
    }
    let mut next = health.clone();
    next.slow_until = Some(now + chrono::Duration::from_std(SLOW_FOR).unwrap_or(half));
    Some(next)
}

/// The record after a success answered in time at `now`: no longer slow, once its
/// mark has held [`SLOW_MARK_HOLD`]. `None`: nothing to write.
pub fn clear_slow(health: &EndpointHealth, now: DateTime<Utc>) -> Option<EndpointHealth> {
    let until = health.slow_until.filter(|until| *until > now)?;
    let marked_at = until - chrono::Duration::from_std(SLOW_FOR).ok()?;
    if elapsed(marked_at, now) < SLOW_MARK_HOLD {
        return None;
    }
    let mut next = health.clone();
    next.slow_until = None;
    Some(next)
}

fn elapsed(since: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - since).to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const FIVE_DAYS: Duration = Duration::from_secs(5 * 86_400);

    /// Feed outcomes in, applying every written record; count the recoveries.
    fn run(outcomes: impl IntoIterator<Item = (bool, DateTime<Utc>)>) -> (usize, usize) {
        let mut health = EndpointHealth::default();
        let (mut recovered, mut writes) = (0, 0);
        for (ok, at) in outcomes {
            let (next, events) = observe(&health, ok, at, FIVE_DAYS);
            if let Some(next) = next {
                health = next;
                writes += 1;
            }
            recovered += events
                .iter()
                .filter(|e| matches!(e, HealthEvent::Recovered { .. }))
                .count();
        }
        (recovered, writes)
    }

    #[test]
    fn a_slow_attempt_marks_the_endpoint_slow_for_a_while_with_few_writes() {
        let t0 = Utc::now();
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        let marked = mark_slow(&EndpointHealth::default(), t0).expect("a first mark is written");
        assert!(marked.is_slow(at(0)) && marked.is_slow(at(599)));
        assert!(!marked.is_slow(at(600)), "and it wears off");
        assert_eq!(mark_slow(&marked, at(299)), None, "fresh enough: no write");
        let renewed = mark_slow(&marked, at(301)).expect("renewed past half its time");
        assert!(renewed.is_slow(at(900)));
        // A quick success clears the mark once it has held a minute, not before.
        assert_eq!(clear_slow(&renewed, at(330)), None);
        let cleared = clear_slow(&renewed, at(361)).expect("recovered");
        assert!(!cleared.is_slow(at(361)));
        assert_eq!(clear_slow(&cleared, at(362)), None, "nothing more to write");
    }

    #[test]
    fn a_flapping_endpoint_announces_no_recovery() {
        // One failure in five, a hundred attempts a second, for 100 s (the hostile
        // test's figures; it used to send 25 recovered events).
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let start = Utc::now();
        let outcomes = (0..10_000).map(|i| {
            (
                rng.gen_bool(0.8),
                start + chrono::Duration::milliseconds(i * 10),
            )
        });
        assert_eq!(run(outcomes).0, 0);
    }

    #[test]
    fn a_real_outage_is_announced_once_after_recovery_holds() {
        let t0 = Utc::now();
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        let mut outcomes: Vec<(bool, DateTime<Utc>)> = (0..180).map(|s| (false, at(s))).collect();
        // Back, but one relapse inside the confirmation window starts it over.
        outcomes.push((true, at(181)));
        outcomes.push((false, at(200)));
        outcomes.extend((201..400).map(|s| (true, at(s))));
        let (recovered, writes) = run(outcomes);
        assert_eq!(recovered, 1);
        assert!(writes < 10, "writes only at transitions, got {writes}");
    }

    #[test]
    fn a_healthy_endpoint_writes_nothing() {
        let t0 = Utc::now();
        let (next, events) = observe(&EndpointHealth::default(), true, t0, FIVE_DAYS);
        assert_eq!((next, events), (None, vec![]));
    }

    #[test]
    fn failing_past_the_limit_asks_to_disable_and_a_success_ends_the_stretch() {
        let t0 = Utc::now();
        let (h, _) = observe(&EndpointHealth::default(), false, t0, FIVE_DAYS);
        let h = h.unwrap();
        assert_eq!(h.failing_since, Some(t0));
        let later = t0 + chrono::Duration::days(4);
        let (h2, events) = observe(&h, false, later, FIVE_DAYS);
        assert!(events.is_empty());
        let h2 = h2.expect("the outage is declared");
        assert_eq!(h2.failing_since, Some(t0), "the stretch keeps its start");
        assert_eq!(h2.outage_since, Some(t0));
        let (_, events) = observe(&h2, false, t0 + chrono::Duration::days(6), FIVE_DAYS);
        assert_eq!(events, vec![HealthEvent::FailingTooLong { days: 5 }]);
        let (h3, _) = observe(&h2, true, later, FIVE_DAYS);
        assert_eq!(h3.unwrap().failing_since, None);
    }
}
