//! The in-process runtime: pollers that play the parts of Lambda's event source
//! mappings — outbox → fan-out, delivery queue → worker, failures queue → failure
//! handler — calling the same core handlers the Lambda functions call.

use std::sync::Arc;
use std::time::Duration;

use entrega_core::handlers::age::check_unacknowledged;
use entrega_core::handlers::failures::handle_failure;
use entrega_core::handlers::fanout::fan_out;
use entrega_core::handlers::worker::{handle_delivery, Disposition};
use entrega_core::ports::{MessageQueue, ReceivedMessage, Services};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::sqlite::SqliteStore;

/// Attempts in flight at once across all endpoints. Per-endpoint caps keep any one
/// endpoint to a fraction of this, which is what protects the other tenants.
pub const WORKER_SLOTS: usize = 64;
/// How long a received delivery message stays hidden: longer than the longest
/// attempt (30 s timeout + lease margin), so no second worker picks it up meanwhile.
pub const RECEIVE_VISIBILITY: Duration = Duration::from_secs(60);
/// Pause between polls when there was nothing to do.
pub const IDLE_POLL: Duration = Duration::from_millis(50);
/// Outbox events fanned out per poll.
const OUTBOX_BATCH: usize = 100;
/// Failure notices handled per poll.
const FAILURE_BATCH: usize = 10;
/// A message whose handler hit a backend error comes back after this.
const ERROR_BACKOFF: Duration = Duration::from_secs(5);

/// How often the 24-hour rule is checked (the scheduled check of DESIGN.md).
pub const AGE_CHECK_INTERVAL: Duration = Duration::from_secs(60);

/// The pollers, started together and stopped together.
pub struct Runtime {
    pub services: Services,
    pub store: SqliteStore,
}

impl Runtime {
    /// Run until `shutdown` turns true; then stop taking work and let in-flight
    /// attempts finish (their outcomes are recorded) before returning.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let mut tasks = JoinSet::new();
        tasks.spawn(this.clone().outbox_loop(shutdown.clone()));
        tasks.spawn(this.clone().delivery_loop(shutdown.clone()));
        tasks.spawn(this.clone().failure_loop(shutdown.clone()));
        tasks.spawn(this.clone().age_loop(shutdown));
        while tasks.join_next().await.is_some() {}
    }

    async fn outbox_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            let worked = match self.store.outbox_waiting(OUTBOX_BATCH).await {
                Ok(events) => {
                    for event in &events {
                        // Marked only after its deliveries are queued: a crash between
                        // the two replays the fan-out, which is idempotent.
                        let done = match fan_out(&self.services, event).await {
                            Ok(_) => self.store.mark_fanned_out(&event.id).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = done {
                            tracing::error!(event_id = %event.id, error = %e, "fan-out failed; will retry");
                        }
                    }
                    !events.is_empty()
                }
                Err(e) => {
                    tracing::error!(error = %e, "reading the outbox failed");
                    false
                }
            };
            if !worked {
                idle(&mut shutdown).await;
            }
        }
    }

    async fn delivery_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let slots = Arc::new(Semaphore::new(WORKER_SLOTS));
        let mut in_flight = JoinSet::new();
        while !*shutdown.borrow() {
            while in_flight.try_join_next().is_some() {}
            let free = slots.available_permits();
            let received = match self
                .services
                .deliveries
                .receive(free, RECEIVE_VISIBILITY)
                .await
            {
                Ok(messages) => messages,
                Err(e) => {
                    tracing::error!(error = %e, "receiving deliveries failed");
                    Vec::new()
                }
            };
            if received.is_empty() {
                idle(&mut shutdown).await;
                continue;
            }
            for message in received {
                let permit = slots.clone().acquire_owned().await.expect("never closed");
                let services = self.services.clone();
                in_flight.spawn(async move {
                    run_delivery(&services, message).await;
                    drop(permit);
                });
            }
        }
        // Graceful stop: no new work, but attempts already sent get their outcome
        // recorded. (Bounded: each attempt ends by its own timeout.)
        while in_flight.join_next().await.is_some() {}
    }

    async fn failure_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            let received = self
                .services
                .failures
                .receive(FAILURE_BATCH, RECEIVE_VISIBILITY)
                .await
                .unwrap_or_else(|e| {
                    tracing::error!(error = %e, "receiving failures failed");
                    Vec::new()
                });
            if received.is_empty() {
                idle(&mut shutdown).await;
                continue;
            }
            for message in received {
                let queue = &self.services.failures;
                let outcome = handle_failure(&self.services, &message.body).await;
                settle(queue.as_ref(), &message, outcome.map(|_| Disposition::Done)).await;
            }
        }
    }
}

impl Runtime {
    /// The 24-hour rule, checked on a timer so it fires without new failures.
    async fn age_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            if let Err(e) = check_unacknowledged(&self.services).await {
                tracing::error!(error = %e, "checking unacknowledged failures failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(AGE_CHECK_INTERVAL) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

async fn run_delivery(services: &Services, message: ReceivedMessage) {
    let outcome = handle_delivery(services, &message.body).await;
    settle(services.deliveries.as_ref(), &message, outcome).await;
}

/// Apply a handler's disposition to its message.
async fn settle(
    queue: &dyn MessageQueue,
    message: &ReceivedMessage,
    outcome: entrega_core::ports::StoreResult<Disposition>,
) {
    let result = match outcome {
        Ok(Disposition::Done) => queue.delete(&message.receipt).await,
        Ok(Disposition::RetryIn(delay)) => queue.change_visibility(&message.receipt, delay).await,
        Err(e) => {
            tracing::error!(error = %e, receive_count = message.receive_count, "handler failed; message will come back");
            queue
                .change_visibility(&message.receipt, ERROR_BACKOFF)
                .await
        }
    };
    if let Err(e) = result {
        // The message stays and reappears after its visibility timeout: nothing lost.
        tracing::error!(error = %e, "settling a message failed");
    }
}

async fn idle(shutdown: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(IDLE_POLL) => {}
        _ = shutdown.changed() => {}
    }
}
