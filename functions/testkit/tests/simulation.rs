//! Scenarios of the deterministic simulation (`entrega_testkit::sim`): the real
//! handlers in virtual time, each run checked against the invariants.

use chrono::DateTime;
use entrega_core::delivery::DeliveryState;
use entrega_core::memory::response;
use entrega_testkit::sim::{seed_or, Sim};

const HOUR: chrono::Duration = chrono::Duration::hours(1);

/// One endpoint is down for six hours while 1 200 events are produced (one every
/// 18 s): all of them are delivered after it returns, within `standard`'s 31-hour
/// window, none lost, and every attempt is on record.
#[tokio::test]
async fn six_hour_outage_loses_nothing() {
    let mut sim = Sim::new(seed_or(1));
    let tenant = sim.tenant("Acme").await;
    let start = sim.now();
    let back: DateTime<_> = start + HOUR * 6;
    let url = "https://down-for-six-hours.example/hook";
    sim.endpoint(
        &tenant,
        url,
        |_| {},
        Box::new(move |now| response(if now < back { 503 } else { 200 })),
    )
    .await;

    const EVENTS: i64 = 1_200;
    for i in 0..EVENTS {
        sim.publish(&tenant, "lead.created").await;
        sim.run_until(start + chrono::Duration::seconds(18 * (i + 1)))
            .await;
    }
    sim.run_until(start + HOUR * 40).await;

    sim.check_invariants().await;
    let deliveries = sim.deliveries().await;
    assert_eq!(deliveries.len(), EVENTS as usize);
    let mut latest = chrono::Duration::zero();
    for d in &deliveries {
        assert_eq!(
            d.state,
            DeliveryState::Delivered,
            "seed {}: {}",
            sim.seed,
            d.id
        );
        let took = d.delivered_at.unwrap() - d.created_at;
        assert!(took <= HOUR * 31, "seed {}: {} took {took}", sim.seed, d.id);
        assert!(
            d.delivered_at.unwrap() >= back,
            "nothing arrives while it is down"
        );
        latest = latest.max(took);
    }
    let arrivals = sim.arrivals();
    let failed = arrivals.iter().filter(|a| a.at < back).count();
    println!(
        "six-hour outage, seed {}: {} requests ({failed} while down), slowest delivery {} min",
        sim.seed,
        arrivals.len(),
        latest.num_minutes()
    );
}

/// The same seed gives the same run, request for request; another seed another run.
#[tokio::test]
async fn a_seed_replays_its_run() {
    async fn run(seed: u64) -> Vec<(String, String, i64)> {
        let mut sim = Sim::new(seed);
        let tenant = sim.tenant("Acme").await;
        let start = sim.now();
        let flaky = start + HOUR;
        sim.endpoint(
            &tenant,
            "https://flaky.example/",
            |_| {},
            Box::new(move |now| response(if now < flaky { 500 } else { 204 })),
        )
        .await;
        for _ in 0..50 {
            sim.publish(&tenant, "a.b").await;
        }
        sim.run_until(start + HOUR * 10).await;
        sim.check_invariants().await;
        sim.arrivals()
            .into_iter()
            .map(|a| (a.url, a.webhook_id, a.at.timestamp_micros()))
            .collect()
    }
    let first = run(42).await;
    assert!(first.len() > 50, "retries happened");
    assert_eq!(first, run(42).await);
    assert_ne!(first, run(43).await);
}
