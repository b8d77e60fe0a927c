//! A deterministic simulation: the real handlers (fan-out, worker, failure handler)
//! on the in-memory world, in virtual time, against scripted endpoints. One seed
//! fixes every random draw (jitter, nonces), and the run is single-threaded, so a
//! seed replays its run exactly: a failing run names its seed, and
//! `ENTREGA_SIM_SEED=<seed>` runs that one again.
//!
//! After a run, [`Sim::check_invariants`] checks what must hold whatever happened:
//! every committed event reached each subscribed endpoint or has a failure record,
//! nothing arrived that was not committed, no retry came before its schedule, and the
//! delivery log accounts for every request an endpoint saw.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use entrega_core::delivery::{Delivery, DeliveryState};
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::handlers::failures::handle_failure;
use entrega_core::handlers::fanout::fan_out;
use entrega_core::handlers::worker::{handle_delivery, policy_of, Disposition};
use entrega_core::ids::{EventId, TenantId};
use entrega_core::memory::{response, World};
use entrega_core::outcome::TransportResult;
use entrega_core::ports::{
    Clock, ManualClock, MessageQueue, SignedRequest, StoreResult, Transport,
};
use entrega_core::tenant::Tenant;
use entrega_runtime::Settlement;

/// How an endpoint answers a request (by its `webhook-id`) at a moment of virtual time.
pub type Behaviour = Box<dyn Fn(DateTime<Utc>, &str) -> TransportResult + Send + Sync>;

/// Messages taken per receive, as a runtime's batch.
const BATCH: usize = 64;
/// A received message stays hidden this long (longer than any attempt).
const VISIBILITY: Duration = Duration::from_secs(60);
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

/// The endpoints' side: answers by URL and time, and remembers every request.
struct Endpoints {
    clock: Arc<ManualClock>,
    behaviours: Mutex<HashMap<String, Behaviour>>,
    arrivals: Mutex<Vec<Arrival>>,
}

#[async_trait]
impl Transport for Endpoints {
    async fn send(&self, request: &SignedRequest) -> TransportResult {
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
    published: Vec<Event>,
    next_event: u64,
    /// Ids are numbered, not random: the order of maps keyed by id, and so the
    /// order of work, must be the same in every run of a seed.
    next_id: std::sync::atomic::AtomicU64,
}

impl Sim {
    /// A fresh world whose randomness comes from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut world = World::new(Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0).unwrap(), seed);
        let endpoints = Arc::new(Endpoints {
            clock: world.clock.clone(),
            behaviours: Mutex::default(),
            arrivals: Mutex::default(),
        });
        world.services.transport = endpoints.clone();
        Self {
            world,
            seed,
            endpoints,
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
        &self,
        tenant: &TenantId,
        url: &str,
        configure: impl FnOnce(&mut Endpoint),
        behave: Behaviour,
    ) -> Endpoint {
        let mut endpoint = Endpoint::new(tenant.clone(), url, self.now());
        endpoint.id = self.id("ep_");
        configure(&mut endpoint);
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
        fan_out(&self.world.services, &event).await.unwrap();
        self.published.push(event.clone());
        event
    }

    /// Every request the endpoints received so far.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.endpoints.arrivals.lock().unwrap().clone()
    }

    /// Run the handlers on whatever is due, moving the clock forward from one due
    /// message to the next, until `until` (the clock ends there) or nothing is left.
    pub async fn run_until(&self, until: DateTime<Utc>) {
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
            let next = [
                self.world.deliveries.next_visible_at(),
                self.world.failures.next_visible_at(),
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
    async fn step(&self) -> bool {
        let services = &self.world.services;
        let deliveries = self
            .world
            .deliveries
            .receive(BATCH, VISIBILITY)
            .await
            .unwrap();
        for message in &deliveries {
            let outcome = handle_delivery(services, &message.body, message.receive_count).await;
            settle(services, &self.world.deliveries, message, outcome).await;
        }
        let failures = self
            .world
            .failures
            .receive(BATCH, VISIBILITY)
            .await
            .unwrap();
        for message in &failures {
            let outcome = handle_failure(services, &message.body)
                .await
                .map(|_| Disposition::Done);
            settle(services, &self.world.failures, message, outcome).await;
        }
        !deliveries.is_empty() || !failures.is_empty()
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
        let mut attempts_in_log = 0;
        for delivery in self.deliveries().await {
            let attempts = store.list_attempts(&delivery.id).await.unwrap();
            attempts_in_log += attempts
                .iter()
                .filter(|a| a.failure_kind != Some(entrega_core::outcome::FailureKind::Interrupted))
                .count();
            match delivery.state {
                DeliveryState::Delivered => {}
                state if state.is_terminal() => {
                    let failures = store.failures_of_delivery(&delivery.id).await.unwrap();
                    assert!(
                        !failures.is_empty(),
                        "seed {seed}: {} ended {state:?} without a failure record",
                        delivery.id
                    );
                }
                state => panic!("seed {seed}: {} still {state:?} after the run", delivery.id),
            }
            let Some(endpoint) = store.get_endpoint(&delivery.endpoint_id).await.unwrap() else {
                continue;
            };
            let policy = policy_of(&endpoint);
            for pair in attempts.windows(2) {
                let (before, after) = (&pair[0], &pair[1]);
                if before.generation != after.generation {
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
        assert_eq!(
            attempts_in_log,
            arrivals.len(),
            "seed {seed}: the delivery log must account for every request the endpoints saw"
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
