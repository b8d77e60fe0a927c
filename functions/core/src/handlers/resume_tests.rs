//! The background resume on the in-memory world.

use chrono::{TimeZone, Utc};

use super::*;
use crate::memory::World;

#[tokio::test]
async fn a_resume_hands_over_where_it_stopped() {
    let start = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();
    // A cap above the count, so the queue hands every message out at once.
    let (world, endpoint) = World::with_endpoint(start, 7, |e| e.max_concurrency = 2_000).await;
    let tenant = endpoint.tenant_id.clone();
    let per_step = RESUME_BATCH * RESUME_BATCHES_PER_STEP;
    let paused = |d: &mut crate::delivery::Delivery| d.state = DeliveryState::Paused;
    for _ in 0..per_step + 50 {
        world.add_delivery(&endpoint, paused).await.unwrap();
    }
    let first = ResumeTask {
        resume_endpoint: endpoint.id.clone(),
        tenant_id: tenant.clone(),
        cursor: None,
        closing: false,
    };
    assert_eq!(
        resume_step(&world.services, &first).await.unwrap(),
        per_step
    );
    let queued = world
        .services
        .deliveries
        .receive(per_step + 10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let handover: Vec<ResumeTask> = queued
        .iter()
        .filter_map(|m| serde_json::from_str::<ResumeTask>(&m.body).ok())
        .collect();
    assert_eq!(queued.len(), per_step + 1);
    assert_eq!(handover.len(), 1, "one message goes on with the rest");
    assert!(
        handover[0].cursor.is_some(),
        "from where this step stopped, not from the start"
    );
    for m in &queued {
        world.services.deliveries.delete(&m.receipt).await.unwrap();
    }
    assert_eq!(
        resume_step(&world.services, &handover[0]).await.unwrap(),
        50
    );
    let rest = world
        .services
        .deliveries
        .receive(100, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(rest.len(), 50, "the last fifty, and no further hand-over");
    assert!(rest
        .iter()
        .all(|m| serde_json::from_str::<ResumeTask>(&m.body).is_err()));

    // A writer that still read the endpoint disabled pauses one more delivery after
    // the first pass went by; the closing pass, a little later, finds it.
    let late = world.add_delivery(&endpoint, paused).await.unwrap();
    world.clock.advance(RESUME_CLOSING_PASS_DELAY);
    let closing: Vec<ResumeTask> = world
        .services
        .deliveries
        .receive(10, std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .iter()
        .filter_map(|m| serde_json::from_str::<ResumeTask>(&m.body).ok())
        .collect();
    assert_eq!(closing.len(), 1);
    assert!(closing[0].closing && closing[0].cursor.is_none());
    assert_eq!(resume_step(&world.services, &closing[0]).await.unwrap(), 1);
    let stored = world.stored_delivery(&late.id).await;
    assert_eq!(stored.state, DeliveryState::Pending);
    let after = world
        .services
        .deliveries
        .receive(10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(after.len(), 1, "its message, and no further pass");
}

#[tokio::test]
async fn a_deleted_endpoints_paused_deliveries_end_a_step_at_a_time() {
    let start = Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap();
    let (world, endpoint) = World::with_endpoint(start, 7, |e| e.disabled = true).await;
    let per_step = RESUME_BATCH * RESUME_BATCHES_PER_STEP;
    let paused = |d: &mut crate::delivery::Delivery| d.state = DeliveryState::Paused;
    for _ in 0..per_step + 20 {
        world.add_delivery(&endpoint, paused).await.unwrap();
    }
    world
        .services
        .store
        .delete_endpoint(&endpoint.id)
        .await
        .unwrap();
    start_resume(&world.services, &endpoint).await.unwrap();
    let mut ended = 0;
    let mut steps = 0;
    while let Some(m) = world
        .services
        .deliveries
        .receive(1, std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .pop()
    {
        let task: ResumeTask = serde_json::from_str(&m.body).unwrap();
        ended += resume_step(&world.services, &task).await.unwrap();
        world.services.deliveries.delete(&m.receipt).await.unwrap();
        steps += 1;
    }
    assert_eq!(
        (ended, steps),
        (per_step + 20, 2),
        "a bounded step, then the rest"
    );
    let left = world
        .services
        .store
        .paused_deliveries(&endpoint.id, None, 10)
        .await
        .unwrap();
    assert!(left.data.is_empty());

    // A writer that read the endpoint before the delete pauses one more afterwards:
    // its own re-read of the endpoint ends it.
    let late = world.add_delivery(&endpoint, paused).await.unwrap();
    resume_if_enabled(&world.services, &late).await.unwrap();
    let stored = world.stored_delivery(&late.id).await;
    assert_eq!(stored.state, DeliveryState::Failed);
    assert_eq!(
        stored.last_error.as_deref(),
        Some(crate::state_machine::ENDPOINT_DELETED_ERROR)
    );
}
