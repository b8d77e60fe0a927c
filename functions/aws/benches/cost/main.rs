//! The cost of a delivery on AWS, measured: N events go through the real handlers on
//! the emulator (outbox stream → fan-out → SQS → worker → receiver), every AWS call is
//! counted by an SDK interceptor, and the bill is priced at us-east-1 on-demand rates.
//!
//! `cargo bench -p entrega-aws --bench cost` (needs the project's `.venv` with moto:
//! `scripts/python-tools`; `ENTREGA_COST_EVENTS` sets N, default 200).

mod meter;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::{Credentials, SharedInterceptor};
use entrega_aws::emulation::Emulation;
use entrega_aws::outbox::outbox_put;
use entrega_aws::provision::provision;
use entrega_aws::resources::{services_on, AwsClients, AwsResources, ResourceNames};
use entrega_core::delivery::DeliveryStatus;
use entrega_core::endpoint::Endpoint;
use entrega_core::event::Event;
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::{DeliveryQuery, NoMetrics, Services, SystemClock};
use entrega_core::retry::{CustomRetry, RetrySpec};
use entrega_core::tenant::Tenant;
use entrega_http::transport::{HttpTransport, TargetPolicy};
use entrega_testkit::Moto;
use meter::{describe, item_size, Meter, Metered, Tally};
use tokio::sync::watch;

/// us-east-1 on-demand prices (USD), November 2026.
mod price {
    /// DynamoDB, per write and per read request unit.
    pub const WRITE_UNIT: f64 = 0.625e-6;
    pub const READ_UNIT: f64 = 0.125e-6;
    /// DynamoDB storage, per GB-month (the 30-day delivery log is kept a month).
    pub const STORAGE_GB_MONTH: f64 = 0.25;
    /// SQS standard, per request (64 KiB chunk).
    pub const SQS_REQUEST: f64 = 0.40e-6;
    /// SNS publish, EventBridge Scheduler invocation.
    pub const SNS_PUBLISH: f64 = 0.50e-6;
    pub const SCHEDULE: f64 = 1.00e-6;
    /// Lambda (arm64): per request, and per GB-second.
    pub const LAMBDA_REQUEST: f64 = 0.20e-6;
    pub const LAMBDA_GB_SECOND: f64 = 0.0000133334;
    /// EventBridge API destinations, per million deliveries (for comparison).
    pub const API_DESTINATIONS_PER_MILLION: f64 = 1.20;
}

/// The template's function memory (MB) and the handler time assumed per invocation:
/// on AWS a batch's time is the receiver's round trip plus a few DynamoDB calls.
const LAMBDA_MEMORY_MB: f64 = 256.0;
const LAMBDA_MS_PER_INVOCATION: f64 = 40.0;
/// The event payload: 1 KiB.
const PAYLOAD_BYTES: usize = 1024;
/// Endpoints the events are spread over (each takes one event type), so none gets
/// more at once than its share of the worker takes.
const SPREAD_OVER: usize = 10;

/// Where the producer's events go; either way every event is committed before the
/// fan-out starts, so the stream's batches are full, as at production rates.
#[derive(Clone, Copy)]
enum Shape {
    /// Over [`SPREAD_OVER`] endpoints of one tenant: what is priced is a delivery.
    Spread,
    /// All to one endpoint: it gets them faster than its share of the worker (a
    /// quarter) takes them, and the rest wait for slots (each wait a visibility
    /// change, a slot asked for, the records read again).
    OneEndpoint,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("ENTREGA_COST_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    println!("Entrega on AWS: the cost of {n} deliveries (1 KiB payload), metered on moto\n");
    let first = run(n, false, Shape::Spread).await;
    report("first attempt succeeds", n, &first);
    let retried = run(n / 2, true, Shape::Spread).await;
    report("one retry (503, then 200 a second later)", n / 2, &retried);
    let burst = run(n, false, Shape::OneEndpoint).await;
    report(
        "first attempt succeeds, every event to one endpoint",
        n,
        &burst,
    );
}

struct Run {
    entrega: Tally,
    producer: Tally,
    outbox_item_bytes: usize,
}

/// A receiver that answers 503 to the first request of each webhook when `fail_first`.
async fn receiver(fail_first: bool) -> (String, Arc<Mutex<(usize, HashSet<String>)>>) {
    use axum::http::{HeaderMap, StatusCode};
    let seen = Arc::new(Mutex::new((0usize, HashSet::new())));
    let state = seen.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap| {
        let state = state.clone();
        async move {
            let id = headers
                .get("webhook-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let mut s = state.lock().unwrap();
            if fail_first && s.1.insert(id.clone()) {
                return StatusCode::SERVICE_UNAVAILABLE;
            }
            s.0 += 1;
            s.1.insert(id);
            StatusCode::OK
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

async fn run(n: usize, fail_first: bool, shape: Shape) -> Run {
    let moto = Moto::start();
    let sdk = entrega_aws::resources::sdk_defaults()
        .endpoint_url(&moto.endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "moto"))
        .load()
        .await;
    let names = ResourceNames::with_prefix("entrega-cost");
    provision(&sdk, &names).await.expect("provisioning on moto");
    let resources = AwsResources::discover(&sdk, "entrega-cost").await.unwrap();
    let plain = AwsClients::new(&sdk);
    let (meter, producer_meter) = (Arc::new(Meter::default()), Arc::new(Meter::default()));
    for m in [&meter, &producer_meter] {
        for table in [&resources.main_table, &resources.outbox_table] {
            m.learn(table, describe(&plain.dynamo, table).await);
        }
    }
    let metered =
        AwsClients::with_interceptors(&sdk, &[SharedInterceptor::new(Metered(meter.clone()))]);
    let producer = AwsClients::with_interceptors(
        &sdk,
        &[SharedInterceptor::new(Metered(producer_meter.clone()))],
    );
    let transport = Arc::new(HttpTransport::new(TargetPolicy {
        allowed_ranges: vec!["127.0.0.0/8".parse().unwrap()],
        allow_http: true,
    }));
    let clock = Arc::new(SystemClock);
    let setup = services_on(&plain, &resources, transport.clone(), clock.clone());
    let mut services = services_on(&metered, &resources, transport, clock);
    // Metrics go to CloudWatch through the log (EMF) on AWS: free of API calls, and
    // noise here.
    services.metrics = Arc::new(NoMetrics);
    // The deployed worker's settings, as its Lambda reads them (the template's default
    // concurrency unless `ENTREGA_WORKER_CONCURRENCY` says otherwise), not the
    // emulator's sixteen pollers' shares: with a quarter of sixteen, an endpoint at the
    // default cap (8) would wait for slots here as it never does on AWS, and the bill
    // would price the emulator's bounces.
    services.settings = entrega_aws::function::settings_from_env();

    let (url, seen) = receiver(fail_first).await;
    let tenant = Tenant {
        id: TenantId::generate(),
        name: "Acme CRM".into(),
        owner_email: "owner@example.com".into(),
        created_at: chrono::Utc::now(),
    };
    setup.store.create_tenant(&tenant, "hash").await.unwrap();
    let endpoints = match shape {
        Shape::Spread => SPREAD_OVER,
        Shape::OneEndpoint => 1,
    };
    for i in 0..endpoints {
        let endpoint = Endpoint {
            retry: RetrySpec::Custom(CustomRetry {
                delays_s: vec![1],
                jitter: 0.0,
                retry_4xx: false,
            }),
            max_concurrency: 64,
            event_types: vec![event_type(i)],
            ..Endpoint::new(tenant.id.clone(), url.clone(), chrono::Utc::now())
        };
        setup
            .store
            .create_endpoint(&endpoint, entrega_core::endpoint::MAX_ENDPOINTS_PER_TENANT)
            .await
            .unwrap();
    }

    // The producer's side: one outbox item per event, each in its own transaction.
    let payload = format!(r#"{{"pad":"{}"}}"#, "x".repeat(PAYLOAD_BYTES - 10));
    let mut outbox_item_bytes = 0;
    for i in 0..n {
        let event = Event {
            id: EventId::generate(),
            tenant_id: tenant.id.clone(),
            event_type: event_type(i % endpoints),
            payload: payload.clone(),
            created_at: chrono::Utc::now(),
        };
        let put = outbox_put(&resources.outbox_table, &event);
        outbox_item_bytes = item_size(put.put().unwrap().item());
        producer
            .dynamo
            .transact_write_items()
            .transact_items(put)
            .send()
            .await
            .unwrap();
    }

    let started = Instant::now();
    let (stop, stopped) = watch::channel(false);
    let emulation = Emulation {
        services: services.clone(),
        resources: resources.clone(),
        clients: metered.clone(),
    };
    let pollers = tokio::spawn(emulation.run(stopped));
    wait_delivered(&setup, &tenant.id, n, &seen).await;
    let _ = stop.send(true);
    let _ = pollers.await;
    eprintln!(
        "  ({n} delivered in {:.1} s on the emulator)",
        started.elapsed().as_secs_f64()
    );
    drop(moto);
    Run {
        entrega: meter.take(),
        producer: producer_meter.take(),
        outbox_item_bytes,
    }
}

/// The event type the `i`th endpoint takes.
fn event_type(i: usize) -> String {
    format!("lead.stage_changed.{i}")
}

async fn wait_delivered(
    services: &Services,
    tenant: &TenantId,
    n: usize,
    seen: &Arc<Mutex<(usize, HashSet<String>)>>,
) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while seen.lock().unwrap().0 < n {
        assert!(Instant::now() < deadline, "deliveries did not finish");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The worker records the outcome after the receiver answered.
    loop {
        let mut delivered = 0;
        let mut cursor = None;
        loop {
            let page = services
                .store
                .list_deliveries(&DeliveryQuery {
                    tenant: Some(tenant.clone()),
                    status: Some(DeliveryStatus::Delivered),
                    limit: 200,
                    cursor: cursor.clone(),
                    ..DeliveryQuery::default()
                })
                .await
                .unwrap();
            delivered += page.data.len();
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        if delivered >= n {
            return;
        }
        assert!(Instant::now() < deadline, "outcomes were not recorded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn calls(t: &Tally, prefix: &str) -> u64 {
    t.calls
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

fn report(title: &str, n: usize, run: &Run) {
    let per = |x: f64| x / n as f64;
    let t = &run.entrega;
    println!("== {title}: per delivery ==");
    println!("{:<44} {:>10}", "call", "per delivery");
    for (call, count) in &t.calls {
        println!("{call:<44} {:>10.2}", per(*count as f64));
    }
    // What a real deployment pays for: the emulation's own stream reads and schedule
    // polling are free or absent on AWS (Lambda reads streams at no charge; EventBridge
    // Scheduler fires schedules itself), and an idle SQS long poll is a fixed cost per
    // queue, not per delivery.
    let sqs = calls(t, "SQS ") - calls(t, "SQS ReceiveMessage")
        + t.batches.get("SQS ReceiveMessage").copied().unwrap_or(0);
    let invocations: u64 = t.batches.values().sum();
    let dynamo_writes = per(t.write_units + t.index_write_units);
    let dynamo_reads = per(t.read_units);
    let stored_gb = per(t.stored_bytes.max(0) as f64) / 1e9;
    let lines = [
        (
            "DynamoDB writes",
            dynamo_writes,
            "WRU",
            dynamo_writes * price::WRITE_UNIT,
        ),
        (
            "  of which index upkeep",
            per(t.index_write_units),
            "WRU",
            per(t.index_write_units) * price::WRITE_UNIT,
        ),
        (
            "DynamoDB reads",
            dynamo_reads,
            "RRU",
            dynamo_reads * price::READ_UNIT,
        ),
        (
            "DynamoDB storage, kept 30 days",
            stored_gb * 1e9,
            "bytes",
            stored_gb * price::STORAGE_GB_MONTH,
        ),
        (
            "SQS requests",
            per(sqs as f64),
            "req",
            per(sqs as f64) * price::SQS_REQUEST,
        ),
        (
            "SNS publishes",
            per(calls(t, "SNS Publish") as f64),
            "req",
            per(calls(t, "SNS Publish") as f64) * price::SNS_PUBLISH,
        ),
        (
            "Scheduler schedules",
            per(calls(t, "Scheduler CreateSchedule") as f64),
            "req",
            per(calls(t, "Scheduler CreateSchedule") as f64) * price::SCHEDULE,
        ),
        (
            "Lambda invocations (non-empty batches)",
            per(invocations as f64),
            "inv",
            per(invocations as f64)
                * (price::LAMBDA_REQUEST
                    + price::LAMBDA_GB_SECOND * LAMBDA_MEMORY_MB / 1024.0
                        * LAMBDA_MS_PER_INVOCATION
                        / 1000.0),
        ),
    ];
    let mut total = 0.0;
    println!(
        "\n{:<40} {:>10} {:<6} {:>12}",
        "", "per delivery", "", "$ per million"
    );
    for (i, (what, amount, unit, dollars)) in lines.iter().enumerate() {
        if i != 1 {
            total += dollars;
        }
        println!(
            "{what:<40} {amount:>10.2} {unit:<6} {:>12.3}",
            dollars * 1e6
        );
    }
    println!(
        "{:<40} {:>10} {:<6} {:>12.3}",
        "Entrega's own calls, total",
        "",
        "",
        total * 1e6
    );
    let p = &run.producer;
    let producer_wru = per(p.write_units + p.index_write_units);
    println!(
        "{:<40} {:>10.2} {:<6} {:>12.3}   ({} B item; one transactional unit up to 1 KiB, i.e. a payload up to ≈ {} B)",
        "producer's outbox item (its transaction)",
        producer_wru,
        "WRU",
        producer_wru * price::WRITE_UNIT * 1e6,
        run.outbox_item_bytes,
        1024usize.saturating_sub(run.outbox_item_bytes - PAYLOAD_BYTES),
    );
    println!(
        "{:<40} {:>10} {:<6} {:>12.3}\n",
        "EventBridge API destinations, for comparison",
        "",
        "",
        price::API_DESTINATIONS_PER_MILLION
    );
}
