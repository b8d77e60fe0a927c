//! The sweeper on the in-memory world.

use std::time::Duration;

use chrono::{TimeZone, Utc};

use super::*;
use crate::memory::World;
use crate::ports::Clock;

/// `n` deliveries of one endpoint whose messages were lost, then time moved past the
/// sweeper's grace.
async fn lost(n: usize) -> World {
    let start = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();
    let (world, endpoint) = World::with_endpoint(start, 5, |_| {}).await;
    for _ in 0..n {
        world.add_delivery(&endpoint, |_| {}).await.unwrap();
        world.clock.advance(Duration::from_millis(10));
    }
    world.clock.advance(Duration::from_secs(20 * 60));
    world
}

#[tokio::test]
async fn a_sweep_reaches_past_the_deliveries_it_already_queued() {
    let world = lost(SWEEP_BATCH + 100).await;
    let first = sweep_overdue(&world.services).await.unwrap();
    assert_eq!(first.requeued, SWEEP_BATCH);
    world.clock.advance(SWEEP_INTERVAL);
    let second = sweep_overdue(&world.services).await.unwrap();
    assert_eq!(
        second.requeued, 100,
        "the next run finds the ones behind the first {SWEEP_BATCH}, not the same again"
    );
    assert_eq!(
        world.deliveries.len(),
        SWEEP_BATCH + 100,
        "each queued once"
    );
    world.clock.advance(SWEEP_INTERVAL);
    assert_eq!(sweep_overdue(&world.services).await.unwrap().requeued, 0);

    // Past the claim (and the grace after it), a delivery still waiting (its message
    // lost again) is queued again.
    world
        .clock
        .advance(SWEEP_CLAIM + SWEEP_GRACE.to_std().unwrap());
    let again = sweep_overdue(&world.services).await.unwrap();
    assert_eq!(again.requeued, SWEEP_BATCH);
}

#[tokio::test]
async fn a_delivery_seen_again_is_postponed_to_its_claims_end() {
    let world = lost(3).await;
    let claimed_at = world.clock.now();
    assert_eq!(sweep_overdue(&world.services).await.unwrap().requeued, 3);
    // Saved since (its message came back, and it is waiting again): back in the
    // sweeper's question, still claimed.
    let store = &world.services.store;
    let some = store
        .overdue_deliveries(claimed_at + chrono::Duration::days(1), 1)
        .await
        .unwrap()
        .remove(0);
    let mut touched = store.get_delivery(&some.id).await.unwrap().unwrap();
    touched.updated_at = world.clock.now();
    store.save_delivery(&touched, &[]).await.unwrap();
    world.clock.advance(Duration::from_secs(3_600));
    assert_eq!(sweep_overdue(&world.services).await.unwrap().requeued, 0);
    // Postponed to the end of the claim made an hour ago, not a claim period from now.
    let claim_ends = claimed_at + chrono::Duration::from_std(SWEEP_CLAIM).unwrap();
    let just_after = store
        .overdue_deliveries(claim_ends + chrono::Duration::minutes(1), 10)
        .await
        .unwrap();
    assert!(just_after.iter().any(|d| d.id == some.id));
}

/// Counts the sweeper's preparation failures (the metric its alarm watches).
#[derive(Default)]
struct PreparationFailures(std::sync::atomic::AtomicUsize);

impl crate::ports::Metrics for PreparationFailures {
    fn attempt(&self, _: &crate::ports::AttemptMetric) {}
    fn failure(&self, _: &crate::ids::TenantId) {}
    fn oldest_unacknowledged_failure(&self, _: Option<Duration>) {}
    fn sweep_preparation_failed(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test]
async fn a_store_that_cannot_prepare_the_sweep_is_still_swept_and_the_failure_counted() {
    let mut world = lost(3).await;
    let failures = std::sync::Arc::new(PreparationFailures::default());
    world.services.metrics = failures.clone();
    world.store.fail_sweep_preparation(true);
    let report = sweep_overdue(&world.services).await.unwrap();
    assert_eq!(
        report.requeued, 3,
        "what the index holds is swept all the same"
    );
    assert_eq!(failures.0.load(std::sync::atomic::Ordering::Relaxed), 1);
    world.store.fail_sweep_preparation(false);
    world.clock.advance(SWEEP_INTERVAL);
    sweep_overdue(&world.services).await.unwrap();
    assert_eq!(
        failures.0.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "a preparation that succeeds is not counted"
    );
}
