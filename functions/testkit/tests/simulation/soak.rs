//! The soak scenario: every kind of receiver, with faults and crashes.

use entrega_testkit::sim::scenarios::soak;

/// Soak: events over 20 endpoints of 4 tenants with every kind of receiver (healthy,
/// flapping, down for hours, always failing, rate-limiting with `Retry-After`,
/// rejecting, gone, at-most-once), while the process crashes after sends and before
/// acknowledgements, queue sends fail and messages are duplicated. The invariants hold
/// after every run. `ENTREGA_SIM_EVENTS` sets the count (default 4 000; the issue's
/// figure is 100 000); `ENTREGA_SIM_SEED` runs one seed instead of the kept ones.
#[tokio::test]
async fn soak_with_faults_and_crashes_keeps_every_invariant() {
    let events: i64 = std::env::var("ENTREGA_SIM_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4_000);
    // Seed 10 is kept: it found a delivery orphaned by a replayed fan-out (a bug of the
    // simulation's outbox replay, fixed) and must keep passing.
    let seeds = match std::env::var("ENTREGA_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => vec![7, 10],
    };
    for seed in seeds {
        let run = soak(seed, events).await;
        println!("{run}");
        assert!(run.crashes > 0, "the run injected crashes: {run}");
    }
}
