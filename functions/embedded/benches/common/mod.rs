//! What the benchmarks share: a loopback receiver answering 204 that notes when each
//! `webhook-id` first arrived, the 1 KiB event body, and the bare client it is compared
//! with.

// Each bench uses a part of what is here.
#![allow(dead_code)]

pub mod server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};

/// Arrival instants by `webhook-id`, and a count of every request.
#[derive(Default)]
pub struct Arrivals {
    pub at: Mutex<HashMap<String, Instant>>,
    pub count: std::sync::atomic::AtomicUsize,
}

pub async fn start_receiver() -> (String, Arc<Arrivals>) {
    let arrivals = Arc::new(Arrivals::default());
    let seen = arrivals.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap, _body: String| {
        let seen = seen.clone();
        async move {
            if let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) {
                seen.at
                    .lock()
                    .unwrap()
                    .entry(id.to_owned())
                    .or_insert_with(Instant::now);
            }
            seen.count
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            StatusCode::NO_CONTENT
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, arrivals)
}

pub fn payload() -> Value {
    // About 1 KiB of JSON, as the measurements used.
    json!({"type": "bench.event", "data": {"pad": "x".repeat(990)}})
}

/// `count` POSTs of the 1 KiB body at `concurrency`: requests per second.
pub async fn bare_client(url: &str, count: usize, concurrency: usize) -> f64 {
    let client = reqwest::Client::new();
    let body = serde_json::to_vec(&payload()).unwrap();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, body, next, url) =
            (client.clone(), body.clone(), next.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < count {
                let resp = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 204);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    count as f64 / started.elapsed().as_secs_f64()
}

/// CPU time (user + system) process `pid` has used so far, in seconds: a figure the
/// machine's noise moves much less than throughput, as other load on the machine slows
/// the process without adding to its CPU time.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces; the fields after it are numbers.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15, counted from 1 with the name as field 2.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / ticks_per_second.max(1.0)
}
