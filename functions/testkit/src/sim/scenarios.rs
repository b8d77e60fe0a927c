//! The scenarios whose figures matter beyond pass or fail (the thundering herd, a
//! tenant beside a slow one, the soak), as functions the tests assert on and the
//! `simulation_figures` example prints.

use std::fmt;
use std::time::Duration;

use entrega_core::ids::EndpointId;
use entrega_core::memory::response;

use super::Sim;

const HOUR: chrono::Duration = chrono::Duration::hours(1);

/// Retries arriving after an endpoint's recovery.
#[derive(Debug, Clone, Copy)]
pub struct Herd {
    pub seed: u64,
    /// Requests at or after the recovery.
    pub after_recovery: usize,
    /// Seconds from the first to the last of them.
    pub span_s: i64,
    /// Arrivals in the busiest 10-second bin.
    pub peak: f64,
    /// Mean arrivals per 10-second bin that had any.
    pub mean: f64,
}

impl fmt::Display for Herd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "thundering herd, seed {}: {} retries over {} s after the recovery; peak {} per 10 s, mean {:.1}: {:.2}x the mean",
            self.seed,
            self.after_recovery,
            self.span_s,
            self.peak,
            self.mean,
            self.peak / self.mean
        )
    }
}

/// Scenario 5: 1 000 events fail together when their endpoint goes down for 10
/// minutes; how their retries reach it when it returns. The run is checked against
/// the invariants.
pub async fn thundering_herd(seed: u64) -> Herd {
    let mut sim = Sim::new(seed);
    let tenant = sim.tenant("Acme").await;
    let start = sim.now();
    let back = start + chrono::Duration::minutes(10);
    sim.endpoint(
        &tenant,
        "https://herd.example/",
        |_| {},
        Box::new(move |now, _| response(if now < back { 503 } else { 200 })),
    )
    .await;
    for _ in 0..1_000 {
        sim.publish(&tenant, "lead.created").await;
    }
    sim.run_until(start + HOUR * 2).await;
    sim.check_invariants().await;

    let after: Vec<i64> = sim
        .arrivals()
        .iter()
        .filter(|a| a.at >= back)
        .map(|a| (a.at - back).num_seconds())
        .collect();
    let (first, last) = (
        after.iter().copied().min().unwrap_or(0),
        after.iter().copied().max().unwrap_or(0),
    );
    const BIN: i64 = 10;
    let mut counts = vec![0usize; ((last - first) / BIN + 1) as usize];
    for t in &after {
        counts[((t - first) / BIN) as usize] += 1;
    }
    // The mean over the bins in which retries arrived: a few events whose earlier
    // retry happened to fall just after the recovery form a small early group, and
    // the quiet minutes between it and the main wave are no part of the herd.
    let busy = counts.iter().filter(|c| **c > 0).count().max(1);
    Herd {
        seed,
        after_recovery: after.len(),
        span_s: last - first,
        peak: counts.iter().copied().max().unwrap_or(0) as f64,
        mean: after.len() as f64 / busy as f64,
    }
}

/// Publish→delivered latency (ms) of each of `events`: until its delivery was
/// recorded delivered (the receiver's answer included).
pub async fn latencies_ms(sim: &Sim, events: &[entrega_core::event::Event]) -> Vec<i64> {
    let mut all = Vec::new();
    for e in events {
        let store = &sim.world.services.store;
        let deliveries = store.deliveries_of_event(e).await.unwrap();
        let delivered = deliveries[0].delivered_at.expect("every event delivered");
        all.push((delivered - e.created_at).num_milliseconds());
    }
    all.sort_unstable();
    all
}

pub fn p99(sorted: &[i64]) -> i64 {
    sorted[(sorted.len() - 1) * 99 / 100]
}

/// Tenant B publishes an event every 5 s to a receiver answering in 20 ms, alone or
/// beside tenant A's `backlog` events queued behind a receiver that takes `slow`
/// (A's endpoint capped at 8 at once, its timeout `timeout_ms`). B's latencies (ms),
/// and the simulation after the run (checked against the invariants).
pub async fn beside_a_slow_tenant(
    seed: u64,
    backlog: usize,
    slow: Duration,
    timeout_ms: u32,
) -> (Vec<i64>, Sim, EndpointId) {
    let mut sim = Sim::new(seed);
    let (a, b) = (sim.tenant("A").await, sim.tenant("B").await);
    let start = sim.now();
    let slow_url = "https://slow.example/";
    let slow_endpoint = sim
        .endpoint(
            &a,
            slow_url,
            |e| {
                e.max_concurrency = 8;
                e.timeout_ms = timeout_ms;
            },
            Box::new(|_, _| response(200)),
        )
        .await;
    sim.latency(slow_url, slow);
    let fast_url = "https://fast.example/";
    sim.endpoint(&b, fast_url, |_| {}, Box::new(|_, _| response(200)))
        .await;
    sim.latency(fast_url, Duration::from_millis(20));
    for _ in 0..backlog {
        sim.publish(&a, "bulk.import").await;
    }
    let mut mine = Vec::new();
    for i in 0..100 {
        mine.push(sim.publish(&b, "lead.created").await);
        sim.run_until(start + chrono::Duration::seconds(5 * (i + 1)))
            .await;
    }
    sim.run_until(start + HOUR * 40).await;
    sim.check_invariants().await;
    (latencies_ms(&sim, &mine).await, sim, slow_endpoint.id)
}

/// What a soak run did.
#[derive(Debug, Clone, Copy)]
pub struct Soak {
    pub seed: u64,
    pub events: i64,
    pub requests: usize,
    pub crashes: usize,
    /// Simulated events per second of real time.
    pub per_second: f64,
}

impl fmt::Display for Soak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "soak, seed {}: {} events, {} requests, {} crashes, {:.0} simulated events/s",
            self.seed, self.events, self.requests, self.crashes, self.per_second
        )
    }
}

/// Scenario 7: `events` over 20 endpoints of 4 tenants with every kind of receiver,
/// with faults and crashes; the run is checked against the invariants.
pub async fn soak(seed: u64, events: i64) -> Soak {
    use super::Faults;
    use entrega_core::endpoint::DeliveryMode;
    use entrega_core::outcome::{FailureKind, TransportResult};

    let mut sim = Sim::with_faults(
        seed,
        Faults {
            crash_before_send: 0.001,
            crash_after_send: 0.002,
            crash_before_ack: 0.002,
            send_failure: 0.01,
            duplicate: 0.01,
            reorder: 0.05,
        },
    );
    let start = sim.now();
    let mut tenants = Vec::new();
    for t in 0..4 {
        tenants.push(sim.tenant(&format!("Tenant {t}")).await);
    }
    for e in 0..20usize {
        let tenant = &tenants[e % 4];
        let url = format!("https://receiver-{e}.example/");
        let behave: super::Behaviour = match e % 8 {
            0 | 1 => Box::new(|_, _| response(200)),
            2 => Box::new(move |now, _| {
                response(if (now - start).num_minutes() % 7 < 3 {
                    502
                } else {
                    204
                })
            }),
            3 => Box::new(move |now, _| response(if now < start + HOUR * 5 { 503 } else { 200 })),
            4 => Box::new(|_, _| response(500)),
            5 => Box::new(|_, id: &str| {
                if id.len().is_multiple_of(2) {
                    TransportResult::Response {
                        status: 429,
                        retry_after: Some("90".into()),
                        excerpt: String::new(),
                    }
                } else {
                    TransportResult::Failed {
                        kind: FailureKind::Timeout,
                        message: "slow".into(),
                    }
                }
            }),
            6 => Box::new(move |now, _| response(if now < start + HOUR * 12 { 400 } else { 410 })),
            _ => Box::new(move |now, _| {
                response(if (now - start).num_minutes() % 11 < 2 {
                    503
                } else {
                    200
                })
            }),
        };
        let at_most_once = e % 5 == 4;
        sim.endpoint(
            tenant,
            &url,
            |ep| {
                if at_most_once {
                    ep.mode = DeliveryMode::AtMostOnce;
                }
            },
            behave,
        )
        .await;
    }
    let clock = std::time::Instant::now();
    let spread = chrono::Duration::hours(24).num_milliseconds() / events;
    for n in 0..events {
        let tenant = tenants[(n % 4) as usize].clone();
        sim.publish(&tenant, "lead.created").await;
        sim.run_until(start + chrono::Duration::milliseconds(spread * (n + 1)))
            .await;
    }
    // Past the last event's whole `standard` schedule: 31.4 hours of delays, up to
    // 20 % longer each with jitter (37.7 h), after 24 hours of publishing.
    sim.run_until(start + HOUR * 64).await;
    sim.check_invariants().await;
    Soak {
        seed,
        events,
        requests: sim.arrivals().len(),
        crashes: sim.crashes,
        per_second: events as f64 / clock.elapsed().as_secs_f64(),
    }
}
