//! Failure records: found by delivery, acknowledged once, and listed oldest first
//! among the unacknowledged (what the 24-hour rule reads).

use chrono::Utc;
use entrega_core::failure::{Acknowledgement, Failure, FailureReason, Reacknowledge};
use entrega_core::ids::{DeliveryId, EndpointId, EventId, FailureId, TenantId};
use entrega_core::ports::Store;

use super::tenant;

/// An exhausted delivery's failure record, failed at `failed_ms`.
fn failure(tenant: &TenantId, delivery: &DeliveryId, generation: u32, failed_ms: i64) -> Failure {
    Failure {
        id: FailureId::for_delivery(delivery, generation, failed_ms),
        tenant_id: tenant.clone(),
        delivery_id: delivery.clone(),
        event_id: EventId::generate(),
        event_type: "a.b".into(),
        endpoint_id: EndpointId::generate(),
        reason: FailureReason::Exhausted,
        payload: String::new(),
        attempt_times: vec![Utc::now()],
        last_status_code: Some(500),
        last_error: Some("HTTP 500".into()),
        created_at: Utc::now(),
        acknowledged_at: None,
        ack_note: None,
        acknowledged_by: None,
    }
}

/// A delivery's failure records are found by the delivery; acknowledging replaces or
/// keeps the first acknowledgement as asked, and says who.
pub async fn failures_are_found_by_delivery_and_acknowledged(store: &dyn Store) {
    let t = tenant(store).await;
    let (delivery, other) = (DeliveryId::generate(), DeliveryId::generate());
    let now = Utc::now().timestamp_millis();
    let (first, second) = (
        failure(&t, &delivery, 0, now),
        failure(&t, &delivery, 1, now),
    );
    for f in [&first, &second, &failure(&t, &other, 0, now)] {
        assert!(store.put_failure_if_absent(f).await.unwrap());
    }
    let mut found: Vec<_> = store
        .failures_of_delivery(&delivery)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.id)
        .collect();
    found.sort();
    let mut want = vec![first.id.clone(), second.id.clone()];
    want.sort();
    assert_eq!(found, want, "exactly this delivery's records");

    let ack = |note: &str, by: &str| Acknowledgement {
        note: note.into(),
        by: by.into(),
        at: Utc::now(),
    };
    let acked = store
        .acknowledge_failure(&first.id, &ack("fixed", "admin"), Reacknowledge::Replace)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(acked.acknowledged_by.as_deref(), Some("admin"));
    assert!(acked.acknowledged_at.is_some());
    let kept = store
        .acknowledge_failure(&first.id, &ack("auto", "resend"), Reacknowledge::KeepFirst)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        kept.ack_note.as_deref(),
        Some("fixed"),
        "a person's note stays"
    );
    let stored = store.get_failure(&first.id).await.unwrap().unwrap();
    assert_eq!(stored.acknowledged_by.as_deref(), Some("admin"));
    let replaced = store
        .acknowledge_failure(&first.id, &ack("more", "tenant:x"), Reacknowledge::Replace)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(replaced.acknowledged_by.as_deref(), Some("tenant:x"));
    let untouched = store.get_failure(&second.id).await.unwrap().unwrap();
    assert!(untouched.acknowledged_at.is_none());
    assert!(store
        .acknowledge_failure(
            &FailureId::for_delivery(&other, 9, 0),
            &ack("x", "admin"),
            Reacknowledge::Replace
        )
        .await
        .unwrap()
        .is_none());
}

/// Unacknowledged failures come oldest first, and an acknowledged one leaves the list.
pub async fn unacknowledged_failures_come_oldest_first(store: &dyn Store) {
    let t = tenant(store).await;
    let base = Utc::now().timestamp_millis() - 10_000;
    let mut made = Vec::new();
    for n in 0..3 {
        let delivery = DeliveryId::generate();
        let f = failure(&t, &delivery, 0, base + n * 1000);
        store.put_failure_if_absent(&f).await.unwrap();
        made.push(f.id);
    }
    let ack = Acknowledgement {
        note: "seen".into(),
        by: "admin".into(),
        at: Utc::now(),
    };
    store
        .acknowledge_failure(&made[1], &ack, Reacknowledge::Replace)
        .await
        .unwrap();
    let (mut seen, mut cursor) = (Vec::new(), None::<String>);
    for _ in 0..1000 {
        let page = store
            .oldest_unacknowledged(1, cursor.as_deref())
            .await
            .unwrap();
        assert!(page.data.iter().all(|f| f.acknowledged_at.is_none()));
        seen.extend(page.data.into_iter().map(|f| f.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "oldest first");
    let mine: Vec<_> = seen.into_iter().filter(|id| made.contains(id)).collect();
    assert_eq!(
        mine,
        [made[0].clone(), made[2].clone()],
        "the acknowledged one is gone"
    );
}
