//! The hostile test's findings about connections, each a regression test: half-open
//! connections, stuck bodies and floods of silent connections never lock other
//! clients out.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::*;

/// Half-open connections (headers never finished) do not starve the server, even
/// past its open-file limit: the connection cap stays below that limit, and at the
/// cap the oldest stuck connection makes room, so `/healthz` keeps answering.
#[tokio::test(flavor = "multi_thread")]
async fn half_open_connections_do_not_starve_the_server() {
    let dir = TempDir::new("slowloris");
    let server = Server::start_with_file_limit(&dir, &LOOPBACK, 256);
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..400 {
        let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await else {
            continue;
        };
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let probes = async {
        for _ in 0..20 {
            let resp = client
                .get(format!("{}/healthz", server.base))
                .send()
                .await
                .expect("healthz answers while 400 half-open connections are held");
            assert_eq!(resp.status(), 200);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), probes)
        .await
        .expect("healthz answers within 30 s");
    drop(held);
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains("Too many open files"), "{log}");
}

/// A request's head is read into a buffer of `READ_BUFFER_MAX` (32 KiB), which one
/// last read can take to about twice that: a head of 100 KiB is refused, so each
/// connection at the cap holds at most that much in headers (hyper's default, about
/// 400 KiB, served this one and let 4 096 connections hold 1.6 GB); 16 KiB is served.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_head_of_100_kib_is_refused() {
    let dir = TempDir::new("big-head");
    let server = Server::start(&dir);
    let addr = server.base.trim_start_matches("http://").to_owned();
    let status_line = |filler: usize| {
        let addr = addr.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let head = format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
                "a".repeat(filler)
            );
            // Refused, the server may close before it has read all of it.
            let _ = s.write_all(head.as_bytes()).await;
            let mut answer = Vec::new();
            let read = s.read_to_end(&mut answer);
            let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
            let answer = String::from_utf8_lossy(&answer).into_owned();
            answer.lines().next().unwrap_or_default().to_owned()
        }
    };
    let served = status_line(16 * 1024).await;
    assert!(served.starts_with("HTTP/1.1 200"), "{served:?}");
    // A 431, or a reset that cut it off: never served.
    let refused = status_line(100 * 1024).await;
    assert!(
        refused.is_empty() || refused.starts_with("HTTP/1.1 431"),
        "{refused:?}"
    );
}

/// A tenant's valid key passes authentication on headers alone. Connections whose
/// requests then wait for bodies that never come are closed for new ones at the cap,
/// as idle ones are: they cannot lock other clients out.
#[tokio::test(flavor = "multi_thread")]
async fn requests_stuck_waiting_for_their_body_do_not_lock_others_out() {
    const CAP: usize = 64;
    let dir = TempDir::new("slow-bodies");
    let cap = CAP.to_string();
    let server = Server::start_loopback(&dir, &["--max-connections", &cap]);
    let (_, attacker) = server.admin().tenant("Slow Body Ltd").await;
    let (_, other) = server.admin().tenant("Other Inc").await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 200000\r\n\r\n{{",
        attacker.key
    );
    let mut held = Vec::new();
    // Twice: the second round takes the places of the idle connections (the set-up's
    // clients), so every place is held by a request waiting for its body.
    for _ in 0..2 {
        for _ in 0..CAP * 2 {
            if let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await {
                let _ = s.write_all(head.as_bytes()).await;
                held.push(s);
            }
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for n in 0..10 {
        let resp = client
            .post(format!("{}/v1/events", server.base))
            .bearer_auth(&other.key)
            .json(&json!({"type": "a.b", "data": {"n": n}}))
            .send()
            .await
            .expect("another tenant publishes while the cap is held by stuck bodies");
        assert_eq!(resp.status(), 202);
    }
    drop(held);
}

/// New connections that never send a request, opened faster than the cap each
/// second, do not lock other clients out: a place is taken from one silent for a
/// quarter of a second, where it was a second and every place stayed too young to take
/// (a hostile test: 18 of 158 probes answered at 400 connections a second, cap 200).
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_new_silent_connections_does_not_lock_others_out() {
    const CAP: usize = 64;
    // Twice the cap each second: every place is under a second old, most are past
    // a quarter.
    const OPENED_PER_TICK: usize = CAP / 10;
    const TICK: Duration = Duration::from_millis(50);
    let dir = TempDir::new("churn");
    let server = Server::start_loopback(&dir, &["--max-connections", &CAP.to_string()]);
    let addr = server.base.trim_start_matches("http://").to_owned();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let flood = tokio::spawn(async move {
        let mut held = std::collections::VecDeque::new();
        while !*stopped.borrow() {
            for _ in 0..OPENED_PER_TICK {
                if let Ok(s) = tokio::net::TcpStream::connect(&addr).await {
                    held.push_back((std::time::Instant::now(), s));
                }
            }
            while held
                .front()
                .is_some_and(|(at, _)| at.elapsed() > Duration::from_millis(1500))
            {
                held.pop_front();
            }
            tokio::time::sleep(TICK).await;
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut failed = Vec::new();
    for _ in 0..20 {
        match client.get(format!("{}/healthz", server.base)).send().await {
            Ok(resp) if resp.status() == 200 => {}
            other => failed.push(format!("{other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(true);
    flood.await.unwrap();
    assert!(
        failed.is_empty(),
        "{} of 20 probes failed: {failed:?}",
        failed.len()
    );
}
