//! A database written by the previous schema opens with what it holds intact.

use std::sync::Arc;

use chrono::{TimeZone, Utc};
use entrega_core::delivery::{Attempt, Delivery, DeliveryState, Trigger};
use entrega_core::event::Event;
use entrega_core::ids::{AttemptId, DeliveryId, EndpointId, EventId, TenantId};
use entrega_core::ports::{DeliveryStore, SystemClock};
use rusqlite::params;

use crate::sqlite::{SqliteDb, SqliteStore};

/// The tables schema 2 wrote that schema 3 changes, as it wrote them.
const SCHEMA_2: &str = r#"
CREATE TABLE deliveries (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    endpoint_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    state TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    version INTEGER NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX deliveries_due ON deliveries
    (coalesce(json_extract(json, '$.next_attempt_at'), json_extract(json, '$.lease_until')))
    WHERE state IN ('pending', 'delivering', 'retrying');
CREATE TABLE attempts (
    id TEXT PRIMARY KEY,
    delivery_id TEXT NOT NULL,
    endpoint_id TEXT NOT NULL,
    started_at TEXT NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX attempts_by_delivery ON attempts (delivery_id);
CREATE INDEX attempts_by_endpoint ON attempts (endpoint_id, started_at);
CREATE TABLE queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    body TEXT NOT NULL,
    grp TEXT NOT NULL,
    ckey TEXT,
    climit INTEGER NOT NULL,
    visible_at INTEGER NOT NULL,
    in_flight INTEGER NOT NULL DEFAULT 0,
    receive_count INTEGER NOT NULL DEFAULT 0,
    receipt TEXT
);
CREATE INDEX queue_ready ON queue (queue, grp, visible_at);
CREATE INDEX queue_in_flight ON queue (queue, in_flight, ckey);
PRAGMA user_version = 2;
"#;

fn delivery(state: DeliveryState, due_hours_ago: i64) -> Delivery {
    let t0 = Utc.with_ymd_and_hms(2001, 1, 1, 12, 0, 0).unwrap();
    let event = Event {
        id: EventId::generate(),
        tenant_id: TenantId::generate(),
        event_type: "a.b".into(),
        payload: "{}".into(),
        created_at: t0,
    };
    let endpoint = EndpointId::generate();
    let id = DeliveryId::for_event(&event.id, &endpoint, t0.timestamp_millis());
    let mut d = Delivery::new(id, &event, endpoint, false, t0);
    d.state = state;
    d.next_attempt_at = Some(t0 - chrono::Duration::hours(due_hours_ago));
    d
}

fn attempt(d: &Delivery) -> Attempt {
    Attempt {
        id: AttemptId::generate(),
        delivery_id: d.id.clone(),
        tenant_id: d.tenant_id.clone(),
        endpoint_id: d.endpoint_id.clone(),
        generation: 0,
        number: 1,
        started_at: d.created_at,
        duration_ms: 5,
        status_code: Some(503),
        failure_kind: None,
        error: None,
        response_excerpt: None,
        trigger: Trigger::Scheduled,
        requested_by: None,
    }
}

#[tokio::test]
async fn a_schema_2_database_keeps_its_deliveries_attempts_and_due_times() {
    let dir = entrega_testkit::TempDir::new("schema-2");
    let path = dir.0.join("old.db");
    let waiting = delivery(DeliveryState::Retrying, 3);
    let delivered = delivery(DeliveryState::Delivered, 5);
    let tried = attempt(&waiting);
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(SCHEMA_2).unwrap();
        for d in [&waiting, &delivered] {
            conn.execute(
                "INSERT INTO deliveries VALUES (?1, ?2, ?3, ?4, 'a.b', ?5, ?6, '', 0, ?7)",
                params![
                    d.id.as_str(),
                    d.tenant_id.as_str(),
                    d.endpoint_id.as_str(),
                    d.event_id.as_str(),
                    d.state.as_str(),
                    d.state.status().as_str(),
                    serde_json::to_string(d).unwrap()
                ],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO attempts VALUES (?1, ?2, ?3, '', ?4)",
            params![
                tried.id.as_str(),
                tried.delivery_id.as_str(),
                tried.endpoint_id.as_str(),
                serde_json::to_string(&tried).unwrap()
            ],
        )
        .unwrap();
    }

    let db = SqliteDb::open(&path).unwrap();
    let store = SqliteStore::new(db.clone(), Arc::new(SystemClock));
    let overdue = store.overdue_deliveries(Utc::now(), 10).await.unwrap();
    assert_eq!(
        overdue.iter().map(|d| &d.id).collect::<Vec<_>>(),
        [&waiting.id],
        "the waiting delivery is due; the delivered one is not"
    );
    let attempts = store.list_attempts(&waiting.id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].id, tried.id);
    let (version, indexes, by_endpoint): (i64, i64, String) = db
        .call(|conn| {
            Ok((
                conn.pragma_query_value(None, "user_version", |r| r.get(0))?,
                conn.query_row(
                    "SELECT COUNT(*) FROM sqlite_master
                     WHERE type = 'index' AND name IN ('queue_ready', 'queue_in_flight')",
                    [],
                    |r| r.get(0),
                )?,
                conn.query_row(
                    "SELECT group_concat(tbl_name) FROM sqlite_master
                     WHERE name = 'attempts_by_endpoint'",
                    [],
                    |r| r.get(0),
                )?,
            ))
        })
        .await
        .unwrap();
    assert_eq!(version, super::SCHEMA_VERSION);
    assert_eq!(indexes, 0, "the queue's unread indexes are gone");
    assert_eq!(
        by_endpoint, "attempts",
        "the endpoint index is on the new table"
    );
    // And the migrated delivery is written as any other.
    let mut next = overdue[0].clone();
    next.state = DeliveryState::Delivered;
    store.save_delivery(&next, &[]).await.unwrap();
    assert!(store
        .overdue_deliveries(Utc::now(), 10)
        .await
        .unwrap()
        .is_empty());
}

/// Schema 3's endpoint index keyed by state is replaced: the endpoint's log and its
/// paused deliveries each have an index that a change of state does not move (but for
/// a pause and its resume), and the resume's page reads only the paused ones.
#[tokio::test]
async fn a_schema_3_database_loses_its_index_by_state() {
    let dir = entrega_testkit::TempDir::new("schema-3");
    let path = dir.0.join("old.db");
    let paused = delivery(DeliveryState::Paused, 1);
    {
        let db = SqliteDb::open(&path).unwrap();
        let store = SqliteStore::new(db.clone(), Arc::new(SystemClock));
        store.create_delivery_if_absent(&paused).await.unwrap();
        db.call(|conn| {
            conn.execute_batch(
                "DROP INDEX deliveries_of_endpoint;
                 DROP INDEX deliveries_paused;
                 CREATE INDEX deliveries_by_endpoint ON deliveries (endpoint_id, state, id);
                 PRAGMA user_version = 3;",
            )?;
            Ok(())
        })
        .await
        .unwrap();
    }

    let db = SqliteDb::open(&path).unwrap();
    let store = SqliteStore::new(db.clone(), Arc::new(SystemClock));
    let page = store
        .paused_deliveries(&paused.endpoint_id, None, 10)
        .await
        .unwrap();
    assert_eq!(
        page.data.iter().map(|d| &d.id).collect::<Vec<_>>(),
        [&paused.id]
    );
    let (version, indexes, plan): (i64, String, String) = db
        .call(|conn| {
            Ok((
                conn.pragma_query_value(None, "user_version", |r| r.get(0))?,
                conn.query_row(
                    "SELECT group_concat(name, ',') FROM (SELECT name FROM sqlite_master
                     WHERE name IN ('deliveries_by_endpoint', 'deliveries_of_endpoint',
                                    'deliveries_paused')
                     ORDER BY name)",
                    [],
                    |r| r.get(0),
                )?,
                conn.query_row(
                    "EXPLAIN QUERY PLAN SELECT json FROM deliveries
                     WHERE endpoint_id = 'e' AND state = 'paused' AND id > '' ORDER BY id LIMIT 5",
                    [],
                    |r| r.get(3),
                )?,
            ))
        })
        .await
        .unwrap();
    assert_eq!(version, super::SCHEMA_VERSION);
    assert_eq!(indexes, "deliveries_of_endpoint,deliveries_paused");
    assert!(
        plan.contains("deliveries_paused"),
        "the resume reads: {plan}"
    );
}

/// Another program's database is refused as such, and left as it was: it failed
/// half-way through the migration with an SQL error naming a column (a hostile test).
#[test]
fn another_programs_database_is_refused_and_left_alone() {
    let dir = entrega_testkit::TempDir::new("schema-other");
    let path = dir.0.join("other.db");
    let schema = "CREATE TABLE events (id INTEGER PRIMARY KEY, body TEXT);
                  CREATE TABLE deliveries (id INTEGER PRIMARY KEY, at TEXT);
                  INSERT INTO events VALUES (1, 'kept');";
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(schema)
        .unwrap();
    let refused = SqliteDb::open(&path).err().expect("refused").to_string();
    assert!(refused.contains("not an Entrega database"), "{refused}");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(tables, ["deliveries", "events"]);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete", "not switched to WAL");
    let body: String = conn
        .query_row("SELECT body FROM events WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    assert_eq!(body, "kept");
}
