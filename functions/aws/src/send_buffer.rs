//! The delivery messages of one outbox stream batch, sent together.
//!
//! Each record's fan-out queues its messages (one per endpoint, often just one); sent
//! as they come, a batch of 100 single-endpoint events is 100 `SendMessageBatch`
//! calls of one message each. Held here and sent ten to a call, it is ten. The
//! outbox trigger decides when to send ([`SendBuffer::flush`]) and, if a send fails,
//! reports the batch failed from the first record whose messages were still held, so
//! Lambda replays from there and the fan-out queues them again (it queues a delivery
//! it finds never attempted).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::ports::{
    DelayLimits, MessageQueue, OutgoingMessage, ReceivedMessage, StoreResult,
};

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
impl MessageQueue for SendBuffer {
    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(messages);
        Ok(())
    }

    async fn receive(&self, max: usize, visibility: Duration) -> StoreResult<Vec<ReceivedMessage>> {
        self.queue.receive(max, visibility).await
    }

    async fn change_visibility(&self, receipt: &str, delay: Duration) -> StoreResult<()> {
        self.queue.change_visibility(receipt, delay).await
    }

    async fn delete(&self, receipt: &str) -> StoreResult<()> {
        self.queue.delete(receipt).await
    }

    fn delay_limits(&self) -> DelayLimits {
        self.queue.delay_limits()
    }
}
