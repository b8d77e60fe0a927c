//! Faults: the soak scenario (every kind of receiver, with faults and crashes), and
//! queue messages duplicated and reordered on their own.

use entrega_core::endpoint::DeliveryMode;
use entrega_core::memory::response;
use entrega_testkit::sim::scenarios::soak;
use entrega_testkit::sim::{env_number, env_or, seed_or, Faults, Sim};

/// Soak: events over 20 endpoints of 4 tenants with every kind of receiver (healthy,
/// flapping, down for hours, always failing, rate-limiting with `Retry-After`,
/// rejecting, gone, at-most-once), while the process crashes after sends and before
/// acknowledgements, queue sends fail, and messages are duplicated and held back to be
/// overtaken. The invariants hold
/// after every run. `ENTREGA_SIM_EVENTS` sets the count (default 4 000; the issue's
/// figure is 100 000); `ENTREGA_SIM_SEED` runs one seed instead of the kept ones.
#[tokio::test]
async fn soak_with_faults_and_crashes_keeps_every_invariant() {
    let events: i64 = env_or("ENTREGA_SIM_EVENTS", 4_000);
    // Seed 10 is kept: it found a delivery orphaned by a replayed fan-out (a bug of the
    // simulation's outbox replay, fixed) and must keep passing.
    let seeds = match env_number("ENTREGA_SIM_SEED") {
        Some(seed) => vec![seed],
        None => vec![7, 10],
    };
    for seed in seeds {
        let run = soak(seed, events).await;
        println!("{run}");
        assert!(run.crashes > 0, "the run injected crashes: {run}");
    }
}

/// Every message may be duplicated and held back so that later ones overtake it: the
/// at-most-once endpoint and the at-least-once one each still receive every event
/// exactly once (a late or second copy finds its delivery settled), though not in the
/// order the events were published.
#[tokio::test]
async fn reordered_and_duplicated_messages_reach_each_endpoint_once() {
    let mut sim = Sim::with_faults(
        seed_or(3),
        Faults {
            duplicate: 0.3,
            reorder: 0.5,
            ..Faults::default()
        },
    );
    let tenant = sim.tenant("Acme").await;
    let start = sim.now();
    let urls = [
        "https://at-most-once.example/",
        "https://at-least-once.example/",
    ];
    sim.endpoint(
        &tenant,
        urls[0],
        |ep| ep.mode = DeliveryMode::AtMostOnce,
        Box::new(|_, _| response(200)),
    )
    .await;
    sim.endpoint(&tenant, urls[1], |_| {}, Box::new(|_, _| response(200)))
        .await;

    let mut published = Vec::new();
    for i in 0..200 {
        published.push(sim.publish(&tenant, "lead.created").await.id.to_string());
        sim.run_until(start + chrono::Duration::seconds(i + 1))
            .await;
    }
    sim.run_until(start + chrono::Duration::hours(1)).await;

    sim.check_invariants().await;
    let mut every_event = published.clone();
    every_event.sort();
    for url in urls {
        let received: Vec<String> = sim
            .arrivals()
            .into_iter()
            .filter(|a| a.url == url)
            .map(|a| a.webhook_id)
            .collect();
        let mut once_each = received.clone();
        once_each.sort();
        assert_eq!(
            once_each, every_event,
            "seed {}: {url} receives every event exactly once",
            sim.seed
        );
        assert_ne!(
            received, published,
            "seed {}: held-back messages were overtaken at {url}",
            sim.seed
        );
    }
}
