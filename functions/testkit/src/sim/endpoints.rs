//! The receivers' side of the simulation: each endpoint answers by the time and the
//! request's `webhook-id`, takes its latency in virtual time (cut at the request's
//! timeout, as a real client cuts it), and every request is remembered.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use entrega_core::memory::response;
use entrega_core::outcome::{FailureKind, TransportResult};
use entrega_core::ports::{Clock, ManualClock, SignedRequest, Transport};

use super::faults::{Dice, Faults};

/// How an endpoint answers a request (by its `webhook-id`) at a moment of virtual time.
pub type Behaviour = Box<dyn Fn(DateTime<Utc>, &str) -> TransportResult + Send + Sync>;

/// One request an endpoint received.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub url: String,
    pub webhook_id: String,
    /// When it arrived (the attempt's start).
    pub at: DateTime<Utc>,
    pub answer: TransportResult,
}

/// Wakers of requests in flight, by when their answer comes.
#[derive(Default)]
pub(super) struct Timers {
    next: AtomicU64,
    waiting: Mutex<BTreeMap<(DateTime<Utc>, u64), Waker>>,
}

impl Timers {
    /// When the next answer comes, if any request is in flight.
    pub(super) fn next_at(&self) -> Option<DateTime<Utc>> {
        self.waiting
            .lock()
            .unwrap()
            .keys()
            .next()
            .map(|(at, _)| *at)
    }

    /// Wake every request whose answer is due at `now`.
    pub(super) fn wake_due(&self, now: DateTime<Utc>) {
        let due: Vec<Waker> = {
            let mut waiting = self.waiting.lock().unwrap();
            let later = waiting.split_off(&(now, u64::MAX));
            std::mem::replace(&mut *waiting, later)
                .into_values()
                .collect()
        };
        due.into_iter().for_each(Waker::wake);
    }

    /// Forget every waiting request (the process died).
    pub(super) fn clear(&self) {
        self.waiting.lock().unwrap().clear();
    }
}

/// A wait in virtual time.
struct Sleep {
    until: DateTime<Utc>,
    clock: Arc<ManualClock>,
    timers: Arc<Timers>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.clock.now() >= self.until {
            return Poll::Ready(());
        }
        let seq = self.timers.next.fetch_add(1, Ordering::Relaxed);
        self.timers
            .waiting
            .lock()
            .unwrap()
            .insert((self.until, seq), cx.waker().clone());
        Poll::Pending
    }
}

pub(super) struct Endpoints {
    pub(super) clock: Arc<ManualClock>,
    pub(super) behaviours: Mutex<HashMap<String, Behaviour>>,
    pub(super) latencies: Mutex<HashMap<String, Duration>>,
    pub(super) arrivals: Mutex<Vec<Arrival>>,
    pub(super) timers: Arc<Timers>,
    pub(super) faults: Faults,
    pub(super) dice: Arc<Dice>,
    /// Set when a crash around a send took the process down.
    pub(super) crashed: AtomicBool,
}

#[async_trait]
impl Transport for Endpoints {
    async fn send(&self, request: &SignedRequest) -> TransportResult {
        if self.dice.roll(self.faults.crash_before_send) {
            self.crashed.store(true, Ordering::Relaxed);
            // Recorded as delivering, never sent: the process is gone.
            return std::future::pending().await;
        }
        let latency = self
            .latencies
            .lock()
            .unwrap()
            .get(&request.url)
            .copied()
            .unwrap_or_default();
        let cut = latency > request.timeout;
        let answer = self.answer(request, cut);
        let wait = latency.min(request.timeout);
        if !wait.is_zero() {
            Sleep {
                until: self.clock.now() + chrono::Duration::from_std(wait).unwrap(),
                clock: self.clock.clone(),
                timers: self.timers.clone(),
            }
            .await;
        }
        if self.dice.roll(self.faults.crash_after_send) {
            self.crashed.store(true, Ordering::Relaxed);
            // The request was sent; the process dies before the answer is read.
            return std::future::pending().await;
        }
        answer
    }
}

impl Endpoints {
    /// What the endpoint answers (a timeout if its latency is past the request's),
    /// remembered as it arrives.
    fn answer(&self, request: &SignedRequest, cut: bool) -> TransportResult {
        let now = self.clock.now();
        let webhook_id = request
            .headers
            .iter()
            .find(|(name, _)| name == "webhook-id")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let answer = if cut {
            TransportResult::Failed {
                kind: FailureKind::Timeout,
                message: "no answer within the timeout".into(),
            }
        } else {
            match self.behaviours.lock().unwrap().get(&request.url) {
                Some(behave) => behave(now, &webhook_id),
                None => response(200),
            }
        };
        self.arrivals.lock().unwrap().push(Arrival {
            url: request.url.clone(),
            webhook_id,
            at: now,
            answer: answer.clone(),
        });
        answer
    }
}
