//! Fan-outs beside the outbox poller: bounded, and never beside it.

use std::sync::Arc;
use std::time::Duration;

use entrega_core::conditions::Conditions;
use entrega_core::ports::{ManualClock, SystemClock};
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

/// Publish `event` in a task of its own, returning once its row is committed (and
/// readable) while the publish may still wait for its sync: the task.
async fn publish_until_committed(
    store: &SqliteStore,
    event: &Event,
) -> tokio::task::JoinHandle<entrega_core::ports::StoreResult<entrega_core::ports::Published>> {
    use entrega_core::ports::EventStore;

    let publishing = tokio::spawn({
        let (store, event) = (store.clone(), event.clone());
        async move { store.publish(&event).await }
    });
    entrega_testkit::eventually(Duration::from_secs(5), "the row committed", || async {
        store
            .get_event(&event.tenant_id, &event.id)
            .await
            .unwrap()
            .map(drop)
    })
    .await;
    publishing
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
        retention: None,
        slots: Default::default(),
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

/// The outbox poller takes no event before its publisher has been answered: the row is
/// committed, and readers see it, before the log is synced, and only the answer lets
/// the publish mark its fan-out under way. A sync held past the grace (a busy disk)
/// must not let the poller fan the event out beside its publish.
#[tokio::test]
async fn the_poller_takes_no_event_whose_publish_waits_for_its_sync() {
    use std::sync::atomic::Ordering;

    use entrega_core::ports::{Clock, EventStore};

    let dir = entrega_testkit::TempDir::new("fan-out-unsynced");
    let (db, hold) = crate::sqlite::SqliteDb::open_with_held_sync(&dir.0.join("e.db"), false);
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let store = SqliteStore::new(db, clock.clone());
    let tenant = entrega_core::ids::TenantId::generate();
    let event = |n: u32| Event {
        id: format!("evt-{n}").parse().unwrap(),
        tenant_id: tenant.clone(),
        event_type: "a.b".into(),
        payload: "{}".into(),
        created_at: clock.now(),
    };
    let (answered, waiting) = (event(1), event(2));
    store.publish(&answered).await.unwrap();
    hold.store(true, Ordering::SeqCst);
    let publishing = publish_until_committed(&store, &waiting).await;
    clock.advance(INLINE_GRACE * 2);
    let polled = tokio::spawn({
        let store = store.clone();
        async move { store.outbox_waiting(10, INLINE_GRACE).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!publishing.is_finished(), "the publish waits for its sync");
    assert!(!polled.is_finished(), "so does the poller");
    hold.store(false, Ordering::SeqCst);
    let taken = polled.await.unwrap().unwrap();
    assert!(
        publishing.is_finished(),
        "answered before the poller took it"
    );
    assert_eq!(
        taken.iter().map(|e| e.id.to_string()).collect::<Vec<_>>(),
        ["evt-1", "evt-2"]
    );
}

/// A publish whose caller stops waiting once its write is queued (a client that hangs
/// up) still leaves its event where the outbox poller finds it.
#[tokio::test]
async fn the_poller_finds_an_event_whose_publisher_hung_up() {
    use std::sync::atomic::Ordering;

    use entrega_core::ports::Clock;

    let dir = entrega_testkit::TempDir::new("fan-out-hung-up");
    let (db, hold) = crate::sqlite::SqliteDb::open_with_held_sync(&dir.0.join("e.db"), true);
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let store = SqliteStore::new(db, clock.clone());
    let event = Event {
        id: "evt-hung-up".parse().unwrap(),
        tenant_id: entrega_core::ids::TenantId::generate(),
        event_type: "a.b".into(),
        payload: "{}".into(),
        created_at: clock.now(),
    };
    let publishing = publish_until_committed(&store, &event).await;
    publishing.abort();
    assert!(publishing.await.unwrap_err().is_cancelled());
    hold.store(false, Ordering::SeqCst);
    clock.advance(INLINE_GRACE * 2);
    let taken =
        entrega_testkit::eventually(Duration::from_secs(5), "the poller's find", || async {
            let taken = store.outbox_waiting(10, INLINE_GRACE).await.unwrap();
            (!taken.is_empty()).then_some(taken)
        })
        .await;
    assert_eq!(taken[0].id, event.id);
}

/// An event stays under way until its outbox row's mark has committed: a poll that
/// read the row before then would fan it out a second time (two messages a delivery,
/// both sent at once).
#[tokio::test]
async fn an_event_stays_under_way_until_its_mark_commits() {
    use entrega_core::ports::EventStore;

    let dir = entrega_testkit::TempDir::new("fan-out-mark");
    let (db, _) = crate::sqlite::SqliteDb::open_with_held_sync(&dir.0.join("e.db"), false);
    let store = SqliteStore::new(db.clone(), Arc::new(SystemClock));
    let event = Event {
        id: "evt-marked".parse().unwrap(),
        tenant_id: entrega_core::ids::TenantId::generate(),
        event_type: "a.b".into(),
        payload: "{}".into(),
        created_at: chrono::Utc::now(),
    };
    store.publish(&event).await.unwrap();
    let under_way = FanOutsUnderWay::default();
    // A publish's own mark, held beside the fan-out's (the marks are counted).
    let publish_mark = under_way.start(&event);
    // The writer busy with another write: the mark waits behind it.
    let (release, busy) = std::sync::mpsc::channel::<()>();
    db.call_detached(
        "hold the writer",
        move |_| {
            let _ = busy.recv();
            Ok(())
        },
        |_| {},
    );
    store
        .mark_fanned_out(&event, under_way.start(&event))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        under_way.contains(&event),
        "under way until the mark commits"
    );
    release.send(()).unwrap();
    entrega_testkit::eventually(Duration::from_secs(5), "the mark committed", || async {
        store
            .outbox_waiting(10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(under_way.contains(&event), "the publish's mark still holds");
    drop(publish_mark);
    // The fan-out's own mark goes as the writer thread ends the commit.
    entrega_testkit::eventually(Duration::from_secs(5), "no mark left", || async {
        (!under_way.contains(&event)).then_some(())
    })
    .await;
    assert!(store
        .outbox_waiting(10, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
}
