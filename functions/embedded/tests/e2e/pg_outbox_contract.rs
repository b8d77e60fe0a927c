//! The outbox table's contract as a drain holds it: the columns it needs (a payload
//! that is not `jsonb` is refused, by `outbox init` and in `/healthz`), a table keyed
//! by tenant and id drained row by row (two tenants' events may share an id, as in
//! the API), and a payload the API would refuse quarantined.

use std::time::Duration;

use entrega_testkit::postgres::PgCluster;
use serde_json::json;

use crate::harness::*;
use crate::pg_outbox::*;

/// A table made by hand to the letter of the contract, but for `id` (a `uuid`, as the
/// README allows), `payload` (`json`) and `created_at` (`text`).
const HAND_MADE: &str = "
    CREATE TABLE entrega_outbox (
        id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        tenant_id  text NOT NULL,
        type       text NOT NULL,
        payload    json NOT NULL,
        created_at text NOT NULL DEFAULT clock_timestamp()::text
    );
    COMMENT ON TABLE entrega_outbox IS 'entrega outbox v1';";

/// The reason of the one row in quarantine, once there is one.
async fn quarantined_reason(db: &tokio_postgres::Client) -> String {
    eventually(Duration::from_secs(10), "a row quarantined", || async {
        db.query_opt("SELECT reason FROM entrega_outbox_quarantine", &[])
            .await
            .unwrap()
            .map(|r| r.get(0))
    })
    .await
}

/// The table's primary key columns, in order.
async fn primary_key(db: &tokio_postgres::Client) -> Vec<String> {
    db.query(
        "SELECT a.attname::text
           FROM pg_constraint c
           JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, place) ON true
           JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
          WHERE c.conrelid = 'entrega_outbox'::regclass AND c.contype = 'p'
          ORDER BY k.place",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_table_contract_is_checked_and_a_table_keyed_by_tenant_drains_row_by_row() {
    let pg = PgCluster::start();
    let db = connect(&pg.url()).await;
    db.batch_execute(&format!("CREATE ROLE {DRAIN_ROLE} LOGIN; {HAND_MADE}"))
        .await
        .unwrap();
    let init = [
        "outbox",
        "init",
        "--postgres",
        &pg.url(),
        "--grant-to",
        DRAIN_ROLE,
    ];

    // A `json` payload (duplicate keys, text that jsonb would refuse): refused by
    // `init`, and by the drain, which says why in `/healthz` and drains nothing.
    let said = entrega_fails(&init);
    assert!(
        said.contains("entrega_outbox.payload is `json`") && said.contains("jsonb"),
        "{said}"
    );
    db.batch_execute(&format!("GRANT SELECT ON entrega_outbox TO {DRAIN_ROLE}"))
        .await
        .unwrap();
    let dir = TempDir::new("pg-contract");
    let mut server = Server::start_loopback(&dir, &["--outbox", &pg.url_as(DRAIN_ROLE)]);
    let health = degraded_health(&server).await;
    assert!(
        health.contains("entrega_outbox.payload is `json`"),
        "{health}"
    );
    server.stop();

    // Made `jsonb`, the `text` time is refused: a bad row's copy into quarantine
    // (a `timestamptz`) failed, and with it every batch, for good.
    db.batch_execute("ALTER TABLE entrega_outbox ALTER COLUMN payload TYPE jsonb")
        .await
        .unwrap();
    let said = entrega_fails(&init);
    assert!(said.contains("created_at"), "{said}");

    // Made a time, `init` takes the table; a `uuid` id drains as text. Keyed by
    // tenant and id (as the README shows), two tenants' rows may share an id.
    db.batch_execute(
        "ALTER TABLE entrega_outbox
           ALTER COLUMN created_at DROP DEFAULT,
           ALTER COLUMN created_at TYPE timestamptz USING created_at::timestamptz,
           ALTER COLUMN created_at SET DEFAULT clock_timestamp()",
    )
    .await
    .unwrap();
    entrega_succeeds(&init, &[]);
    assert_eq!(primary_key(&db).await, ["id"], "init re-keys nothing");
    db.batch_execute(
        "ALTER TABLE entrega_outbox DROP CONSTRAINT entrega_outbox_pkey,
                                    ADD PRIMARY KEY (tenant_id, id)",
    )
    .await
    .unwrap();
    entrega_succeeds(&init, &[]);
    assert_eq!(primary_key(&db).await, ["tenant_id", "id"]);

    let server = Server::start_loopback(&dir, &["--outbox", &pg.url_as(DRAIN_ROLE)]);
    let receiver = Receiver::answering(200).await;
    let (a, acme) = server.admin().tenant("Acme CRM").await;
    let (b, bolt) = server.admin().tenant("Bolt CRM").await;
    acme.endpoint(json!({"url": receiver.url("/acme")})).await;
    bolt.endpoint(json!({"url": receiver.url("/bolt")})).await;
    let shared = "6a1f4f5e-8f3b-4b8e-9c55-0d1c2b3a4f5e";
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    db.batch_execute(&format!(
        "BEGIN;
         INSERT INTO entrega_outbox (id, tenant_id, type, payload)
              VALUES ('{shared}', '{a}', 'lead.created', '{{\"for\": \"a\"}}'),
                     ('{shared}', '{b}', 'lead.created', '{{\"for\": \"b\"}}');
         INSERT INTO entrega_outbox (tenant_id, type, payload)
              VALUES ('{a}', 'lead.created', '{deep}');
         COMMIT;"
    ))
    .await
    .expect("one id for two tenants, in one transaction");
    let got = eventually(
        Duration::from_secs(20),
        "both tenants' webhooks",
        || async {
            let got = receiver.got();
            (got.len() >= 2).then_some(got)
        },
    )
    .await;
    let mut paths: Vec<(&str, &str)> = got
        .iter()
        .map(|r| (r.path.as_str(), r.header("webhook-id")))
        .collect();
    paths.sort();
    assert_eq!(paths, [("/acme", shared), ("/bolt", shared)]);
    let bodies: Vec<serde_json::Value> = got
        .iter()
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect();
    for (r, body) in got.iter().zip(&bodies) {
        assert_eq!(
            body["data"]["for"],
            if r.path == "/acme" { "a" } else { "b" }
        );
    }

    // Nested deeper than the API takes: quarantined, as `POST /v1/events` refuses it.
    let reason = quarantined_reason(&db).await;
    assert_eq!(reason, "bad_payload");
    assert_eq!(outbox_rows(&db).await, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.got().len(), 2, "the deep row is never sent");

    // Changed under a connected drain, the table is checked again within
    // `CONTRACT_RECHECK`, not only at the next reconnect.
    db.batch_execute("ALTER TABLE entrega_outbox ALTER COLUMN payload TYPE json")
        .await
        .unwrap();
    let health = degraded_health_within(&server, Duration::from_secs(30)).await;
    assert!(
        health.contains("entrega_outbox.payload is `json`"),
        "{health}"
    );
}

/// A `tenant_id` column of another type (a `uuid`) holds no tenant Entrega has, but
/// it must not stop the drain: its rows are quarantined as unknown tenants. (The
/// batch query compared it with a text array, and failed every batch.)
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_column_of_another_type_does_not_stop_the_drain() {
    let pg = PgCluster::start();
    let db = connect(&pg.url()).await;
    db.batch_execute(&format!(
        "CREATE ROLE {DRAIN_ROLE} LOGIN;
         CREATE TABLE entrega_outbox (
             id         text PRIMARY KEY DEFAULT gen_random_uuid()::text,
             tenant_id  uuid NOT NULL,
             type       text NOT NULL,
             payload    jsonb NOT NULL,
             created_at timestamptz NOT NULL DEFAULT clock_timestamp()
         );
         COMMENT ON TABLE entrega_outbox IS 'entrega outbox v1';
         INSERT INTO entrega_outbox (tenant_id, type, payload)
              VALUES (gen_random_uuid(), 'lead.created', '{{}}');"
    ))
    .await
    .unwrap();
    entrega_succeeds(
        &[
            "outbox",
            "init",
            "--postgres",
            &pg.url(),
            "--grant-to",
            DRAIN_ROLE,
        ],
        &[],
    );
    let dir = TempDir::new("pg-tenant-uuid");
    let _server = Server::start_loopback(&dir, &["--outbox", &pg.url_as(DRAIN_ROLE)]);
    let reason = quarantined_reason(&db).await;
    assert_eq!(reason, "unknown_tenant");
    assert_eq!(outbox_rows(&db).await, 0);
}
