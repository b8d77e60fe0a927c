//! The lease written ahead of an at-least-once attempt: what every store promises.

use entrega_core::delivery::DeliveryState;
use entrega_core::ports::{Store, StoreError};

use super::{attempt, fresh_delivery};

/// A write made ahead lands before any write its caller makes next, and tells its
/// fate (before the outcome is written): one that loses to a write made meanwhile
/// from the same version (a resend's) is a conflict, whether the store says so at once
/// or once it commits, and leaves the other write standing; its attempts are kept.
pub async fn a_write_ahead_lands_before_the_next(store: &dyn Store) {
    let (_, endpoint, fresh) = fresh_delivery(store).await;
    let (stored, _) = store.create_delivery_if_absent(&fresh).await.unwrap();
    let mut begun = stored.clone();
    begun.state = DeliveryState::Delivering;
    begun.attempt_count = 1;
    let pending = store.save_delivery_ahead(&begun, &[]).await.unwrap();
    // Written before the write ahead is known to have landed: it must land after it.
    let mut done = begun.clone();
    done.version += 1;
    done.state = DeliveryState::Delivered;
    let done = store
        .save_delivery(&done, &[attempt(&fresh, &endpoint, 1)])
        .await
        .expect("the write ahead landed first");
    assert_eq!(pending.await.unwrap().version, stored.version + 1);
    let read = store.get_delivery(&fresh.id).await.unwrap().unwrap();
    assert_eq!(
        (read.state, read.version),
        (DeliveryState::Delivered, done.version)
    );

    // Another delivery: a resend writes from the version the worker read, first.
    let (_, endpoint, fresh) = fresh_delivery(store).await;
    let (read, _) = store.create_delivery_if_absent(&fresh).await.unwrap();
    let mut resent = read.clone();
    resent.generation += 1;
    let resent = store.save_delivery(&resent, &[]).await.unwrap();
    let mut begun = read.clone();
    begun.state = DeliveryState::Delivering;
    let lost = match store
        .save_delivery_ahead(&begun, &[attempt(&fresh, &endpoint, 1)])
        .await
    {
        Err(StoreError::Conflict(_)) => true,
        Ok(pending) => matches!(pending.await, Err(StoreError::Conflict(_))),
        Err(e) => panic!("a write ahead failed: {e}"),
    };
    assert!(lost, "a write ahead that lost says so");
    let stored = store.get_delivery(&fresh.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.generation, stored.version, stored.state),
        (resent.generation, resent.version, resent.state),
        "the resend stands"
    );
    assert_eq!(store.list_attempts(&fresh.id).await.unwrap().len(), 1);
}
