//! Store conformance: behaviour every store adapter (SQLite, DynamoDB) must share,
//! one function per promise, called by each adapter's own test suite so the two
//! cannot drift apart.

use chrono::Utc;
use entrega_core::delivery::{Attempt, Delivery, Trigger};
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::ids::{AttemptId, DeliveryId, EventId, TenantId};
use entrega_core::ports::{Published, Store, StoreError};
use entrega_core::tenant::Tenant;

mod ahead;
mod endpoint_limit;
mod failures;
mod overdue;
mod paused;
mod queue;
mod races;
mod slots;

pub use ahead::a_write_ahead_lands_before_the_next;
pub use endpoint_limit::creates_racing_at_the_limit_store_no_more_than_it;
pub use failures::{
    failures_are_found_by_delivery_and_acknowledged, unacknowledged_failures_come_oldest_first,
};
pub use overdue::overdue_deliveries_come_most_overdue_first;
pub use paused::paused_deliveries_page_through_once;
pub use queue::{every_queue_promise, StaleReceipts};
pub use races::racing_writers_of_one_record_have_one_winner;
pub use slots::endpoint_slots_cap_each_endpoint;

/// Every promise below, in turn, on one store: what each adapter's suite runs.
pub async fn every_promise(store: &dyn Store) {
    endpoint_config_and_health_are_versioned_apart(store).await;
    creates_racing_at_the_limit_store_no_more_than_it(store).await;
    event_ids_are_scoped_to_their_tenant(store).await;
    deliveries_are_created_once_and_attempts_append(store).await;
    a_write_ahead_lands_before_the_next(store).await;
    remembered_keys_can_be_forgotten(store).await;
    tenants_list_newest_first_in_pages(store).await;
    failures_are_found_by_delivery_and_acknowledged(store).await;
    delivery_lists_page_newest_first(store).await;
    the_outbox_pages_events_since_a_time(store).await;
    counters_count_each_token_once(store).await;
    unacknowledged_failures_come_oldest_first(store).await;
    overdue_deliveries_come_most_overdue_first(store).await;
    paused_deliveries_page_through_once(store).await;
    racing_writers_of_one_record_have_one_winner(store).await;
}

async fn tenant(store: &dyn Store) -> TenantId {
    let tenant = Tenant {
        id: TenantId::generate(),
        name: "Conformance".into(),
        owner_email: "owner@example.com".into(),
        created_at: Utc::now(),
    };
    store
        .create_tenant(&tenant, &format!("hash-{}", tenant.id))
        .await
        .unwrap();
    tenant.id
}

/// An endpoint's configuration and its health are written under separate versions:
/// a stale configuration write is a conflict, and a health write never changes the
/// configuration (nor the other way round).
pub async fn endpoint_config_and_health_are_versioned_apart(store: &dyn Store) {
    let t = tenant(store).await;
    let endpoint = Endpoint::new(t, "https://hooks.example.com/", Utc::now());
    store
        .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    let read = store.get_endpoint(&endpoint.id).await.unwrap().unwrap();
    assert_eq!((read.version, read.health.version), (0, 0));

    let mut changed = read.clone();
    changed.description = Some("first".into());
    let saved = store.update_endpoint(&changed).await.unwrap();
    assert_eq!(saved.version, 1);
    let mut stale = read.clone();
    stale.description = Some("stale".into());
    assert!(matches!(
        store.update_endpoint(&stale).await,
        Err(StoreError::Conflict(_))
    ));

    let mut health = read.health.clone();
    health.failing_since = Some(Utc::now());
    let written = store
        .update_endpoint_health(&endpoint.id, &health)
        .await
        .unwrap();
    assert_eq!(written.version, 1);
    assert!(matches!(
        store.update_endpoint_health(&endpoint.id, &health).await,
        Err(StoreError::Conflict(_))
    ));
    let after = store.get_endpoint(&endpoint.id).await.unwrap().unwrap();
    assert_eq!(after.description.as_deref(), Some("first"), "config kept");
    assert_eq!(after.version, 1);
    assert_eq!(after.health.failing_since, health.failing_since);
    assert_eq!(after.health.version, 1);

    let mut again = after.clone();
    again.timeout_ms = 2_000;
    store.update_endpoint(&again).await.unwrap();
    let last = store.get_endpoint(&endpoint.id).await.unwrap().unwrap();
    assert_eq!(last.health, after.health, "health kept");
    assert_eq!(last.timeout_ms, 2_000);
}

/// Event ids are scoped to their tenant: the same id in two tenants is two events.
pub async fn event_ids_are_scoped_to_their_tenant(store: &dyn Store) {
    let (a, b) = (tenant(store).await, tenant(store).await);
    let id: EventId = "shared-id-1".parse().unwrap();
    let event = |t: &TenantId, data: &str| Event {
        id: id.clone(),
        tenant_id: t.clone(),
        event_type: "a.b".into(),
        payload: data.into(),
        created_at: Utc::now(),
    };
    assert_eq!(
        store.publish(&event(&a, r#"{"of":"a"}"#)).await.unwrap(),
        Published::Created
    );
    assert_eq!(
        store.publish(&event(&b, r#"{"of":"b"}"#)).await.unwrap(),
        Published::Created
    );
    assert!(matches!(
        store.publish(&event(&a, r#"{"of":"a2"}"#)).await.unwrap(),
        Published::Existing(e) if e.payload == r#"{"of":"a"}"#
    ));
    assert_eq!(
        store.get_event(&b, &id).await.unwrap().unwrap().payload,
        r#"{"of":"b"}"#
    );
    assert!(store
        .get_event(&TenantId::generate(), &id)
        .await
        .unwrap()
        .is_none());
}

/// A tenant, an endpoint of it and a delivery to it, not yet stored.
async fn fresh_delivery(store: &dyn Store) -> (Event, Endpoint, Delivery) {
    let t = tenant(store).await;
    let endpoint = Endpoint::new(t.clone(), "https://hooks.example.com/", Utc::now());
    let event = Event {
        id: EventId::generate(),
        tenant_id: t.clone(),
        event_type: "a.b".into(),
        payload: "{}".into(),
        created_at: Utc::now(),
    };
    let id = DeliveryId::for_event(&event.id, &endpoint.id, event.created_at.timestamp_millis());
    let fresh = Delivery::new(id, &event, endpoint.id.clone(), false, Utc::now());
    (event, endpoint, fresh)
}

/// Attempt `number` of `delivery` (generation 0), answered 200.
pub fn attempt(delivery: &Delivery, endpoint: &Endpoint, number: u32) -> Attempt {
    Attempt {
        id: AttemptId::generate(),
        delivery_id: delivery.id.clone(),
        tenant_id: delivery.tenant_id.clone(),
        endpoint_id: endpoint.id.clone(),
        generation: 0,
        number,
        started_at: Utc::now(),
        duration_ms: 5,
        status_code: Some(200),
        failure_kind: None,
        error: None,
        response_excerpt: None,
        trigger: Trigger::Scheduled,
        requested_by: None,
    }
}

/// A delivery is created once (and says so), and a save that loses to a newer version
/// still records its attempt without touching the delivery.
pub async fn deliveries_are_created_once_and_attempts_append(store: &dyn Store) {
    let (event, endpoint, fresh) = fresh_delivery(store).await;
    let id = fresh.id.clone();
    let (_, created) = store.create_delivery_if_absent(&fresh).await.unwrap();
    assert!(created);
    let (stored, created) = store.create_delivery_if_absent(&fresh).await.unwrap();
    assert!(!created);
    assert_eq!(stored.id, id);
    let attempt = attempt(&fresh, &endpoint, 1);
    let mut stale = stored.clone();
    stale.version += 1;
    stale.attempt_count = 1;
    assert!(matches!(
        store.save_delivery(&stale, &[attempt]).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.list_attempts(&id).await.unwrap().len(), 1);
    let unchanged = store.get_delivery(&id).await.unwrap().unwrap();
    assert_eq!(
        unchanged.version, stored.version,
        "the delivery is untouched"
    );
    let of_event = store.deliveries_of_event(&event).await.unwrap();
    assert_eq!(of_event.len(), 1);
    let elsewhere = Event {
        tenant_id: TenantId::generate(),
        ..event.clone()
    };
    assert!(
        store
            .deliveries_of_event(&elsewhere)
            .await
            .unwrap()
            .is_empty(),
        "event ids are scoped to their tenant"
    );
    // Neighbours of the same millisecond (a backfill stamped to the second), with a
    // delivery each to two endpoints: every event finds its own two, no other.
    let second = Endpoint::new(
        event.tenant_id.clone(),
        "https://hooks.example.com/2",
        Utc::now(),
    );
    let mut neighbours = Vec::new();
    for _ in 0..6 {
        let other = Event {
            id: EventId::generate(),
            ..event.clone()
        };
        for to in [&endpoint, &second] {
            let id = DeliveryId::for_event(&other.id, &to.id, other.created_at.timestamp_millis());
            let d = Delivery::new(id, &other, to.id.clone(), false, Utc::now());
            store.create_delivery_if_absent(&d).await.unwrap();
        }
        neighbours.push(other);
    }
    for other in &neighbours {
        let found = store.deliveries_of_event(other).await.unwrap();
        assert_eq!(found.len(), 2, "its own two");
        assert!(found.iter().all(|d| d.event_id == other.id));
    }
    assert_eq!(
        store.deliveries_of_event(&event).await.unwrap().len(),
        1,
        "and none of its neighbours'"
    );
    // Even one whose id starts as this event's do (a hash clash, one in 262 144).
    let clash = Event {
        id: EventId::generate(),
        ..event.clone()
    };
    let start = DeliveryId::prefix_of_event(&event.id, event.created_at.timestamp_millis());
    let forged: DeliveryId = format!("{start}{:014x}", rand::random::<u64>() >> 8)
        .parse()
        .expect("a valid id");
    let d = Delivery::new(forged, &clash, second.id.clone(), false, Utc::now());
    store.create_delivery_if_absent(&d).await.unwrap();
    let found = store.deliveries_of_event(&event).await.unwrap();
    assert_eq!(found.len(), 1, "the clash is not the event's");
    assert_eq!(found[0].event_id, event.id);
}

/// A remembered key can be forgotten (a claim whose request failed).
pub async fn remembered_keys_can_be_forgotten(store: &dyn Store) {
    let ttl = std::time::Duration::from_secs(60);
    let key = format!("claim#{}", rand::random::<u64>());
    assert_eq!(store.remember_once(&key, "1", ttl).await.unwrap(), None);
    assert_eq!(
        store
            .remember_once(&key, "2", ttl)
            .await
            .unwrap()
            .as_deref(),
        Some("1")
    );
    store.forget(&key).await.unwrap();
    assert_eq!(store.remember_once(&key, "3", ttl).await.unwrap(), None);
}

/// Tenants list newest first, a page at a time, each once.
pub async fn tenants_list_newest_first_in_pages(store: &dyn Store) {
    let mine = [
        tenant(store).await,
        tenant(store).await,
        tenant(store).await,
    ];
    let (mut seen, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let page = store.list_tenants(2, cursor.as_deref()).await.unwrap();
        assert!(page.data.len() <= 2);
        seen.extend(page.data.into_iter().map(|t| t.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(seen, sorted, "newest first, none twice");
    for t in &mine {
        assert!(seen.contains(t), "{t} is listed");
    }
}

/// The delivery log pages newest first through every listing (a tenant's, an
/// endpoint's, the admin's), each delivery once, in order, whatever the page size —
/// also where the store writes its indexes in shards.
pub async fn delivery_lists_page_newest_first(store: &dyn Store) {
    use entrega_core::ports::DeliveryQuery;
    let t = tenant(store).await;
    let endpoint = Endpoint::new(t.clone(), "https://hooks.example.com/", Utc::now());
    let mut made = Vec::new();
    for i in 0..23 {
        let event = Event {
            id: EventId::generate(),
            tenant_id: t.clone(),
            event_type: if i % 2 == 0 { "even" } else { "odd" }.into(),
            payload: "{}".into(),
            created_at: Utc::now(),
        };
        let id = DeliveryId::for_event(&event.id, &endpoint.id, Utc::now().timestamp_millis());
        let d = Delivery::new(id.clone(), &event, endpoint.id.clone(), false, Utc::now());
        store.create_delivery_if_absent(&d).await.unwrap();
        made.push(id);
    }
    made.sort_by(|a, b| b.cmp(a));
    let queries = [
        DeliveryQuery {
            tenant: Some(t.clone()),
            ..DeliveryQuery::default()
        },
        DeliveryQuery {
            endpoint_id: Some(endpoint.id.clone()),
            ..DeliveryQuery::default()
        },
        DeliveryQuery::default(),
    ];
    for base in queries {
        for limit in [1, 5, 50] {
            let (mut seen, mut cursor) = (Vec::new(), None::<String>);
            for _ in 0..100 {
                let page = store
                    .list_deliveries(&DeliveryQuery {
                        limit,
                        cursor: cursor.clone(),
                        ..base.clone()
                    })
                    .await
                    .unwrap();
                assert!(page.data.len() <= limit);
                seen.extend(
                    page.data
                        .into_iter()
                        .filter(|d| d.tenant_id == t)
                        .map(|d| d.id),
                );
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            assert_eq!(seen, made, "{base:?} in pages of {limit}");
        }
    }
    let odd = store
        .list_deliveries(&DeliveryQuery {
            tenant: Some(t.clone()),
            event_type: Some("odd".into()),
            limit: 100,
            ..DeliveryQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(odd.data.len(), 11, "filters apply to the records");
}

/// The outbox pages through every event once, keeping those created since a time.
pub async fn the_outbox_pages_events_since_a_time(store: &dyn Store) {
    let t = tenant(store).await;
    let since = Utc::now() - chrono::Duration::minutes(1);
    let mut want = Vec::new();
    for age_minutes in [120, 0, 0] {
        let event = Event {
            id: EventId::generate(),
            tenant_id: t.clone(),
            event_type: "a.b".into(),
            payload: "{}".into(),
            created_at: Utc::now() - chrono::Duration::minutes(age_minutes),
        };
        store.publish(&event).await.unwrap();
        if age_minutes == 0 {
            want.push(event.id);
        }
    }
    let (mut seen, mut cursor) = (Vec::new(), None::<String>);
    for _ in 0..10_000 {
        let page = store
            .outbox_page(since, cursor.as_deref(), 2)
            .await
            .unwrap();
        seen.extend(
            page.events
                .into_iter()
                .filter(|e| e.tenant_id == t)
                .map(|e| e.id),
        );
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    seen.sort();
    want.sort();
    assert_eq!(seen, want, "the two recent events, once each");
}

/// A counter counts each token once, and says its value either way.
pub async fn counters_count_each_token_once(store: &dyn Store) {
    let ttl = std::time::Duration::from_secs(3600);
    let key = format!("conf#{}", rand::random::<u64>());
    let token = |n: u32| format!("counted#{key}#{n}");
    assert_eq!(store.increment_once(&key, &token(1), ttl).await.unwrap(), 1);
    assert_eq!(
        store.increment_once(&key, &token(1), ttl).await.unwrap(),
        1,
        "again: not counted"
    );
    assert_eq!(store.increment_once(&key, &token(2), ttl).await.unwrap(), 2);
    assert_eq!(
        store.increment(&key, ttl).await.unwrap(),
        3,
        "the same counter"
    );
}
