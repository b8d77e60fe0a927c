//! What the handlers of one Lambda batch write in bulk, held until the batch ends:
//! every call on AWS is billed, and a batch's handlers make many small ones.
//!
//! - [`SendBuffer`]: the delivery messages of an outbox stream batch. Each record's
//!   fan-out queues its messages (one per endpoint, often just one); sent as they
//!   come, a batch of 100 single-endpoint events is 100 `SendMessageBatch` calls of
//!   one message each. Held and sent ten to a call, it is ten. The outbox trigger
//!   decides when to send ([`SendBuffer::flush`]) and, if a send fails, reports the
//!   batch failed from the first record whose messages were still held, so Lambda
//!   replays from there and the fan-out queues them again (it queues a delivery it
//!   finds never attempted).
//! - [`BacklogBuffer`]: the tenants' backlog counters. Every delivery moves its
//!   tenant's counter twice (fanned out, finished), each an `UpdateItem` of one write
//!   unit; summed per tenant over a batch, it is one update per tenant and batch. The
//!   price: an invocation that dies before its flush (a timeout) loses its batch's
//!   moves, not one delivery's, and the messages it finished are not redone to make
//!   them again. The counter is a brake against runaway publishing, not a ledger
//!   ([`crate::dynamo`]'s backlog), and a batch is bounded (ten messages at the
//!   worker, one stream batch at the fan-out).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use entrega_core::ids::TenantId;
use entrega_core::ports::{Backlog, MessageQueue, OutgoingMessage, SendHook, StoreResult};

pub struct SendBuffer {
    queue: Arc<dyn MessageQueue>,
    held: Mutex<Vec<OutgoingMessage>>,
}

impl SendBuffer {
    pub fn new(queue: Arc<dyn MessageQueue>) -> Self {
        Self {
            queue,
            held: Mutex::default(),
        }
    }

    /// Messages queued and not yet sent.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Send every held message. On an error some may have gone out; the caller replays
    /// the records they came from, and a duplicate message is tolerated by the worker.
    pub async fn flush(&self) -> StoreResult<()> {
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        if held.is_empty() {
            return Ok(());
        }
        self.queue.send(held).await
    }
}

#[async_trait]
impl SendHook for SendBuffer {
    fn queue(&self) -> &dyn MessageQueue {
        self.queue.as_ref()
    }

    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(messages);
        Ok(())
    }
}

/// Backlog moves summed per tenant until [`BacklogBuffer::flush`]; reads go through.
pub struct BacklogBuffer {
    backlog: Arc<dyn Backlog>,
    held: Mutex<HashMap<TenantId, i64>>,
}

impl BacklogBuffer {
    pub fn new(backlog: Arc<dyn Backlog>) -> Self {
        Self {
            backlog,
            held: Mutex::default(),
        }
    }

    /// Record every tenant's summed move. The counter is a brake against runaway
    /// publishing, not a ledger (see the backlog port): a move that cannot be recorded
    /// is logged and dropped rather than failing a batch whose work is done, which
    /// would only redo that work.
    pub async fn flush(&self) {
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        for (tenant, delta) in held {
            if delta == 0 {
                continue;
            }
            if let Err(e) = self.backlog.record(&tenant, delta).await {
                tracing::error!(tenant_id = %tenant, delta, error = %e, "a backlog move was not recorded; the tenant's figure is off by it");
            }
        }
    }
}

#[async_trait]
impl Backlog for BacklogBuffer {
    async fn tenant_backlog(&self, tenant: &TenantId) -> StoreResult<u64> {
        self.backlog.tenant_backlog(tenant).await
    }

    async fn record(&self, tenant: &TenantId, delta: i64) -> StoreResult<()> {
        *self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(tenant.clone())
            .or_default() += delta;
        Ok(())
    }
}
