//! The faults a simulation injects, drawn from its seed: crashes (decided by the
//! runner and the endpoints' transport), and a delivery queue whose sends fail, are
//! duplicated or are held back so that later messages overtake them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::memory::MemoryQueue;
use entrega_core::ports::{MessageQueue, OutgoingMessage, SendHook, StoreError, StoreResult};
use rand::Rng;

/// How often each fault strikes (each a probability per chance).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Per request about to be sent: the process dies after its "delivering" write,
    /// before the request leaves.
    pub crash_before_send: f64,
    /// Per request sent: the process dies before it learns the outcome.
    pub crash_after_send: f64,
    /// Per handled message: the process dies after recording, before settling.
    pub crash_before_ack: f64,
    /// Per queue send: it fails (a backend error; a fan-out dies midway).
    pub send_failure: f64,
    /// Per message sent: it is delivered twice.
    pub duplicate: f64,
    /// Per message sent (each copy of a duplicate apart): it is held back by up to
    /// [`REORDER_WINDOW`], so messages sent after it are received before it.
    pub reorder: f64,
}

/// The most a reordered message is held back: long beside the milliseconds between
/// sends, short beside a retry schedule, as a queue's own reordering is.
pub const REORDER_WINDOW: Duration = Duration::from_secs(30);

/// The fault dice, seeded apart from the handlers' randomness.
pub(super) struct Dice(pub(super) Mutex<rand::rngs::StdRng>);

impl Dice {
    pub(super) fn roll(&self, p: f64) -> bool {
        p > 0.0 && self.0.lock().unwrap().gen_bool(p.min(1.0))
    }

    /// A duration in (0, `max`].
    pub(super) fn up_to(&self, max: Duration) -> Duration {
        let ms = max.as_millis().max(1) as u64;
        Duration::from_millis(self.0.lock().unwrap().gen_range(1..=ms))
    }
}

/// The delivery queue as the handlers see it: sends may fail or be duplicated.
pub(super) struct FaultyQueue {
    pub(super) inner: MemoryQueue,
    pub(super) faults: Faults,
    pub(super) dice: Arc<Dice>,
}

#[async_trait]
impl SendHook for FaultyQueue {
    fn queue(&self) -> &dyn MessageQueue {
        &self.inner
    }

    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        if self.dice.roll(self.faults.send_failure) {
            return Err(StoreError::Backend(
                "injected: the queue refused the send".into(),
            ));
        }
        let mut sent = Vec::with_capacity(messages.len());
        for m in messages {
            if self.dice.roll(self.faults.duplicate) {
                sent.push(m.clone());
            }
            sent.push(m);
        }
        for m in &mut sent {
            if self.dice.roll(self.faults.reorder) {
                m.delay += self.dice.up_to(REORDER_WINDOW);
            }
        }
        self.inner.send(sent).await
    }
}
