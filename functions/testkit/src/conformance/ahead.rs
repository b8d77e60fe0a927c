//! The write ahead of an at-least-once attempt: what every store promises.

use entrega_core::delivery::DeliveryState;
use entrega_core::ports::{Store, StoreError};

use super::{attempt, fresh_delivery};

/// A write made ahead lands before the write that follows it (which may be
/// conditional on the version it writes), and one that loses to a newer version is
/// reported as a conflict, by it or by the write that follows; its attempts are
/// recorded either way.
pub async fn a_write_ahead_lands_before_the_next(store: &dyn Store) {
    let (_, endpoint, fresh) = fresh_delivery(store).await;
    let (stored, _) = store.create_delivery_if_absent(&fresh).await.unwrap();
    let mut begun = stored.clone();
    begun.state = DeliveryState::Delivering;
    begun.attempt_count = 1;
    let begun = store.save_delivery_ahead(&begun, &[]).await.unwrap();
    assert_eq!(begun.version, stored.version + 1);
    let mut done = begun.clone();
    done.state = DeliveryState::Delivered;
    let done = store
        .save_delivery(&done, &[attempt(&fresh, &endpoint, 1)])
        .await
        .expect("the write ahead landed first");
    let read = store.get_delivery(&fresh.id).await.unwrap().unwrap();
    assert_eq!(
        (read.state, read.version),
        (DeliveryState::Delivered, done.version)
    );

    // From the version read before either: it loses.
    let mut stale = stored.clone();
    stale.state = DeliveryState::Delivering;
    let late = attempt(&fresh, &endpoint, 2);
    let lost = match store.save_delivery_ahead(&stale, &[late]).await {
        Err(StoreError::Conflict(_)) => true,
        Ok(assumed) => matches!(
            store.save_delivery(&assumed, &[]).await,
            Err(StoreError::Conflict(_))
        ),
        Err(e) => panic!("a write ahead failed: {e}"),
    };
    assert!(lost, "a stale write ahead is reported as a conflict");
    let read = store.get_delivery(&fresh.id).await.unwrap().unwrap();
    assert_eq!(
        (read.state, read.version),
        (DeliveryState::Delivered, done.version)
    );
    assert_eq!(store.list_attempts(&fresh.id).await.unwrap().len(), 2);
}
