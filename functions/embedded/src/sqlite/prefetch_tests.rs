//! A prefetched record answers only the first read of it, inside its task's scope.

use std::sync::Arc;

use entrega_core::handlers::fanout::fan_out;
use entrega_core::ports::{Services, SystemClock};
use entrega_http::transport::{HttpTransport, TargetPolicy};

use super::*;

async fn services(dir: &entrega_testkit::TempDir) -> (Services, SqliteStore) {
    let transport = Arc::new(HttpTransport::new(TargetPolicy::default()));
    let (services, parts) = crate::serve::open_sqlite_parts(
        &dir.0.join("p.db"),
        crate::sqlite::Durability::Full,
        Arc::new(SystemClock),
        transport,
    )
    .await
    .unwrap();
    (services, parts.store)
}

#[tokio::test]
async fn a_prefetched_record_answers_its_tasks_first_read_only() {
    let dir = entrega_testkit::TempDir::new("prefetch-first-read");
    let (services, store) = services(&dir).await;
    let (endpoint, event) =
        crate::test_support::tenant_with_endpoint(&services, "https://hooks.example.com/").await;
    let event = event();
    services.store.publish(&event).await.unwrap();
    fan_out(&services, &event).await.unwrap();
    let read = services.store.deliveries_of_event(&event).await.unwrap()[0].clone();
    let task = DeliveryTask::for_delivery(&read);

    let mut batch = store.prefetch(&[Some(task), None]).await;
    assert_eq!(batch.len(), 2, "one per message, in order");
    let prefetched = batch.remove(0);
    // Changed after the prefetch: the task's first read sees the prefetched version,
    // its next read (and any read outside the task) the stored one.
    let changed = services.store.save_delivery(&read, &[]).await.unwrap();
    let seen = prefetched
        .scope(async {
            let first = services.store.get_delivery(&read.id).await.unwrap();
            let second = services.store.get_delivery(&read.id).await.unwrap();
            let endpoint = services.store.get_endpoint(&endpoint.id).await.unwrap();
            let stored_event = services
                .store
                .get_event(&event.tenant_id, &event.id)
                .await
                .unwrap();
            (first, second, endpoint, stored_event)
        })
        .await;
    assert_eq!(seen.0.map(|d| d.version), Some(read.version), "prefetched");
    assert_eq!(
        seen.1.map(|d| d.version),
        Some(changed.version),
        "read anew"
    );
    assert_eq!(seen.2.map(|e| e.id), Some(endpoint.id.clone()));
    assert_eq!(seen.3.map(|e| e.payload), Some(event.payload.clone()));
    let outside = services.store.get_delivery(&read.id).await.unwrap();
    assert_eq!(outside.map(|d| d.version), Some(changed.version));
}

#[tokio::test]
async fn a_record_not_prefetched_is_read_from_the_store() {
    let dir = entrega_testkit::TempDir::new("prefetch-other-record");
    let (services, store) = services(&dir).await;
    let (_, event) =
        crate::test_support::tenant_with_endpoint(&services, "https://hooks.example.com/").await;
    let (one, other) = (event(), event());
    for e in [&one, &other] {
        services.store.publish(e).await.unwrap();
        fan_out(&services, e).await.unwrap();
    }
    let first = services.store.deliveries_of_event(&one).await.unwrap()[0].clone();
    let second = services.store.deliveries_of_event(&other).await.unwrap()[0].clone();
    let prefetched = store
        .prefetch(&[Some(DeliveryTask::for_delivery(&first))])
        .await
        .pop()
        .unwrap();
    let seen = prefetched
        .scope(async {
            // Another delivery's read leaves the prefetched one for its own read.
            let other = services.store.get_delivery(&second.id).await.unwrap();
            let own = services.store.get_delivery(&first.id).await.unwrap();
            (other, own)
        })
        .await;
    assert_eq!(seen.0.map(|d| d.id), Some(second.id));
    assert_eq!(seen.1.map(|d| d.id), Some(first.id));
}
