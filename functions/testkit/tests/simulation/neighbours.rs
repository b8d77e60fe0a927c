//! Tenants beside a slow one: a receiver cut at its timeout (scenario 2) and a noisy
//! neighbour's backlog (scenario 6) must not change another tenant's latency.

use entrega_testkit::sim::scenarios::{beside_a_slow_tenant, p99};
use entrega_testkit::sim::{env_or, seed_or};

/// Scenario 2: a receiver that answers in 8 s, its endpoint's timeout 5 s: every
/// attempt is cut at the timeout, and the other tenant's latency is what it is alone.
#[tokio::test]
async fn a_slow_receiver_is_cut_at_its_timeout_and_others_keep_their_latency() {
    use entrega_core::outcome::FailureKind;

    let seed = seed_or(2);
    let (alone, _, _) = beside_a_slow_tenant(seed, 0, std::time::Duration::ZERO, 10_000).await;
    let (beside, sim, slow) =
        beside_a_slow_tenant(seed, 300, std::time::Duration::from_secs(8), 5_000).await;
    println!(
        "slow receiver, seed {seed}: B p99 {} ms alone, {} ms beside 300 events to an 8 s receiver",
        p99(&alone),
        p99(&beside)
    );
    assert!(p99(&alone) >= 20, "a delivery takes the receiver's 20 ms");
    assert!(p99(&beside) as f64 <= 1.5 * p99(&alone) as f64);
    let mut cut = 0;
    for d in sim.deliveries().await {
        for a in sim.world.services.store.list_attempts(&d.id).await.unwrap() {
            if a.endpoint_id == slow {
                // Cut at the 5 s timeout, never later.
                assert_eq!(a.failure_kind, Some(FailureKind::Timeout), "{a:?}");
                assert_eq!(a.duration_ms, 5_000, "{a:?}");
                cut += 1;
            }
        }
    }
    assert!(
        cut >= 300,
        "every attempt at the slow receiver was cut ({cut})"
    );
}

/// Scenario 6: tenant A has a backlog behind a receiver that takes 2 s; tenant B's
/// latency beside it ÷ its latency alone (goal ≤ 1.5×). `ENTREGA_SIM_BACKLOG` sets
/// A's backlog (default the 50 000: a receive looks only at the head of each
/// endpoint's lane, so the full size takes seconds).
#[tokio::test]
async fn a_noisy_neighbour_does_not_slow_another_tenant() {
    let backlog: usize = env_or("ENTREGA_SIM_BACKLOG", 50_000);
    let seed = seed_or(6);
    let (alone, _, _) = beside_a_slow_tenant(seed, 0, std::time::Duration::ZERO, 10_000).await;
    let (beside, _, _) =
        beside_a_slow_tenant(seed, backlog, std::time::Duration::from_secs(2), 10_000).await;
    assert!(p99(&alone) >= 20, "a delivery takes the receiver's 20 ms");
    let ratio = p99(&beside) as f64 / p99(&alone) as f64;
    println!(
        "noisy neighbour, seed {seed}: B p99 {} ms alone, {} ms beside A's {backlog}-event backlog: {ratio:.2}×",
        p99(&alone),
        p99(&beside)
    );
    assert!(ratio <= 1.5, "B's p99 grew {ratio:.2}× beside A's backlog");
}
