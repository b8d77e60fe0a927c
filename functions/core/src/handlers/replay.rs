//! Replaying the fan-out over the outbox: the way back when the outbox trigger gave up
//! on events (a stream batch bisected into its DLQ, a bug fixed since). Safe to run at
//! any time and as often as needed, because the fan-out is idempotent: a delivery that
//! exists is found, not made again, and only one still untouched is queued again.

use chrono::{DateTime, Utc};

use crate::ports::{Services, StoreResult};

use super::fanout::fan_out;

/// Outbox items one replay step reads: bounded work; the rest is its cursor.
pub const REPLAY_PAGE: usize = 200;

/// What one replay step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Events of the window found in the page.
    pub events: usize,
    /// Their deliveries (found or made).
    pub deliveries: usize,
    /// Items that are not events (malformed; the trigger parked them in the outbox DLQ).
    pub malformed: usize,
    /// Where the next step starts; `None`: the outbox is done.
    pub next_cursor: Option<String>,
}

/// Fan out again the events committed at or after `since`, one page of the outbox
/// from `cursor`.
pub async fn replay_outbox(
    services: &Services,
    since: DateTime<Utc>,
    cursor: Option<&str>,
) -> StoreResult<Replayed> {
    let page = services
        .store
        .outbox_page(since, cursor, REPLAY_PAGE)
        .await?;
    let mut replayed = Replayed {
        malformed: page.malformed,
        next_cursor: page.next_cursor,
        ..Replayed::default()
    };
    for event in &page.events {
        replayed.deliveries += fan_out(services, event).await?;
        replayed.events += 1;
    }
    Ok(replayed)
}
