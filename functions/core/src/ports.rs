//! The ports: what the handlers need from the outside world, as small async traits.
//! The SQLite adapters (embedded) and the AWS adapters implement the same traits, so
//! every handler is written once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::delivery::{Attempt, Delivery, DeliveryStatus};
use crate::endpoint::{Endpoint, EndpointHealth};
use crate::event::Event;
use crate::failure::{Acknowledgement, Failure, FailureQuery, Reacknowledge};
use crate::ids::{DeliveryId, EndpointId, EventId, FailureId, TenantId};
use crate::outcome::TransportResult;
use crate::tenant::{Principal, Tenant};

/// Most rows one list call returns.
pub const MAX_PAGE_SIZE: usize = 200;

/// A store or queue operation that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The write's precondition failed: an id already taken, or a stale version.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The backend failed (I/O, a throttled request). Worth retrying later.
    #[error("backend: {0}")]
    Backend(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Wall-clock time. A port so that a 31-hour retry schedule runs in seconds in tests.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// One page of a newest-first listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// A page from up to `limit + 1` rows read newest first: the extra row only says
    /// there is more, and the cursor is the last row kept. `resume` is where to go on
    /// when the read stopped early for another reason (a bounded scan), if no extra row
    /// was found.
    pub fn from_rows(
        mut data: Vec<T>,
        limit: usize,
        cursor: impl Fn(&T) -> String,
        resume: Option<String>,
    ) -> Self {
        let next_cursor = if data.len() > limit {
            data.truncate(limit);
            data.last().map(cursor)
        } else {
            resume
        };
        Self { data, next_cursor }
    }
}

#[async_trait]
pub trait TenantStore: Send + Sync {
    /// Create the tenant and its first API key (stored as a hash) together.
    async fn create_tenant(&self, tenant: &Tenant, api_key_hash: &str) -> StoreResult<()>;
    async fn get_tenant(&self, id: &TenantId) -> StoreResult<Option<Tenant>>;
    /// Every tenant, newest id first, a page at a time.
    async fn list_tenants(&self, limit: usize, cursor: Option<&str>) -> StoreResult<Page<Tenant>>;
    /// Register a key hash for a principal (the admin key at first start).
    async fn put_api_key(&self, api_key_hash: &str, principal: &Principal) -> StoreResult<()>;
    async fn principal_for_key(&self, api_key_hash: &str) -> StoreResult<Option<Principal>>;
    /// Whether any admin key is registered (a first start generates one otherwise).
    async fn has_admin_key(&self) -> StoreResult<bool>;
}

/// Whether [`EndpointStore::create_endpoint`] stored the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointCreated {
    Stored,
    /// The tenant already had as many endpoints as the limit allows: nothing stored.
    TenantFull,
}

#[async_trait]
pub trait EndpointStore: Send + Sync {
    /// Store the endpoint unless its tenant already has `per_tenant` endpoints. The
    /// count and the write are one step: creates racing at the limit never store more
    /// than it between them, and one that was answered `Stored` is never taken back.
    async fn create_endpoint(
        &self,
        endpoint: &Endpoint,
        per_tenant: usize,
    ) -> StoreResult<EndpointCreated>;
    /// The endpoint with its health record.
    async fn get_endpoint(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>>;
    /// Write the configuration (never the health record) if the stored version is
    /// still `endpoint.version`; returns it at the next version. `Conflict` if it
    /// changed meanwhile or is gone.
    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<Endpoint>;
    /// Write the health record (never the configuration) if its stored version is
    /// still `health.version`; returns it at the next version.
    async fn update_endpoint_health(
        &self,
        id: &EndpointId,
        health: &EndpointHealth,
    ) -> StoreResult<EndpointHealth>;
    async fn delete_endpoint(&self, id: &EndpointId) -> StoreResult<()>;
    /// Newest first; `None` tenant lists every tenant's (admin).
    async fn list_endpoints(
        &self,
        tenant: Option<&TenantId>,
        limit: usize,
        cursor: Option<&str>,
    ) -> StoreResult<Page<Endpoint>>;
    /// Every endpoint of the tenant, enabled or not (fan-out filters by type).
    async fn tenant_endpoints(&self, tenant: &TenantId) -> StoreResult<Vec<Endpoint>>;
}

/// Whether a publish created the event or found it already there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    Created,
    /// The id was taken: idempotent publish returns the stored event.
    Existing(Event),
}

#[async_trait]
pub trait EventStore: Send + Sync {
    /// Write the event into the outbox unless its tenant already has an event with
    /// this id (ids are scoped to their tenant: two tenants may use the same one).
    async fn publish(&self, event: &Event) -> StoreResult<Published>;
    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> StoreResult<Option<Event>>;
    /// The outbox in storage order, a page of up to `limit` items read at a time from
    /// `cursor`, keeping the events created at or after `since` (a replay of the
    /// fan-out). A page may hold fewer than `limit` events and still have a cursor.
    async fn outbox_page(
        &self,
        since: DateTime<Utc>,
        cursor: Option<&str>,
        limit: usize,
    ) -> StoreResult<OutboxPage>;
}

/// A page of the outbox: the events, how many items could not be read as events
/// (malformed producer items; they are in the outbox DLQ), and where to go on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutboxPage {
    pub events: Vec<Event>,
    pub malformed: usize,
    pub next_cursor: Option<String>,
}

/// Filters of the delivery log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryQuery {
    /// `None`: every tenant (admin).
    pub tenant: Option<TenantId>,
    pub endpoint_id: Option<EndpointId>,
    pub event_type: Option<String>,
    pub status: Option<DeliveryStatus>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub limit: usize,
    pub cursor: Option<String>,
}

/// A write under way: resolves to its result once it has committed.
pub type PendingWrite<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = StoreResult<T>> + Send>>;

/// A write that has already committed, as a [`PendingWrite`].
pub fn written<T: Send + 'static>(value: T) -> PendingWrite<T> {
    Box::pin(std::future::ready(Ok(value)))
}

#[async_trait]
pub trait DeliveryStore: Send + Sync {
    /// Create unless a delivery with this id exists; either way return the stored one,
    /// and whether this call created it.
    async fn create_delivery_if_absent(&self, delivery: &Delivery)
        -> StoreResult<(Delivery, bool)>;
    async fn get_delivery(&self, id: &DeliveryId) -> StoreResult<Option<Delivery>>;
    /// Record `attempts`, then write `delivery` if the stored version is still
    /// `delivery.version` (else `Conflict`). Returns the written delivery (version + 1).
    ///
    /// The attempts are recorded whether or not the write lands, and before it: they
    /// happened, so the log keeps them even when a resend changed the delivery
    /// meanwhile, and it never shows a state without the attempt that explains it. An
    /// attempt recorded again under the same id stays one record. (One contract for
    /// every store: DynamoDB does it in two plain writes, half the cost of a
    /// transaction, and SQLite in one.)
    async fn save_delivery(
        &self,
        delivery: &Delivery,
        attempts: &[Attempt],
    ) -> StoreResult<Delivery>;
    /// [`Self::save_delivery`] for the lease written before an at-least-once attempt:
    /// a store may return once the write is queued, with what resolves to its result
    /// once it has committed, so the attempt is sent while it commits (a commit's wait
    /// is most of an attempt's time on one machine). The write must commit before any
    /// write the caller makes after this returns.
    ///
    /// Why that is safe: the lease guards against a duplicate message's attempt, and at
    /// least once a duplicate send is within the promise (a crash before it commits
    /// only means the attempt is made again). The caller learns the write's fate
    /// before it records the outcome, so an outcome never lands on a delivery this
    /// write did not (a resend, a pause, a duplicate's lease). A store that cannot be
    /// written at the moment should wait instead, so that it does not send while it
    /// cannot record. The default waits for the commit.
    async fn save_delivery_ahead(
        &self,
        delivery: &Delivery,
        attempts: &[Attempt],
    ) -> StoreResult<PendingWrite<Delivery>> {
        let saved = self.save_delivery(delivery, attempts).await?;
        Ok(written(saved))
    }
    async fn list_attempts(&self, id: &DeliveryId) -> StoreResult<Vec<Attempt>>;
    async fn list_deliveries(&self, query: &DeliveryQuery) -> StoreResult<Page<Delivery>>;
    /// Every delivery of `event`, in id order. Their ids share a start
    /// ([`DeliveryId::prefix_of_event`]), so a store can find them among the tenant's
    /// deliveries by it instead of keeping an index per event.
    async fn deliveries_of_event(&self, event: &Event) -> StoreResult<Vec<Delivery>>;
    /// Attempts at an endpoint started at or after `since`, newest first, at most `limit`.
    async fn endpoint_attempts_since(
        &self,
        endpoint: &EndpointId,
        since: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Attempt>>;
    /// Paused deliveries of an endpoint, a page at a time from `cursor` (`None`: from
    /// the start), at most `limit`. `next_cursor` is `None` once nothing is left to
    /// look at; a page may hold fewer than `limit` and still have one (a store that
    /// reads past other deliveries to find paused ones bounds its work per call).
    async fn paused_deliveries(
        &self,
        endpoint: &EndpointId,
        cursor: Option<&str>,
        limit: usize,
    ) -> StoreResult<Page<Delivery>>;
    /// Before a sweep asks [`Self::overdue_deliveries`] about times before `before`:
    /// bring its answer up to date. A store that keeps some waiting deliveries out of
    /// its index (DynamoDB leaves young ones out) enters the ones still waiting here.
    /// A failure leaves the answer as it was: the sweeper still asks, and says so.
    async fn prepare_sweep(&self, _before: DateTime<Utc>) -> StoreResult<()> {
        Ok(())
    }
    /// Deliveries of every tenant that were due ([`Delivery::due_at`]) before `before`
    /// and are still waiting, most overdue first (as far as the store's index orders
    /// them), at most `limit`. The sweeper's question; the answer may include some due
    /// a little later, which the sweeper checks again.
    async fn overdue_deliveries(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Delivery>>;
    /// The sweeper queued these deliveries (as read) again: leave each out of
    /// [`Self::overdue_deliveries`] for times up to its `until`, so the next sweeps
    /// reach the ones behind them. Only while a delivery is as read: a save puts it
    /// back where its state says. The records themselves are not touched.
    async fn postpone_sweep(&self, postponed: &[(Delivery, DateTime<Utc>)]) -> StoreResult<()>;
}

#[async_trait]
pub trait FailureStore: Send + Sync {
    /// Store unless the id exists; `true` when this call created it.
    async fn put_failure_if_absent(&self, failure: &Failure) -> StoreResult<bool>;
    async fn get_failure(&self, id: &FailureId) -> StoreResult<Option<Failure>>;
    /// Newest first.
    async fn list_failures(&self, query: &FailureQuery) -> StoreResult<Page<Failure>>;
    /// Unacknowledged failures, oldest first, a page at a time (the 24-hour rule reads
    /// only as far as the overdue ones go).
    async fn oldest_unacknowledged(
        &self,
        limit: usize,
        after: Option<&str>,
    ) -> StoreResult<Page<Failure>>;
    /// Every failure record of one delivery (one per failed generation), oldest first.
    async fn failures_of_delivery(&self, delivery: &DeliveryId) -> StoreResult<Vec<Failure>>;
    /// Mark analyzed, conditional on the record as read; the failure as stored
    /// afterwards (`None`: no such record).
    async fn acknowledge_failure(
        &self,
        id: &FailureId,
        ack: &Acknowledgement,
        again: Reacknowledge,
    ) -> StoreResult<Option<Failure>>;
}

#[async_trait]
pub trait CounterStore: Send + Sync {
    /// Add one to the counter `key` and return the new value. Counters expire after
    /// `ttl` (hourly windows need not be kept forever).
    async fn increment(&self, key: &str, ttl: Duration) -> StoreResult<u64>;
    /// Add one to the counter `key` unless `token` was counted before, atomically (the
    /// count and the token commit together), and return the counter's value: a handler
    /// that runs again after dying midway counts each thing exactly once.
    async fn increment_once(&self, key: &str, token: &str, ttl: Duration) -> StoreResult<u64>;
    /// Store `value` under `key` unless something is there already, and return what was
    /// there (the answer to a repeated request with the same `Idempotency-Key`).
    async fn remember_once(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> StoreResult<Option<String>>;
    /// What is remembered under `key`, unless it expired.
    async fn recall(&self, key: &str) -> StoreResult<Option<String>>;
    /// Drop what is remembered under `key` (a claim whose request failed).
    async fn forget(&self, key: &str) -> StoreResult<()>;
}

/// The undelivered work of each tenant, for backpressure: past a limit, publishing
/// answers 429 before the disk fills.
#[async_trait]
pub trait Backlog: Send + Sync {
    /// Deliveries waiting for an attempt (queued, retrying) plus events waiting for
    /// fan-out, of `tenant`.
    async fn tenant_backlog(&self, tenant: &TenantId) -> StoreResult<u64>;
    /// `delta` deliveries entered (+) or left (−) the waiting set of `tenant`. A store
    /// that derives the figure from its queues ignores this.
    async fn record(&self, tenant: &TenantId, delta: i64) -> StoreResult<()>;
}

/// A backlog nobody tracks (tools that run handlers outside a runtime).
pub struct NoBacklog;

#[async_trait]
impl Backlog for NoBacklog {
    async fn tenant_backlog(&self, _: &TenantId) -> StoreResult<u64> {
        Ok(0)
    }
    async fn record(&self, _: &TenantId, _: i64) -> StoreResult<()> {
        Ok(())
    }
}

/// Everything a handler may read or write. One adapter implements all of it.
pub trait Store:
    TenantStore + EndpointStore + EventStore + DeliveryStore + FailureStore + CounterStore
{
}

impl<T> Store for T where
    T: TenantStore + EndpointStore + EventStore + DeliveryStore + FailureStore + CounterStore
{
}

/// A signed webhook request, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedRequest {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub timeout: Duration,
}

/// Sends one webhook attempt. Never fails: every problem is a [`TransportResult`].
#[async_trait]
pub trait Transport: Send + Sync {
    async fn send(&self, request: &SignedRequest) -> TransportResult;
}

mod queue;
pub use queue::{DelayLimits, LongDelayScheduler, MessageQueue, OutgoingMessage, ReceivedMessage};
mod metrics;
pub use metrics::{AttemptMetric, Metrics, NoMetrics};
mod random;
pub use random::{RandomSource, RngOf, SeededRandom, SystemRandom};
mod send_hook;
pub use send_hook::{Hooked, SendHook};
mod settings;
pub use settings::{Settings, DEFAULT_MAX_BACKLOG};
mod notices;
pub use notices::{Audience, Notice, NoticeKind, Notifier};

/// The ports a runtime hands to the handlers.
#[derive(Clone)]
pub struct Services {
    pub store: Arc<dyn Store>,
    pub deliveries: Arc<dyn MessageQueue>,
    pub failures: Arc<dyn MessageQueue>,
    pub scheduler: Arc<dyn LongDelayScheduler>,
    pub notifier: Arc<dyn Notifier>,
    pub transport: Arc<dyn Transport>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<dyn Metrics>,
    pub backlog: Arc<dyn Backlog>,
    pub slots: Arc<dyn crate::slots::EndpointSlots>,
    pub random: Arc<dyn RandomSource>,
    pub settings: Settings,
}

/// A clock that moves only when told: simulations run days of retries in milliseconds.
#[derive(Debug)]
pub struct ManualClock {
    now: std::sync::Mutex<DateTime<Utc>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: std::sync::Mutex::new(start),
        }
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now += chrono::Duration::from_std(by).expect("a representable duration");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}
