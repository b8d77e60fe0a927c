//! The attempts under way, and the watch that moves the slow ones out of the worker's
//! slots (see `runtime::SLOW_AFTER`).
//!
//! Why a watch on a timer instead of a timer per attempt: a timer registered and
//! cancelled for every attempt cost about a seventh of the worker path's CPU, for the
//! few attempts that run long. Here an attempt costs one insert and one removal in a
//! map, and the watch looks at what is under way four times a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::sqlite::queue::SqliteQueue;

/// How often the watch looks for attempts past the threshold: an attempt moves out
/// at most this long after it.
pub const SLOW_CHECK_INTERVAL: Duration = Duration::from_millis(250);

struct Running {
    started: Instant,
    receipt: String,
    /// The worker slot it holds, until it moves to a slow one.
    worker_slot: Option<OwnedSemaphorePermit>,
    slow_slot: Option<OwnedSemaphorePermit>,
}

/// See the module docs.
#[derive(Clone, Default)]
pub struct SlowAttempts {
    running: Arc<Mutex<HashMap<u64, Running>>>,
    next: Arc<std::sync::atomic::AtomicU64>,
}

/// An attempt under way; its slot (worker or slow) is given back when this drops.
pub struct UnderWay {
    attempts: SlowAttempts,
    key: u64,
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.attempts.lock().remove(&self.key);
    }
}

impl SlowAttempts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Note the attempt for the message of `receipt`, holding `worker_slot`.
    pub fn start(&self, receipt: &str, worker_slot: OwnedSemaphorePermit) -> UnderWay {
        self.insert(Running {
            started: Instant::now(),
            receipt: receipt.to_owned(),
            worker_slot: Some(worker_slot),
            slow_slot: None,
        })
    }

    /// Note an attempt that starts in `slow_slot` (its endpoint's attempts ran long
    /// lately): it holds no worker slot, so the watch leaves it alone.
    pub fn start_slow(&self, receipt: &str, slow_slot: OwnedSemaphorePermit) -> UnderWay {
        self.insert(Running {
            started: Instant::now(),
            receipt: receipt.to_owned(),
            worker_slot: None,
            slow_slot: Some(slow_slot),
        })
    }

    fn insert(&self, running: Running) -> UnderWay {
        let key = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock().insert(key, running);
        UnderWay {
            attempts: self.clone(),
            key,
        }
    }

    /// Every [`SLOW_CHECK_INTERVAL`] until `shutdown`: each attempt in a worker slot
    /// for `slow_after` or more is noted slow, and moved to one of `slow_slots` when
    /// one is free and its tenant may have it, or else, if it took a kept worker slot,
    /// to one of `kept_moves` (tried again at each look while neither).
    pub async fn watch(
        self,
        slow_after: Duration,
        slow_slots: Arc<Semaphore>,
        kept_moves: Arc<Semaphore>,
        queue: SqliteQueue,
        mut shutdown: watch::Receiver<bool>,
    ) {
        while !*shutdown.borrow() {
            tokio::select! {
                _ = tokio::time::sleep(SLOW_CHECK_INTERVAL) => {}
                _ = shutdown.changed() => return,
            }
            let mut moved = false;
            for attempt in self.lock().values_mut() {
                if attempt.worker_slot.is_none() || attempt.started.elapsed() < slow_after {
                    continue;
                }
                let mut slow = slow_slots.clone().try_acquire_owned().ok();
                let demoted = queue.note_slow(&attempt.receipt, slow.is_some())
                    || queue.demote_from_kept_place(&attempt.receipt, || {
                        slow = kept_moves.clone().try_acquire_owned().ok();
                        slow.is_some()
                    });
                if demoted {
                    attempt.worker_slot = None;
                    attempt.slow_slot = slow;
                    moved = true;
                }
            }
            if moved {
                queue.wake_consumer();
            }
        }
    }
}
