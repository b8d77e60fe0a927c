//! The start's repair, on a real database: only waiting deliveries no message names
//! are queued, each once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use entrega_core::delivery::{Delivery, DeliveryState};
use entrega_core::handlers::fanout::fan_out;
use entrega_core::handlers::resume::start_resume;
use entrega_core::handlers::task::DeliveryTask;
use entrega_core::ids::DeliveryId;
use entrega_core::ports::{Services, SystemClock};
use entrega_http::transport::TargetPolicy;

use super::queue_orphaned_deliveries;
use crate::test_support::{sqlite_services, tenant_with_endpoint};

/// How many messages of the delivery queue name each delivery (a resume task, which
/// names none, under the empty key); the messages are left hidden.
async fn messages_per_delivery(services: &Services) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for message in services
        .deliveries
        .receive(100, Duration::from_secs(600))
        .await
        .unwrap()
    {
        let key = serde_json::from_str::<DeliveryTask>(&message.body)
            .map_or(String::new(), |task| task.delivery_id.to_string());
        *seen.entry(key).or_default() += 1;
    }
    seen
}

#[tokio::test]
async fn waiting_deliveries_without_a_message_are_queued_once_and_no_other() {
    let dir = entrega_testkit::TempDir::new("restart-orphans");
    let (services, parts) =
        sqlite_services(&dir, Arc::new(SystemClock), TargetPolicy::default()).await;
    let (endpoint, event) = tenant_with_endpoint(&services, "https://hooks.example.com/").await;

    // Queued as a publish queues it.
    let queued = event();
    services.store.publish(&queued).await.unwrap();
    fan_out(&services, &queued).await.unwrap();
    let queued = services.store.deliveries_of_event(&queued).await.unwrap()[0]
        .id
        .clone();
    // Written, its message not: what a stop between the two writes leaves.
    let written = |state: DeliveryState, paused: bool| {
        let e = event();
        let id = DeliveryId::for_event(&e.id, &endpoint.id, e.created_at.timestamp_millis());
        let mut d = Delivery::new(id, &e, endpoint.id.clone(), paused, Utc::now());
        d.state = state;
        d
    };
    let orphan = written(DeliveryState::Pending, false);
    let settled = written(DeliveryState::Delivered, false);
    let paused = written(DeliveryState::Paused, true);
    for d in [&orphan, &settled, &paused] {
        services.store.create_delivery_if_absent(d).await.unwrap();
    }
    // A resume task names no delivery: it must not hide every other message's.
    start_resume(&services, &endpoint).await.unwrap();

    assert_eq!(
        queue_orphaned_deliveries(&services, &parts.store)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        queue_orphaned_deliveries(&services, &parts.store)
            .await
            .unwrap(),
        0,
        "queued once"
    );
    let expected = BTreeMap::from([
        (String::new(), 1),
        (queued.to_string(), 1),
        (orphan.id.to_string(), 1),
    ]);
    assert_eq!(messages_per_delivery(&services).await, expected);
}
