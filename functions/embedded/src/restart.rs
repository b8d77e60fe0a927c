//! What a start repairs of the previous process's unfinished work: waiting deliveries
//! whose message it had not yet written when it stopped.
//!
//! A few paths write a delivery and queue its message in two transactions (a resume
//! step marks a page of paused deliveries pending, then queues them; a fan-out beside
//! its request or by the outbox poller creates, then queues). A `kill -9` or a power
//! loss between the two leaves a delivery waiting with no message. The sweeper would
//! find it, but only once it is [`SWEEP_GRACE`] overdue: for that long "did this
//! event arrive?" would answer "pending" for a delivery nothing is working on. At
//! start the answer is exact instead of late: the database is locked to one process
//! and nothing of this one runs yet, so every waiting delivery no message names is
//! such a one, and is queued at once.
//!
//! [`SWEEP_GRACE`]: entrega_core::handlers::sweep::SWEEP_GRACE

use entrega_core::handlers::sweep::queue_again;
use entrega_core::ports::{Services, StoreResult};

use crate::sqlite::SqliteStore;

/// Deliveries queued again at one start. A crash leaves at most one resume step's
/// and a few fan-outs' worth; this bounds a start's work on a database that lost more
/// (edited by hand), whose rest the sweeper, or the next start, finds.
pub const ORPHANS_AT_START: usize = 10_000;
/// Messages per send (one transaction, one sync each): 10 000 sent one by one held the
/// start, and the API, for 5 - 10 s on two cores.
const ORPHANS_PER_SEND: usize = 500;

/// Queue every waiting delivery no message names (up to [`ORPHANS_AT_START`]); how
/// many. Call before the API and the workers start.
pub async fn queue_orphaned_deliveries(
    services: &Services,
    store: &SqliteStore,
) -> StoreResult<usize> {
    let orphans = store.waiting_without_message(ORPHANS_AT_START).await?;
    if orphans.is_empty() {
        return Ok(0);
    }
    for batch in orphans.chunks(ORPHANS_PER_SEND) {
        queue_again(services, batch).await?;
    }
    for delivery in &orphans {
        tracing::debug!(delivery_id = %delivery.id, tenant_id = %delivery.tenant_id, "queued at start");
    }
    tracing::warn!(
        queued = orphans.len(),
        first = %orphans[0].id,
        "queued waiting deliveries whose message the previous process had not written"
    );
    services.metrics.deliveries_swept(orphans.len() as u64);
    if orphans.len() == ORPHANS_AT_START {
        tracing::warn!(
            limit = ORPHANS_AT_START,
            "more waiting deliveries without a message than a start queues; the sweeper, \
             or the next start, finds the rest"
        );
    }
    Ok(orphans.len())
}

#[cfg(test)]
#[path = "restart_tests.rs"]
mod tests;
