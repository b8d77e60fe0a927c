//! The soak scenario: every kind of receiver, with faults and crashes.

use entrega_core::memory::response;
use entrega_testkit::sim::{seed_or, Sim};

use super::HOUR;

/// Soak: events over 20 endpoints of 4 tenants with every kind of receiver (healthy,
/// flapping, down for hours, always failing, rate-limiting with `Retry-After`,
/// rejecting, gone, at-most-once), while the process crashes after sends and before
/// acknowledgements, queue sends fail and messages are duplicated. The invariants hold
/// after every run. `ENTREGA_SIM_EVENTS` sets the count (default 4 000; the issue's
/// figure is 100 000).
#[tokio::test]
async fn soak_with_faults_and_crashes_keeps_every_invariant() {
    use entrega_core::endpoint::DeliveryMode;
    use entrega_core::outcome::{FailureKind, TransportResult};
    use entrega_testkit::sim::Faults;

    let events: i64 = std::env::var("ENTREGA_SIM_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4_000);
    let seed = seed_or(7);
    let mut sim = Sim::with_faults(
        seed,
        Faults {
            crash_after_send: 0.002,
            crash_before_ack: 0.002,
            send_failure: 0.01,
            duplicate: 0.01,
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
        let behave: entrega_testkit::sim::Behaviour = match e % 8 {
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
    let secs = clock.elapsed().as_secs_f64();
    println!(
        "soak, seed {seed}: {events} events, {} requests, {} crashes, {:.0} simulated events/s",
        sim.arrivals().len(),
        sim.crashes,
        events as f64 / secs
    );
    assert!(sim.crashes > 0, "the run injected crashes");
}
