//! The read caches: never an answer older than a confirmed write, bounded in age and
//! size; and the store's two users of them.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use entrega_core::endpoint::Endpoint;
use entrega_core::ids::TenantId;
use entrega_core::ports::{Clock, EndpointStore, ManualClock, TenantStore};
use entrega_core::tenant::{Principal, Tenant};

use super::*;
use crate::sqlite::{SqliteDb, SqliteStore};

fn at(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0).unwrap()
}

#[test]
fn a_value_read_before_a_write_is_never_used_after_it() {
    let cache = ReadCache::<&str, u32>::default();
    let before = cache.generation();
    cache.invalidate();
    cache.put("a", 1, before, at(0));
    assert_eq!(cache.get(&"a", at(0)), None, "read before the write");
    cache.put("a", 2, cache.generation(), at(0));
    assert_eq!(cache.get(&"a", at(0)), Some(2), "read after it");
    cache.invalidate();
    assert_eq!(cache.get(&"a", at(0)), None, "a later write");
}

#[test]
fn an_entry_is_trusted_for_a_while_only() {
    let cache = ReadCache::<&str, u32>::default();
    cache.put("a", 1, cache.generation(), at(0));
    let last = TRUSTED_FOR.num_seconds() - 1;
    assert_eq!(cache.get(&"a", at(last)), Some(1));
    assert_eq!(cache.get(&"a", at(last + 1)), None);
}

#[test]
fn the_cache_holds_a_bounded_number_of_entries() {
    let cache = ReadCache::<usize, u32>::default();
    for key in 0..MAX_ENTRIES + 10 {
        cache.put(key, 1, cache.generation(), at(0));
        assert!(cache.entries().len() <= MAX_ENTRIES);
    }
    assert_eq!(cache.get(&(MAX_ENTRIES + 9), at(0)), Some(1), "the newest");
}

/// A store on a fresh database under a clock that moves only when told, so no entry
/// ages out unless the test says so.
fn store(name: &str) -> (entrega_testkit::TempDir, SqliteStore, Arc<ManualClock>) {
    let dir = entrega_testkit::TempDir::new(name);
    let clock = Arc::new(ManualClock::new(at(0)));
    let store = SqliteStore::new(SqliteDb::open(&dir.0.join("c.db")).unwrap(), clock.clone());
    (dir, store, clock)
}

async fn tenant_with_key(store: &SqliteStore, now: DateTime<Utc>, key_hash: &str) -> Tenant {
    let tenant = Tenant {
        id: TenantId::generate(),
        name: "T".into(),
        owner_email: "owner@example.com".into(),
        created_at: now,
    };
    store.create_tenant(&tenant, key_hash).await.unwrap();
    tenant
}

async fn listed(store: &SqliteStore, tenant: &TenantId) -> Vec<Endpoint> {
    store.tenant_endpoints(tenant).await.unwrap()
}

#[tokio::test]
async fn a_tenants_endpoints_show_every_write_through_the_store_at_once() {
    let (_dir, store, clock) = store("cache-endpoints");
    let tenant = TenantId::generate();
    assert!(listed(&store, &tenant).await.is_empty());

    let mut endpoint = Endpoint::new(tenant.clone(), "https://hooks.example.com/", clock.now());
    store
        .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    assert_eq!(listed(&store, &tenant).await.len(), 1, "created");

    endpoint.disabled = true;
    let endpoint = store.update_endpoint(&endpoint).await.unwrap();
    assert!(listed(&store, &tenant).await[0].disabled, "updated");

    let health = store
        .update_endpoint_health(&endpoint.id, &endpoint.health)
        .await
        .unwrap();
    assert_eq!(
        listed(&store, &tenant).await[0].health.version,
        health.version
    );

    store.delete_endpoint(&endpoint.id).await.unwrap();
    assert!(listed(&store, &tenant).await.is_empty(), "deleted");
}

#[tokio::test]
async fn a_change_made_by_hand_is_seen_once_its_entry_is_no_longer_trusted() {
    let (_dir, store, clock) = store("cache-by-hand");
    let tenant = tenant_with_key(&store, clock.now(), "hash-of-key").await;
    let endpoint = Endpoint::new(tenant.id.clone(), "https://hooks.example.com/", clock.now());
    store
        .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    let principal = Some(Principal::Tenant(tenant.id.clone()));
    assert_eq!(
        store.principal_for_key("hash-of-key").await.unwrap(),
        principal
    );
    assert_eq!(listed(&store, &tenant.id).await.len(), 1);

    // An operator's shell, past the store: the key revoked, the endpoint removed.
    store
        .db
        .call(|conn| {
            conn.execute_batch("DELETE FROM api_keys; DELETE FROM endpoints;")?;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(
        store.principal_for_key("hash-of-key").await.unwrap(),
        principal,
        "answered from memory while trusted"
    );
    assert_eq!(listed(&store, &tenant.id).await.len(), 1);

    clock.advance(Duration::from_secs(TRUSTED_FOR.num_seconds() as u64));
    assert_eq!(store.principal_for_key("hash-of-key").await.unwrap(), None);
    assert!(listed(&store, &tenant.id).await.is_empty());
}

#[tokio::test]
async fn a_key_that_names_nobody_is_not_remembered() {
    let (_dir, store, clock) = store("cache-unknown-key");
    assert_eq!(store.principal_for_key("hash-of-key").await.unwrap(), None);
    let tenant = tenant_with_key(&store, clock.now(), "hash-of-key").await;
    assert_eq!(
        store.principal_for_key("hash-of-key").await.unwrap(),
        Some(Principal::Tenant(tenant.id.clone()))
    );
}
