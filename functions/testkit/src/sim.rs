//! A deterministic simulation: the real handlers (fan-out, worker, failure handler)
//! on the in-memory world, in virtual time, against scripted endpoints. One seed
//! fixes every random draw (jitter, nonces), and the run is single-threaded, so a
//! seed replays its run exactly: a failing run names its seed, and
//! `ENTREGA_SIM_SEED=<seed>` runs that one again.
//!
//! [`Faults`] inject, by the same seed: a crash right after a request was sent (the
//! outcome never recorded; the process restarts), a crash after the outcome was
//! recorded but before the message was settled, a failing queue send (a fan-out that
//! dies midway is replayed, as the outbox poller does), and duplicated messages.
//!
//! After a run, [`Sim::check_invariants`] checks what must hold whatever happened:
//! every committed event reached each subscribed endpoint or has a failure record,
//! nothing arrived that was not committed, an at-most-once endpoint never saw an
//! event twice, no retry came before its schedule, and the delivery log accounts for
//! every request an endpoint saw.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use entrega_core::delivery::{Delivery, DeliveryState};
use entrega_core::endpoint::DeliveryMode;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::handlers::failures::handle_failure;
use entrega_core::handlers::fanout::fan_out;
use entrega_core::handlers::worker::{handle_delivery, policy_of, Disposition};
use entrega_core::ids::{EventId, TenantId};
use entrega_core::memory::{response, World};
use entrega_core::outcome::TransportResult;
use entrega_core::ports::{
    Clock, DelayLimits, ManualClock, MessageQueue, OutgoingMessage, ReceivedMessage, SignedRequest,
    StoreError, StoreResult, Transport,
};
use entrega_core::slots::InProcessSlots;
use entrega_core::tenant::Tenant;
use entrega_runtime::Settlement;
use futures_util::FutureExt;
use rand::{Rng, SeedableRng};

/// How an endpoint answers a request (by its `webhook-id`) at a moment of virtual time.
pub type Behaviour = Box<dyn Fn(DateTime<Utc>, &str) -> TransportResult + Send + Sync>;

/// Messages taken per receive, as a runtime's batch.
const BATCH: usize = 64;
/// A received message stays hidden this long (longer than any attempt).
const VISIBILITY: Duration = Duration::from_secs(60);
/// How old an event whose fan-out failed is when the outbox poller takes it again.
const OUTBOX_REPLAY: chrono::Duration = chrono::Duration::seconds(2);
/// Steps a run may take at one instant before it is called a livelock.
const MAX_STEPS_AT_ONE_INSTANT: usize = 10_000;

/// One request an endpoint received.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub url: String,
    pub webhook_id: String,
    pub at: DateTime<Utc>,
    pub answer: TransportResult,
}

/// How often each fault strikes (each a probability per chance).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Per request sent: the process dies before it learns the outcome.
    pub crash_after_send: f64,
    /// Per handled message: the process dies after recording, before settling.
    pub crash_before_ack: f64,
    /// Per queue send: it fails (a backend error; a fan-out dies midway).
    pub send_failure: f64,
    /// Per message sent: it is delivered twice.
    pub duplicate: f64,
}

/// The fault dice, seeded apart from the handlers' randomness.
struct Dice(Mutex<rand::rngs::StdRng>);

impl Dice {
    fn roll(&self, p: f64) -> bool {
        p > 0.0 && self.0.lock().unwrap().gen_bool(p.min(1.0))
    }
}

/// The endpoints' side: answers by URL and time, and remembers every request.
struct Endpoints {
    clock: Arc<ManualClock>,
    behaviours: Mutex<HashMap<String, Behaviour>>,
    arrivals: Mutex<Vec<Arrival>>,
    faults: Faults,
    dice: Arc<Dice>,
    /// Set when a crash after a send took the process down.
    crashed: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Transport for Endpoints {
    async fn send(&self, request: &SignedRequest) -> TransportResult {
        let answer = self.answer(request);
        if self.dice.roll(self.faults.crash_after_send) {
            self.crashed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            // The request was sent; the process dies before the answer is read.
            return std::future::pending().await;
        }
        answer
    }
}

impl Endpoints {
    fn answer(&self, request: &SignedRequest) -> TransportResult {
        let now = self.clock.now();
        let webhook_id = request
            .headers
            .iter()
            .find(|(name, _)| name == "webhook-id")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let answer = match self.behaviours.lock().unwrap().get(&request.url) {
            Some(behave) => behave(now, &webhook_id),
            None => response(200),
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

/// The delivery queue as the handlers see it: sends may fail or be duplicated.
struct FaultyQueue {
    inner: entrega_core::memory::MemoryQueue,
    faults: Faults,
    dice: Arc<Dice>,
}

#[async_trait]
impl MessageQueue for FaultyQueue {
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
        self.inner.send(sent).await
    }

    async fn receive(&self, max: usize, visibility: Duration) -> StoreResult<Vec<ReceivedMessage>> {
        self.inner.receive(max, visibility).await
    }

    async fn change_visibility(&self, receipt: &str, delay: Duration) -> StoreResult<()> {
        self.inner.change_visibility(receipt, delay).await
    }

    async fn delete(&self, receipt: &str) -> StoreResult<()> {
        self.inner.delete(receipt).await
    }

    fn delay_limits(&self) -> DelayLimits {
        self.inner.delay_limits()
    }
}

/// The seed to run: `ENTREGA_SIM_SEED` if set (to replay a failure), else `default`.
pub fn seed_or(default: u64) -> u64 {
    std::env::var("ENTREGA_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

pub struct Sim {
    pub world: World,
    pub seed: u64,
    endpoints: Arc<Endpoints>,
    faults: Faults,
    dice: Arc<Dice>,
    /// Endpoints that must never see an event twice.
    at_most_once: HashSet<String>,
    /// Events whose fan-out failed midway, with when the outbox poller takes each
    /// again.
    unfanned: Vec<(Event, DateTime<Utc>)>,
    /// Crashes injected so far.
    pub crashes: usize,
    published: Vec<Event>,
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
            arrivals: Mutex::default(),
            faults,
            dice: dice.clone(),
            crashed: Default::default(),
        });
        world.services.transport = endpoints.clone();
        world.services.deliveries = Arc::new(FaultyQueue {
            inner: world.deliveries.clone(),
            faults,
            dice: dice.clone(),
        });
        Self {
            world,
            seed,
            endpoints,
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
        let tenant = Tenant {
            id: self.id("ten_"),
            name: name.into(),
            owner_email: "owner@example.com".into(),
            created_at: self.now(),
        };
        self.world
            .services
            .store
            .create_tenant(&tenant, &format!("key-{}", tenant.id))
            .await
            .unwrap();
        tenant.id
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
            .create_endpoint(&endpoint)
            .await
            .unwrap();
        self.endpoints
            .behaviours
            .lock()
            .unwrap()
            .insert(url.to_owned(), behave);
        endpoint
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
            let next = [
                self.world.deliveries.next_visible_at(),
                self.world.failures.next_visible_at(),
                replay_due,
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
            if next.is_none_or(|at| at > until) {
                return;
            }
        }
    }

    /// Handle what is receivable now; whether there was any.
    async fn step(&mut self) -> bool {
        let replayed = self.replay_fan_outs().await;
        let services = self.world.services.clone();
        let deliveries = self
            .world
            .deliveries
            .receive(BATCH, VISIBILITY)
            .await
            .unwrap();
        for message in &deliveries {
            let handled =
                handle_delivery(&services, &message.body, message.receive_count).now_or_never();
            let Some(outcome) = handled else {
                // The process died right after sending: what it held is gone, and the
                // rest of this batch stays hidden until its visibility timeout.
                assert!(
                    self.endpoints
                        .crashed
                        .swap(false, std::sync::atomic::Ordering::Relaxed),
                    "seed {}: a handler did not finish in one poll without a crash",
                    self.seed
                );
                self.restart();
                return true;
            };
            if self.dice.roll(self.faults.crash_before_ack) {
                // Recorded, not settled: the message comes back after its timeout.
                self.restart();
                return true;
            }
            settle(&services, &self.world.deliveries, message, outcome).await;
        }
        let failures = self
            .world
            .failures
            .receive(BATCH, VISIBILITY)
            .await
            .unwrap();
        for message in &failures {
            let outcome = handle_failure(&services, &message.body)
                .await
                .map(|_| Disposition::Done);
            settle(&services, &self.world.failures, message, outcome).await;
        }
        replayed || !deliveries.is_empty() || !failures.is_empty()
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

    /// Every delivery of every published event.
    pub async fn deliveries(&self) -> Vec<Delivery> {
        let mut all = Vec::new();
        for event in &self.published {
            all.extend(
                self.world
                    .services
                    .store
                    .deliveries_of_event(&event.tenant_id, &event.id)
                    .await
                    .unwrap(),
            );
        }
        all
    }

    /// What must hold after any run; panics naming the seed.
    pub async fn check_invariants(&self) {
        let seed = self.seed;
        let store = &self.world.services.store;
        let committed: HashSet<String> = self.published.iter().map(|e| e.id.to_string()).collect();
        let arrivals = self.arrivals();
        for a in &arrivals {
            assert!(
                committed.contains(&a.webhook_id),
                "seed {seed}: {} received {} that nobody published",
                a.url,
                a.webhook_id
            );
        }
        let mut seen_twice = HashMap::<(&str, &str), usize>::new();
        for a in arrivals
            .iter()
            .filter(|a| self.at_most_once.contains(&a.url))
        {
            *seen_twice.entry((&a.url, &a.webhook_id)).or_default() += 1;
        }
        for ((url, id), times) in seen_twice {
            assert!(
                times <= 1,
                "seed {seed}: at-most-once {url} received {id} {times} times"
            );
        }
        let (mut completed, mut interrupted) = (0, 0);
        for delivery in self.deliveries().await {
            let attempts = store.list_attempts(&delivery.id).await.unwrap();
            for a in &attempts {
                match a.failure_kind {
                    Some(entrega_core::outcome::FailureKind::Interrupted) => interrupted += 1,
                    _ => completed += 1,
                }
            }
            let endpoint = store.get_endpoint(&delivery.endpoint_id).await.unwrap();
            match delivery.state {
                DeliveryState::Delivered => {}
                // Waiting for a human to re-enable its endpoint.
                DeliveryState::Paused if endpoint.as_ref().is_some_and(|e| e.disabled) => {}
                state if state.is_terminal() => {
                    let failures = store.failures_of_delivery(&delivery.id).await.unwrap();
                    assert!(
                        !failures.is_empty(),
                        "seed {seed}: {} ended {state:?} without a failure record",
                        delivery.id
                    );
                }
                state => {
                    let queued = self
                        .world
                        .deliveries
                        .bodies()
                        .into_iter()
                        .filter(|b| b.contains(delivery.id.as_str()))
                        .count();
                    panic!(
                        "seed {seed}: {} still {state:?} after the run ({queued} messages for it queued)\n{delivery:?}\n{attempts:#?}",
                        delivery.id
                    )
                }
            }
            let Some(endpoint) = endpoint else {
                continue;
            };
            let policy = policy_of(&endpoint);
            for pair in attempts.windows(2) {
                let (before, after) = (&pair[0], &pair[1]);
                // A new generation starts at once (a resend), and an attempt whose
                // outcome a crash lost is sent again as soon as that is known.
                let interrupted =
                    before.failure_kind == Some(entrega_core::outcome::FailureKind::Interrupted);
                if before.generation != after.generation || interrupted {
                    continue;
                }
                let scheduled = policy.delays()[before.number as usize - 1];
                let earliest = scheduled.mul_f64(1.0 - policy.jitter());
                let waited = (after.started_at - before.started_at)
                    .to_std()
                    .unwrap_or_default();
                assert!(
                    waited + Duration::from_millis(1) >= earliest,
                    "seed {seed}: attempt {} of {} came after {waited:?}, before its schedule ({earliest:?})",
                    after.number,
                    delivery.id
                );
            }
        }
        // Every request an endpoint saw is in the log: with its outcome, or as an
        // interrupted attempt when the process died before reading the answer (a
        // crash before the send is also logged as interrupted, hence the range).
        assert!(
            completed <= arrivals.len() && arrivals.len() <= completed + interrupted,
            "seed {seed}: {} requests seen, {completed} attempts logged with an outcome and {interrupted} interrupted",
            arrivals.len()
        );
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
