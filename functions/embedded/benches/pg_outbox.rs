//! The PostgreSQL outbox drain: a throw-away cluster on loopback, the real `entrega
//! serve --outbox` binary, and in one run:
//!
//! 0. one row at a time: commit -> delivered latency, woken by `LISTEN/NOTIFY`;
//! 1. a backlog: N rows (1 KiB payloads) committed at once for a tenant without
//!    endpoints; how fast the drain alone empties the table (rows/s into Entrega's
//!    store);
//! 2. the same for a tenant with one endpoint: the drain beside fan-out and delivery
//!    to a loopback receiver, and how fast they are delivered;
//! 3. a steady load: producers committing [`STEADY_RATE`] rows/s in small
//!    transactions for [`STEADY_SECONDS`]; the most rows the outbox held at once and
//!    commit → delivered latency (p50, p99), which say whether the drain keeps up.
//!
//! Figures are printed, never asserted (the machine is shared). Run with
//! `cargo bench -p entrega-embedded --bench pg_outbox`; `ENTREGA_BENCH_ROWS` sets N
//! (default [`DEFAULT_ROWS`]). The server programs come from `scripts/postgres-tools`
//! (`ENTREGA_PG_BIN`), or the machine's `/usr/lib/postgresql`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use entrega_testkit::postgres::PgCluster;
use tokio_postgres::{Client, NoTls};

mod common;
use common::server::{set_up_tenant, start_server};
use common::{start_receiver, Arrivals};

const DEFAULT_ROWS: i64 = 50_000;
const STEADY_RATE: usize = 5_000;
const STEADY_SECONDS: u64 = 10;
/// Rows per producer transaction in the steady load (one commit every 10 ms each).
const ROWS_PER_COMMIT: usize = 25;
const PRODUCERS: usize = STEADY_RATE / ROWS_PER_COMMIT / 100;
const ENDPOINT_CONCURRENCY: u32 = 64;
const LIMIT: Duration = Duration::from_secs(600);
const LOW_LOAD_ROWS: usize = 200;

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn outbox_rows(db: &Client) -> i64 {
    db.query_one("SELECT count(*) FROM entrega_outbox", &[])
        .await
        .unwrap()
        .get(0)
}

/// The `p` quantile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// A tenant without endpoints: its events are drained and fanned out to nobody.
async fn new_tenant(server: &common::server::Server) -> String {
    let (status, created) = common::server::post(
        &reqwest::Client::new(),
        format!("{}/v1/tenants", server.base),
        common::server::ADMIN_KEY,
        &serde_json::json!({"name": "Quiet", "owner_email": "owner@example.com"}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    created["tenant"]["id"].as_str().unwrap().to_owned()
}

async fn wait_delivered(arrivals: &Arrivals, want: usize) {
    let started = Instant::now();
    while arrivals.at.lock().unwrap().len() < want {
        assert!(started.elapsed() < LIMIT, "deliveries stalled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main]
async fn main() {
    let rows: i64 = std::env::var("ENTREGA_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ROWS);
    let pg = PgCluster::start();
    let mut db = connect(&pg.url()).await;
    entrega_embedded::pg_outbox::schema::init(&mut db, None)
        .await
        .unwrap();
    let (url, arrivals) = start_receiver().await;
    let server = start_server(&["--outbox".into(), pg.url()]);
    let (tenant, _key) = set_up_tenant(&server, &url, ENDPOINT_CONCURRENCY).await;
    let pad = "x".repeat(990);

    // 0. One row at a time: commit -> delivered, woken by LISTEN/NOTIFY.
    let mut one_by_one = Vec::new();
    for n in 0..LOW_LOAD_ROWS {
        let id = format!("low-{n}");
        db.execute(
            "INSERT INTO entrega_outbox (id, tenant_id, type, payload)
             VALUES ($1, $2, 'bench.event', jsonb_build_object('pad', $3::text))",
            &[&id, &tenant, &pad],
        )
        .await
        .unwrap();
        let committed = Instant::now();
        wait_delivered(&arrivals, n + 1).await;
        one_by_one.push(arrivals.at.lock().unwrap()[&id].saturating_duration_since(committed));
    }
    one_by_one.sort();
    println!(
        "one row at a time ({LOW_LOAD_ROWS}): commit -> delivered p50 {:.2} ms, p99 {:.2} ms",
        percentile(&one_by_one, 0.50).as_secs_f64() * 1000.0,
        percentile(&one_by_one, 0.99).as_secs_f64() * 1000.0,
    );

    // 1 and 2. A backlog committed at once: to a tenant with no endpoint (the drain
    // alone), then to the one whose endpoint receives them.
    let quiet = new_tenant(&server).await;
    for (label, owner) in [("no endpoint", &quiet), ("one endpoint", &tenant)] {
        let before = arrivals.at.lock().unwrap().len();
        let committed = Instant::now();
        db.execute(
            "INSERT INTO entrega_outbox (tenant_id, type, payload)
             SELECT $1, 'bench.event', jsonb_build_object('n', n, 'pad', $3::text)
               FROM generate_series(1, $2::bigint) AS n",
            &[owner, &rows, &pad],
        )
        .await
        .unwrap();
        let inserted = committed.elapsed();
        while outbox_rows(&db).await > 0 {
            assert!(committed.elapsed() < LIMIT, "the drain stalled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let drained = committed.elapsed();
        let mut line = format!(
            "backlog of {rows} rows, {label} (inserted in {:.2} s): drained in {:.2} s = {:.0} rows/s into the store",
            inserted.as_secs_f64(),
            drained.as_secs_f64(),
            rows as f64 / drained.as_secs_f64(),
        );
        if owner == &tenant {
            wait_delivered(&arrivals, before + rows as usize).await;
            let delivered = committed.elapsed();
            line += &format!(
                "; delivered in {:.2} s = {:.0} deliveries/s",
                delivered.as_secs_f64(),
                rows as f64 / delivered.as_secs_f64()
            );
        }
        println!("{line}");
    }

    // 3. A steady load at STEADY_RATE rows/s.
    let before = arrivals.at.lock().unwrap().len();
    let commits = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop_at = Instant::now() + Duration::from_secs(STEADY_SECONDS);
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let (url, tenant, pad, commits) = (pg.url(), tenant.clone(), pad.clone(), commits.clone());
        producers.push(tokio::spawn(async move {
            let mut db = connect(&url).await;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut n = 0usize;
            while Instant::now() < stop_at {
                tick.tick().await;
                let tx = db.transaction().await.unwrap();
                let ids: Vec<String> = tx
                    .query(
                        "INSERT INTO entrega_outbox (id, tenant_id, type, payload)
                         SELECT $1 || '-' || i, $2, 'bench.event', jsonb_build_object('pad', $3::text)
                           FROM generate_series(1, $4::int) AS i
                         RETURNING id",
                        &[
                            &format!("steady-{p}-{n}"),
                            &tenant,
                            &pad,
                            &(ROWS_PER_COMMIT as i32),
                        ],
                    )
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                tx.commit().await.unwrap();
                let at = Instant::now();
                commits.lock().unwrap().extend(ids.into_iter().map(|id| (id, at)));
                n += 1;
            }
        }));
    }
    let mut deepest = 0;
    while producers.iter().any(|p| !p.is_finished()) {
        deepest = deepest.max(outbox_rows(&db).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let commits = std::mem::take(&mut *commits.lock().unwrap());
    wait_delivered(&arrivals, before + commits.len()).await;
    let arrived = arrivals.at.lock().unwrap();
    let mut latencies: Vec<Duration> = commits
        .iter()
        .filter_map(|(id, at)| {
            arrived
                .get(id)
                .map(|got| got.saturating_duration_since(*at))
        })
        .collect();
    latencies.sort();
    println!(
        "steady {} rows/s for {STEADY_SECONDS} s ({} rows in {PRODUCERS} producers' transactions of {ROWS_PER_COMMIT}): \
         at most {deepest} rows waiting in the outbox; commit -> delivered p50 {:.1} ms, p99 {:.1} ms",
        commits.len() as u64 / STEADY_SECONDS,
        commits.len(),
        percentile(&latencies, 0.50).as_secs_f64() * 1000.0,
        percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
    );
}
