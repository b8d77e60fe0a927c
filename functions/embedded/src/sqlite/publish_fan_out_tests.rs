//! A publish with its deliveries in one commit, and the events it leaves to the
//! fan-out beside the request.

use std::sync::Arc;
use std::time::Duration;

use entrega_core::delivery::DeliveryState;
use entrega_core::endpoint::Endpoint;
use entrega_core::handlers::task::DeliveryTask;
use entrega_core::ports::{Published, Services, SystemClock};
use entrega_http::api::Publisher;
use entrega_http::transport::TargetPolicy;
use entrega_testkit::TempDir;

use crate::fan_out::{FanOutBesideRequest, FanOutsUnderWay, InlineFanOut, PublishAndFanOut};
use crate::sqlite::backlog::EmbeddedBacklog;
use crate::test_support::{sqlite_services, tenant_with_endpoint};

async fn open(dir: &TempDir) -> (Services, EmbeddedBacklog, PublishAndFanOut) {
    let (services, parts) =
        sqlite_services(dir, Arc::new(SystemClock), TargetPolicy::default()).await;
    let inline = Arc::new(InlineFanOut {
        services: services.clone(),
        store: parts.store.clone(),
        under_way: FanOutsUnderWay::default(),
    });
    let publisher = PublishAndFanOut {
        store: parts.store.clone(),
        queue: parts.deliveries.clone(),
        clock: services.clock.clone(),
        beside: FanOutBesideRequest::new(inline),
    };
    (services, parts, publisher)
}

/// The event, its delivery and the delivery's first message commit together: nothing
/// is left for the outbox poller, and the message is receivable once the publish has
/// answered. The same id again is the same event: no second delivery or message.
#[tokio::test]
async fn a_publish_commits_its_deliveries_and_their_first_messages() {
    let dir = TempDir::new("publish-fan-out");
    let (services, parts, publisher) = open(&dir).await;
    let (endpoint, event) = tenant_with_endpoint(&services, "https://hooks.example.com/").await;
    let event = event();
    assert_eq!(publisher.publish(&event).await.unwrap(), Published::Created);

    let waiting = parts
        .store
        .outbox_waiting(10, Duration::ZERO)
        .await
        .unwrap();
    assert!(waiting.is_empty(), "marked fanned out: {waiting:?}");
    let deliveries = services.store.deliveries_of_event(&event).await.unwrap();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].state, DeliveryState::Pending);
    assert_eq!(deliveries[0].endpoint_id, endpoint.id);
    let received = services
        .deliveries
        .receive(10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(received.len(), 1);
    let task: DeliveryTask = serde_json::from_str(&received[0].body).unwrap();
    assert_eq!(task.delivery_id, deliveries[0].id);

    match publisher.publish(&event).await.unwrap() {
        Published::Existing(stored) => assert!(stored.same_as(&event)),
        Published::Created => panic!("the same id published twice"),
    }
    assert_eq!(
        services
            .store
            .deliveries_of_event(&event)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        parts.deliveries.depth().await.unwrap(),
        1,
        "no second message"
    );
}

/// An event to a disabled endpoint is published alone and fanned out beside the
/// request by the fan-out handler, which resumes a delivery created paused if its
/// endpoint was enabled meanwhile: the enabled endpoint's delivery is queued, the
/// disabled one's paused, and the outbox row marked.
#[tokio::test]
async fn an_event_to_a_disabled_endpoint_is_fanned_out_beside_the_publish() {
    let dir = TempDir::new("publish-fan-out-disabled");
    let (services, parts, publisher) = open(&dir).await;
    let (enabled, event) = tenant_with_endpoint(&services, "https://hooks.example.com/").await;
    let event = event();
    let mut disabled = Endpoint::new(
        event.tenant_id.clone(),
        "https://other.example.com/",
        chrono::Utc::now(),
    );
    disabled.disabled = true;
    services
        .store
        .create_endpoint(&disabled, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();

    assert_eq!(publisher.publish(&event).await.unwrap(), Published::Created);
    entrega_testkit::eventually(Duration::from_secs(5), "the fan-out beside", || async {
        let marked = parts
            .store
            .outbox_waiting(10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty();
        let deliveries = services.store.deliveries_of_event(&event).await.unwrap();
        (marked && deliveries.len() == 2).then_some(deliveries)
    })
    .await
    .iter()
    .for_each(|d| {
        let expected = if d.endpoint_id == enabled.id {
            DeliveryState::Pending
        } else {
            DeliveryState::Paused
        };
        assert_eq!(d.state, expected, "{}", d.endpoint_id);
    });
    assert_eq!(parts.deliveries.depth().await.unwrap(), 1);
}
