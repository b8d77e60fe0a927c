//! The outbox trigger: one committed event becomes one delivery per subscribed
//! endpoint, each queued for the worker.
//!
//! Idempotent by construction, because outbox records are delivered at least once
//! (a stream shard retried, an embedded poller that crashed before marking the row):
//! delivery ids are derived from (event, endpoint), the store refuses a second create,
//! and a delivery found still untouched is queued again, which the worker tolerates.

use std::time::Duration;

use tracing::{info_span, Instrument};

use chrono::{DateTime, Utc};

use crate::delivery::{Delivery, DeliveryState};
use crate::endpoint::Endpoint;
use crate::event::Event;
use crate::ids::DeliveryId;
use crate::ports::{OutgoingMessage, Services, StoreResult};

use super::task::DeliveryTask;

/// Fan `event` out; returns how many deliveries it has (new or found).
pub async fn fan_out(services: &Services, event: &Event) -> StoreResult<usize> {
    let endpoints = services.store.tenant_endpoints(&event.tenant_id).await?;
    fan_out_to(services, event, &endpoints).await
}

/// Fan `event` out to `endpoints`, its tenant's endpoints as read after the event was
/// published (a batch of stream records reads each tenant's once: every event in it
/// was published before the batch was read).
pub async fn fan_out_to(
    services: &Services,
    event: &Event,
    endpoints: &[Endpoint],
) -> StoreResult<usize> {
    let span = info_span!("fan_out", event_id = %event.id, tenant_id = %event.tenant_id);
    async {
        let now = services.clock.now();
        let mut messages = Vec::new();
        let mut count = 0;
        let mut waiting = 0;
        for (fresh, endpoint) in planned_deliveries(event, endpoints, now) {
            let (stored, created) = services.store.create_delivery_if_absent(&fresh).await?;
            count += 1;
            if created && stored.state == DeliveryState::Paused {
                // Created paused from a list that may be older than an enable.
                super::resume::resume_if_enabled(services, &stored).await?;
                continue;
            }
            if created && stored.state == DeliveryState::Pending {
                waiting += 1;
            }
            messages.extend(first_message(&stored, endpoint));
        }
        if !messages.is_empty() {
            services.deliveries.send(messages).await?;
        }
        if waiting > 0 {
            services.backlog.record(&event.tenant_id, waiting).await?;
        }
        tracing::debug!(deliveries = count, "fanned out");
        Ok(count)
    }
    .instrument(span)
    .await
}

/// How much later than an event's time an endpoint may have been created and still get
/// it: the event's time may come from a producer's clock (the DynamoDB outbox item's
/// `created_at`), which may run a little behind ours.
pub const PUBLISH_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Whether `endpoint` may have existed when `event` was published. A fan-out that runs
/// again later (a stream read again from its start, `entrega outbox replay`) reads
/// today's endpoints: without this, an endpoint created since got the old events (a
/// hostile test), which no one ever sent it.
fn existed_when_published(endpoint: &Endpoint, event: &Event) -> bool {
    (endpoint.created_at - event.created_at)
        .to_std()
        .map_or(true, |later| later <= PUBLISH_CLOCK_SKEW)
}

/// The delivery `event` gets at each of `endpoints` that subscribes to it and may have
/// existed when it was published, as a fan-out at `now` creates it (paused at a
/// disabled endpoint), beside its endpoint. Its id is derived from the event and the
/// endpoint, so a second fan-out plans the same ids.
pub fn planned_deliveries<'a>(
    event: &'a Event,
    endpoints: &'a [Endpoint],
    now: DateTime<Utc>,
) -> impl Iterator<Item = (Delivery, &'a Endpoint)> + 'a {
    endpoints
        .iter()
        .filter(|e| e.subscribes_to(&event.event_type) && existed_when_published(e, event))
        .map(move |endpoint| {
            let id =
                DeliveryId::for_event(&event.id, &endpoint.id, event.created_at.timestamp_millis());
            let fresh = Delivery::new(id, event, endpoint.id.clone(), endpoint.disabled, now);
            (fresh, endpoint)
        })
}

/// The message a fan-out queues for `stored` (the delivery as the store holds it after
/// the fan-out's create), if any: only a never-attempted delivery needs its first
/// message; anything further along already has one (or is paused until its endpoint
/// is re-enabled).
pub fn first_message(stored: &Delivery, endpoint: &Endpoint) -> Option<OutgoingMessage> {
    (stored.state == DeliveryState::Pending && stored.attempt_count == 0).then(|| {
        DeliveryTask::for_delivery(stored).message(endpoint.max_concurrency, Duration::ZERO)
    })
}
