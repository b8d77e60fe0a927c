//! A publish that queues its event's deliveries in the same transaction, the embedded
//! API's way to publish (see `crate::fan_out::PublishAndFanOut`): one commit holds the
//! event (its outbox row already marked fanned out), its deliveries and their first
//! messages.
//!
//! Why one commit: publishing, then fanning out beside the request, took four writes
//! an event (the event; its deliveries; their messages; the outbox row's mark), each a
//! trip to the writer thread and back, and the mark rewrote the event's row. In one
//! transaction a crash keeps all of it or none of it (then the publisher was not
//! answered), so nothing is left for the outbox poller to finish.

use std::sync::Arc;

use entrega_core::delivery::Delivery;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::handlers::fanout::first_message;
use entrega_core::ports::{OutgoingMessage, Published, StoreResult};
use rusqlite::Connection;

use super::deliveries::NewDelivery;
use super::events::{insert_event, size_limit_refusal};
use super::queue::{QueueRows, SqliteQueue};
use super::{DbError, SqliteStore};

/// A delivery a publish creates: the delivery as the fan-out plans it, and the message
/// that starts its first attempt.
pub struct PlannedDelivery {
    pub delivery: Delivery,
    pub first_message: OutgoingMessage,
}

/// The write of a publish with its deliveries, made ready before the writer thread.
struct PublishWrite {
    id: String,
    tenant: String,
    json: String,
    soft_limit: Option<i64>,
    deliveries: Vec<(NewDelivery, OutgoingMessage)>,
    /// The tenant's endpoints the deliveries were planned from.
    endpoints: Arc<Vec<Endpoint>>,
    queue: &'static str,
    now_ms: i64,
}

/// What the write did: the publish's answer, and the messages it stored (with their
/// row ids) for the queue's scheduler.
type Written = (Published, Option<(QueueRows, Vec<i64>)>);

impl PublishWrite {
    fn run(&self, conn: &Connection) -> Result<Option<Written>, DbError> {
        let Some(published) = insert_event(
            conn,
            self.soft_limit,
            &self.id,
            &self.tenant,
            &self.json,
            true,
        )?
        else {
            return Ok(None);
        };
        if published != Published::Created {
            // The same id again: that event's fan-out is its own (done, or the
            // outbox poller's to do).
            return Ok(Some((published, None)));
        }
        let mut messages = Vec::with_capacity(self.deliveries.len());
        for (new, planned_message) in &self.deliveries {
            let (stored, created) = new.insert_if_absent(conn)?;
            if created {
                messages.push(planned_message.clone());
            } else if let Some(endpoint) =
                self.endpoints.iter().find(|e| e.id == stored.endpoint_id)
            {
                // A delivery kept from an earlier event of this id (its outbox row
                // deleted since): what a fan-out queues for it is decided by its state.
                messages.extend(first_message(&stored, endpoint));
            }
        }
        let rows = QueueRows::of(messages);
        let ids = rows.insert(conn, self.queue, self.now_ms)?;
        Ok(Some((published, Some((rows, ids)))))
    }
}

impl SqliteStore {
    /// Store `event` with `deliveries` (planned from `endpoints`, the tenant's list)
    /// and their first messages in `queue`, in one commit, as
    /// [`entrega_core::ports::EventStore::publish`] answers: nothing is written for an
    /// id already taken. Run to completion (a message stored but not handed to the
    /// queue's scheduler would wait unseen until a restart).
    pub async fn publish_with_deliveries(
        &self,
        event: &Event,
        deliveries: Vec<PlannedDelivery>,
        endpoints: Arc<Vec<Endpoint>>,
        queue: &SqliteQueue,
    ) -> StoreResult<Published> {
        let write = PublishWrite {
            id: event.id.to_string(),
            tenant: event.tenant_id.to_string(),
            json: serde_json::to_string(event).map_err(DbError::from)?,
            soft_limit: self.db.publish_page_limit(),
            deliveries: deliveries
                .into_iter()
                .map(|p| Ok((NewDelivery::of(p.delivery)?, p.first_message)))
                .collect::<Result<_, DbError>>()?,
            endpoints,
            queue: queue.name(),
            now_ms: queue.now_ms(),
        };
        let (db, queue) = (self.db.clone(), queue.clone());
        super::db::to_completion(async move {
            let now_ms = write.now_ms;
            let (published, queued) = db
                .call(move |conn| write.run(conn))
                .await?
                .ok_or_else(size_limit_refusal)?;
            if let Some((rows, ids)) = queued {
                queue.schedule(&rows, ids, now_ms);
            }
            Ok(published)
        })
        .await
    }
}

#[cfg(test)]
#[path = "publish_fan_out_tests.rs"]
mod tests;
