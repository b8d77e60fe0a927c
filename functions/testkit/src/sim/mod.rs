//! A deterministic simulation: the real handlers (fan-out, worker, failure handler)
//! on the in-memory world, in virtual time, against scripted endpoints that may take
//! their time to answer. Up to [`WORKERS`] handlers run at once, interleaved on one
//! thread; the clock jumps to the next answer or the next due message. One seed fixes
//! every random draw (jitter, nonces, faults), so a seed replays its run exactly: a
//! failing run names its seed, and `ENTREGA_SIM_SEED=<seed>` runs that one again.
//!
//! [`Faults`] inject, by the same seed: a crash after the "delivering" write but
//! before the request leaves, a crash right after a request was sent (the outcome
//! never recorded; the process restarts), a crash after the outcome was
//! recorded but before the message was settled, a failing queue send (a fan-out that
//! dies midway is replayed, as the outbox poller does), duplicated messages, and
//! messages held back so that later ones overtake them.
//!
//! After a run, [`Sim::check_invariants`] checks what must hold whatever happened:
//! every committed event reached each subscribed endpoint or has a failure record,
//! nothing arrived that was not committed, an at-most-once endpoint never saw an
//! event twice, no retry came before its schedule, and the delivery log accounts for
//! every request an endpoint saw.

mod endpoints;
mod faults;
mod invariants;
pub mod scenarios;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use entrega_core::endpoint::{DeliveryMode, Endpoint};
use entrega_core::event::Event;
use entrega_core::handlers::failures::handle_failure;
use entrega_core::handlers::fanout::fan_out;
use entrega_core::handlers::worker::{handle_delivery, Disposition};
use entrega_core::ids::{EventId, TenantId};
use entrega_core::memory::World;
use entrega_core::ports::{Clock, Hooked, MessageQueue, ReceivedMessage, StoreResult};
use entrega_core::slots::InProcessSlots;
use entrega_runtime::Settlement;
use futures_util::future::LocalBoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use rand::SeedableRng;

pub use endpoints::{Arrival, Behaviour};
use endpoints::{Endpoints, Timers};
use faults::{Dice, FaultyQueue};
pub use faults::{Faults, REORDER_WINDOW};

/// A handler that finished: its message and what came of it.
struct Handled {
    message: ReceivedMessage,
    outcome: StoreResult<Disposition>,
}

/// Handlers running at once, as the embedded runtime's worker slots.
const WORKERS: usize = 64;
/// A received message stays hidden this long (longer than any attempt).
const VISIBILITY: Duration = Duration::from_secs(60);
/// How old an event whose fan-out failed is when the outbox poller takes it again.
const OUTBOX_REPLAY: chrono::Duration = chrono::Duration::seconds(2);
/// Steps a run may take at one instant before it is called a livelock.
const MAX_STEPS_AT_ONE_INSTANT: usize = 10_000;

/// The seed to run: `ENTREGA_SIM_SEED` if set (to replay a failure), else `default`.
pub fn seed_or(default: u64) -> u64 {
    env_or("ENTREGA_SIM_SEED", default)
}

/// The environment variable `name` read as a number (a run's size or seed), if set.
pub fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

/// The environment variable `name` read as a number, else `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    env_number(name).unwrap_or(default)
}

pub struct Sim {
    pub world: World,
    pub seed: u64,
    endpoints: Arc<Endpoints>,
    /// The handlers running now.
    running: FuturesUnordered<LocalBoxFuture<'static, Handled>>,
    faults: Faults,
    dice: Arc<Dice>,
    /// Endpoints that must never see an event twice.
    pub(super) at_most_once: HashSet<String>,
    /// Events whose fan-out failed midway, with when the outbox poller takes each
    /// again.
    unfanned: Vec<(Event, DateTime<Utc>)>,
    /// Crashes injected so far.
    pub crashes: usize,
    pub(super) published: Vec<Event>,
    next_event: u64,
    /// Ids are numbered, not random: the order of maps keyed by id, and so the
    /// order of work, must be the same in every run of a seed.
    next_id: std::sync::atomic::AtomicU64,
}

impl Sim {
    /// A fresh world whose randomness comes from `seed`, without faults.
    pub fn new(seed: u64) -> Self {
        Self::with_faults(seed, Faults::default())
    }

    /// A fresh world whose randomness, faults included, comes from `seed`.
    pub fn with_faults(seed: u64, faults: Faults) -> Self {
        let mut world = World::new(Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0).unwrap(), seed);
        let dice = Arc::new(Dice(Mutex::new(rand::rngs::StdRng::seed_from_u64(
            seed ^ 0x5eed_fa17,
        ))));
        let endpoints = Arc::new(Endpoints {
            clock: world.clock.clone(),
            behaviours: Mutex::default(),
            latencies: Mutex::default(),
            arrivals: Mutex::default(),
            timers: Arc::new(Timers::default()),
            faults,
            dice: dice.clone(),
            crashed: Default::default(),
        });
        world.services.transport = endpoints.clone();
        world.services.deliveries = Arc::new(Hooked(FaultyQueue {
            inner: world.deliveries.clone(),
            faults,
            dice: dice.clone(),
        }));
        Self {
            world,
            seed,
            endpoints,
            running: FuturesUnordered::new(),
            faults,
            dice,
            at_most_once: HashSet::new(),
            unfanned: Vec::new(),
            crashes: 0,
            published: Vec::new(),
            next_event: 0,
            next_id: std::sync::atomic::AtomicU64::new(1),
        }
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.world.clock.now()
    }

    /// The next numbered id with `prefix`.
    fn id<T: std::str::FromStr>(&self, prefix: &str) -> T
    where
        T::Err: std::fmt::Debug,
    {
        let n = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{prefix}{n:032x}").parse().unwrap()
    }

    pub async fn tenant(&self, name: &str) -> TenantId {
        self.world
            .add_tenant(self.id("ten_"), name, "owner@example.com")
            .await
            .unwrap()
    }

    /// An endpoint of `tenant` at `url`, set up by `configure`, answering as `behave`.
    pub async fn endpoint(
        &mut self,
        tenant: &TenantId,
        url: &str,
        configure: impl FnOnce(&mut Endpoint),
        behave: Behaviour,
    ) -> Endpoint {
        let mut endpoint = Endpoint::new(tenant.clone(), url, self.now());
        endpoint.id = self.id("ep_");
        configure(&mut endpoint);
        if endpoint.mode == DeliveryMode::AtMostOnce {
            self.at_most_once.insert(endpoint.url.clone());
        }
        self.world
            .services
            .store
            .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
            .await
            .unwrap();
        self.endpoints
            .behaviours
            .lock()
            .unwrap()
            .insert(url.to_owned(), behave);
        endpoint
    }

    /// From now on, the endpoint at `url` takes `latency` to answer (cut at the
    /// request's timeout).
    pub fn latency(&self, url: &str, latency: Duration) {
        self.endpoints
            .latencies
            .lock()
            .unwrap()
            .insert(url.to_owned(), latency);
    }

    /// Publish an event now and fan it out, as a producer's commit and the trigger.
    pub async fn publish(&mut self, tenant: &TenantId, event_type: &str) -> Event {
        self.next_event += 1;
        let event = Event {
            id: format!("sim-{}", self.next_event)
                .parse::<EventId>()
                .unwrap(),
            tenant_id: tenant.clone(),
            event_type: event_type.into(),
            payload: format!(r#"{{"n":{}}}"#, self.next_event),
            created_at: self.now(),
        };
        self.world.services.store.publish(&event).await.unwrap();
        self.published.push(event.clone());
        if fan_out(&self.world.services, &event).await.is_err() {
            self.unfanned
                .push((event.clone(), self.now() + OUTBOX_REPLAY));
        }
        event
    }

    /// Every request the endpoints received so far.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.endpoints.arrivals.lock().unwrap().clone()
    }

    /// Run the handlers on whatever is due, moving the clock forward from one due
    /// message to the next, until `until` (the clock ends there) or nothing is left.
    pub async fn run_until(&mut self, until: DateTime<Utc>) {
        let mut steps_now = 0;
        loop {
            let worked = self.step().await;
            if worked {
                steps_now += 1;
                assert!(
                    steps_now < MAX_STEPS_AT_ONE_INSTANT,
                    "seed {}: no progress in virtual time at {}",
                    self.seed,
                    self.now()
                );
                continue;
            }
            steps_now = 0;
            let replay_due = self.unfanned.iter().map(|(_, at)| *at).min();
            // Nothing could be done now: what is visible now waits for room (a key at
            // its cap), so the next thing is strictly later.
            let now = self.now();
            let next = [
                self.world.deliveries.next_visible_after(now),
                self.world.failures.next_visible_after(now),
                replay_due,
                self.endpoints.timers.next_at(),
            ]
            .into_iter()
            .flatten()
            .min();
            let target = match next {
                Some(at) if at <= until => at,
                _ => until,
            };
            if target > self.now() {
                self.world
                    .clock
                    .advance((target - self.now()).to_std().unwrap());
            }
            self.endpoints.timers.wake_due(self.now());
            if next.is_none_or(|at| at > until) {
                return;
            }
        }
    }

    /// Start handlers for what is receivable now, while there is room, and drive
    /// every running handler as far as it goes at this instant; whether anything
    /// happened.
    async fn step(&mut self) -> bool {
        let mut progressed = self.replay_fan_outs().await;
        let room = WORKERS.saturating_sub(self.running.len());
        if room > 0 {
            let received = self
                .world
                .deliveries
                .receive(room, VISIBILITY)
                .await
                .unwrap();
            for message in received {
                progressed = true;
                let services = self.world.services.clone();
                self.running.push(
                    async move {
                        let outcome =
                            handle_delivery(&services, &message.body, message.receive_count).await;
                        Handled { message, outcome }
                    }
                    .boxed_local(),
                );
            }
        }
        while let Some(Some(done)) = self.running.next().now_or_never() {
            progressed = true;
            if self.dice.roll(self.faults.crash_before_ack) {
                // Recorded, not settled: the message comes back after its timeout.
                self.crash();
                return true;
            }
            settle(
                &self.world.services,
                &self.world.deliveries,
                &done.message,
                done.outcome,
            )
            .await;
        }
        if self
            .endpoints
            .crashed
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            // The process died right after a send: every running handler with it;
            // their messages stay hidden until their visibility timeout.
            self.crash();
            return true;
        }
        let services = self.world.services.clone();
        let failures = self
            .world
            .failures
            .receive(WORKERS, VISIBILITY)
            .await
            .unwrap();
        for message in &failures {
            let outcome = handle_failure(&services, &message.body)
                .await
                .map(|_| Disposition::Done);
            settle(&services, &self.world.failures, message, outcome).await;
        }
        progressed || !failures.is_empty()
    }

    /// The process dies and restarts: what ran is dropped, nothing in memory
    /// survives (the endpoint slots its attempts held); the store and the queues do.
    fn crash(&mut self) {
        self.running = FuturesUnordered::new();
        self.endpoints.timers.clear();
        self.restart();
    }

    /// A restarted process: nothing in memory survives (the endpoint slots its
    /// attempts held), the store and the queues do.
    fn restart(&mut self) {
        self.crashes += 1;
        self.world.services.slots = Arc::new(InProcessSlots::default());
    }

    /// Fan out again the events whose fan-out failed, [`OUTBOX_REPLAY`] after each
    /// try (the outbox poller's pace); whether any was due.
    async fn replay_fan_outs(&mut self) -> bool {
        let now = self.now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unfanned)
            .into_iter()
            .partition(|(_, at)| *at <= now);
        self.unfanned = later;
        let any = !due.is_empty();
        for (event, _) in due {
            if fan_out(&self.world.services, &event).await.is_err() {
                self.unfanned.push((event, now + OUTBOX_REPLAY));
            }
        }
        any
    }
}

async fn settle(
    services: &entrega_core::ports::Services,
    queue: &dyn MessageQueue,
    message: &entrega_core::ports::ReceivedMessage,
    outcome: StoreResult<Disposition>,
) {
    Settlement::of(&outcome, message.receive_count, services.random.as_ref())
        .apply(queue, &message.receipt)
        .await;
}
