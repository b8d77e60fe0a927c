//! The delivery queue's ports: a queue with SQS semantics, how it holds a retry back,
//! and the scheduler for waits too long for the queue itself.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::StoreResult;

/// A message to enqueue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutgoingMessage {
    pub body: String,
    /// The fairness group (the tenant): receiving is round-robin over groups.
    pub group: String,
    pub delay: Duration,
    /// Messages sharing a key have at most `limit` in flight (per-endpoint caps).
    pub concurrency_key: Option<String>,
    pub concurrency_limit: u32,
}

/// A received message; `receipt` names this receipt of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    pub receipt: String,
    pub body: String,
    pub receive_count: u32,
}

/// A queue with SQS semantics: received messages are hidden for a visibility timeout
/// and come back unless deleted, so a crashed consumer loses nothing.
#[async_trait]
pub trait MessageQueue: Send + Sync {
    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()>;
    async fn receive(&self, max: usize, visibility: Duration) -> StoreResult<Vec<ReceivedMessage>>;
    /// Hide the message for `delay` from now.
    async fn change_visibility(&self, receipt: &str, delay: Duration) -> StoreResult<()>;
    async fn delete(&self, receipt: &str) -> StoreResult<()>;
    /// How this queue holds a retry back; see [`DelayLimits`].
    fn delay_limits(&self) -> DelayLimits;
}

/// How a queue holds a message back until its retry is due.
///
/// On SQS a message hidden after a receive counts as *in flight*, and a standard
/// queue refuses every receive past about 120 000 in flight: a dead endpoint with a
/// long retry schedule would stop delivery for every tenant. A delayed send is not in
/// flight. So only short waits hide the message; longer ones send it again delayed,
/// and past the longest send delay it goes through the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayLimits {
    /// Longest wait spent hidden (`change_visibility`); `None`: any.
    pub hide: Option<Duration>,
    /// Longest delay of a new message (`send`); `None`: any.
    pub send: Option<Duration>,
}

impl DelayLimits {
    /// A queue with no such limits (the embedded one): every wait is a hidden message.
    pub const UNLIMITED: Self = Self {
        hide: None,
        send: None,
    };

    /// Messages held back at once by hiding, for `rate` new failing events a second
    /// retried on `delays`: each spends every wait up to `hide` in flight (Little's
    /// law), plus `attempt` per attempt being made.
    pub fn in_flight(&self, rate: f64, delays: &[Duration], attempt: Duration) -> f64 {
        let hidden: f64 = delays
            .iter()
            .filter(|d| self.hide.is_none_or(|h| **d <= h))
            .map(Duration::as_secs_f64)
            .sum();
        rate * (hidden + attempt.as_secs_f64() * (delays.len() + 1) as f64)
    }
}

/// Sends a message at a time too far off for the queue itself (EventBridge Scheduler).
#[async_trait]
pub trait LongDelayScheduler: Send + Sync {
    async fn schedule(&self, message: OutgoingMessage, at: DateTime<Utc>) -> StoreResult<()>;
}
