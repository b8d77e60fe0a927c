//! A queue that changes only how messages are sent: a buffer that holds them, a fault
//! injector, a test's witness. The [`SendHook`] says what a send does; [`Hooked`]
//! makes it a [`MessageQueue`] whose other calls go to the queue it names.

use std::time::Duration;

use async_trait::async_trait;

use super::{DelayLimits, MessageQueue, OutgoingMessage, ReceivedMessage, StoreResult};

/// What a send does, in front of [`Self::queue`].
#[async_trait]
pub trait SendHook: Send + Sync {
    /// The queue every other call goes to.
    fn queue(&self) -> &dyn MessageQueue;
    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()>;
}

/// A [`SendHook`] as a queue; derefs to the hook, for what else it offers.
pub struct Hooked<H>(pub H);

impl<H> std::ops::Deref for Hooked<H> {
    type Target = H;

    fn deref(&self) -> &H {
        &self.0
    }
}

#[async_trait]
impl<H: SendHook> MessageQueue for Hooked<H> {
    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        self.0.send(messages).await
    }

    async fn receive(&self, max: usize, visibility: Duration) -> StoreResult<Vec<ReceivedMessage>> {
        self.0.queue().receive(max, visibility).await
    }

    async fn change_visibility(&self, receipt: &str, delay: Duration) -> StoreResult<()> {
        self.0.queue().change_visibility(receipt, delay).await
    }

    async fn delete(&self, receipt: &str) -> StoreResult<()> {
        self.0.queue().delete(receipt).await
    }

    fn delay_limits(&self) -> DelayLimits {
        self.0.queue().delay_limits()
    }
}
