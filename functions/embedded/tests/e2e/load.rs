//! A bounded load test on loopback: 50 connections publishing as fast as they can
//! while half-open connections are held and `/healthz` is probed. The backlog limit
//! answers 429 (or the store 503), always with `Retry-After`; every accepted event is
//! delivered once the load stops; `/healthz` answers every probe.
//!
//! `ENTREGA_LOAD_SECS` sets the duration (default [`DEFAULT_SECS`]; the figure
//! is 30). The latency figures are printed, not asserted: this machine is shared, and
//! performance is measured by benchmarks; the assertion is liveness (every probe
//! answered within [`PROBE_LIMIT`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::harness::*;

const DEFAULT_SECS: u64 = 8;
const PUBLISHERS: usize = 50;
const HALF_OPEN: usize = 200;
const BACKLOG: &str = "500";
const PROBE_EVERY: Duration = Duration::from_millis(50);
/// A probe slower than this counts as the server being unavailable.
const PROBE_LIMIT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread")]
async fn publishing_under_load_with_half_open_connections_loses_nothing() {
    let secs = std::env::var("ENTREGA_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    let dir = TempDir::new("load");
    let server = Server::start_loopback(&dir, &["--max-backlog", BACKLOG]);
    let (_, acme) = server.admin().tenant("Acme").await;
    // A receiver slower than the publishers, so the backlog limit is reached.
    let receiver =
        Receiver::start(vec![], Reply::status(204).after(Duration::from_millis(20))).await;
    acme.endpoint(json!({"url": receiver.url("/"), "max_concurrency": 8}))
        .await;

    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..HALF_OPEN {
        if let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await {
            let _ = s
                .write_all(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n")
                .await;
            held.push(s);
        }
    }

    let deadline = Instant::now() + Duration::from_secs(secs);
    let accepted = Arc::new(Mutex::new(Vec::<String>::new()));
    let refused = Arc::new(Mutex::new((0u64, 0u64)));
    let mut publishers = Vec::new();
    for p in 0..PUBLISHERS {
        let (api, accepted, refused) = (acme.clone(), accepted.clone(), refused.clone());
        publishers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let resp = client
                    .post(format!("{}/v1/events", api.base))
                    .bearer_auth(&api.key)
                    .json(&json!({"type": "load.x", "data": {"p": p, "i": i}}))
                    .send()
                    .await
                    .expect("the API answers");
                match resp.status().as_u16() {
                    202 => {
                        let id = resp.json::<Value>().await.unwrap()["id"]
                            .as_str()
                            .unwrap()
                            .to_owned();
                        accepted.lock().unwrap().push(id);
                    }
                    status @ (429 | 503) => {
                        assert!(
                            resp.headers().contains_key("retry-after"),
                            "{status} without Retry-After"
                        );
                        {
                            let mut r = refused.lock().unwrap();
                            if status == 429 {
                                r.0 += 1
                            } else {
                                r.1 += 1
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    status => panic!("{status}: {}", resp.text().await.unwrap()),
                }
            }
        }));
    }
    let probes = {
        let base = server.base.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(PROBE_LIMIT)
                .build()
                .unwrap();
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let started = Instant::now();
                let resp = client
                    .get(format!("{base}/healthz"))
                    .send()
                    .await
                    .expect("healthz answers within the limit under load");
                assert_eq!(resp.status(), 200);
                latencies.push(started.elapsed());
                tokio::time::sleep(PROBE_EVERY).await;
            }
            latencies
        })
    };
    for p in publishers {
        p.await.unwrap();
    }
    let mut latencies = probes.await.unwrap();
    drop(held);

    let accepted = accepted.lock().unwrap().clone();
    let (too_many, unavailable) = *refused.lock().unwrap();
    assert!(!accepted.is_empty());
    assert!(
        too_many > 0,
        "the backlog limit of {BACKLOG} was never reached"
    );
    // Everything accepted arrives, once the load has stopped.
    all_delivered(&receiver, &accepted, Duration::from_secs(180)).await;
    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    eprintln!(
        "load {secs} s: {} accepted ({:.0}/s), {too_many} × 429, {unavailable} × 503; \
         /healthz p50 {:?} p99 {:?} over {} probes, {HALF_OPEN} half-open connections held",
        accepted.len(),
        accepted.len() as f64 / secs as f64,
        pct(0.5),
        pct(0.99),
        latencies.len()
    );
}
