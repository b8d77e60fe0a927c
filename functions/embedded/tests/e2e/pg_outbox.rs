//! A producer's transactional outbox in a real PostgreSQL (a throw-away cluster):
//! the producer's business write and its outbox row commit together, and `entrega
//! serve --outbox` turns exactly the committed rows into delivered, signed webhooks.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use entrega_core::signature::{verify, Secret};
use entrega_testkit::postgres::PgCluster;
use serde_json::json;
use tokio_postgres::{Client, NoTls};

use crate::harness::*;

/// The role Entrega drains as: only what `entrega outbox init --grant-to` gives it.
pub(crate) const DRAIN_ROLE: &str = "entrega_drain";

pub(crate) async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A cluster with the producer's own table, the outbox made by `entrega outbox init`
/// (run twice: it is idempotent), and a least-privilege role for the drain.
pub(crate) async fn producer_database() -> (PgCluster, Client) {
    let pg = PgCluster::start();
    let admin = outbox_ready(&pg, &[]).await;
    (pg, admin)
}

/// The producer's table, the outbox and the drain's role on `pg`; `env` for `entrega
/// outbox init` (a trusted certificate).
pub(crate) async fn outbox_ready(pg: &PgCluster, env: &[(&str, &str)]) -> Client {
    let admin = connect(&pg.url()).await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {DRAIN_ROLE} LOGIN;
             CREATE TABLE leads (id serial PRIMARY KEY, name text NOT NULL);"
        ))
        .await
        .unwrap();
    let url = pg.url();
    for _ in 0..2 {
        let init = [
            "outbox",
            "init",
            "--postgres",
            &url,
            "--grant-to",
            DRAIN_ROLE,
        ];
        entrega_succeeds(&init, env);
    }
    admin
}

/// The producer's transaction: a lead and its event, committed or rolled back together.
pub(crate) async fn create_lead(db: &mut Client, tenant: &str, name: &str, commit: bool) -> String {
    let tx = db.transaction().await.unwrap();
    tx.execute("INSERT INTO leads (name) VALUES ($1)", &[&name])
        .await
        .unwrap();
    let id: String = tx
        .query_one(
            "INSERT INTO entrega_outbox (tenant_id, type, payload)
             VALUES ($1, 'lead.created', jsonb_build_object('name', $2::text))
             RETURNING id",
            &[&tenant, &name],
        )
        .await
        .unwrap()
        .get(0);
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    id
}

/// `/healthz` once it says degraded (503): its body.
pub(crate) async fn degraded_health(server: &Server) -> String {
    degraded_health_within(server, Duration::from_secs(10)).await
}

/// [`degraded_health`], waiting up to `limit`.
pub(crate) async fn degraded_health_within(server: &Server, limit: Duration) -> String {
    eventually(limit, "a degraded /healthz", || async {
        let resp = reqwest::get(format!("{}/healthz", server.base))
            .await
            .unwrap();
        (resp.status() == 503).then_some(resp.text().await.unwrap())
    })
    .await
}

pub(crate) async fn outbox_rows(db: &Client) -> i64 {
    db.query_one("SELECT count(*) FROM entrega_outbox", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_row_is_delivered_signed_a_rolled_back_one_never_and_a_bad_one_is_quarantined()
{
    let (pg, mut db) = producer_database().await;
    let dir = TempDir::new("pg-outbox");
    let server = Server::start_loopback(&dir, &["--outbox", &pg.url_as(DRAIN_ROLE)]);
    let (tenant, acme) = server.admin().tenant("Acme CRM").await;
    let receiver = Receiver::answering(200).await;
    let endpoint = acme.endpoint(json!({"url": receiver.url("/hooks")})).await;
    let secret: Secret = endpoint["secret"].as_str().unwrap().parse().unwrap();

    // A row no tenant owns, ahead of the good ones: quarantined, not in their way.
    let stranger = entrega_core::ids::TenantId::generate().to_string();
    let bad = create_lead(&mut db, &stranger, "Nobody", true).await;
    let huge: String = db
        .query_one(
            "INSERT INTO entrega_outbox (tenant_id, type, payload)
             VALUES ($1, 'lead.created', jsonb_build_object('pad', repeat('x', 300000)))
             RETURNING id",
            &[&tenant],
        )
        .await
        .unwrap()
        .get(0);
    let rolled_back = create_lead(&mut db, &tenant, "Never", false).await;
    // An id the API already published with other content.
    let reused = acme
        .post(
            "/v1/events",
            json!({"type": "lead.created", "data": {"name": "API"}, "id": "lead-7"}),
        )
        .await;
    assert_eq!(reused.0, 202, "{}", reused.1);
    db.execute(
        "INSERT INTO entrega_outbox (id, tenant_id, type, payload)
         VALUES ('lead-7', $1, 'lead.created', '{\"name\": \"outbox\"}')",
        &[&tenant],
    )
    .await
    .unwrap();
    let committed_at = Instant::now();
    let committed = create_lead(&mut db, &tenant, "Ada", true).await;

    let got = &eventually(
        Duration::from_secs(10),
        "the committed lead's webhook",
        || async {
            receiver
                .got()
                .into_iter()
                .find(|r| r.header("webhook-id") == committed)
        },
    )
    .await;
    println!(
        "PostgreSQL outbox: commit -> delivered in {:?} (LISTEN/NOTIFY wake-up)",
        got.at - committed_at
    );
    assert_eq!(got.header("webhook-id"), committed);
    verify(
        &[secret],
        &committed,
        got.header("webhook-timestamp").parse().unwrap(),
        got.body.as_bytes(),
        got.header("webhook-signature"),
        chrono::Utc::now().timestamp(),
        300,
    )
    .expect("signed with the endpoint's secret");
    let body: serde_json::Value = serde_json::from_str(&got.body).unwrap();
    assert_eq!(body["data"], json!({"name": "Ada"}));

    let (status, _) = acme.get(&format!("/v1/events/{rolled_back}")).await;
    assert_eq!(status, 404, "a rolled-back transaction is no event");
    let quarantined = |id: String| {
        let db = &db;
        async move {
            let row = db
                .query_one(
                    "SELECT reason, octet_length(payload::text)
                       FROM entrega_outbox_quarantine WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            (row.get::<_, String>(0), row.get::<_, i32>(1))
        }
    };
    assert_eq!(quarantined(bad).await.0, "unknown_tenant");
    let (reason, kept) = quarantined(huge).await;
    assert_eq!(reason, "too_large");
    assert!(kept > 300_000, "kept whole in quarantine");
    assert_eq!(
        quarantined("lead-7".into()).await.0,
        "id_reused",
        "the API's event is kept, not replaced"
    );
    assert_eq!(
        outbox_rows(&db).await,
        0,
        "every row drained or quarantined"
    );
    let (_, metrics) = server.metrics(ADMIN_KEY).await;
    assert!(
        metrics.contains(r#"entrega_producer_outbox_quarantined_total{reason="unknown_tenant"} 1"#)
            && metrics
                .contains(r#"entrega_producer_outbox_quarantined_total{reason="too_large"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("entrega_producer_outbox_events_total 1"),
        "{metrics}"
    );
    // Nothing more arrives: not the rolled-back row, not the reused id a second time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids: Vec<String> = receiver
        .got()
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&committed) && ids.contains(&"lead-7".to_owned()));
    let api_body: serde_json::Value = serde_json::from_str(
        &receiver
            .got()
            .into_iter()
            .find(|r| r.header("webhook-id") == "lead-7")
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(api_body["data"], json!({"name": "API"}));
}

/// Two drains of one table while producers commit from eight connections: each row
/// becomes one event, delivered once; no row is skipped.
#[tokio::test(flavor = "multi_thread")]
async fn two_drains_neither_double_nor_skip_a_row() {
    const PRODUCERS: usize = 8;
    const LEADS_EACH: usize = 250;
    let (pg, _db) = producer_database().await;
    let url = pg.url_as(DRAIN_ROLE);
    let dir = TempDir::new("pg-two-drains");
    let server = Server::start_loopback(&dir, &["--outbox", &url, "--outbox", &url]);
    let (tenant, acme) = server.admin().tenant("Acme CRM").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/hooks"), "max_concurrency": 64}))
        .await;

    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let (url, tenant) = (pg.url(), tenant.clone());
        producers.push(tokio::spawn(async move {
            let mut db = connect(&url).await;
            let mut ids = Vec::new();
            for i in 0..LEADS_EACH {
                ids.push(create_lead(&mut db, &tenant, &format!("lead {p}-{i}"), true).await);
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for p in producers {
        ids.extend(p.await.unwrap());
    }
    all_delivered(&receiver, &ids, Duration::from_secs(60)).await;
    let mut times: HashMap<String, usize> = HashMap::new();
    for got in receiver.got() {
        *times
            .entry(got.header("webhook-id").to_owned())
            .or_default() += 1;
    }
    assert_eq!(times.len(), ids.len(), "one event per row, none skipped");
    assert!(
        times.values().all(|n| *n == 1),
        "no row became two deliveries"
    );
}

/// `kill -9` while a backlog drains: after a restart every committed row is an event,
/// and each reached the receiver.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_mid_drain_loses_nothing() {
    const LEADS: i64 = 20_000;
    let (pg, db) = producer_database().await;
    let url = pg.url_as(DRAIN_ROLE);
    let dir = TempDir::new("pg-kill");
    let mut server = Server::start_loopback(&dir, &[]);
    let (tenant, acme) = server.admin().tenant("Acme CRM").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/hooks"), "max_concurrency": 64}))
        .await;
    server.stop();
    let ids: Vec<String> = db
        .query(
            "INSERT INTO entrega_outbox (tenant_id, type, payload)
             SELECT $1, 'lead.created', jsonb_build_object('n', n)
               FROM generate_series(1, $2::bigint) AS n
             RETURNING id",
            &[&tenant, &LEADS],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();

    let mut server = Server::start_loopback(&dir, &["--outbox", &url]);
    let left = eventually(Duration::from_secs(30), "the drain under way", || async {
        let left = outbox_rows(&db).await;
        (left < LEADS).then_some(left)
    })
    .await;
    server.kill_hard();
    let after_kill = outbox_rows(&db).await;
    println!("killed with {left}..{after_kill} of {LEADS} rows still in the outbox");
    assert!(after_kill > 0, "killed mid-drain, not after it");

    let _server = Server::start_loopback(&dir, &["--outbox", &url]);
    all_delivered(&receiver, &ids, Duration::from_secs(120)).await;
    assert_eq!(outbox_rows(&db).await, 0);
}

/// A tenant at its backlog limit gets back-pressure, not loss: its rows wait in the
/// producer's outbox, and another tenant's rows behind them are drained and delivered.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_backlog_leaves_rows_waiting_without_holding_up_other_tenants() {
    const BACKLOG: i64 = 20;
    let (pg, mut db) = producer_database().await;
    let dir = TempDir::new("pg-backpressure");
    let server = Server::start_loopback(
        &dir,
        &[
            "--outbox",
            &pg.url_as(DRAIN_ROLE),
            "--max-backlog",
            &BACKLOG.to_string(),
        ],
    );
    let (busy_tenant, busy) = server.admin().tenant("Busy").await;
    let down = Receiver::answering(503).await;
    busy.endpoint(json!({"url": down.url("/hooks")})).await;
    let (calm_tenant, calm) = server.admin().tenant("Calm").await;
    let up = Receiver::answering(200).await;
    calm.endpoint(json!({"url": up.url("/hooks")})).await;

    // In one transaction, so one batch holds them all: the limit must hold inside a
    // batch, not only between batches.
    db.execute(
        "INSERT INTO entrega_outbox (tenant_id, type, payload)
         SELECT $1, 'lead.created', jsonb_build_object('n', n)
           FROM generate_series(1, $2::bigint) AS n",
        &[&busy_tenant, &(BACKLOG * 3)],
    )
    .await
    .unwrap();
    let calm_id = create_lead(&mut db, &calm_tenant, "calm", true).await;
    all_delivered(&up, &[calm_id], Duration::from_secs(20)).await;
    let waiting: i64 = db
        .query_one(
            "SELECT count(*) FROM entrega_outbox WHERE tenant_id = $1",
            &[&busy_tenant],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        waiting,
        BACKLOG * 2,
        "the busy tenant has exactly its backlog's worth accepted; the rest wait at the source"
    );
    let quarantined: i64 = db
        .query_one("SELECT count(*) FROM entrega_outbox_quarantine", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(quarantined, 0, "held back, not thrown away");
}

/// Whatever the producer's clock put in `created_at` (years ahead, `infinity`,
/// `-infinity`), a row is an event accepted now and delivered at once; and a backlog
/// of large payloads, more than one batch may hold in memory, drains over several.
#[tokio::test(flavor = "multi_thread")]
async fn odd_times_and_large_payloads_drain_and_deliver() {
    let (pg, db) = producer_database().await;
    let dir = TempDir::new("pg-odd");
    let server = Server::start_loopback(&dir, &["--outbox", &pg.url_as(DRAIN_ROLE)]);
    let (tenant, acme) = server.admin().tenant("Acme CRM").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/hooks"), "max_concurrency": 32}))
        .await;
    let mut ids = Vec::new();
    for created_at in [
        "-infinity",
        "infinity",
        "294276-12-31",
        "now() + interval '1 day'",
    ] {
        let when = if created_at.starts_with("now") {
            created_at.to_owned()
        } else {
            format!("'{created_at}'")
        };
        let id: String = db
            .query_one(
                &format!(
                    "INSERT INTO entrega_outbox (tenant_id, type, payload, created_at)
                     VALUES ($1, 'lead.created', '{{}}', {when}) RETURNING id"
                ),
                &[&tenant],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    all_delivered(&receiver, &ids, Duration::from_secs(10)).await;

    // 100 rows of 250 KB: 25 MB, more than one batch takes in (16 MiB).
    let large: Vec<String> = db
        .query(
            "INSERT INTO entrega_outbox (tenant_id, type, payload)
             SELECT $1, 'lead.created', jsonb_build_object('pad', repeat('x', 250000))
               FROM generate_series(1, 100)
             RETURNING id",
            &[&tenant],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    all_delivered(&receiver, &large, Duration::from_secs(60)).await;
    assert_eq!(outbox_rows(&db).await, 0);
}

/// The drain is part of `entrega serve` on either backend: on the AWS one (DynamoDB and
/// SQS on the emulator) a committed row is delivered too, fanned out by the outbox
/// table's stream.
#[cfg(feature = "aws")]
#[tokio::test(flavor = "multi_thread")]
async fn the_aws_backend_drains_the_outbox_too() {
    let (pg, mut db) = producer_database().await;
    let moto = entrega_testkit::Moto::start();
    let env = crate::aws_backend::aws_env(&moto);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    entrega_succeeds(
        &["provision", "--backend", "aws", "--aws-prefix", "pgo"],
        &env,
    );
    let dir = TempDir::new("pg-aws");
    let url = pg.url_as(DRAIN_ROLE);
    let flags = [
        &LOOPBACK[..],
        &["--backend", "aws", "--aws-prefix", "pgo", "--outbox", &url],
    ]
    .concat();
    let server = Server::start_env(&dir, &flags, &env);
    let (tenant, acme) = server.admin().tenant("Acme on AWS").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/hooks")})).await;
    let id = create_lead(&mut db, &tenant, "Ada", true).await;
    all_delivered(&receiver, &[id], Duration::from_secs(30)).await;
    assert_eq!(outbox_rows(&db).await, 0);
}
