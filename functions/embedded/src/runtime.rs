//! The in-process runtime: pollers that play the parts of Lambda's event source
//! mappings — outbox → fan-out, delivery queue → worker, failures queue → failure
//! handler — calling the same core handlers the Lambda functions call.
//!
//! Each loop wakes on work (a publish wakes the fan-out, a queued message wakes the
//! worker) and polls only as the fallback. A failing backend is a *condition*: logged
//! once, reported by `/healthz`, and retried with exponential backoff rather than in a
//! tight loop that would flood the log and the disk.

use std::sync::Arc;
use std::time::Duration;

use entrega_core::conditions::{Component, Conditions};
use entrega_core::handlers::age::check_unacknowledged;
use entrega_core::handlers::failures::handle_failure;
use entrega_core::handlers::fanout::fan_out;
use entrega_core::handlers::sweep::{sweep_overdue, SWEEP_INTERVAL};
use entrega_core::handlers::worker::{handle_delivery, Disposition};
use entrega_core::ports::{ReceivedMessage, Services, StoreError};
use entrega_runtime::{pause, poll_until_stopped, LoopBackoff, Settlement, AGE_CHECK_INTERVAL};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::sqlite::queue::SqliteQueue;
use crate::sqlite::replayable;
use crate::sqlite::SqliteStore;

/// Attempts in flight at once across all endpoints. Per-endpoint caps keep any one
/// endpoint to a fraction of this, which is what protects the other tenants.
pub const WORKER_SLOTS: usize = 64;
/// How long a received delivery message stays hidden: longer than the longest
/// attempt (30 s timeout + lease margin), so no second worker picks it up meanwhile.
pub const RECEIVE_VISIBILITY: Duration = Duration::from_secs(60);
/// Longest wait between polls when nothing signalled work (delayed retries coming
/// due, and a missed wake-up, are picked up this late at worst).
pub const IDLE_POLL: Duration = Duration::from_millis(50);
/// Outbox events fanned out per poll.
const OUTBOX_BATCH: usize = 100;
/// Failure notices handled per poll.
const FAILURE_BATCH: usize = 10;

/// Fan-outs started by publishes and not yet done, at most: past it a publish leaves
/// its event to the outbox poller (which takes it [`INLINE_GRACE`] later), so a flood
/// of publishes cannot pile up tasks without bound.
pub const INLINE_FAN_OUTS: usize = 1_024;

/// The embedded runtime's step after a publish commits: fan the event out at once,
/// beside the request (which answers 202 without waiting for it), so a tenant's burst
/// is fanned out as fast as it is accepted and its other events never queue behind
/// it in the outbox. A failure here loses nothing: the event is committed, and the
/// outbox poller fans it out once it is [`INLINE_GRACE`] old.
pub struct InlineFanOut {
    pub services: Services,
    pub store: SqliteStore,
    /// [`INLINE_FAN_OUTS`] permits.
    pub running: Arc<Semaphore>,
}

impl InlineFanOut {
    pub fn new(services: Services, store: SqliteStore) -> Self {
        Self {
            services,
            store,
            running: Arc::new(Semaphore::new(INLINE_FAN_OUTS)),
        }
    }
}

#[async_trait::async_trait]
impl entrega_http::api::AfterPublish for InlineFanOut {
    async fn published(&self, event: &entrega_core::event::Event) {
        let Ok(permit) = self.running.clone().try_acquire_owned() else {
            tracing::debug!(event_id = %event.id, "too many fan-outs under way; the outbox poller takes this one");
            return;
        };
        let (services, store, event) = (self.services.clone(), self.store.clone(), event.clone());
        tokio::spawn(async move {
            if let Err(e) = fan_out_committed(&services, &store, &event).await {
                tracing::debug!(event_id = %event.id, error = %e, "fan-out at publish failed; the outbox poller retries it");
            }
            drop(permit);
        });
    }
}

/// Fan a committed event out, then mark its outbox row. Marked only after its
/// deliveries are queued: a crash between the two replays the fan-out, which is
/// idempotent.
///
/// Its writes are [`replayable`]: the outbox row is already durable, so they commit
/// without waiting for the disk (see there for why that loses nothing).
async fn fan_out_committed(
    services: &Services,
    store: &SqliteStore,
    event: &entrega_core::event::Event,
) -> Result<(), StoreError> {
    replayable(async {
        fan_out(services, event).await?;
        store.mark_fanned_out(event).await
    })
    .await
}

/// How old an outbox row must be before the poller takes it: younger ones are being
/// fanned out by their own publish request.
pub const INLINE_GRACE: Duration = Duration::from_secs(2);

/// The pollers, started together and stopped together.
pub struct Runtime {
    pub services: Services,
    pub store: SqliteStore,
    /// The delivery queue itself, for its wake-up signal.
    pub delivery_queue: SqliteQueue,
    pub conditions: Arc<Conditions>,
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
        tasks.spawn(this.clone().age_loop(shutdown.clone()));
        tasks.spawn(this.clone().sweep_loop(shutdown));
        while tasks.join_next().await.is_some() {}
    }

    fn failing(&self, component: Component, error: &StoreError) {
        self.conditions
            .failing(component, &error.to_string(), self.services.clock.now());
    }

    fn observe(&self, component: Component, result: &Result<bool, StoreError>) {
        match result {
            Ok(_) => self.conditions.recovered(component),
            Err(e) => self.failing(component, e),
        }
    }

    async fn outbox_loop(self: Arc<Self>, shutdown: watch::Receiver<bool>) {
        poll_until_stopped(
            shutdown,
            IDLE_POLL,
            || self.fan_out_waiting(),
            |result| self.observe(Component::Outbox, result),
        )
        .await;
    }

    /// Fan out what waits in the outbox; `Ok(true)` if there was any.
    async fn fan_out_waiting(&self) -> Result<bool, StoreError> {
        let events = self
            .store
            .outbox_waiting(OUTBOX_BATCH, INLINE_GRACE)
            .await?;
        for event in &events {
            fan_out_committed(&self.services, &self.store, event).await?;
        }
        Ok(!events.is_empty())
    }

    async fn delivery_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let slots = Arc::new(Semaphore::new(WORKER_SLOTS));
        let mut in_flight = JoinSet::new();
        let mut backoff = LoopBackoff::default();
        while !*shutdown.borrow() {
            while in_flight.try_join_next().is_some() {}
            let free = slots.available_permits();
            if free == 0 {
                tokio::select! {
                    _ = in_flight.join_next() => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            let received = match self
                .services
                .deliveries
                .receive(free, RECEIVE_VISIBILITY)
                .await
            {
                Ok(messages) => {
                    backoff.reset();
                    messages
                }
                Err(e) => {
                    self.failing(Component::Deliveries, &e);
                    pause(&mut shutdown, backoff.next_pause()).await;
                    continue;
                }
            };
            if received.is_empty() {
                tokio::select! {
                    _ = self.delivery_queue.work_arrived() => {}
                    _ = tokio::time::sleep(IDLE_POLL) => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            for message in received {
                let permit = slots.clone().acquire_owned().await.expect("never closed");
                let (services, conditions) = (self.services.clone(), self.conditions.clone());
                in_flight.spawn(async move {
                    run_delivery(&services, &conditions, message).await;
                    drop(permit);
                });
            }
        }
        // Graceful stop: no new work, but attempts already sent get their outcome
        // recorded. (Bounded: each attempt ends by its own timeout.)
        while in_flight.join_next().await.is_some() {}
    }

    async fn failure_loop(self: Arc<Self>, shutdown: watch::Receiver<bool>) {
        poll_until_stopped(
            shutdown,
            IDLE_POLL,
            || self.handle_failures(),
            |result| self.observe(Component::Failures, result),
        )
        .await;
    }

    /// Handle a batch of failure notices; `Ok(true)` if there were any. One notice's
    /// backend error is the batch's (the others are settled each by its own outcome).
    async fn handle_failures(&self) -> Result<bool, StoreError> {
        let queue = &self.services.failures;
        let received = queue.receive(FAILURE_BATCH, RECEIVE_VISIBILITY).await?;
        let mut failed = None;
        for message in &received {
            let outcome = handle_failure(&self.services, &message.body)
                .await
                .map(|_| Disposition::Done);
            if let Err(e) = &outcome {
                failed = Some(e.clone());
            }
            Settlement::of(
                &outcome,
                message.receive_count,
                self.services.random.as_ref(),
            )
            .apply(queue.as_ref(), &message.receipt)
            .await;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(!received.is_empty()),
        }
    }

    /// The sweeper, on a timer: the embedded queue shares the store's transactions, so
    /// a lost message would take a bug or a hand-edited database; the sweep is the
    /// same safety net as on AWS, from the same handler.
    async fn sweep_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        pause(&mut shutdown, SWEEP_INTERVAL).await;
        while !*shutdown.borrow() {
            match sweep_overdue(&self.services).await {
                Ok(_) => self.conditions.recovered(Component::Sweeper),
                Err(e) => self.failing(Component::Sweeper, &e),
            }
            pause(&mut shutdown, SWEEP_INTERVAL).await;
        }
    }

    /// The 24-hour rule, checked on a timer so it fires without new failures.
    async fn age_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            match check_unacknowledged(&self.services).await {
                Ok(_) => self.conditions.recovered(Component::AgeCheck),
                Err(e) => self.failing(Component::AgeCheck, &e),
            }
            pause(&mut shutdown, AGE_CHECK_INTERVAL).await;
        }
    }
}

async fn run_delivery(services: &Services, conditions: &Conditions, message: ReceivedMessage) {
    let outcome = handle_delivery(services, &message.body, message.receive_count).await;
    match &outcome {
        Ok(_) => conditions.recovered(Component::Deliveries),
        Err(e) => {
            tracing::debug!(error = %e, receive_count = message.receive_count, "handler failed; message will come back");
            conditions.failing(Component::Deliveries, &e.to_string(), services.clock.now())
        }
    }
    Settlement::of(&outcome, message.receive_count, services.random.as_ref())
        .apply(services.deliveries.as_ref(), &message.receipt)
        .await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use entrega_core::ports::SystemClock;
    use entrega_http::api::AfterPublish;
    use entrega_http::transport::{HttpTransport, TargetPolicy};
    use tokio::sync::Semaphore;

    use super::InlineFanOut;

    /// A publish that finds every fan-out slot taken leaves its event to the outbox
    /// poller; one that finds a slot fans it out beside the request.
    #[tokio::test]
    async fn fan_outs_past_the_bound_are_left_to_the_outbox_poller() {
        let dir = entrega_testkit::TempDir::new("inline-bound");
        let transport = Arc::new(HttpTransport::new(TargetPolicy::default()));
        let (services, store) =
            crate::serve::open_sqlite(&dir.0.join("i.db"), Arc::new(SystemClock), transport)
                .await
                .unwrap();
        let (_, event) =
            crate::test_support::tenant_with_endpoint(&services, "https://hooks.example.com/")
                .await;

        let full = InlineFanOut {
            running: Arc::new(Semaphore::new(0)),
            ..InlineFanOut::new(services.clone(), store.clone())
        };
        let left = event();
        services.store.publish(&left).await.unwrap();
        full.published(&left).await;
        let free = InlineFanOut::new(services.clone(), store.clone());
        let taken = event();
        services.store.publish(&taken).await.unwrap();
        free.published(&taken).await;
        // The outbox keeps the event left alone, and only it, once the other's
        // fan-out has marked its row.
        entrega_testkit::eventually(Duration::from_secs(5), "the fan-out", || async {
            let waiting = store.outbox_waiting(10, Duration::ZERO).await.unwrap();
            (waiting.len() == 1 && waiting[0].id == left.id).then_some(())
        })
        .await;
        assert_eq!(
            services
                .store
                .deliveries_of_event(&taken)
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(services
            .store
            .deliveries_of_event(&left)
            .await
            .unwrap()
            .is_empty());
    }
}
