//! The embedded runtime's endpoint slots: the in-process slots, and with an endpoint's
//! slot, the place its queue lane gave the message being handled. Both go back
//! together once the attempt's request is over, so the lane may hand out the
//! endpoint's next message while this one's outcome is still being written.

use std::future::Future;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use entrega_core::ports::StoreResult;
use entrega_core::slots::{EndpointSlots, InProcessSlots, SlotLease, SlotPool};

use crate::sqlite::queue::SqliteQueue;

tokio::task_local! {
    /// The receipt of the delivery message the current task handles.
    static HANDLING: String;
}

/// Run `work`, the handler of the delivery message of `receipt`.
pub async fn handling<F: Future>(receipt: &str, work: F) -> F::Output {
    HANDLING.scope(receipt.to_owned(), work).await
}

/// See the module docs.
pub struct LaneSlots {
    slots: InProcessSlots,
    deliveries: SqliteQueue,
}

impl LaneSlots {
    pub fn new(deliveries: SqliteQueue) -> Self {
        Self {
            slots: InProcessSlots::default(),
            deliveries,
        }
    }
}

#[async_trait]
impl EndpointSlots for LaneSlots {
    async fn acquire(
        &self,
        pool: &SlotPool,
        limit: u32,
        holder: &str,
        now: DateTime<Utc>,
        lease: std::time::Duration,
    ) -> StoreResult<Option<SlotLease>> {
        self.slots.acquire(pool, limit, holder, now, lease).await
    }

    async fn release(&self, lease: &SlotLease) -> StoreResult<()> {
        let released = self.slots.release(lease).await;
        if matches!(lease.pool, SlotPool::Endpoint(_)) {
            // Outside a message's handler (none in this runtime) there is no place.
            let _ = HANDLING.try_with(|receipt| self.deliveries.request_over(receipt));
        }
        released
    }
}
