//! The in-process runtime: pollers that play the parts of Lambda's event source
//! mappings — outbox → fan-out, delivery queue → worker, failures queue → failure
//! handler — calling the same core handlers the Lambda functions call.
//!
//! Each loop wakes on work (a publish wakes the fan-out, a queued message wakes the
//! worker) and polls only as the fallback. A failing backend is a *condition*: logged
//! once, reported by `/healthz`, and retried with exponential backoff rather than in a
//! tight loop that would flood the log and the disk.

use std::sync::Arc;
use std::time::Duration;

use entrega_core::conditions::{Component, Conditions};
use entrega_core::endpoint::MAX_CONCURRENCY_CAP;
use entrega_core::handlers::age::check_unacknowledged;
use entrega_core::handlers::failures::handle_failure;
use entrega_core::handlers::sweep::{sweep_overdue, SWEEP_INTERVAL};
use entrega_core::handlers::task::DeliveryTask;
use entrega_core::handlers::worker::{handle_delivery, Disposition};
use entrega_core::ports::{ReceivedMessage, Services, StoreError};
use entrega_runtime::{pause, poll_until_stopped, LoopBackoff, Settlement, AGE_CHECK_INTERVAL};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::fan_out::{fan_out_committed, FanOutsUnderWay};
use crate::slow_attempts::SlowAttempts;
use crate::sqlite::queue::SqliteQueue;
use crate::sqlite::retention::PurgeCursor;
use crate::sqlite::SqliteStore;

/// Attempts in flight at once across all endpoints, but the slow ones (which move to
/// [`SLOW_SLOTS`]). Per-endpoint caps, the slow tenants' share and the kept slots
/// below are what protect the other tenants. Why 128, not 64: past the slow tenants'
/// share the others keep 96, where they had 32, so endpoints that answer in a second
/// or so (not slow by the rules) do not queue behind one another while other tenants
/// hang (three tenants at 10 events/s to 0.9 s endpoints waited 2 – 3 s); and a busy
/// tenant's endpoint with a cap of 64 reaches it (it was held to the 48 shared).
pub const WORKER_SLOTS: usize = 128;
/// Worker slots kept for light tenants: once [`SHARED_SLOTS`] attempts are in flight,
/// a tenant gets another only while it has fewer than [`KEPT_SLOTS_PER_TENANT`] and
/// none of its attempts has run past [`SLOW_AFTER`] in the last [`SLOW_MEMORY`]. So
/// tenants whose endpoints hang, however many, never take the kept slots, and another
/// tenant's attempts still start at once.
pub const KEPT_SLOTS: usize = 16;
/// What tenants with attempts to spare share before the kept slots.
pub const SHARED_SLOTS: usize = WORKER_SLOTS - KEPT_SLOTS;
/// Attempts in flight below which a tenant may take a kept slot.
pub const KEPT_SLOTS_PER_TENANT: usize = 4;
/// The same for a tenant none of whose endpoints has answered within [`SLOW_AFTER`]
/// in the last [`SLOW_MEMORY`] (a new one, say): new tenants whose endpoints hang,
/// arriving together, each took four kept slots before any was known slow, so four of
/// them filled the kept slots (a hostile test). One each keeps a new tenant's first
/// attempt starting at once; its next ones get the full share once one ends in time.
pub const KEPT_SLOTS_PER_UNPROVEN_TENANT: usize = 1;
/// How long a tenant one of whose attempts ran past [`SLOW_AFTER`] counts as slow:
/// kept from the kept slots, and held to [`SLOW_TENANTS_SHARE`].
pub const SLOW_MEMORY: Duration = Duration::from_secs(60);
/// Worker slots tenants slow lately hold at once, together (attempts moved to slow
/// slots aside): when the slow slots are all taken, their attempts stay in worker
/// slots for their whole timeout, and without this bound they would leave a busy
/// healthy tenant the kept slots only.
pub const SLOW_TENANTS_SHARE: usize = 32;
/// Most of [`SLOW_TENANTS_SHARE`] one tenant holds: a quarter, so four tenants must
/// hang, each beyond its slow slots, before another slow tenant waits for the share
/// (see `KeptSlots::slow_share_per_group`).
pub const SLOW_TENANTS_SHARE_PER_TENANT: usize = SLOW_TENANTS_SHARE / 4;
const _: () = assert!(SLOW_TENANTS_SHARE < SHARED_SLOTS);
const _: () = assert!(KEPT_SLOTS < WORKER_SLOTS && KEPT_SLOTS_PER_TENANT <= KEPT_SLOTS);
/// An attempt still running after this (noticed within
/// [`crate::slow_attempts::SLOW_CHECK_INTERVAL`]) leaves its worker slot for one of the
/// [`SLOW_SLOTS`] (when one is free): an endpoint that hangs then holds the slow
/// slots, not the ones every tenant's quick attempts turn over in, and it no longer
/// counts against its tenant's share (its endpoint's cap still holds it). For
/// [`SLOW_MEMORY`] after, that endpoint's attempts start in a slow slot at once.
pub const SLOW_AFTER: Duration = Duration::from_secs(1);
/// Attempts past [`SLOW_AFTER`] in flight at once beside the worker's slots: each is
/// a socket and its request, so they are bounded too; when all are taken, or its
/// tenant holds [`SLOW_SLOTS_PER_TENANT`], a slow attempt keeps its worker slot.
pub const SLOW_SLOTS: usize = 512;
/// Slow slots an attempt may start in (its endpoint slow lately) only while more
/// than this many are free: the last are kept for attempts already running long in
/// worker slots. Why: started ones cannot step back, and those the slow slots had no
/// room for held their worker slots for their whole timeout (up to 100 of 128 when
/// hanging tenants' new attempts took the slow slots first), where a new attempt left
/// waiting costs nothing. All the worker's slots fit.
pub const SLOW_SLOTS_KEPT_FOR_MOVES: usize = WORKER_SLOTS;
const _: () = assert!(SLOW_SLOTS_KEPT_FOR_MOVES < SLOW_SLOTS);
/// Attempts moved out of kept worker slots beside [`SLOW_SLOTS`], when none of those
/// was free: a tenant is known slow only once one of its attempts has run long, so new
/// tenants whose endpoints hang may take the kept slots first, and with the slow slots
/// all taken (hanging tenants fill them by design) those attempts held the kept slots
/// for their whole timeout. Room for the kept slots filled four times over within one
/// timeout: with [`KEPT_SLOTS_PER_UNPROVEN_TENANT`], 64 new hanging tenants arriving
/// in waves, once the slow slots are full. Not a wall: past that the kept slots are
/// held again until a timeout frees one. Each is a socket, so bounded as well.
pub const KEPT_SLOT_MOVES: usize = KEPT_SLOTS * 4;
/// Slow slots one tenant may hold: one endpoint at the largest cap fits (so its
/// neighbours keep their turn), and two tenants must hang to fill them all (the
/// others are protected by the kept slots either way).
pub const SLOW_SLOTS_PER_TENANT: usize = MAX_CONCURRENCY_CAP as usize;
/// The delivery queue's rule for the worker's last slots, from the constants above.
pub fn kept_slots() -> crate::sqlite::KeptSlots {
    crate::sqlite::KeptSlots {
        shared: SHARED_SLOTS as u32,
        floor: KEPT_SLOTS_PER_TENANT as u32,
        unproven_floor: KEPT_SLOTS_PER_UNPROVEN_TENANT as u32,
        slow_memory: SLOW_MEMORY.as_millis() as i64,
        quick_within: SLOW_AFTER.as_millis() as i64,
        demoted_per_group: SLOW_SLOTS_PER_TENANT as u32,
        slow_share: SLOW_TENANTS_SHARE as u32,
        slow_share_per_group: SLOW_TENANTS_SHARE_PER_TENANT as u32,
    }
}

/// How long a received delivery message stays hidden: longer than the longest
/// attempt (30 s timeout + lease margin), so no second worker picks it up meanwhile.
pub const RECEIVE_VISIBILITY: Duration = Duration::from_secs(60);
/// Longest wait between polls when nothing signalled work (delayed retries coming
/// due, and a missed wake-up, are picked up this late at worst).
pub const IDLE_POLL: Duration = Duration::from_millis(50);
/// While the queue holds more than a receive takes, a receive waits for this many free
/// slots (or [`GATHER_WINDOW`]), so that one receive, and one read of what its
/// messages need, serves several messages instead of one each time an attempt ends.
pub const RECEIVE_AT_LEAST: usize = 16;
const _: () = assert!(RECEIVE_AT_LEAST <= WORKER_SLOTS);
/// The longest a receive waits to gather [`RECEIVE_AT_LEAST`] free slots: under load
/// attempts end thousands of times a second, so it is reached only when they are slow.
pub const GATHER_WINDOW: Duration = Duration::from_millis(1);
/// Outbox events fanned out per poll.
const OUTBOX_BATCH: usize = 100;
/// Failure notices handled per poll.
const FAILURE_BATCH: usize = 10;

/// How soon after start the first retention pass runs (not at once: a restart is
/// busy enough with what it replays).
const PURGE_FIRST_AFTER: Duration = Duration::from_secs(60);
/// Between retention passes: what expires meanwhile waits at most this long.
const PURGE_INTERVAL: Duration = Duration::from_secs(600);
/// Between the steps of one pass: each step is one write of bounded size, and the
/// pause leaves the writer to everybody else's work.
const PURGE_STEP_PAUSE: Duration = Duration::from_millis(100);

/// How old an outbox row must be before the poller takes it: younger ones are being
/// fanned out by their own publish request.
pub const INLINE_GRACE: Duration = Duration::from_secs(2);

/// The worker's slots (see [`WORKER_SLOTS`] and [`SLOW_SLOTS`]), shared with
/// `/metrics` so an operator sees how many are taken.
#[derive(Clone)]
pub struct WorkerSlots {
    worker: Arc<Semaphore>,
    slow: Arc<Semaphore>,
    /// See [`KEPT_SLOT_MOVES`].
    kept_moves: Arc<Semaphore>,
}

impl Default for WorkerSlots {
    fn default() -> Self {
        Self {
            worker: Arc::new(Semaphore::new(WORKER_SLOTS)),
            slow: Arc::new(Semaphore::new(SLOW_SLOTS)),
            kept_moves: Arc::new(Semaphore::new(KEPT_SLOT_MOVES)),
        }
    }
}

impl WorkerSlots {
    /// Worker slots and slow slots taken now (the moves out of kept slots counted as
    /// slow: they are attempts running long outside the worker's slots).
    pub fn in_use(&self) -> (usize, usize) {
        (
            WORKER_SLOTS - self.worker.available_permits(),
            SLOW_SLOTS - self.slow.available_permits() + KEPT_SLOT_MOVES
                - self.kept_moves.available_permits(),
        )
    }
}

/// The pollers, started together and stopped together.
pub struct Runtime {
    pub services: Services,
    pub store: SqliteStore,
    /// The delivery queue itself, for its wake-up signal.
    pub delivery_queue: SqliteQueue,
    pub conditions: Arc<Conditions>,
    /// What is being fanned out beside the poller, which it leaves alone.
    pub fan_outs_under_way: FanOutsUnderWay,
    /// How long settled records are kept (see [`crate::sqlite::retention`]); `None`:
    /// forever.
    pub retention: Option<chrono::Duration>,
    /// The worker's slots, shared with `/metrics`.
    pub slots: WorkerSlots,
}

impl Runtime {
    /// Run until `shutdown` turns true; then stop taking work and let in-flight
    /// attempts finish (their outcomes are recorded) before returning.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let mut tasks = JoinSet::new();
        tasks.spawn(this.clone().outbox_loop(shutdown.clone()));
        tasks.spawn(this.clone().delivery_loop(shutdown.clone()));
        tasks.spawn(this.clone().failure_loop(shutdown.clone()));
        tasks.spawn(this.clone().age_loop(shutdown.clone()));
        tasks.spawn(this.clone().sweep_loop(shutdown.clone()));
        tasks.spawn(this.clone().retention_loop(shutdown));
        while tasks.join_next().await.is_some() {}
    }

    fn failing(&self, component: Component, error: &StoreError) {
        self.conditions
            .failing(component, &error.to_string(), self.services.clock.now());
    }

    fn observe(&self, component: Component, result: &Result<bool, StoreError>) {
        match result {
            Ok(_) => self.conditions.recovered(component),
            Err(e) => self.failing(component, e),
        }
    }

    async fn outbox_loop(self: Arc<Self>, shutdown: watch::Receiver<bool>) {
        poll_until_stopped(
            shutdown,
            IDLE_POLL,
            || self.fan_out_waiting(),
            |result| self.observe(Component::Outbox, result),
        )
        .await;
    }

    /// Fan out what waits in the outbox, but for what is being fanned out beside the
    /// poller; `Ok(true)` if there was any (what is under way is looked at again at
    /// the next poll, not at once).
    pub(crate) async fn fan_out_waiting(&self) -> Result<bool, StoreError> {
        let events = self
            .store
            .outbox_waiting(OUTBOX_BATCH, INLINE_GRACE)
            .await?;
        let mut fanned_out = false;
        for event in &events {
            if !self.fan_outs_under_way.contains(event) {
                fan_out_committed(&self.services, &self.store, &self.fan_outs_under_way, event)
                    .await?;
                fanned_out = true;
            }
        }
        Ok(fanned_out)
    }

    async fn delivery_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let (slots, slow_slots) = (self.slots.worker.clone(), self.slots.slow.clone());
        let attempts = SlowAttempts::default();
        tokio::spawn(attempts.clone().watch(
            SLOW_AFTER,
            slow_slots.clone(),
            self.slots.kept_moves.clone(),
            self.delivery_queue.clone(),
            shutdown.clone(),
        ));
        let mut in_flight = JoinSet::new();
        let mut backoff = LoopBackoff::default();
        // Whether the last receive got all it asked for: only then is there a backlog
        // worth gathering slots for. (Not otherwise: when slow attempts hold most slots
        // and other tenants' messages trickle in, each would wait the window.)
        let mut backlog = false;
        while !*shutdown.borrow() {
            while in_flight.try_join_next().is_some() {}
            let free = slots.available_permits();
            if free == 0 {
                tokio::select! {
                    _ = in_flight.join_next() => {}
                    // A slot given up by a slow attempt.
                    _ = self.delivery_queue.work_arrived() => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            if backlog && free < RECEIVE_AT_LEAST {
                gather_free_slots(&slots, &mut in_flight).await;
            }
            let free = slots.available_permits();
            let received = match self
                .services
                .deliveries
                .receive(free, RECEIVE_VISIBILITY)
                .await
            {
                Ok(messages) => {
                    backoff.reset();
                    backlog = messages.len() == free;
                    messages
                }
                Err(e) => {
                    self.failing(Component::Deliveries, &e);
                    pause(&mut shutdown, backoff.next_pause()).await;
                    continue;
                }
            };
            if received.is_empty() {
                tokio::select! {
                    _ = self.delivery_queue.work_arrived() => {}
                    _ = tokio::time::sleep(IDLE_POLL) => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            let tasks: Vec<Option<DeliveryTask>> = received
                .iter()
                .map(|m| serde_json::from_str(&m.body).ok())
                .collect();
            let prefetched = self.store.prefetch(&tasks).await;
            for (message, prefetched) in received.into_iter().zip(prefetched) {
                // An attempt at an endpoint slow lately starts in a slow slot, if one
                // is free (see `Scheduler::demote_if_lane_slow`); others in a worker
                // slot (free: as many were received).
                let mut slow = None;
                let demoted = self
                    .delivery_queue
                    .demote_if_lane_slow(&message.receipt, || {
                        if slow_slots.available_permits() <= SLOW_SLOTS_KEPT_FOR_MOVES {
                            return false;
                        }
                        slow = slow_slots.clone().try_acquire_owned().ok();
                        slow.is_some()
                    });
                let under_way = match slow {
                    Some(slow) if demoted => attempts.start_slow(&message.receipt, slow),
                    _ => {
                        let permit = slots.clone().acquire_owned().await.expect("never closed");
                        attempts.start(&message.receipt, permit)
                    }
                };
                let (services, conditions) = (self.services.clone(), self.conditions.clone());
                in_flight.spawn(async move {
                    prefetched
                        .scope(run_delivery(&services, &conditions, message))
                        .await;
                    drop(under_way);
                });
            }
        }
        // Graceful stop: no new work, but attempts already sent get their outcome
        // recorded. (Bounded: each attempt ends by its own timeout.)
        while in_flight.join_next().await.is_some() {}
    }

    async fn failure_loop(self: Arc<Self>, shutdown: watch::Receiver<bool>) {
        poll_until_stopped(
            shutdown,
            IDLE_POLL,
            || self.handle_failures(),
            |result| self.observe(Component::Failures, result),
        )
        .await;
    }

    /// Handle a batch of failure notices; `Ok(true)` if there were any. One notice's
    /// backend error is the batch's (the others are settled each by its own outcome).
    async fn handle_failures(&self) -> Result<bool, StoreError> {
        let queue = &self.services.failures;
        let received = queue.receive(FAILURE_BATCH, RECEIVE_VISIBILITY).await?;
        let mut failed = None;
        for message in &received {
            let outcome = handle_failure(&self.services, &message.body)
                .await
                .map(|_| Disposition::Done);
            if let Err(e) = &outcome {
                failed = Some(e.clone());
            }
            Settlement::of(
                &outcome,
                message.receive_count,
                self.services.random.as_ref(),
            )
            .apply(queue.as_ref(), &message.receipt)
            .await;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(!received.is_empty()),
        }
    }

    /// The sweeper, on a timer: the embedded queue shares the store's database, and a
    /// message a crash kept from being written is queued at the next start
    /// ([`crate::restart`]), so a lost message would take a failed write, a bug or a
    /// hand-edited database; the sweep is the same safety net as on AWS, from the same
    /// handler.
    async fn sweep_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        pause(&mut shutdown, SWEEP_INTERVAL).await;
        while !*shutdown.borrow() {
            match sweep_overdue(&self.services).await {
                Ok(_) => self.conditions.recovered(Component::Sweeper),
                Err(e) => self.failing(Component::Sweeper, &e),
            }
            pause(&mut shutdown, SWEEP_INTERVAL).await;
        }
    }

    /// The retention purge: a pass every [`PURGE_INTERVAL`], a step at a time with
    /// [`PURGE_STEP_PAUSE`] between steps, so a first pass over a large old database
    /// never holds the writer for long.
    async fn retention_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let Some(retention) = self.retention else {
            return;
        };
        let mut cursor = PurgeCursor::default();
        let mut wait = PURGE_FIRST_AFTER;
        loop {
            pause(&mut shutdown, wait).await;
            if *shutdown.borrow() {
                return;
            }
            let cutoff = self.services.clock.now() - retention;
            match self.store.purge_step(cutoff, cursor.clone()).await {
                Ok(step) => {
                    self.conditions.recovered(Component::Retention);
                    if step.deliveries + step.events + step.failures > 0 {
                        tracing::info!(
                            deliveries = step.deliveries,
                            events = step.events,
                            failures = step.failures,
                            "deleted records past the retention period"
                        );
                    }
                    (cursor, wait) = match step.next {
                        Some(next) => (next, PURGE_STEP_PAUSE),
                        None => (PurgeCursor::default(), PURGE_INTERVAL),
                    };
                }
                Err(e) => {
                    self.failing(Component::Retention, &e);
                    wait = PURGE_INTERVAL;
                }
            }
        }
    }

    /// The 24-hour rule, checked on a timer so it fires without new failures.
    async fn age_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            match check_unacknowledged(&self.services).await {
                Ok(_) => self.conditions.recovered(Component::AgeCheck),
                Err(e) => self.failing(Component::AgeCheck, &e),
            }
            pause(&mut shutdown, AGE_CHECK_INTERVAL).await;
        }
    }
}

/// Wait until [`RECEIVE_AT_LEAST`] worker slots are free, attempts under way end, or
/// [`GATHER_WINDOW`] has passed, whichever comes first.
async fn gather_free_slots(slots: &Semaphore, in_flight: &mut JoinSet<()>) {
    let deadline = tokio::time::Instant::now() + GATHER_WINDOW;
    while slots.available_permits() < RECEIVE_AT_LEAST {
        tokio::select! {
            ended = in_flight.join_next() => if ended.is_none() { return },
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
}

async fn run_delivery(services: &Services, conditions: &Conditions, message: ReceivedMessage) {
    let outcome = crate::lane_slots::handling(
        &message.receipt,
        handle_delivery(services, &message.body, message.receive_count),
    )
    .await;
    match &outcome {
        Ok(_) => conditions.recovered(Component::Deliveries),
        Err(e) => {
            tracing::debug!(error = %e, receive_count = message.receive_count, "handler failed; message will come back");
            conditions.failing(Component::Deliveries, &e.to_string(), services.clock.now())
        }
    }
    Settlement::of(&outcome, message.receive_count, services.random.as_ref())
        .apply(services.deliveries.as_ref(), &message.receipt)
        .await;
}
