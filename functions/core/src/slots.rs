//! Per-endpoint concurrency across every worker: before it sends, a worker takes one
//! of the endpoint's `max_concurrency` slots for the length of the attempt's lease, and
//! gives it back when the outcome is recorded. On AWS many Lambda invocations work the
//! queue at once, so a cap kept inside one batch would let each invocation send its
//! own `max_concurrency`; the slots live in the store instead (DynamoDB), and a worker
//! that finds them all taken hides the message briefly rather than waiting, so no
//! invocation ever runs past its time waiting for one. The same slots, in a pool of
//! their own ([`SlotPool::SlowEndpoints`]), bound the attempts at endpoints slow lately
//! together, where the runtime keeps such a share (AWS).
//!
//! A worker that dies holding a slot loses it at the lease's end, as a crashed attempt
//! loses its delivery lease: the slot is never held for longer than an attempt can run.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::ids::EndpointId;
use crate::ports::StoreResult;

/// What a set of slots caps.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SlotPool {
    /// One endpoint's attempts: its `max_concurrency`.
    Endpoint(EndpointId),
    /// The attempts at every endpoint slow lately, together: the worker's share for
    /// them ([`crate::ports::Settings::slow_endpoint_share`]), so that endpoints that
    /// hang never hold every invocation of the worker.
    SlowEndpoints,
}

/// One slot of a pool, held by one attempt until `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLease {
    pub pool: SlotPool,
    pub slot: u32,
    /// Who holds it (the delivery and its attempt), so only the holder releases it.
    pub holder: String,
    pub until: DateTime<Utc>,
}

/// The slots of every pool.
#[async_trait]
pub trait EndpointSlots: Send + Sync {
    /// One of `pool`'s `limit` slots for `holder` until `now + lease`, or `None`
    /// when every slot is held by a lease still running.
    async fn acquire(
        &self,
        pool: &SlotPool,
        limit: u32,
        holder: &str,
        now: DateTime<Utc>,
        lease: Duration,
    ) -> StoreResult<Option<SlotLease>>;
    /// Give the slot back. A slot whose lease ran out and was taken by another holder
    /// is left to that holder.
    async fn release(&self, lease: &SlotLease) -> StoreResult<()>;
}

/// The slots of one process, in memory: the embedded runtime (one process holds every
/// worker) and tests.
#[derive(Debug, Default)]
pub struct InProcessSlots {
    held: Mutex<HashMap<SlotPool, Vec<Option<Holder>>>>,
}

/// Who holds a slot, and until when.
type Holder = (String, DateTime<Utc>);

#[async_trait]
impl EndpointSlots for InProcessSlots {
    async fn acquire(
        &self,
        pool: &SlotPool,
        limit: u32,
        holder: &str,
        now: DateTime<Utc>,
        lease: Duration,
    ) -> StoreResult<Option<SlotLease>> {
        let until = now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let slots = held.entry(pool.clone()).or_default();
        let limit = limit.max(1) as usize;
        if slots.len() < limit {
            slots.resize(limit, None);
        }
        let free = slots
            .iter()
            .take(limit)
            .position(|s| s.as_ref().is_none_or(|(_, until)| *until <= now));
        Ok(free.map(|slot| {
            slots[slot] = Some((holder.to_owned(), until));
            SlotLease {
                pool: pool.clone(),
                slot: slot as u32,
                holder: holder.to_owned(),
                until,
            }
        }))
    }

    async fn release(&self, lease: &SlotLease) -> StoreResult<()> {
        self.release_holder(&lease.pool, &lease.holder);
        Ok(())
    }
}

/// Slots shared by many processes (`shared`, the store), asked only after this
/// process's own count allows it: when the process itself already holds an
/// endpoint's whole cap (a Lambda batch of ten messages to one endpoint capped at
/// eight), the two left over are known busy without a round trip, and without the
/// failed conditional writes a shared store bills for.
pub struct LocalFirstSlots<S> {
    local: InProcessSlots,
    shared: S,
}

impl<S> LocalFirstSlots<S> {
    pub fn new(shared: S) -> Self {
        Self {
            local: InProcessSlots::default(),
            shared,
        }
    }
}

#[async_trait]
impl<S: EndpointSlots> EndpointSlots for LocalFirstSlots<S> {
    async fn acquire(
        &self,
        pool: &SlotPool,
        limit: u32,
        holder: &str,
        now: DateTime<Utc>,
        lease: Duration,
    ) -> StoreResult<Option<SlotLease>> {
        let Some(local) = self.local.acquire(pool, limit, holder, now, lease).await? else {
            return Ok(None);
        };
        let shared = self.shared.acquire(pool, limit, holder, now, lease).await;
        if !matches!(shared, Ok(Some(_))) {
            self.local.release(&local).await?;
        }
        shared
    }

    async fn release(&self, lease: &SlotLease) -> StoreResult<()> {
        self.local.release_holder(&lease.pool, &lease.holder);
        self.shared.release(lease).await
    }
}

impl InProcessSlots {
    /// Free whichever slot of `pool` `holder` holds (a holder is one ask: the
    /// worker makes each unique). Found by holder, not number, so [`LocalFirstSlots`]
    /// frees its local slot with the shared store's lease.
    fn release_holder(&self, pool: &SlotPool, holder: &str) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slots) = held.get_mut(pool) {
            for slot in slots.iter_mut() {
                if slot.as_ref().is_some_and(|(h, _)| h == holder) {
                    *slot = None;
                }
            }
        }
    }
}
