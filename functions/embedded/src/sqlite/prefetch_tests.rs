//! A prefetched record answers only the first read of it, inside its task's scope.

use std::sync::Arc;

use entrega_core::handlers::fanout::fan_out;
use entrega_core::ports::{Services, SystemClock};
use entrega_http::transport::TargetPolicy;

use super::*;

async fn services(dir: &entrega_testkit::TempDir) -> (Services, SqliteStore) {
    let (services, parts) =
        crate::test_support::sqlite_services(dir, Arc::new(SystemClock), TargetPolicy::default())
            .await;
    (services, parts.store)
}

/// A tenant's endpoint, and one event published to it and fanned out.
async fn one_event_fanned_out(services: &Services) -> (entrega_core::endpoint::Endpoint, Event) {
    let (endpoint, event) =
        crate::test_support::tenant_with_endpoint(services, "https://hooks.example.com/").await;
    let event = event();
    services.store.publish(&event).await.unwrap();
    fan_out(services, &event).await.unwrap();
    (endpoint, event)
}

#[tokio::test]
async fn a_prefetched_record_answers_its_tasks_first_read_only() {
    let dir = entrega_testkit::TempDir::new("prefetch-first-read");
    let (services, store) = services(&dir).await;
    let (endpoint, event) = one_event_fanned_out(&services).await;
    let read = services.store.deliveries_of_event(&event).await.unwrap()[0].clone();
    let task = DeliveryTask::for_delivery(&read);

    let mut batch = store.prefetch(&[Some(task), None]).await;
    assert_eq!(batch.len(), 2, "one per message, in order");
    let (prefetched, nothing) = (batch.remove(0), batch.remove(0));
    // Each record changed (the event removed) after the prefetch: the task's first read
    // of each sees what was prefetched; its next read, and any read outside the task,
    // what is stored.
    let changed = services.store.save_delivery(&read, &[]).await.unwrap();
    let changed_endpoint = services.store.update_endpoint(&endpoint).await.unwrap();
    assert_ne!(changed_endpoint.version, endpoint.version);
    let (tenant, id) = (event.tenant_id.to_string(), event.id.to_string());
    store
        .db()
        .call(move |conn| {
            conn.execute(
                "DELETE FROM outbox WHERE tenant_id = ?1 AND id = ?2",
                [&tenant, &id],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let reads = &services.store;
    let seen = prefetched
        .scope(async {
            (
                reads.get_delivery(&read.id).await.unwrap(),
                reads.get_delivery(&read.id).await.unwrap(),
                reads.get_endpoint(&endpoint.id).await.unwrap(),
                reads.get_endpoint(&endpoint.id).await.unwrap(),
                reads.get_event(&event.tenant_id, &event.id).await.unwrap(),
                reads.get_event(&event.tenant_id, &event.id).await.unwrap(),
            )
        })
        .await;
    assert_eq!(seen.0.map(|d| d.version), Some(read.version), "prefetched");
    assert_eq!(
        seen.1.map(|d| d.version),
        Some(changed.version),
        "read anew"
    );
    assert_eq!(seen.2.map(|e| e.version), Some(endpoint.version));
    assert_eq!(seen.3.map(|e| e.version), Some(changed_endpoint.version));
    assert_eq!(seen.4.map(|e| e.payload), Some(event.payload.clone()));
    assert!(seen.5.is_none(), "the event is gone from the store");
    let outside = reads.get_delivery(&read.id).await.unwrap();
    assert_eq!(outside.map(|d| d.version), Some(changed.version));
    let unknown = nothing
        .scope(async { reads.get_delivery(&read.id).await.unwrap() })
        .await;
    assert_eq!(
        unknown.map(|d| d.version),
        Some(changed.version),
        "a message that is no delivery task has nothing prefetched"
    );
}

#[tokio::test]
async fn a_read_of_another_record_leaves_the_prefetched_one() {
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
    let changed = services.store.save_delivery(&first, &[]).await.unwrap();
    let reads = &services.store;
    let seen = prefetched
        .scope(async {
            let other = reads.get_delivery(&second.id).await.unwrap();
            let own = reads.get_delivery(&first.id).await.unwrap();
            (other, own)
        })
        .await;
    assert_eq!(seen.0.map(|d| d.id), Some(second.id));
    assert_eq!(
        seen.1.map(|d| d.version),
        Some(first.version),
        "still the prefetched one, not the stored {}",
        changed.version
    );
}

/// The worker's read of an endpoint may be made with its batch, a moment before an
/// enable whose resume then finds nothing paused. The delivery the worker pauses on
/// that read is resumed by the worker itself, which reads the endpoint again.
#[tokio::test]
async fn a_delivery_paused_on_a_stale_read_of_a_disabled_endpoint_is_resumed() {
    use entrega_core::delivery::DeliveryState;
    use entrega_core::handlers::worker::handle_delivery;
    use std::time::Duration;

    let dir = entrega_testkit::TempDir::new("prefetch-stale-disable");
    let (services, store) = services(&dir).await;
    let (endpoint, _) = one_event_fanned_out(&services).await;
    let queue = &services.deliveries;
    let first = queue.receive(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(first.len(), 1);
    let disabled = services
        .store
        .update_endpoint(&Endpoint {
            disabled: true,
            ..endpoint
        })
        .await
        .unwrap();
    let task: DeliveryTask = serde_json::from_str(&first[0].body).unwrap();
    let prefetched = store.prefetch(&[Some(task.clone())]).await.pop().unwrap();
    // Enabled after the batch was read (its resume would find nothing paused yet).
    services
        .store
        .update_endpoint(&Endpoint {
            disabled: false,
            ..disabled
        })
        .await
        .unwrap();

    prefetched
        .scope(handle_delivery(&services, &first[0].body, 1))
        .await
        .unwrap();

    let delivery = services
        .store
        .get_delivery(&task.delivery_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(delivery.state, DeliveryState::Pending, "not left paused");
    let again = queue.receive(10, Duration::from_secs(60)).await.unwrap();
    let tasks: Vec<DeliveryTask> = again
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    assert_eq!(
        tasks.iter().map(|t| &t.delivery_id).collect::<Vec<_>>(),
        vec![&task.delivery_id],
        "queued again, once"
    );
}
