//! The handlers both runtimes run: the outbox trigger (fan-out), the delivery worker,
//! the failure handler, and resuming a re-enabled endpoint. Each is written over the
//! ports only; a Lambda binary and the embedded pollers differ only in how they feed
//! messages in and act on the returned disposition.

pub mod age;
pub mod failures;
pub mod fanout;
pub mod health;
pub mod notices;
pub mod replay;
pub mod resend;
pub mod resume;
pub mod task;
pub mod webhook;
pub mod worker;

use std::time::Duration;

use chrono::{DateTime, Utc};

/// A time until `at`, never negative.
pub(crate) fn until(at: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (at - now).to_std().unwrap_or(Duration::ZERO)
}
