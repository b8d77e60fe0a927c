//! What the handler of a received delivery message reads first — its delivery, the
//! delivery's endpoint, its event — read for a whole received batch in one go and
//! handed to each message's task.
//!
//! Why: three point reads a message, each taking a read connection and finding the
//! log changed since its last read (so dropping its page cache), were a fifth of the
//! worker's time. One read transaction for a batch reads each endpoint once however
//! many of its messages the batch holds.
//!
//! Why this is not a cache: a prefetched record lives in the task-local scope of the
//! one task that handles its message ([`Prefetched::scope`]), and answers only that
//! task's *first* read of that record; every later read goes to the database, and
//! nothing outlives the task. So a prefetched record is the read the handler makes
//! first, made a few milliseconds earlier (the rest of the batch read, and the spawn),
//! and the handler already copes with a record changing right after it read it: the
//! delivery's writes are conditional on the version read (at most once, the durable
//! "about to send" write lands before the request, or there is no request); an event
//! never changes; an endpoint changed while an attempt starts (disabled, its URL or
//! secret) is the race every attempt already has, a moment wider.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;

use entrega_core::delivery::Delivery;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::handlers::task::DeliveryTask;
use entrega_core::ids::{DeliveryId, EndpointId, EventId, TenantId};
use rusqlite::Connection;

use super::deliveries::read_delivery;
use super::endpoints::read_endpoint;
use super::events::read_event;
use super::{DbError, SqliteStore};

/// Batches of at most this many messages are read on the calling thread.
const PREFETCH_HERE_AT_MOST: usize = 4;

tokio::task_local! {
    static PREFETCHED: Prefetched;
}

/// The records one delivery message's handler will read first; each is taken by the
/// first read of it.
#[derive(Default)]
pub struct Prefetched {
    delivery: Cell<Option<Delivery>>,
    endpoint: Cell<Option<Endpoint>>,
    event: Cell<Option<Event>>,
}

impl Prefetched {
    /// Run `work` (the message's handler) with these records at hand.
    pub async fn scope<F: Future>(self, work: F) -> F::Output {
        PREFETCHED.scope(self, work).await
    }
}

/// `cell`'s record, if it is the one `wanted`; it stays if not.
fn take_if<T>(cell: &Cell<Option<T>>, wanted: impl FnOnce(&T) -> bool) -> Option<T> {
    let record = cell.take()?;
    if wanted(&record) {
        return Some(record);
    }
    cell.set(Some(record));
    None
}

pub(super) fn take_delivery(id: &DeliveryId) -> Option<Delivery> {
    PREFETCHED
        .try_with(|p| take_if(&p.delivery, |d| &d.id == id))
        .ok()
        .flatten()
}

pub(super) fn take_endpoint(id: &EndpointId) -> Option<Endpoint> {
    PREFETCHED
        .try_with(|p| take_if(&p.endpoint, |e| &e.id == id))
        .ok()
        .flatten()
}

pub(super) fn take_event(tenant: &TenantId, id: &EventId) -> Option<Event> {
    PREFETCHED
        .try_with(|p| take_if(&p.event, |e| &e.tenant_id == tenant && &e.id == id))
        .ok()
        .flatten()
}

impl SqliteStore {
    /// What the handlers of `tasks` will read first, in one read transaction; one
    /// [`Prefetched`] per task, in order (empty where a record is missing, or if the
    /// read fails: the handler then reads for itself, and meets the failure there).
    pub async fn prefetch(&self, tasks: &[Option<DeliveryTask>]) -> Vec<Prefetched> {
        let ids: Vec<Option<String>> = tasks
            .iter()
            .map(|t| t.as_ref().map(|t| t.delivery_id.to_string()))
            .collect();
        let count = ids.len();
        let read_all = move |conn: &Connection| {
            // One snapshot for the batch: without it each statement would be a read
            // transaction of its own, each finding the log changed.
            conn.execute_batch("BEGIN")?;
            let records = read_batch(conn, &ids);
            // Ended whatever came of the reads: the connection goes back to the pool,
            // and one left in a transaction would read that snapshot forever (and hold
            // back every checkpoint).
            let ended = conn.execute_batch("COMMIT");
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            let records = records?;
            ended?;
            Ok(records)
        };
        // A few messages' records are read on the calling thread, at once (at low load
        // a hop to another thread and back is most of the wait); a larger batch on the
        // blocking pool, as it may hold 64 events of up to 256 KiB each to decode.
        let read = if count <= PREFETCH_HERE_AT_MOST {
            self.db.get(read_all).await
        } else {
            self.db.read(read_all).await
        };
        match read {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "prefetching a batch failed; each handler reads for itself");
                (0..count).map(|_| Prefetched::default()).collect()
            }
        }
    }
}

fn read_batch(conn: &Connection, ids: &[Option<String>]) -> Result<Vec<Prefetched>, DbError> {
    let mut endpoints: HashMap<EndpointId, Option<Endpoint>> = HashMap::new();
    let mut batch = Vec::with_capacity(ids.len());
    for id in ids {
        let prefetched = Prefetched::default();
        if let Some(delivery) = id
            .as_deref()
            .map(|id| read_delivery(conn, id))
            .transpose()?
            .flatten()
        {
            let endpoint = match endpoints.get(&delivery.endpoint_id) {
                Some(endpoint) => endpoint.clone(),
                None => {
                    let endpoint = read_endpoint(conn, delivery.endpoint_id.as_str())?;
                    endpoints.insert(delivery.endpoint_id.clone(), endpoint.clone());
                    endpoint
                }
            };
            prefetched.endpoint.set(endpoint);
            prefetched.event.set(read_event(
                conn,
                delivery.tenant_id.as_str(),
                delivery.event_id.as_str(),
            )?);
            prefetched.delivery.set(Some(delivery));
        }
        batch.push(prefetched);
    }
    Ok(batch)
}

#[cfg(test)]
#[path = "prefetch_tests.rs"]
mod tests;
