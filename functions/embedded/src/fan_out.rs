//! The embedded runtime's fan-out of an event, outside the outbox poller: in a
//! publish's own commit ([`PublishAndFanOut`]), beside a publish's request when that
//! cannot be, and by a producer outbox's drain. The poller stays the fallback: it fans
//! out what these did not (a crash, a full bound), and leaves alone what they are
//! fanning out, so no event is fanned out twice at once (that would queue two
//! messages for each of its deliveries, and both could be sent).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use entrega_core::event::Event;
use entrega_core::handlers::fanout::{fan_out, first_message, planned_deliveries};
use entrega_core::ports::{Clock, Published, Services, StoreError, StoreResult};
use tokio::sync::Semaphore;

use crate::sqlite::publish_fan_out::PlannedDelivery;
use crate::sqlite::queue::SqliteQueue;
use crate::sqlite::replayable;
use crate::sqlite::SqliteStore;

/// Deliveries one publish creates in its own commit, at most: an event for a tenant
/// with more subscribed endpoints is fanned out beside the request instead, so one
/// publish's write never holds the writer thread for long.
pub const DELIVERIES_IN_A_PUBLISH: usize = 64;

/// A step after an event commits: the fan-out beside a publish's request, or behind a
/// producer outbox's drain.
#[async_trait::async_trait]
pub trait AfterPublish: Send + Sync {
    async fn published(&self, event: &Event);
}

/// Fan-outs started by publishes and not yet done, at most: past it a publish leaves
/// its event to the outbox poller (which takes it [`crate::runtime::INLINE_GRACE`]
/// later), so a flood of publishes cannot pile up tasks without bound.
pub const FAN_OUTS_BESIDE_REQUESTS: usize = 1_024;

/// The events being fanned out here, which the outbox poller leaves alone: from a
/// publish's start of its fan-out, or a poller's, until the outbox row's mark has
/// committed. Counted: a publish and its fan-out each hold a mark.
#[derive(Clone, Default)]
pub struct FanOutsUnderWay(Arc<Mutex<HashMap<(String, String), usize>>>);

impl FanOutsUnderWay {
    fn key(event: &Event) -> (String, String) {
        (event.tenant_id.to_string(), event.id.to_string())
    }

    fn set(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), usize>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `event` is being fanned out here.
    pub fn contains(&self, event: &Event) -> bool {
        self.set().contains_key(&Self::key(event))
    }

    /// Mark `event` under way until the guard is dropped (also if the task holding it
    /// is cancelled: an event left marked would never be fanned out by the poller).
    fn start(&self, event: &Event) -> UnderWay {
        let key = Self::key(event);
        *self.set().entry(key.clone()).or_default() += 1;
        UnderWay {
            set: self.clone(),
            key,
        }
    }
}

struct UnderWay {
    set: FanOutsUnderWay,
    key: (String, String),
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        let mut set = self.set.set();
        if let Some(held) = set.get_mut(&self.key) {
            *held -= 1;
            if *held == 0 {
                set.remove(&self.key);
            }
        }
    }
}

/// Fan a committed event out, then mark its outbox row, holding `event` under way
/// until the mark has committed. Marked only after its deliveries are queued: a crash
/// between the two replays the fan-out. Held until then: a poll that read the row
/// before its mark committed fanned the event out again (a second message for each
/// delivery, both sent at once).
///
/// Its writes are [`replayable`]: the outbox row is already durable, so they commit
/// without waiting for the disk (see there for why that loses nothing).
pub async fn fan_out_committed(
    services: &Services,
    store: &SqliteStore,
    under_way: &FanOutsUnderWay,
    event: &Event,
) -> Result<(), StoreError> {
    let until_marked = under_way.start(event);
    replayable(async {
        fan_out(services, event).await?;
        store.mark_fanned_out(event, until_marked).await
    })
    .await
}

/// Fan a committed event out at once, returning when it is done (a drain's step: the
/// fan-out is its back-pressure). A failure here loses nothing: the event is
/// committed, and the outbox poller fans it out.
pub struct InlineFanOut {
    pub services: Services,
    pub store: SqliteStore,
    pub under_way: FanOutsUnderWay,
}

impl InlineFanOut {
    /// Fan `event` out; a failure is left to the outbox poller.
    async fn fan_out(&self, event: &Event) {
        if let Err(e) = fan_out_committed(&self.services, &self.store, &self.under_way, event).await
        {
            tracing::debug!(event_id = %event.id, error = %e, "fan-out after publish failed; the outbox poller retries it");
        }
    }
}

#[async_trait::async_trait]
impl AfterPublish for InlineFanOut {
    async fn published(&self, event: &Event) {
        // Under way from here until its mark commits: `fan_out_committed` holds it.
        self.fan_out(event).await;
    }
}

/// A publish's step: start the event's fan-out beside the request, which answers 202
/// without waiting for it (its event is committed), so publishers do not wait a second
/// commit and a tenant's burst is fanned out as fast as it is accepted.
pub struct FanOutBesideRequest {
    pub inline: Arc<InlineFanOut>,
    /// [`FAN_OUTS_BESIDE_REQUESTS`] permits.
    pub running: Arc<Semaphore>,
}

impl FanOutBesideRequest {
    pub fn new(inline: Arc<InlineFanOut>) -> Self {
        Self {
            inline,
            running: Arc::new(Semaphore::new(FAN_OUTS_BESIDE_REQUESTS)),
        }
    }
}

#[async_trait::async_trait]
impl AfterPublish for FanOutBesideRequest {
    async fn published(&self, event: &Event) {
        let Ok(permit) = self.running.clone().try_acquire_owned() else {
            tracing::debug!(event_id = %event.id, "too many fan-outs under way; the outbox poller takes this one");
            return;
        };
        // Marked before the request answers, so the poller never finds it unmarked.
        let marked = self.inline.under_way.start(event);
        let (inline, event) = (self.inline.clone(), event.clone());
        tokio::spawn(async move {
            inline.fan_out(&event).await;
            drop((marked, permit));
        });
    }
}

/// The embedded API's publish: the event, its deliveries and their first messages in
/// one commit (see [`crate::sqlite::publish_fan_out`]), planned by the fan-out's own
/// rules from the tenant's endpoints as the store reads them. Where that cannot be, the
/// event is published alone and fanned out beside the request, as before:
///
/// - a disabled endpoint subscribes: its delivery is created paused, and an enable that
///   commits between reading the list and the publish's commit must still resume it,
///   which the fan-out handler does after its create (`resume_if_enabled`);
/// - more than [`DELIVERIES_IN_A_PUBLISH`] endpoints subscribe.
pub struct PublishAndFanOut {
    pub store: SqliteStore,
    pub queue: SqliteQueue,
    pub clock: Arc<dyn Clock>,
    pub beside: FanOutBesideRequest,
}

#[async_trait::async_trait]
impl entrega_http::api::Publisher for PublishAndFanOut {
    async fn publish(&self, event: &Event) -> StoreResult<Published> {
        use entrega_core::ports::EventStore;

        let endpoints = self.store.shared_tenant_endpoints(&event.tenant_id).await?;
        let mut planned = Vec::new();
        for (delivery, endpoint) in planned_deliveries(event, &endpoints, self.clock.now()) {
            let first = first_message(&delivery, endpoint);
            match first {
                Some(first_message) if planned.len() < DELIVERIES_IN_A_PUBLISH => {
                    planned.push(PlannedDelivery {
                        delivery,
                        first_message,
                    })
                }
                _ => {
                    let published = self.store.publish(event).await?;
                    if published == Published::Created {
                        self.beside.published(event).await;
                    }
                    return Ok(published);
                }
            }
        }
        self.store
            .publish_with_deliveries(event, planned, endpoints, &self.queue)
            .await
    }
}

#[cfg(test)]
#[path = "fan_out_tests.rs"]
mod tests;
