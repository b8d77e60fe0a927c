//! The sweeper's store query: what every store promises.

use chrono::Utc;
use entrega_core::delivery::Delivery;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::ids::{DeliveryId, EventId};
use entrega_core::ports::Store;

use super::tenant;

/// The sweeper's question: waiting deliveries (pending, retrying, or delivering under
/// a lease) due before a time, most overdue first; never a finished or paused one, and
/// a delivery leaves the answer once it is saved finished.
pub async fn overdue_deliveries_come_most_overdue_first(store: &dyn Store) {
    use chrono::TimeZone;
    use entrega_core::delivery::DeliveryState;
    // Long ago, so that the other promises' deliveries (due now) are never in the way.
    let t0 = Utc.with_ymd_and_hms(2001, 1, 1, 12, 0, 0).unwrap();
    let hours = chrono::Duration::hours;
    let t = tenant(store).await;
    let endpoint = Endpoint::new(t.clone(), "https://hooks.example.com/", t0);
    let make = |state: DeliveryState, next: Option<i64>, lease: Option<i64>| {
        let event = Event {
            id: EventId::generate(),
            tenant_id: t.clone(),
            event_type: "a.b".into(),
            payload: "{}".into(),
            created_at: t0 - hours(10),
        };
        let id = DeliveryId::for_event(&event.id, &endpoint.id, t0.timestamp_millis());
        let mut d = Delivery::new(id, &event, endpoint.id.clone(), false, t0 - hours(10));
        d.state = state;
        d.next_attempt_at = next.map(|h| t0 + hours(h));
        d.lease_until = lease.map(|h| t0 + hours(h));
        d
    };
    let pending = make(DeliveryState::Pending, Some(-3), None);
    let retrying = make(DeliveryState::Retrying, Some(-5), None);
    let delivering = make(DeliveryState::Delivering, None, Some(-2));
    let later = make(DeliveryState::Retrying, Some(1), None);
    let finished = make(DeliveryState::Exhausted, None, None);
    let paused = make(DeliveryState::Paused, Some(-6), None);
    for d in [&pending, &retrying, &delivering, &later, &finished, &paused] {
        store.create_delivery_if_absent(d).await.unwrap();
    }
    let ids =
        |found: Vec<Delivery>| -> Vec<DeliveryId> { found.into_iter().map(|d| d.id).collect() };

    let found = store.overdue_deliveries(t0, 100).await.unwrap();
    assert_eq!(
        ids(found),
        [
            retrying.id.clone(),
            pending.id.clone(),
            delivering.id.clone()
        ]
    );
    let most = store.overdue_deliveries(t0, 1).await.unwrap();
    assert_eq!(
        ids(most)[..],
        [retrying.id.clone()][..],
        "the limit keeps the most overdue"
    );

    // Postponed by the sweeper: out of the answer for times up to `until`, back after.
    // One postponed as read; one as a version that is not the stored one (changed
    // since the sweeper read it), which stays where its state says.
    let read = store.get_delivery(&pending.id).await.unwrap().unwrap();
    let mut stale = store.get_delivery(&delivering.id).await.unwrap().unwrap();
    stale.version += 1;
    store
        .postpone_sweep(&[(read, t0 + hours(2)), (stale, t0 + hours(2))])
        .await
        .unwrap();
    let found = store.overdue_deliveries(t0, 100).await.unwrap();
    assert_eq!(
        ids(found),
        [retrying.id.clone(), delivering.id.clone()],
        "a postponed delivery is left out, a postponement of another version is not"
    );
    let later_on = store.overdue_deliveries(t0 + hours(3), 100).await.unwrap();
    assert!(
        ids(later_on).contains(&pending.id),
        "and comes back once its postponement has passed"
    );

    let mut delivered = store.get_delivery(&retrying.id).await.unwrap().unwrap();
    delivered.state = DeliveryState::Delivered;
    delivered.next_attempt_at = None;
    store.save_delivery(&delivered, &[]).await.unwrap();
    let found = store.overdue_deliveries(t0, 100).await.unwrap();
    assert_eq!(
        ids(found)[..],
        [delivering.id.clone()][..],
        "a delivered one leaves, the postponed one stays out"
    );

    // A save of the postponed delivery puts it back where its state says.
    let mut touched = store.get_delivery(&pending.id).await.unwrap().unwrap();
    touched.updated_at = t0;
    store.save_delivery(&touched, &[]).await.unwrap();
    let found = store.overdue_deliveries(t0, 100).await.unwrap();
    assert_eq!(ids(found), [pending.id.clone(), delivering.id.clone()]);
}
