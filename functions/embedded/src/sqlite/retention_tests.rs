//! The retention purge: what has outlived the period goes, with its attempts and its
//! event; what is still waiting, paused or recent stays, and so does its event.

use std::sync::Arc;
use std::time::Duration;

use entrega_core::delivery::{Delivery, DeliveryState};
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::failure::{Failure, FailureReason};
use entrega_core::ids::{EventId, FailureId, TenantId};
use entrega_core::ports::{Clock, DeliveryStore, EventStore, FailureStore, ManualClock};

use super::*;
use crate::sqlite::SqliteDb;

const PERIOD: Duration = Duration::from_secs(30 * 86_400);

struct World {
    _dir: entrega_testkit::TempDir,
    store: SqliteStore,
    clock: Arc<ManualClock>,
    tenant: TenantId,
    endpoint: Endpoint,
}

impl World {
    fn new(name: &str) -> Self {
        let dir = entrega_testkit::TempDir::new(name);
        let clock = Arc::new(ManualClock::new(Utc::now() - chrono::Duration::days(60)));
        let store = SqliteStore::new(SqliteDb::open(&dir.0.join("r.db")).unwrap(), clock.clone());
        let tenant = TenantId::generate();
        let endpoint = Endpoint::new(tenant.clone(), "https://hooks.example.com/", clock.now());
        Self {
            _dir: dir,
            store,
            clock,
            tenant,
            endpoint,
        }
    }

    /// An event published now, with one delivery to the endpoint left in `state`
    /// (`None`: no delivery) and, if settled, one attempt.
    async fn event(&self, state: Option<DeliveryState>) -> (Event, Option<Delivery>) {
        let now = self.clock.now();
        let event = Event {
            id: EventId::generate(),
            tenant_id: self.tenant.clone(),
            event_type: "a.b".into(),
            payload: "{}".into(),
            created_at: now,
        };
        self.store.publish(&event).await.unwrap();
        self.store.mark_fanned_out(&event, ()).await.unwrap();
        let Some(state) = state else {
            return (event, None);
        };
        let id = DeliveryId::for_event(&event.id, &self.endpoint.id, now.timestamp_millis());
        let fresh = Delivery::new(id, &event, self.endpoint.id.clone(), false, now);
        let (mut delivery, _) = self.store.create_delivery_if_absent(&fresh).await.unwrap();
        if state != DeliveryState::Pending {
            delivery.state = state;
            delivery.updated_at = now;
            let attempts = if state.is_terminal() {
                vec![entrega_testkit::conformance::attempt(
                    &delivery,
                    &self.endpoint,
                    1,
                )]
            } else {
                vec![]
            };
            delivery = self
                .store
                .save_delivery(&delivery, &attempts)
                .await
                .unwrap();
        }
        (event, Some(delivery))
    }

    async fn failure(&self, delivery: &Delivery) -> FailureId {
        let now = self.clock.now();
        let failure = Failure {
            id: FailureId::for_delivery(&delivery.id, 0, now.timestamp_millis()),
            tenant_id: self.tenant.clone(),
            delivery_id: delivery.id.clone(),
            event_id: delivery.event_id.clone(),
            event_type: "a.b".into(),
            endpoint_id: self.endpoint.id.clone(),
            reason: FailureReason::Exhausted,
            payload: "{}".into(),
            attempt_times: vec![now],
            last_status_code: Some(500),
            last_error: Some("HTTP 500".into()),
            created_at: now,
            acknowledged_at: None,
            ack_note: None,
            acknowledged_by: None,
        };
        assert!(self.store.put_failure_if_absent(&failure).await.unwrap());
        failure.id
    }

    /// Purge passes until one is done, as the runtime runs them.
    async fn purge(&self) -> PurgeStep {
        let cutoff = self.clock.now() - chrono::Duration::from_std(PERIOD).unwrap();
        let mut total = PurgeStep::default();
        let mut cursor = PurgeCursor::default();
        loop {
            let step = self.store.purge_step(cutoff, cursor).await.unwrap();
            total.deliveries += step.deliveries;
            total.events += step.events;
            total.failures += step.failures;
            match step.next {
                Some(next) => cursor = next,
                None => return total,
            }
        }
    }

    async fn has_event(&self, event: &Event) -> bool {
        self.store
            .get_event(&event.tenant_id, &event.id)
            .await
            .unwrap()
            .is_some()
    }

    async fn has_delivery(&self, delivery: &Option<Delivery>) -> bool {
        let id = &delivery.as_ref().unwrap().id;
        self.store.get_delivery(id).await.unwrap().is_some()
    }
}

#[tokio::test]
async fn settled_records_past_the_period_go_and_everything_else_stays() {
    let w = World::new("retention");
    let (delivered, delivered_d) = w.event(Some(DeliveryState::Delivered)).await;
    let (exhausted, exhausted_d) = w.event(Some(DeliveryState::Exhausted)).await;
    let old_failure = w.failure(exhausted_d.as_ref().unwrap()).await;
    let (unrouted, _) = w.event(None).await;
    let (waiting, waiting_d) = w.event(Some(DeliveryState::Retrying)).await;
    let (paused, paused_d) = w.event(Some(DeliveryState::Paused)).await;
    // A settled delivery of the same age changed since (resent, delivered again).
    let (resent, mut resent_d) = w.event(Some(DeliveryState::Delivered)).await;

    w.clock.advance(PERIOD + Duration::from_secs(3_600));
    let d = resent_d.as_mut().unwrap();
    d.updated_at = w.clock.now();
    *d = w.store.save_delivery(d, &[]).await.unwrap();
    let (recent, recent_d) = w.event(Some(DeliveryState::Delivered)).await;
    let recent_failure = w.failure(recent_d.as_ref().unwrap()).await;

    let purged = w.purge().await;
    assert_eq!(
        (purged.deliveries, purged.events, purged.failures),
        (2, 3, 1),
        "{purged:?}"
    );
    for (event, delivery) in [(&delivered, &delivered_d), (&exhausted, &exhausted_d)] {
        assert!(!w.has_event(event).await && !w.has_delivery(delivery).await);
        let id = &delivery.as_ref().unwrap().id;
        assert!(
            w.store.list_attempts(id).await.unwrap().is_empty(),
            "its attempts too"
        );
    }
    assert!(
        !w.has_event(&unrouted).await,
        "an old event with no delivery"
    );
    assert!(w.store.get_failure(&old_failure).await.unwrap().is_none());
    for (event, delivery) in [
        (&waiting, &waiting_d),
        (&paused, &paused_d),
        (&resent, &resent_d),
        (&recent, &recent_d),
    ] {
        assert!(w.has_event(event).await, "the event of a delivery left");
        assert!(w.has_delivery(delivery).await);
    }
    assert!(w
        .store
        .get_failure(&recent_failure)
        .await
        .unwrap()
        .is_some());
    assert_eq!(w.purge().await, PurgeStep::default(), "nothing more to do");
}

/// A pass over more than a window goes on from where each step stopped. An event
/// whose delivery outlived the step that passed it goes in the next pass.
#[tokio::test]
async fn a_pass_goes_window_by_window() {
    let w = World::new("retention-windows");
    let old = PURGE_WINDOW + 20;
    for _ in 0..old {
        w.event(Some(DeliveryState::Delivered)).await;
    }
    w.clock.advance(PERIOD * 2);
    let cutoff = w.clock.now() - chrono::Duration::from_std(PERIOD).unwrap();
    let first = w
        .store
        .purge_step(cutoff, PurgeCursor::default())
        .await
        .unwrap();
    assert_eq!(first.deliveries, PURGE_WINDOW, "one window at a time");
    let second = w
        .store
        .purge_step(cutoff, first.next.expect("more to do"))
        .await
        .unwrap();
    assert_eq!(second.deliveries, 20);
    assert_eq!(second.next, None, "the pass is done");
    let next_pass = w.purge().await;
    assert_eq!(next_pass.deliveries, 0);
    assert_eq!(first.events + second.events + next_pass.events, old);
    assert_eq!(w.purge().await, PurgeStep::default());
}
