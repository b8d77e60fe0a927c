//! What only the SQLite delivery store promises beyond the shared conformance suite.

use std::sync::Arc;

use chrono::Utc;
use entrega_core::endpoint::Endpoint;
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::SystemClock;

use super::*;
use crate::sqlite::SqliteDb;

/// A database written by a build that derived delivery ids otherwise: a replayed
/// fan-out (an outbox row not yet marked when the old build stopped) computes a new id
/// for the same event and endpoint, and finds the delivery already there.
#[tokio::test]
async fn one_delivery_per_event_and_endpoint_whatever_its_id() {
    let dir = entrega_testkit::TempDir::new("deliveries-one-per-pair");
    let store = SqliteStore::new(
        SqliteDb::open(&dir.0.join("d.db")).unwrap(),
        Arc::new(SystemClock),
    );
    let tenant = TenantId::generate();
    let endpoint = Endpoint::new(tenant.clone(), "https://hooks.example.com/", Utc::now());
    let event = Event {
        id: EventId::generate(),
        tenant_id: tenant,
        event_type: "a.b".into(),
        payload: "{}".into(),
        created_at: Utc::now(),
    };
    let old_layout = DeliveryId::generate();
    let first = Delivery::new(
        old_layout.clone(),
        &event,
        endpoint.id.clone(),
        false,
        Utc::now(),
    );
    assert!(store.create_delivery_if_absent(&first).await.unwrap().1);
    let replayed =
        DeliveryId::for_event(&event.id, &endpoint.id, event.created_at.timestamp_millis());
    let again = Delivery::new(replayed, &event, endpoint.id.clone(), false, Utc::now());
    let (stored, created) = store.create_delivery_if_absent(&again).await.unwrap();
    assert!(!created, "not made twice");
    assert_eq!(stored.id, old_layout, "the one already there");
    assert_eq!(store.deliveries_of_event(&event).await.unwrap().len(), 1);
}

/// A resend that commits while an attempt's lease is still on its way to the disk:
/// the lease loses, and the attempt's outcome (written once it knows) loses too, so
/// the resend stands. (The outcome must not be written against the version the lease
/// would have written: the resend wrote that version number first.)
#[tokio::test]
async fn an_outcome_never_lands_on_a_resend_its_lease_lost_to() {
    use entrega_core::handlers::{fanout::fan_out, worker::handle_delivery};
    use entrega_http::transport::TargetPolicy;
    use std::time::Duration;

    let dir = entrega_testkit::TempDir::new("deliveries-lease-lost");
    let receiver = entrega_testkit::Receiver::answering(200).await;
    let loopback = TargetPolicy {
        allowed_ranges: vec!["127.0.0.0/8".parse().unwrap()],
        allow_http: true,
    };
    let (services, parts) =
        crate::test_support::sqlite_services(&dir, Arc::new(SystemClock), loopback).await;
    let (_, event) =
        crate::test_support::tenant_with_endpoint(&services, &receiver.url("/hook")).await;
    let event = event();
    services.store.publish(&event).await.unwrap();
    fan_out(&services, &event).await.unwrap();
    let message = services
        .deliveries
        .receive(1, Duration::from_secs(60))
        .await
        .unwrap()
        .pop()
        .expect("the fan-out queued a message");
    let read = services.store.deliveries_of_event(&event).await.unwrap()[0].clone();

    // Hold the writer; queue the resend behind it; then the attempt, whose lease
    // queues behind the resend while the worker reads the delivery as it was.
    let db = parts.store.db().clone();
    let hold = tokio::spawn(async move {
        db.call(|_| {
            std::thread::sleep(Duration::from_millis(500));
            Ok(())
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut resent = read.clone();
    resent.generation += 1;
    let resend = {
        let store = services.store.clone();
        tokio::spawn(async move { store.save_delivery(&resent, &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    handle_delivery(&services, &message.body, message.receive_count)
        .await
        .unwrap();
    hold.await.unwrap().unwrap();
    let resent = resend.await.unwrap().unwrap();

    assert_eq!(receiver.count(), 1, "the attempt was made");
    let stored = services
        .store
        .get_delivery(&read.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (stored.generation, stored.version, stored.state),
        (resent.generation, resent.version, resent.state),
        "the resend stands"
    );
    assert_eq!(
        services.store.list_attempts(&read.id).await.unwrap().len(),
        1,
        "and the attempt is in the log"
    );
}

/// At start every lease of the previous process is void (one process per database):
/// the delivery it was attempting, and one resent meanwhile, which kept the lease of
/// the attempt it superseded, are both free to go at once.
#[tokio::test]
async fn a_restart_releases_every_lease_of_the_previous_process() {
    let dir = entrega_testkit::TempDir::new("deliveries-dead-leases");
    let store = SqliteStore::new(
        SqliteDb::open(&dir.0.join("d.db")).unwrap(),
        Arc::new(SystemClock),
    );
    let tenant = TenantId::generate();
    let endpoint = Endpoint::new(tenant.clone(), "https://hooks.example.com/", Utc::now());
    let mut leased = Vec::new();
    use entrega_core::delivery::DeliveryState;
    for state in [DeliveryState::Delivering, DeliveryState::Pending] {
        let event = Event {
            id: EventId::generate(),
            tenant_id: tenant.clone(),
            event_type: "a.b".into(),
            payload: "{}".into(),
            created_at: Utc::now(),
        };
        let id =
            DeliveryId::for_event(&event.id, &endpoint.id, event.created_at.timestamp_millis());
        let fresh = Delivery::new(id, &event, endpoint.id.clone(), false, Utc::now());
        let (mut d, _) = store.create_delivery_if_absent(&fresh).await.unwrap();
        d.state = state;
        d.lease_until = Some(Utc::now() + chrono::Duration::seconds(60));
        leased.push(store.save_delivery(&d, &[]).await.unwrap());
    }
    // The one mid-attempt had its lease only, no next attempt.
    let mut attempting = leased[0].clone();
    attempting.next_attempt_at = None;
    leased[0] = store.save_delivery(&attempting, &[]).await.unwrap();
    let restarted = Utc::now();
    assert_eq!(store.release_dead_leases().await.unwrap(), 2);
    for d in &leased {
        let stored = store.get_delivery(&d.id).await.unwrap().unwrap();
        assert_eq!((stored.state, stored.lease_until), (d.state, None));
        assert!(stored.next_attempt_at.is_some(), "due again: {stored:?}");
    }
    // Due by the restart, so in the sweeper's view and in the start's repair.
    let due = |found: Vec<Delivery>| {
        let mut ids: Vec<_> = found.into_iter().map(|d| d.id).collect();
        ids.sort();
        ids
    };
    let mut all: Vec<_> = leased.iter().map(|d| d.id.clone()).collect();
    all.sort();
    let later = restarted + chrono::Duration::seconds(1);
    assert_eq!(due(store.overdue_deliveries(later, 10).await.unwrap()), all);
    assert_eq!(due(store.waiting_without_message(10).await.unwrap()), all);
}
