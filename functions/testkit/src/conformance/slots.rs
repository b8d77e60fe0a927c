//! Endpoint slots: what every adapter of the port promises.

use chrono::Utc;
use entrega_core::ids::EndpointId;
use entrega_core::slots::{EndpointSlots, SlotPool};

/// Endpoint slots: at most `limit` held at once per pool, pools apart (an endpoint's
/// and the slow endpoints' share), a
/// released or expired slot taken again, and a release by a former holder (whose lease
/// ran out and was taken over) leaving the new holder's slot alone. Every adapter of
/// [`EndpointSlots`] runs this.
pub async fn endpoint_slots_cap_each_endpoint(slots: &dyn EndpointSlots) {
    let lease = std::time::Duration::from_secs(30);
    let now = Utc::now();
    let busy = SlotPool::Endpoint(EndpointId::generate());
    let other = SlotPool::SlowEndpoints;
    let mut held = Vec::new();
    // Enough tries that random probing finds every free slot of three.
    for i in 0..40 {
        if let Some(l) = slots
            .acquire(&busy, 3, &format!("h{i}"), now, lease)
            .await
            .unwrap()
        {
            held.push(l);
        }
    }
    let mut numbers: Vec<u32> = held.iter().map(|l| l.slot).collect();
    numbers.sort();
    assert_eq!(numbers, [0, 1, 2], "three slots, each held once");
    assert!(
        slots
            .acquire(&other, 1, "o", now, lease)
            .await
            .unwrap()
            .is_some(),
        "another pool's slots are its own"
    );
    slots.release(&held[0]).await.unwrap();
    let mut again = None;
    for i in 0..40 {
        again = slots
            .acquire(&busy, 3, &format!("again{i}"), now, lease)
            .await
            .unwrap();
        if again.is_some() {
            break;
        }
    }
    let again = again.expect("a released slot is free again");
    assert_eq!(again.slot, held[0].slot);
    assert!(slots
        .acquire(&busy, 3, "late", now, lease)
        .await
        .unwrap()
        .is_none());

    // Past the leases' end every slot is free, and the holders whose lease ran out
    // cannot release what a new holder took.
    let later = now + chrono::Duration::seconds(31);
    let mut taken_over = Vec::new();
    for i in 0..40 {
        if let Some(l) = slots
            .acquire(&busy, 3, &format!("new{i}"), later, lease)
            .await
            .unwrap()
        {
            taken_over.push(l);
        }
    }
    assert_eq!(taken_over.len(), 3, "expired leases are taken over");
    for old in &held {
        slots.release(old).await.unwrap();
    }
    assert!(
        slots
            .acquire(&busy, 3, "still-full", later, lease)
            .await
            .unwrap()
            .is_none(),
        "a former holder's release frees nothing"
    );
}
