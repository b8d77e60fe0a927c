//! The store in memory: tenants and keys, endpoints (configuration and health
//! versioned apart), the outbox, counters and claims. Deliveries, attempts and
//! failures are in [`super::log`]. One mutex over plain maps: every call is atomic,
//! and every conditional write checks the version it was given, as the real stores do.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::delivery::{Attempt, Delivery};
use crate::endpoint::Endpoint;
use crate::endpoint_health::EndpointHealth;
use crate::event::Event;
use crate::failure::Failure;
use crate::ids::{EndpointId, EventId, TenantId};
use crate::ports::{
    Clock, CounterStore, EndpointCreated, EndpointStore, EventStore, OutboxPage, Page, Published,
    StoreError, StoreResult, TenantStore,
};
use crate::tenant::{Principal, Tenant};

/// Outbox items read per page at most (as the SQLite store).
const OUTBOX_PAGE_MAX: usize = 1000;

#[derive(Default)]
pub(super) struct Data {
    tenants: BTreeMap<String, Tenant>,
    keys: HashMap<String, Principal>,
    endpoints: BTreeMap<String, Endpoint>,
    /// In storage order; an item's sequence number is its index + 1.
    outbox: Vec<Event>,
    /// Where each (tenant, event id) is in the outbox.
    event_index: HashMap<(String, String), usize>,
    pub(super) deliveries: BTreeMap<String, Delivery>,
    /// Delivery ids of each (tenant, event id).
    pub(super) deliveries_by_event: HashMap<(String, String), Vec<String>>,
    /// In append order.
    pub(super) attempts: Vec<Attempt>,
    /// Positions in `attempts` of each delivery's attempts.
    pub(super) attempts_by_delivery: HashMap<String, Vec<usize>>,
    pub(super) failures: BTreeMap<String, Failure>,
    /// Failure ids of each delivery, in id order.
    pub(super) failures_by_delivery: HashMap<String, BTreeSet<String>>,
    /// Counter and claim values with when they expire (Unix seconds).
    counters: HashMap<String, (u64, i64)>,
    remembered: HashMap<String, (String, i64)>,
    /// Deliveries the sweeper postponed: the version it read, and until when.
    pub(super) sweep_postponed: HashMap<String, (u64, chrono::DateTime<chrono::Utc>)>,
    /// What tenants' endpoint lists answer while they lag ([`MemoryStore::lag_endpoint_lists`]).
    listed_endpoints: Option<BTreeMap<String, Endpoint>>,
    /// Whether preparing a sweep fails ([`MemoryStore::fail_sweep_preparation`]).
    pub(super) sweep_preparation_fails: bool,
    /// What tests observe of the calls made ([`MemoryStore::yield_in_delivery_creates`]).
    pub(super) probes: Probes,
}

/// Calls counted for tests: how many endpoint lists were read, and how many delivery
/// creates were under way at once (each yields once when `create_yields`, so creates
/// made concurrently overlap, as on a store across a network).
#[derive(Default)]
pub(super) struct Probes {
    endpoint_list_reads: usize,
    pub(super) create_yields: bool,
    /// Events gone as a DynamoDB TTL deletes them ([`MemoryStore::expire_event`]).
    pub(super) expired_events: BTreeSet<(String, String)>,
    /// Creates of this event's deliveries fail ([`MemoryStore::fail_creates_for_event`]).
    pub(super) failing_event: Option<EventId>,
    pub(super) creates_under_way: usize,
    pub(super) most_creates_under_way: usize,
}

/// The in-memory store; cheap to clone (shared).
#[derive(Clone)]
pub struct MemoryStore {
    pub(super) clock: Arc<dyn Clock>,
    data: Arc<Mutex<Data>>,
}

impl MemoryStore {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            data: Arc::default(),
        }
    }

    pub(super) fn data(&self) -> MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now until [`Self::catch_up_endpoint_lists`], a tenant's endpoint list
    /// answers the endpoints as they are now, while reads by id see every change: on
    /// AWS the list is read from an index that lags the table, and a fan-out may act
    /// on it.
    pub fn lag_endpoint_lists(&self) {
        let mut data = self.data();
        data.listed_endpoints = Some(data.endpoints.clone());
    }

    /// Endpoint lists see every change again.
    pub fn catch_up_endpoint_lists(&self) {
        self.data().listed_endpoints = None;
    }

    /// From now on, preparing a sweep fails (`fails`) or succeeds, as a DynamoDB
    /// store's scan for deliveries left out of its due index can (throttled).
    pub fn fail_sweep_preparation(&self, fails: bool) {
        self.data().sweep_preparation_fails = fails;
    }

    /// From now on, each delivery create yields to the caller's other work once
    /// before it is made, so creates made concurrently are seen under way together
    /// ([`Self::most_creates_under_way`]).
    pub fn yield_in_delivery_creates(&self) {
        self.data().probes.create_yields = true;
    }

    /// From now on, creating a delivery of `event` fails as a throttled store does
    /// (`None`: none fails).
    pub fn fail_creates_for_event(&self, event: Option<EventId>) {
        self.data().probes.failing_event = event;
    }

    /// From now on, `tenant`'s event `id` is gone, as a DynamoDB TTL deletes an outbox
    /// item at the end of the retention period.
    pub fn expire_event(&self, tenant: &TenantId, id: &EventId) {
        self.data()
            .probes
            .expired_events
            .insert((tenant.to_string(), id.to_string()));
    }

    /// The most delivery creates that were under way at once.
    pub fn most_creates_under_way(&self) -> usize {
        self.data().probes.most_creates_under_way
    }

    /// How many times a tenant's endpoint list was read.
    pub fn endpoint_list_reads(&self) -> usize {
        self.data().probes.endpoint_list_reads
    }

    fn now_secs(&self) -> i64 {
        self.clock.now().timestamp()
    }
}

impl Data {
    /// Append each attempt not already recorded under its id.
    pub(super) fn append_attempts(&mut self, attempts: &[Attempt]) {
        for attempt in attempts {
            let at = self.attempts.len();
            let of_delivery = self
                .attempts_by_delivery
                .entry(attempt.delivery_id.to_string())
                .or_default();
            if of_delivery
                .iter()
                .any(|i| self.attempts[*i].id == attempt.id)
            {
                continue;
            }
            of_delivery.push(at);
            self.attempts.push(attempt.clone());
        }
    }
}

/// Rows newest id first, after `cursor` (exclusive), one page of `limit`.
pub(super) fn page_desc<T: Clone>(
    rows: impl DoubleEndedIterator<Item = (String, T)>,
    cursor: Option<&str>,
    limit: usize,
    keep: impl Fn(&T) -> bool,
) -> Page<T> {
    let mut data: Vec<(String, T)> = rows
        .rev()
        .filter(|(id, row)| cursor.is_none_or(|c| id.as_str() < c) && keep(row))
        .take(limit + 1)
        .collect();
    let next_cursor = if data.len() > limit {
        data.truncate(limit);
        data.last().map(|(id, _)| id.clone())
    } else {
        None
    };
    Page {
        data: data.into_iter().map(|(_, row)| row).collect(),
        next_cursor,
    }
}

#[async_trait]
impl TenantStore for MemoryStore {
    async fn create_tenant(&self, tenant: &Tenant, api_key_hash: &str) -> StoreResult<()> {
        let mut data = self.data();
        let id = tenant.id.to_string();
        if data.tenants.contains_key(&id) {
            return Err(StoreError::Conflict(format!("tenant {id} exists")));
        }
        data.tenants.insert(id, tenant.clone());
        data.keys.insert(
            api_key_hash.to_owned(),
            Principal::Tenant(tenant.id.clone()),
        );
        Ok(())
    }

    async fn get_tenant(&self, id: &TenantId) -> StoreResult<Option<Tenant>> {
        Ok(self.data().tenants.get(id.as_str()).cloned())
    }

    async fn list_tenants(&self, limit: usize, cursor: Option<&str>) -> StoreResult<Page<Tenant>> {
        let data = self.data();
        let rows = data.tenants.iter().map(|(id, t)| (id.clone(), t.clone()));
        Ok(page_desc(rows, cursor, limit, |_| true))
    }

    async fn put_api_key(&self, api_key_hash: &str, principal: &Principal) -> StoreResult<()> {
        self.data()
            .keys
            .insert(api_key_hash.to_owned(), principal.clone());
        Ok(())
    }

    async fn principal_for_key(&self, api_key_hash: &str) -> StoreResult<Option<Principal>> {
        Ok(self.data().keys.get(api_key_hash).cloned())
    }

    async fn has_admin_key(&self) -> StoreResult<bool> {
        Ok(self.data().keys.values().any(|p| *p == Principal::Admin))
    }
}

#[async_trait]
impl EndpointStore for MemoryStore {
    async fn create_endpoint(
        &self,
        endpoint: &Endpoint,
        per_tenant: usize,
    ) -> StoreResult<EndpointCreated> {
        let mut data = self.data();
        let id = endpoint.id.to_string();
        if data.endpoints.contains_key(&id) {
            return Err(StoreError::Conflict(format!("endpoint {id} exists")));
        }
        let held = data
            .endpoints
            .values()
            .filter(|e| e.tenant_id == endpoint.tenant_id)
            .count();
        if held >= per_tenant {
            return Ok(EndpointCreated::TenantFull);
        }
        // Stored at version 0 with an empty health record, as the real stores do.
        let mut stored = endpoint.clone();
        stored.version = 0;
        stored.health = EndpointHealth::default();
        data.endpoints.insert(id, stored);
        Ok(EndpointCreated::Stored)
    }

    async fn get_endpoint(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>> {
        Ok(self.data().endpoints.get(id.as_str()).cloned())
    }

    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<Endpoint> {
        let mut data = self.data();
        let id = endpoint.id.to_string();
        let Some(stored) = data
            .endpoints
            .get_mut(&id)
            .filter(|e| e.version == endpoint.version)
        else {
            return Err(StoreError::Conflict(format!(
                "endpoint {id}: changed meanwhile or no longer exists"
            )));
        };
        let mut next = endpoint.clone();
        next.version += 1;
        // The configuration only: the health record is versioned apart.
        let health = std::mem::take(&mut stored.health);
        *stored = next.clone();
        stored.health = health;
        Ok(next)
    }

    async fn update_endpoint_health(
        &self,
        id: &EndpointId,
        health: &EndpointHealth,
    ) -> StoreResult<EndpointHealth> {
        let mut data = self.data();
        let Some(stored) = data
            .endpoints
            .get_mut(id.as_str())
            .filter(|e| e.health.version == health.version)
        else {
            return Err(StoreError::Conflict(format!(
                "endpoint {id}: health changed meanwhile"
            )));
        };
        let mut next = health.clone();
        next.version += 1;
        stored.health = next.clone();
        Ok(next)
    }

    async fn delete_endpoint(&self, id: &EndpointId) -> StoreResult<()> {
        self.data().endpoints.remove(id.as_str());
        Ok(())
    }

    async fn list_endpoints(
        &self,
        tenant: Option<&TenantId>,
        limit: usize,
        cursor: Option<&str>,
    ) -> StoreResult<Page<Endpoint>> {
        let data = self.data();
        let rows = data.endpoints.iter().map(|(id, e)| (id.clone(), e.clone()));
        Ok(page_desc(rows, cursor, limit, |e| {
            tenant.is_none_or(|t| e.tenant_id == *t)
        }))
    }

    async fn tenant_endpoints(&self, tenant: &TenantId) -> StoreResult<Vec<Endpoint>> {
        let mut data = self.data();
        data.probes.endpoint_list_reads += 1;
        Ok(data
            .listed_endpoints
            .as_ref()
            .unwrap_or(&data.endpoints)
            .values()
            .filter(|e| e.tenant_id == *tenant)
            .cloned()
            .collect())
    }
}

#[async_trait]
impl EventStore for MemoryStore {
    async fn publish(&self, event: &Event) -> StoreResult<Published> {
        let mut data = self.data();
        let key = (event.tenant_id.to_string(), event.id.to_string());
        if let Some(&at) = data.event_index.get(&key) {
            return Ok(Published::Existing(data.outbox[at].clone()));
        }
        let at = data.outbox.len();
        data.outbox.push(event.clone());
        data.event_index.insert(key, at);
        Ok(Published::Created)
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> StoreResult<Option<Event>> {
        let data = self.data();
        let key = (tenant.to_string(), id.to_string());
        if data.probes.expired_events.contains(&key) {
            return Ok(None);
        }
        let at = data.event_index.get(&key);
        Ok(at.map(|&at| data.outbox[at].clone()))
    }

    async fn outbox_page(
        &self,
        since: DateTime<Utc>,
        cursor: Option<&str>,
        limit: usize,
    ) -> StoreResult<OutboxPage> {
        let after: usize = cursor.and_then(|c| c.parse().ok()).unwrap_or(0);
        let limit = limit.clamp(1, OUTBOX_PAGE_MAX);
        let data = self.data();
        let items: Vec<(usize, &Event)> = data
            .outbox
            .iter()
            .enumerate()
            .map(|(i, e)| (i + 1, e))
            .skip(after)
            .take(limit)
            .collect();
        let next_cursor = (items.len() == limit)
            .then(|| items.last().map(|(seq, _)| seq.to_string()))
            .flatten();
        Ok(OutboxPage {
            events: items
                .into_iter()
                .filter(|(_, e)| e.created_at >= since)
                .map(|(_, e)| e.clone())
                .collect(),
            malformed: 0,
            next_cursor,
        })
    }
}

#[async_trait]
impl CounterStore for MemoryStore {
    async fn increment(&self, key: &str, ttl: Duration) -> StoreResult<u64> {
        let now = self.now_secs();
        let mut data = self.data();
        let counter = data
            .counters
            .entry(key.to_owned())
            .or_insert((0, now + ttl.as_secs() as i64));
        if counter.1 < now {
            *counter = (0, now + ttl.as_secs() as i64);
        }
        counter.0 += 1;
        Ok(counter.0)
    }

    async fn increment_once(&self, key: &str, token: &str, ttl: Duration) -> StoreResult<u64> {
        let now = self.now_secs();
        let expires = now + ttl.as_secs() as i64;
        let mut data = self.data();
        if data.remembered.get(token).is_some_and(|(_, at)| *at >= now) {
            return Ok(data
                .counters
                .get(key)
                .filter(|(_, at)| *at >= now)
                .map_or(0, |(value, _)| *value));
        }
        data.remembered
            .insert(token.to_owned(), ("counted".into(), expires));
        let counter = data.counters.entry(key.to_owned()).or_insert((0, expires));
        if counter.1 < now {
            *counter = (0, expires);
        }
        counter.0 += 1;
        Ok(counter.0)
    }

    async fn remember_once(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> StoreResult<Option<String>> {
        let now = self.now_secs();
        let mut data = self.data();
        // Expired entries are ignored where read and overwritten here, not swept: a
        // sweep on every call made a long simulation quadratic.
        if let Some((existing, _)) = data.remembered.get(key).filter(|(_, at)| *at >= now) {
            return Ok(Some(existing.clone()));
        }
        data.remembered.insert(
            key.to_owned(),
            (value.to_owned(), now + ttl.as_secs() as i64),
        );
        Ok(None)
    }

    async fn recall(&self, key: &str) -> StoreResult<Option<String>> {
        let now = self.now_secs();
        Ok(self
            .data()
            .remembered
            .get(key)
            .filter(|(_, at)| *at >= now)
            .map(|(value, _)| value.clone()))
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.data().remembered.remove(key);
        Ok(())
    }
}
