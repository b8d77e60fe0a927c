//! End-to-end benchmark of the embedded runtime: the real `entrega serve` binary on a
//! fresh database, a loopback receiver answering 204, and in one run:
//!
//! 1. the bare client: `reqwest` POSTing the same 1 KiB body to the same receiver at
//!    the same concurrency (the ceiling for this machine);
//! 2. publish → delivered latency at low load (one event at a time);
//! 3. throughput: N events published over the API by [`PUBLISHERS`] connections to one
//!    endpoint (`max_concurrency` [`ENDPOINT_CONCURRENCY`]): publish rate, delivered
//!    rate, latency under load, and the server's peak RSS.
//!
//! Figures are printed, never asserted (the machine is shared). Run with
//! `cargo bench -p entrega-embedded --bench e2e`; `ENTREGA_BENCH_EVENTS` sets N
//! (default [`DEFAULT_EVENTS`]), `ENTREGA_BENCH_FLAGS` adds `serve` flags (for example
//! `--durability normal`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

mod common;
use common::server::{post, set_up, start_server};
use common::{bare_client, cpu_seconds, payload, start_receiver, Arrivals};

const DEFAULT_EVENTS: usize = 20_000;
const PUBLISHERS: usize = 32;
const ENDPOINT_CONCURRENCY: u32 = 64;
const LOW_LOAD_EVENTS: usize = 300;
/// Deliveries left pending behind an endpoint that never answers, for the memory
/// figure (`ENTREGA_BENCH_PENDING`).
const DEFAULT_PENDING: usize = 100_000;
/// How long the throughput run may take before the bench gives up.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// Publish `ids` with [`PUBLISHERS`] connections; when each was sent.
async fn publish_all(base: &str, key: &str, ids: Vec<String>) -> HashMap<String, Instant> {
    let client = reqwest::Client::new();
    let ids = Arc::new(ids);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sent_at = Arc::new(Mutex::new(HashMap::new()));
    let mut publishers = Vec::new();
    for _ in 0..PUBLISHERS {
        let (client, base, key) = (client.clone(), base.to_owned(), key.to_owned());
        let (ids, next, sent_at) = (ids.clone(), next.clone(), sent_at.clone());
        publishers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(id) = ids.get(n) else { break };
                let sent = publish(&client, &base, &key, id).await;
                sent_at.lock().unwrap().insert(id.clone(), sent);
            }
        }));
    }
    for p in publishers {
        p.await.unwrap();
    }
    let sent = std::mem::take(&mut *sent_at.lock().unwrap());
    sent
}

fn rss_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Publish event `id`; the instant just before the request.
async fn publish(client: &reqwest::Client, base: &str, key: &str, id: &str) -> Instant {
    let mut body = payload();
    body["id"] = json!(id);
    let started = Instant::now();
    let (status, answer) = post(client, format!("{base}/v1/events"), key, &body).await;
    assert_eq!(status, 202, "{answer}");
    started
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn latencies(published: &HashMap<String, Instant>, arrivals: &Arrivals) -> Vec<Duration> {
    let at = arrivals.at.lock().unwrap();
    let mut all: Vec<Duration> = published
        .iter()
        .filter_map(|(id, sent)| at.get(id).map(|got| got.duration_since(*sent)))
        .collect();
    all.sort();
    all
}

async fn wait_for(arrivals: &Arrivals, ids: &[String]) {
    let deadline = Instant::now() + DRAIN_LIMIT;
    loop {
        let missing = {
            let at = arrivals.at.lock().unwrap();
            ids.iter().filter(|id| !at.contains_key(*id)).count()
        };
        if missing == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{missing} events not delivered");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::main]
async fn main() {
    let events: usize = std::env::var("ENTREGA_BENCH_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_EVENTS);
    let flags: Vec<String> = std::env::var("ENTREGA_BENCH_FLAGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let (url, arrivals) = start_receiver().await;

    let bare = bare_client(&url, events, ENDPOINT_CONCURRENCY as usize).await;
    println!("bare client: {bare:.0} requests/s ({events} POSTs of 1 KiB, concurrency {ENDPOINT_CONCURRENCY})");

    let server = start_server(&flags);
    let key = set_up(&server, &url, ENDPOINT_CONCURRENCY).await;
    let client = reqwest::Client::new();

    // Low load: one event at a time, each waited for.
    let mut published = HashMap::new();
    for n in 0..LOW_LOAD_EVENTS {
        let id = format!("low-{n}");
        let sent = publish(&client, &server.base, &key, &id).await;
        wait_for(&arrivals, std::slice::from_ref(&id)).await;
        published.insert(id, sent);
    }
    let low = latencies(&published, &arrivals);
    println!(
        "low load: publish -> delivered p50 {:.2} ms, p99 {:.2} ms ({} events, one at a time)",
        percentile(&low, 0.5).as_secs_f64() * 1e3,
        percentile(&low, 0.99).as_secs_f64() * 1e3,
        low.len()
    );

    // Throughput.
    let ids: Vec<String> = (0..events).map(|n| format!("load-{n}")).collect();
    let started = Instant::now();
    let server_cpu = cpu_seconds(server.child.id());
    let sent_at = publish_all(&server.base, &key, ids.clone()).await;
    let publish_secs = started.elapsed().as_secs_f64();
    wait_for(&arrivals, &ids).await;
    let total_secs = started.elapsed().as_secs_f64();
    let server_cpu = cpu_seconds(server.child.id()) - server_cpu;
    let loaded = latencies(&sent_at, &arrivals);
    println!(
        "throughput: published {:.0}/s, delivered {:.0}/s ({events} events, {PUBLISHERS} publishers); \
         under load p50 {:.1} ms, p99 {:.1} ms",
        events as f64 / publish_secs,
        events as f64 / total_secs,
        percentile(&loaded, 0.5).as_secs_f64() * 1e3,
        percentile(&loaded, 0.99).as_secs_f64() * 1e3,
    );
    println!(
        "delivered / bare client: {:.1} %; server CPU {:.1} µs an event (publish to delivered); \
         server peak RSS {:.0} MB",
        100.0 * events as f64 / total_secs / bare,
        1e6 * server_cpu / events as f64,
        rss_mb(server.child.id(), "VmHWM:")
    );

    // Memory with a large backlog: deliveries pending behind an endpoint that accepts
    // no connection (one attempt at a time hangs until its timeout).
    let pending: usize = std::env::var("ENTREGA_BENCH_PENDING")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_PENDING);
    let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stuck = format!("http://{}/", hanging.local_addr().unwrap());
    let key = set_up(&server, &stuck, 1).await;
    let ids = (0..pending).map(|n| format!("pending-{n}")).collect();
    let started = Instant::now();
    publish_all(&server.base, &key, ids).await;
    println!(
        "{pending} deliveries pending (published at {:.0}/s): server RSS {:.0} MB, peak {:.0} MB",
        pending as f64 / started.elapsed().as_secs_f64(),
        rss_mb(server.child.id(), "VmRSS:"),
        rss_mb(server.child.id(), "VmHWM:")
    );
}
