//! Races between a person's change and the background: a quick disable during a
//! resume, and a 410 from a URL the endpoint no longer has. Each was found by a
//! hostile test against the binary; here each is pinned on the in-memory world.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{TimeZone, Utc};

use super::health;
use super::resume::{resume_step, ResumeTask};
use super::task::DeliveryTask;
use super::worker::Disposition;
use super::worker_case::{case, Case, During, NEW_URL};
use crate::delivery::DeliveryState;
use crate::endpoint::Endpoint;
use crate::memory::response;
use crate::memory::{MemoryQueue, World};
use crate::ports::{Clock, Hooked, MessageQueue, OutgoingMessage, SendHook, StoreResult};

async fn world_with_endpoint() -> (World, Endpoint) {
    World::with_endpoint(
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap(),
        3,
        |_| {},
    )
    .await
}

/// A delivery queue that notes, at each send, the state of the delivery each message
/// names: what a worker taking the message at that instant would find.
struct Witness {
    inner: MemoryQueue,
    world: Arc<World>,
    seen: Mutex<Vec<DeliveryState>>,
}

#[async_trait]
impl SendHook for Witness {
    fn queue(&self) -> &dyn MessageQueue {
        &self.inner
    }

    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        for m in &messages {
            if let Ok(task) = serde_json::from_str::<DeliveryTask>(&m.body) {
                let d = self
                    .world
                    .services
                    .store
                    .get_delivery(&task.delivery_id)
                    .await?;
                self.seen.lock().unwrap().push(d.unwrap().state);
            }
        }
        self.inner.send(messages).await
    }
}

/// A resume marks a delivery pending before its message exists. The other order lost
/// deliveries to a quick disable: the worker dropped the message of a delivery still
/// paused, then the resume wrote "pending", and no later enable looked at it again.
#[tokio::test]
async fn a_resumed_delivery_is_pending_before_its_message_is_sent() {
    let (world, mut endpoint) = world_with_endpoint().await;
    let world = Arc::new(world);
    let store = &world.services.store;
    endpoint.disabled = true;
    endpoint = store.update_endpoint(&endpoint).await.unwrap();
    let event = crate::event::Event {
        id: crate::ids::EventId::generate(),
        tenant_id: endpoint.tenant_id.clone(),
        event_type: "lead.created".into(),
        payload: "{}".into(),
        created_at: world.clock.now(),
    };
    store.publish(&event).await.unwrap();
    super::fanout::fan_out(&world.services, &event)
        .await
        .unwrap();
    let delivery = store.deliveries_of_event(&event).await.unwrap().remove(0);
    assert_eq!(delivery.state, DeliveryState::Paused);

    endpoint.disabled = false;
    store.update_endpoint(&endpoint).await.unwrap();
    let witness = Arc::new(Hooked(Witness {
        inner: world.deliveries.clone(),
        world: world.clone(),
        seen: Mutex::new(Vec::new()),
    }));
    let mut services = world.services.clone();
    services.deliveries = witness.clone();
    let task = ResumeTask {
        resume_endpoint: endpoint.id.clone(),
        tenant_id: endpoint.tenant_id.clone(),
        cursor: None,
        closing: false,
    };
    assert_eq!(resume_step(&services, &task).await.unwrap(), 1);
    assert_eq!(*witness.seen.lock().unwrap(), [DeliveryState::Pending]);
}

/// A 410 is about the URL that answered it: if the endpoint was pointed elsewhere
/// while the attempt ran, the new URL is not disabled for it.
#[tokio::test]
async fn a_410_from_a_url_the_endpoint_no_longer_has_disables_nothing() {
    let (world, attempted) = world_with_endpoint().await;
    let store = &world.services.store;
    let mut moved = attempted.clone();
    moved.url = "https://new.acme.example/".into();
    store.update_endpoint(&moved).await.unwrap();

    let now = world.clock.now();
    health::disable(
        &world.services,
        &attempted,
        super::follow_up::GONE_REASON,
        now,
    )
    .await
    .unwrap();
    let current = store.get_endpoint(&attempted.id).await.unwrap().unwrap();
    assert!(!current.disabled, "the new URL has not failed");
    assert!(world.notices.notices().is_empty(), "nobody is told of it");

    // The same verdict on the URL it has now does disable it.
    health::disable(
        &world.services,
        &current,
        super::follow_up::GONE_REASON,
        now,
    )
    .await
    .unwrap();
    assert!(
        store
            .get_endpoint(&attempted.id)
            .await
            .unwrap()
            .unwrap()
            .disabled
    );
}

/// One delivery attempted, answered 410 after the endpoint was changed during the
/// attempt (deleted, or pointed elsewhere), and handled.
async fn gone_after_a_change(change: During) -> (Case, crate::delivery::Delivery) {
    let mut c = case(|_| {}).await;
    c.world.transport.then([response(410)]);
    let d = c.publish().await;
    c.change_during_the_first_attempt(match change {
        During::Resend(_) => During::Resend(d.id.clone()),
        other => other,
    });
    assert_eq!(c.handle_next().await, Disposition::Done);
    (c, d)
}

/// A 410 from the URL the endpoint had when the attempt started, answered after it
/// was pointed elsewhere, disables nothing; the delivery is tried at the new URL
/// (it stayed paused for an enable that never came, found by a hostile test).
#[tokio::test]
async fn gone_from_a_url_changed_during_the_attempt_tries_the_new_one() {
    let (c, d) = gone_after_a_change(During::MoveUrl).await;
    assert!(!c.stored_endpoint().await.disabled);
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Delivered);
    let urls: Vec<_> = c
        .world
        .transport
        .requests()
        .into_iter()
        .map(|r| r.url)
        .collect();
    assert_eq!(urls, ["https://hooks.acme.example/", NEW_URL]);
}

/// A 410 from an endpoint deleted during the attempt ends the delivery with it, as
/// the deletion ends every other delivery of the endpoint.
#[tokio::test]
async fn gone_from_an_endpoint_deleted_during_the_attempt_ends_the_delivery() {
    let (c, d) = gone_after_a_change(During::Delete).await;
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Failed);
}

/// A 410 answered while a resend waits behind the attempt still disables the
/// endpoint, and the resend waits, paused, for it to be enabled again: it went
/// straight to the URL that had just said Gone (a hostile test).
#[tokio::test]
async fn gone_while_a_resend_waits_disables_the_endpoint_and_holds_the_resend() {
    let placeholder = crate::ids::DeliveryId::generate();
    let (c, d) = gone_after_a_change(During::Resend(placeholder)).await;
    assert!(c.stored_endpoint().await.disabled, "the 410 stands");
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Paused);
    assert_eq!(
        c.world.transport.requests().len(),
        1,
        "not sent to the Gone URL"
    );
}

/// A 410 answered after the endpoint was disabled and enabled again during the
/// attempt disables nothing: the enable was answered 200 after the request went, and
/// the endpoint's next attempt, under the configuration it has now, gives a verdict
/// of its own (the enable was undone by the old request's 410, a hostile test).
#[tokio::test]
async fn gone_from_before_a_disable_and_enable_during_the_attempt_leaves_it_enabled() {
    let (c, d) = gone_after_a_change(During::DisableAndEnable).await;
    assert!(!c.stored_endpoint().await.disabled, "the enable stands");
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Delivered);
    assert_eq!(c.world.transport.requests().len(), 2);
}

/// At most once, a resend while the attempt is still out is refused: queued, it went
/// once that attempt ended, whatever its answer, and the receiver had the event twice
/// (a hostile test). Once the attempt has ended, a person may resend it.
#[tokio::test]
async fn a_resend_while_an_at_most_once_attempt_is_out_is_refused() {
    let mut c = case(|e| e.mode = crate::endpoint::DeliveryMode::AtMostOnce).await;
    let d = c.publish().await;
    c.change_during_the_first_attempt(During::ResendRefused(d.id.clone()));
    assert_eq!(c.handle_next().await, Disposition::Done);
    let delivered = c.delivery(&d.id).await;
    assert_eq!(delivered.state, DeliveryState::Delivered);
    assert!(c.receive().await.is_none(), "nothing else is queued");
    assert_eq!(c.world.transport.requests().len(), 1);

    let resent = super::resend::resend_delivery(&c.world.services, &delivered, "admin")
        .await
        .expect("a resend after the attempt ended is a person's choice");
    assert_eq!(resent.state, DeliveryState::Pending);
}

/// A 410 answered after a change that leaves the endpoint as it was for the verdict
/// (its description) disables it at once: voided by any change, the Gone receiver had
/// a second request (a hostile test, against the first version of the rule above).
#[tokio::test]
async fn gone_after_a_description_change_during_the_attempt_disables_at_once() {
    let (c, d) = gone_after_a_change(During::Describe).await;
    assert!(c.stored_endpoint().await.disabled);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Paused);
    assert_eq!(c.world.transport.requests().len(), 1);
}
