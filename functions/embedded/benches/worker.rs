//! The worker's hot path against the bare client, in one run: N deliveries queued in a
//! fresh SQLite store (full durability), then the embedded runtime's delivery loop —
//! receive, sign, the SSRF-guarded transport, classify, record, settle — drains them to
//! a loopback receiver answering 204, one endpoint at `max_concurrency`
//! [`DEFAULT_CONCURRENCY`] (`ENTREGA_BENCH_CONCURRENCY` sets another). The bare client
//! POSTs the same 1 KiB body at the same concurrency.
//!
//! Figures are printed, never asserted. `cargo bench -p entrega-embedded --bench
//! worker`; `ENTREGA_BENCH_DELIVERIES` sets N (default [`DEFAULT_DELIVERIES`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use entrega_core::conditions::Conditions;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::SystemClock;
use entrega_core::tenant::Tenant;
use entrega_embedded::fan_out::{fan_out_committed, FanOutsUnderWay};
use entrega_embedded::runtime::Runtime;
use entrega_embedded::serve::open_sqlite_parts;
use entrega_embedded::sqlite::Durability;
use entrega_http::transport::{HttpTransport, TargetPolicy};

mod common;
use common::{bare_client, cpu_seconds, payload, start_receiver};

// The `entrega` binary's allocator, so the figure is the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const DEFAULT_DELIVERIES: usize = 20_000;
const DEFAULT_CONCURRENCY: u32 = 64;
/// How long the drain may take before the bench gives up.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("ENTREGA_BENCH_DELIVERIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_DELIVERIES);
    let concurrency: u32 = std::env::var("ENTREGA_BENCH_CONCURRENCY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CONCURRENCY);
    let (url, arrivals) = start_receiver().await;
    let me = std::process::id();
    let cpu_before = cpu_seconds(me);
    let bare = bare_client(&url, n, concurrency as usize).await;
    let bare_cpu = cpu_seconds(me) - cpu_before;
    println!(
        "bare client: {bare:.0} requests/s ({n} POSTs of 1 KiB, concurrency {concurrency}); \
         CPU {:.1} µs a request (client and receiver)",
        1e6 * bare_cpu / n as f64
    );

    let dir = entrega_testkit::TempDir::new("bench-worker");
    let transport = Arc::new(HttpTransport::new(TargetPolicy {
        allowed_ranges: vec!["127.0.0.0/8".parse().unwrap()],
        allow_http: true,
    }));
    let (services, parts) = open_sqlite_parts(
        &dir.0.join("worker.db"),
        Durability::Full,
        Arc::new(SystemClock),
        transport,
    )
    .await
    .unwrap();
    let now = Utc::now();
    let tenant = Tenant {
        id: TenantId::generate(),
        name: "Bench".into(),
        owner_email: "owner@example.com".into(),
        created_at: now,
    };
    services
        .store
        .create_tenant(&tenant, "bench")
        .await
        .unwrap();
    let mut endpoint = Endpoint::new(tenant.id.clone(), url, now);
    endpoint.max_concurrency = concurrency;
    services
        .store
        .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
        .await
        .unwrap();
    let body = serde_json::to_string(&payload()["data"]).unwrap();
    for _ in 0..n {
        let event = Event {
            id: EventId::generate(),
            tenant_id: tenant.id.clone(),
            event_type: "bench.event".into(),
            payload: body.clone(),
            created_at: Utc::now(),
        };
        services.store.publish(&event).await.unwrap();
        // Marked fanned out, so the outbox poller does not fan it out again.
        fan_out_committed(&services, &parts.store, &FanOutsUnderWay::default(), &event)
            .await
            .unwrap();
    }

    let before = arrivals.count.load(Ordering::Relaxed);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runtime = Runtime {
        services,
        store: parts.store,
        delivery_queue: parts.deliveries,
        conditions: Arc::new(Conditions::default()),
        fan_outs_under_way: Default::default(),
        retention: None,
        slots: Default::default(),
    };
    println!("queued; draining");
    let started = Instant::now();
    let cpu_before = cpu_seconds(me);
    let running = tokio::spawn(runtime.run(stopped));
    while arrivals.count.load(Ordering::Relaxed) - before < n {
        assert!(
            started.elapsed() < DRAIN_LIMIT,
            "the deliveries did not drain"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let worker = n as f64 / started.elapsed().as_secs_f64();
    let worker_cpu = cpu_seconds(me) - cpu_before;
    println!(
        "worker path: {worker:.0} deliveries/s ({n} queued, recorded with full durability); \
         {:.1} % of the bare client; CPU {:.1} µs a delivery (worker and receiver)",
        100.0 * worker / bare,
        1e6 * worker_cpu / n as f64
    );
    let _ = stop.send(true);
    let _ = running.await;
}
