//! Fan-outs beside the outbox poller: bounded, and never beside it.

use std::sync::Arc;
use std::time::Duration;

use entrega_core::conditions::Conditions;
use entrega_core::ports::{ManualClock, SystemClock};
use entrega_http::api::AfterPublish;
use entrega_http::transport::TargetPolicy;
use tokio::sync::Semaphore;

use super::*;
use crate::runtime::{Runtime, INLINE_GRACE};

async fn open(
    dir: &entrega_testkit::TempDir,
    clock: Arc<dyn entrega_core::ports::Clock>,
) -> (Services, crate::sqlite::backlog::EmbeddedBacklog) {
    crate::test_support::sqlite_services(dir, clock, TargetPolicy::default()).await
}

/// A publish that finds every slot taken leaves its event to the outbox poller; one
/// that finds a slot fans it out beside the request.
#[tokio::test]
async fn fan_outs_past_the_bound_are_left_to_the_outbox_poller() {
    let dir = entrega_testkit::TempDir::new("fan-out-bound");
    let (services, parts) = open(&dir, Arc::new(SystemClock)).await;
    let store = parts.store;
    let (_, event) =
        crate::test_support::tenant_with_endpoint(&services, "https://hooks.example.com/").await;
    let inline = Arc::new(InlineFanOut {
        services: services.clone(),
        store: store.clone(),
        under_way: FanOutsUnderWay::default(),
    });
    let full = FanOutBesideRequest {
        running: Arc::new(Semaphore::new(0)),
        ..FanOutBesideRequest::new(inline.clone())
    };
    let left = event();
    services.store.publish(&left).await.unwrap();
    full.published(&left).await;
    let taken = event();
    services.store.publish(&taken).await.unwrap();
    FanOutBesideRequest::new(inline).published(&taken).await;
    // The outbox keeps the event left alone, and only it, once the other's fan-out has
    // marked its row.
    entrega_testkit::eventually(Duration::from_secs(5), "the fan-out", || async {
        let waiting = store.outbox_waiting(10, Duration::ZERO).await.unwrap();
        (waiting.len() == 1 && waiting[0].id == left.id).then_some(())
    })
    .await;
    let of = |e| {
        let store = services.store.clone();
        async move { store.deliveries_of_event(&e).await.unwrap().len() }
    };
    assert_eq!(of(taken).await, 1);
    assert_eq!(of(left).await, 0);
}

/// The outbox poller leaves an event alone while it is being fanned out beside it,
/// and takes it once that is over (had it not finished).
#[tokio::test]
async fn the_poller_leaves_an_event_under_way_alone() {
    let dir = entrega_testkit::TempDir::new("fan-out-under-way");
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let (services, parts) = open(&dir, clock.clone()).await;
    let (_, event) =
        crate::test_support::tenant_with_endpoint(&services, "https://hooks.example.com/").await;
    let under_way = FanOutsUnderWay::default();
    let runtime = Runtime {
        services: services.clone(),
        store: parts.store.clone(),
        delivery_queue: parts.deliveries.clone(),
        conditions: Arc::new(Conditions::default()),
        fan_outs_under_way: under_way.clone(),
    };
    let event = event();
    services.store.publish(&event).await.unwrap();
    clock.advance(INLINE_GRACE * 2);
    let marked = under_way.start(&event);
    assert!(!runtime.fan_out_waiting().await.unwrap(), "nothing taken");
    assert!(services
        .store
        .deliveries_of_event(&event)
        .await
        .unwrap()
        .is_empty());
    drop(marked);
    assert!(runtime.fan_out_waiting().await.unwrap(), "taken once over");
    assert_eq!(
        services
            .store
            .deliveries_of_event(&event)
            .await
            .unwrap()
            .len(),
        1
    );
}
