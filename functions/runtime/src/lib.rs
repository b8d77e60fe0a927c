//! The event-source runtime every host shares. Three hosts feed the same handlers:
//! the embedded runtime's pollers (SQLite queues), the Lambda glue (an SQS batch
//! event), and the local emulation of Lambda's event source mappings (SQS and the
//! outbox stream against AWS APIs). What they must agree on lives here once:
//!
//! - what becomes of a received message after its handler ran ([`Settlement`]),
//!   including how long a backend error keeps it hidden;
//! - the polling loop: run a pass, pause when it found nothing, back off
//!   exponentially while the backend fails ([`poll_until_stopped`], [`LoopBackoff`]);
//! - the intervals of the periodic tasks.

use std::future::Future;
use std::time::Duration;

use entrega_core::handlers::worker::Disposition;
use entrega_core::handlers::{backoff, BACKEND_ERROR_BACKOFF, BACKEND_ERROR_BACKOFF_MAX};
use entrega_core::ports::{MessageQueue, RandomSource, StoreError, StoreResult};
use tokio::sync::watch;

/// How often the 24-hour rule is checked where no scheduler runs it (the embedded
/// runtime, the emulation); the SAM template schedules it every 15 minutes.
pub const AGE_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// First and longest pause of a loop whose backend keeps failing: short enough that a
/// brief outage costs little, long enough that a long one does not flood the log.
pub const LOOP_BACKOFF_START: Duration = Duration::from_millis(100);
pub const LOOP_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What becomes of a received message once its handler has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Nothing more will come of it: delete it (on Lambda, report it a success).
    Delete,
    /// Keep it, hidden this long (on Lambda, also report it failed so it is kept).
    Hide(Duration),
}

impl Settlement {
    /// The settlement of a handler's outcome for a message received `receive_count`
    /// times. A backend error hides the message for a time growing with its receives
    /// (not a fixed few seconds, which retried a throttled table until the receive
    /// count ran out, nor the queue's whole visibility timeout).
    pub fn of(
        outcome: &StoreResult<Disposition>,
        receive_count: u32,
        random: &dyn RandomSource,
    ) -> Self {
        match outcome {
            Ok(Disposition::Done) => Self::Delete,
            Ok(Disposition::RetryIn(delay)) => Self::Hide(*delay),
            Err(_) => Self::Hide(backoff(
                receive_count,
                BACKEND_ERROR_BACKOFF,
                BACKEND_ERROR_BACKOFF_MAX,
                random,
            )),
        }
    }

    /// Apply it to the message with `receipt` through its queue (hosts that delete
    /// messages themselves). A failure here loses nothing: the message stays, and
    /// returns after its visibility timeout.
    pub async fn apply(self, queue: &dyn MessageQueue, receipt: &str) {
        let result = match self {
            Self::Delete => queue.delete(receipt).await,
            Self::Hide(delay) => queue.change_visibility(receipt, delay).await,
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "settling a message failed; it returns after its visibility timeout");
        }
    }
}

/// Exponential backoff for a loop whose backend fails.
#[derive(Debug, Clone)]
pub struct LoopBackoff(Duration);

impl Default for LoopBackoff {
    fn default() -> Self {
        Self(Duration::ZERO)
    }
}

impl LoopBackoff {
    pub fn reset(&mut self) {
        self.0 = Duration::ZERO;
    }

    /// The next pause: [`LOOP_BACKOFF_START`], doubling to [`LOOP_BACKOFF_MAX`].
    pub fn next_pause(&mut self) -> Duration {
        self.0 = (self.0 * 2).clamp(LOOP_BACKOFF_START, LOOP_BACKOFF_MAX);
        self.0
    }
}

/// Wait `pause`, or less if `shutdown` turns true.
pub async fn pause(shutdown: &mut watch::Receiver<bool>, pause: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(pause) => {}
        _ = shutdown.changed() => {}
    }
}

/// Run `pass` until `shutdown` turns true. A pass answers whether it found work: if
/// it did, the next runs at once; if not, after `idle`. A failing pass is retried
/// after a [`LoopBackoff`] pause. `observe` sees every result (to log it, or report
/// the backend's condition).
pub async fn poll_until_stopped<P, F>(
    mut shutdown: watch::Receiver<bool>,
    idle: Duration,
    mut pass: P,
    mut observe: impl FnMut(&Result<bool, StoreError>),
) where
    P: FnMut() -> F,
    F: Future<Output = Result<bool, StoreError>>,
{
    let mut backoff = LoopBackoff::default();
    while !*shutdown.borrow() {
        let result = pass().await;
        observe(&result);
        match result {
            Ok(true) => backoff.reset(),
            Ok(false) => {
                backoff.reset();
                pause(&mut shutdown, idle).await;
            }
            Err(_) => pause(&mut shutdown, backoff.next_pause()).await,
        }
    }
}

#[cfg(test)]
mod tests;
