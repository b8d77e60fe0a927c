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
