//! The handlers both runtimes run: the outbox trigger (fan-out), the delivery worker,
//! the failure handler, and resuming a re-enabled endpoint. Each is written over the
//! ports only; a Lambda binary and the embedded pollers differ only in how they feed
//! messages in and act on the returned disposition.

pub mod age;
mod attempt_slots;
pub mod failures;
pub mod fanout;
mod follow_up;
pub mod health;
pub mod notices;
pub mod replay;
pub mod resend;
pub mod resume;
pub mod sweep;
pub mod task;
pub mod webhook;
pub mod worker;

use std::time::Duration;

use chrono::{DateTime, Utc};

/// A time until `at`, never negative.
pub(crate) fn until(at: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (at - now).to_std().unwrap_or(Duration::ZERO)
}

/// A handler that hit a backend error (a throttled table, a timeout) gets its message
/// back after this on the first receive, doubling with each receive after.
pub const BACKEND_ERROR_BACKOFF: Duration = Duration::from_secs(5);
/// The longest a backend error holds a message back: long enough that a throttled
/// table is not hammered, short enough that a recovered one is used within minutes.
pub const BACKEND_ERROR_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// How long to hide a message on its `receive_count`th receive: `base` doubled per
/// receive after the first, capped at `max`, and spread over its upper half at random
/// so that messages that failed together do not all come back together.
pub fn backoff(
    receive_count: u32,
    base: Duration,
    max: Duration,
    random: &dyn crate::ports::RandomSource,
) -> Duration {
    let doublings = receive_count.saturating_sub(1).min(16);
    let full = base.saturating_mul(1 << doublings).min(max);
    let half = full / 2;
    // 53 random bits: a uniform fraction in [0, 1).
    let unit = (random.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    half + full.mul_f64(unit * 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_receive_within_its_upper_half_and_stops_at_the_cap() {
        let base = Duration::from_secs(4);
        let max = Duration::from_secs(60);
        for (receives, full) in [(0, 4), (1, 4), (2, 8), (3, 16), (4, 32), (5, 60), (40, 60)] {
            for _ in 0..50 {
                let wait = backoff(receives, base, max, &crate::ports::SystemRandom);
                let full = Duration::from_secs(full);
                assert!(wait >= full / 2 && wait <= full, "{receives}: {wait:?}");
            }
        }
    }
}

#[cfg(test)]
mod handler_tests;

#[cfg(test)]
mod race_tests;

#[cfg(test)]
mod worker_case;
