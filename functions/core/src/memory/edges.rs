//! The edges of the process in memory: a transport that answers from a script and
//! records every request, and a notifier that records every notice. With the store,
//! the queues, a manual clock and a seeded random source they make [`World`]: the
//! real handlers run on it with nothing leaving the process.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{MemoryQueue, MemoryStore};
use crate::delivery::Delivery;
use crate::endpoint::Endpoint;
use crate::event::Event;
use crate::ids::{DeliveryId, EventId, TenantId};
use crate::outcome::TransportResult;
use crate::ports::{
    Clock, ManualClock, NoBacklog, NoMetrics, Notice, Notifier, SeededRandom, Services, Settings,
    SignedRequest, StoreResult, Transport,
};
use crate::slots::InProcessSlots;
use crate::tenant::Tenant;

/// Answers requests in order from a script, then with a fallback; records each.
pub struct ScriptedTransport {
    script: Mutex<VecDeque<TransportResult>>,
    fallback: Mutex<TransportResult>,
    seen: Mutex<Vec<SignedRequest>>,
}

impl ScriptedTransport {
    /// Every request answered with `status`.
    pub fn answering(status: u16) -> Self {
        Self {
            script: Mutex::default(),
            fallback: Mutex::new(response(status)),
            seen: Mutex::default(),
        }
    }

    /// The next requests answered with these results, in order.
    pub fn then(&self, results: impl IntoIterator<Item = TransportResult>) -> &Self {
        lock(&self.script).extend(results);
        self
    }

    /// From now on, requests the script does not cover get `result`.
    pub fn otherwise(&self, result: TransportResult) {
        *lock(&self.fallback) = result;
    }

    /// Every request sent so far.
    pub fn requests(&self) -> Vec<SignedRequest> {
        lock(&self.seen).clone()
    }
}

/// A final response with `status` and an empty body.
pub fn response(status: u16) -> TransportResult {
    TransportResult::Response {
        status,
        retry_after: None,
        excerpt: String::new(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait]
impl Transport for ScriptedTransport {
    async fn send(&self, request: &SignedRequest) -> TransportResult {
        lock(&self.seen).push(request.clone());
        let scripted = lock(&self.script).pop_front();
        scripted.unwrap_or_else(|| lock(&self.fallback).clone())
    }
}

/// Records every notice.
#[derive(Default)]
pub struct RecordingNotifier(Mutex<Vec<Notice>>);

impl RecordingNotifier {
    pub fn notices(&self) -> Vec<Notice> {
        lock(&self.0).clone()
    }
}

#[async_trait]
impl Notifier for RecordingNotifier {
    async fn notify(&self, notice: &Notice) -> StoreResult<()> {
        lock(&self.0).push(notice.clone());
        Ok(())
    }
}

/// Every port in memory, and handles on each for a test to drive and inspect.
pub struct World {
    pub services: Services,
    pub clock: Arc<ManualClock>,
    pub store: MemoryStore,
    pub deliveries: MemoryQueue,
    pub failures: MemoryQueue,
    pub transport: Arc<ScriptedTransport>,
    pub notices: Arc<RecordingNotifier>,
}

impl World {
    /// A world at `start`, its endpoints answering 200, its randomness from `seed`.
    pub fn new(start: DateTime<Utc>, seed: u64) -> Self {
        let clock = Arc::new(ManualClock::new(start));
        let store = MemoryStore::new(clock.clone());
        let deliveries = MemoryQueue::new(clock.clone());
        let failures = MemoryQueue::new(clock.clone());
        let transport = Arc::new(ScriptedTransport::answering(200));
        let notices = Arc::new(RecordingNotifier::default());
        let services = Services {
            store: Arc::new(store.clone()),
            deliveries: Arc::new(deliveries.clone()),
            failures: Arc::new(failures.clone()),
            scheduler: Arc::new(deliveries.clone()),
            notifier: notices.clone(),
            transport: transport.clone(),
            clock: clock.clone(),
            metrics: Arc::new(NoMetrics),
            backlog: Arc::new(NoBacklog),
            slots: Arc::new(InProcessSlots::default()),
            random: Arc::new(SeededRandom::new(seed)),
            settings: Settings::default(),
        };
        Self {
            services,
            clock,
            store,
            deliveries,
            failures,
            transport,
            notices,
        }
    }

    /// A tenant created now, with an API key of its own.
    pub async fn add_tenant(
        &self,
        id: TenantId,
        name: &str,
        owner_email: &str,
    ) -> StoreResult<TenantId> {
        let tenant = Tenant {
            id,
            name: name.into(),
            owner_email: owner_email.into(),
            created_at: self.clock.now(),
        };
        let key = format!("key-{}", tenant.id);
        self.services.store.create_tenant(&tenant, &key).await?;
        Ok(tenant.id)
    }

    /// An endpoint of `tenant` at `url`, set up by `configure`, stored.
    pub async fn add_endpoint(
        &self,
        tenant: &TenantId,
        url: &str,
        configure: impl FnOnce(&mut Endpoint),
    ) -> StoreResult<Endpoint> {
        let mut endpoint = Endpoint::new(tenant.clone(), url, self.clock.now());
        configure(&mut endpoint);
        self.services
            .store
            .create_endpoint(&endpoint, crate::endpoint::MAX_ENDPOINTS_PER_TENANT)
            .await?;
        Ok(endpoint)
    }

    /// A world at `start` with one tenant and its one endpoint, set up by `configure`.
    pub async fn with_endpoint(
        start: DateTime<Utc>,
        seed: u64,
        configure: impl FnOnce(&mut Endpoint),
    ) -> (Self, Endpoint) {
        let world = Self::new(start, seed);
        let tenant = world
            .add_tenant(TenantId::generate(), "Acme", "owner@acme.example")
            .await
            .expect("the memory store takes a tenant");
        let endpoint = world
            .add_endpoint(&tenant, "https://hooks.acme.example/", configure)
            .await
            .expect("the memory store takes an endpoint");
        (world, endpoint)
    }

    /// The delivery `id` as stored now (it must be stored).
    pub async fn stored_delivery(&self, id: &DeliveryId) -> Delivery {
        let stored = self.services.store.get_delivery(id).await;
        stored.unwrap().expect("the delivery is stored")
    }

    /// A delivery to `endpoint` of a new event made now, set up by `configure`, stored
    /// without a message (as if its message were lost, or never needed).
    pub async fn add_delivery(
        &self,
        endpoint: &Endpoint,
        configure: impl FnOnce(&mut Delivery),
    ) -> StoreResult<Delivery> {
        let now = self.clock.now();
        let event = Event {
            id: EventId::generate(),
            tenant_id: endpoint.tenant_id.clone(),
            event_type: "invoice.paid".into(),
            payload: "{}".into(),
            created_at: now,
        };
        let id = DeliveryId::for_event(&event.id, &endpoint.id, now.timestamp_millis());
        let mut delivery = Delivery::new(id, &event, endpoint.id.clone(), false, now);
        configure(&mut delivery);
        self.services
            .store
            .create_delivery_if_absent(&delivery)
            .await?;
        Ok(delivery)
    }
}
