//! The worker tests' fixture: a tenant with one endpoint in a fresh in-memory world,
//! and the steps a runtime takes with a message (shared by `worker_tests.rs` and
//! `race_tests.rs`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};

use super::worker::{handle_delivery, Disposition};
use crate::delivery::Delivery;
use crate::endpoint::Endpoint;
use crate::event::Event;
use crate::handlers::fanout::fan_out;
use crate::ids::{EventId, TenantId};
use crate::memory::World;
use crate::ports::{Clock, MessageQueue, ReceivedMessage};
use crate::retry::{CustomRetry, RetrySpec};
use crate::slots::SlotPool;

pub(super) const HIDE: Duration = Duration::from_secs(60);

pub(super) struct Case {
    pub(super) world: World,
    pub(super) endpoint: Endpoint,
}

/// A tenant with one endpoint set up by `configure`, in a fresh world.
pub(super) async fn case(configure: impl FnOnce(&mut Endpoint)) -> Case {
    let world = World::new(Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap(), 7);
    let tenant = world
        .add_tenant(TenantId::generate(), "Acme", "owner@acme.example")
        .await
        .unwrap();
    let endpoint = world
        .add_endpoint(&tenant, "https://hooks.acme.example/", configure)
        .await
        .unwrap();
    Case { world, endpoint }
}

pub(super) fn retry_after(delays_s: Vec<u64>) -> RetrySpec {
    RetrySpec::Custom(CustomRetry {
        delays_s,
        jitter: 0.0,
        retry_4xx: false,
    })
}

impl Case {
    /// Publish an event and fan it out; its delivery.
    pub(super) async fn publish(&self) -> Delivery {
        let event = Event {
            id: EventId::generate(),
            tenant_id: self.endpoint.tenant_id.clone(),
            event_type: "lead.created".into(),
            payload: r#"{"lead":1}"#.into(),
            created_at: self.world.clock.now(),
        };
        self.world.services.store.publish(&event).await.unwrap();
        fan_out(&self.world.services, &event).await.unwrap();
        let deliveries = self
            .world
            .services
            .store
            .deliveries_of_event(&event)
            .await
            .unwrap();
        assert_eq!(deliveries.len(), 1);
        deliveries[0].clone()
    }

    pub(super) async fn receive(&self) -> Option<ReceivedMessage> {
        self.world.deliveries.receive(1, HIDE).await.unwrap().pop()
    }

    /// Receive the next message, handle it, and settle it as a runtime would.
    pub(super) async fn handle_next(&self) -> Disposition {
        let message = self.receive().await.expect("a message is waiting");
        let disposition =
            handle_delivery(&self.world.services, &message.body, message.receive_count)
                .await
                .unwrap();
        match disposition {
            Disposition::Done => self.world.deliveries.delete(&message.receipt).await,
            Disposition::RetryIn(delay) => {
                self.world
                    .deliveries
                    .change_visibility(&message.receipt, delay)
                    .await
            }
        }
        .unwrap();
        disposition
    }

    pub(super) async fn delivery(&self, id: &crate::ids::DeliveryId) -> Delivery {
        self.world.stored_delivery(id).await
    }

    pub(super) async fn attempts(
        &self,
        id: &crate::ids::DeliveryId,
    ) -> Vec<crate::delivery::Attempt> {
        self.world.services.store.list_attempts(id).await.unwrap()
    }

    /// Change the endpoint as stored now, as its owner would.
    pub(super) async fn change_endpoint(&self, change: impl FnOnce(&mut Endpoint)) {
        let mut endpoint = self.stored_endpoint().await;
        change(&mut endpoint);
        let store = &self.world.services.store;
        store.update_endpoint(&endpoint).await.unwrap();
    }

    /// The endpoint as stored now (its health included).
    pub(super) async fn stored_endpoint(&self) -> Endpoint {
        let stored = self.world.services.store.get_endpoint(&self.endpoint.id);
        stored.await.unwrap().expect("the endpoint is stored")
    }

    /// The one place of a slow share of one, for `holder`, if it is free.
    pub(super) async fn hold_slow_share(&self, holder: &str) -> Option<crate::slots::SlotLease> {
        self.hold(SlotPool::SlowEndpoints, holder).await
    }

    /// The first of the endpoint's slots, for `holder` (another attempt), if it is free.
    pub(super) async fn hold_endpoint_slot(&self, holder: &str) -> Option<crate::slots::SlotLease> {
        self.hold(SlotPool::Endpoint(self.endpoint.id.clone()), holder)
            .await
    }

    /// The first place of `pool`, taken as a pool of one, for `holder`.
    async fn hold(&self, pool: SlotPool, holder: &str) -> Option<crate::slots::SlotLease> {
        let now = self.world.clock.now();
        let slots = &self.world.services.slots;
        slots.acquire(&pool, 1, holder, now, HIDE).await.unwrap()
    }

    pub(super) fn advance(&self, seconds: u64) {
        self.world.clock.advance(Duration::from_secs(seconds));
    }
}

/// What a person does while the first request is out.
pub(super) enum During {
    /// Points the endpoint at [`NEW_URL`].
    MoveUrl,
    /// Deletes the endpoint.
    Delete,
    /// Resends this delivery.
    Resend(crate::ids::DeliveryId),
    /// Tries to resend this delivery of an at-most-once endpoint, which is refused.
    ResendRefused(crate::ids::DeliveryId),
    /// Disables the endpoint, then enables it again.
    DisableAndEnable,
    /// Changes the endpoint's description.
    Describe,
}

/// Does what [`During`] says while the first request is out, then answers as the
/// scripted transport does.
struct ChangedDuringTheAttempt {
    inner: Arc<crate::memory::ScriptedTransport>,
    /// The world's services as they were (no HTTP is sent through them).
    services: crate::ports::Services,
    endpoint: crate::ids::EndpointId,
    change: During,
    done: std::sync::atomic::AtomicBool,
}

/// Where [`ChangedDuringTheAttempt`] points the endpoint.
pub(super) const NEW_URL: &str = "https://new.acme.example/";

#[async_trait::async_trait]
impl crate::ports::Transport for ChangedDuringTheAttempt {
    async fn send(&self, request: &crate::ports::SignedRequest) -> crate::outcome::TransportResult {
        if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let store = &self.services.store;
            match &self.change {
                During::Delete => store.delete_endpoint(&self.endpoint).await.unwrap(),
                During::MoveUrl => {
                    let mut moved = store.get_endpoint(&self.endpoint).await.unwrap().unwrap();
                    moved.url = NEW_URL.into();
                    store.update_endpoint(&moved).await.unwrap();
                }
                During::Resend(id) => {
                    let delivery = store.get_delivery(id).await.unwrap().unwrap();
                    super::resend::resend_delivery(&self.services, &delivery, "admin")
                        .await
                        .unwrap();
                }
                During::ResendRefused(id) => {
                    let delivery = store.get_delivery(id).await.unwrap().unwrap();
                    let refused =
                        super::resend::resend_delivery(&self.services, &delivery, "admin").await;
                    assert!(
                        matches!(
                            refused,
                            Err(super::resend::ResendError::AttemptUnderWay { .. })
                        ),
                        "{refused:?}"
                    );
                }
                During::DisableAndEnable => {
                    let mut e = store.get_endpoint(&self.endpoint).await.unwrap().unwrap();
                    e.disabled = true;
                    store.update_endpoint(&e).await.unwrap();
                    let mut e = store.get_endpoint(&self.endpoint).await.unwrap().unwrap();
                    e.enable(self.services.clock.now());
                    store.update_endpoint(&e).await.unwrap();
                }
                During::Describe => {
                    let mut e = store.get_endpoint(&self.endpoint).await.unwrap().unwrap();
                    e.description = Some("changed during the attempt".into());
                    store.update_endpoint(&e).await.unwrap();
                }
            }
        }
        self.inner.send(request).await
    }
}

impl Case {
    /// The first request changes the endpoint as [`ChangedDuringTheAttempt`] does.
    pub(super) fn change_during_the_first_attempt(&mut self, change: During) {
        self.world.services.transport = Arc::new(ChangedDuringTheAttempt {
            inner: self.world.transport.clone(),
            services: self.world.services.clone(),
            endpoint: self.endpoint.id.clone(),
            change,
            done: Default::default(),
        });
    }
}
