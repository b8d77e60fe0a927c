//! Resuming an endpoint that was re-enabled: its paused deliveries are queued again.

use std::time::Duration;

use crate::delivery::DeliveryState;
use crate::endpoint::Endpoint;
use crate::ports::{Services, StoreError, StoreResult};

use super::task::DeliveryTask;

/// Paused deliveries handled per store round trip.
const RESUME_BATCH: usize = 100;

/// Queue every paused delivery of `endpoint`; returns how many.
pub async fn resume_paused(services: &Services, endpoint: &Endpoint) -> StoreResult<usize> {
    let mut resumed = 0;
    loop {
        let paused = services
            .store
            .paused_deliveries(&endpoint.id, RESUME_BATCH)
            .await?;
        if paused.is_empty() {
            return Ok(resumed);
        }
        // Queue first, then mark pending: a crash in between leaves a paused delivery
        // with a message (the worker starts it anyway), never a pending one without.
        let messages = paused
            .iter()
            .map(|d| DeliveryTask::for_delivery(d, endpoint).message(endpoint, Duration::ZERO))
            .collect();
        services.deliveries.send(messages).await?;
        let now = services.clock.now();
        let mut moved = 0;
        for delivery in paused {
            let mut next = delivery;
            next.state = DeliveryState::Pending;
            next.next_attempt_at = Some(now);
            next.updated_at = now;
            match services.store.save_delivery(&next, &[]).await {
                Ok(_) => moved += 1,
                // The worker got there first: it is no longer ours to move.
                Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        resumed += moved;
        if moved > 0 {
            services
                .backlog
                .record(&endpoint.tenant_id, moved as i64)
                .await?;
        }
        if moved == 0 {
            // Every row changed under us (the endpoint was disabled again): stop rather
            // than spin; the worker owns those deliveries now.
            return Ok(resumed);
        }
    }
}
