//! The hostile test's findings, each a regression test: what the API confirmed stays
//! done, fairness inside a tenant, backpressure, a full disk, and resends repeated or
//! racing an attempt. (Connections, input and the database file have files of their
//! own: `hostile_connections.rs`, `hostile_input.rs`, `hostile_db_file.rs`.)

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::*;

/// Confirmed endpoint changes are never undone by the worker's health bookkeeping,
/// even while the endpoint fails half its requests at a high rate.
#[tokio::test(flavor = "multi_thread")]
async fn confirmed_endpoint_changes_are_never_undone_by_the_worker() {
    let dir = TempDir::new("lost-updates");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    // Alternating failure and success: every attempt is a health transition.
    let script: Vec<Reply> = (0..4000)
        .map(|i| Reply::status(if i % 2 == 0 { 500 } else { 200 }))
        .collect();
    let receiver = Receiver::start(script, Reply::status(200)).await;
    let ep = acme
        .endpoint(json!({"url": receiver.url("/"), "retry": {"delays_s": [1, 1, 1], "jitter": 0}, "max_concurrency": 32}))
        .await;
    let path = format!("/v1/endpoints/{}", ep["id"].as_str().unwrap());
    let publisher = {
        let acme = acme.clone();
        tokio::spawn(async move {
            for i in 0..600 {
                acme.publish("load.x", json!({ "i": i })).await;
            }
        })
    };
    let mut confirmed = Vec::new();
    for i in 0..60 {
        let (status, body) = match i % 3 {
            0 => {
                acme.call(
                    "PATCH",
                    &path,
                    Some(json!({"description": format!("d{i}")})),
                )
                .await
            }
            1 => acme.post(&format!("{path}/rotate-secret"), json!({})).await,
            _ => {
                acme.call("PATCH", &path, Some(json!({"timeout_ms": 1000 + i})))
                    .await
            }
        };
        assert_eq!(status, 200, "{body}");
        confirmed.push(body);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (_, now) = acme.get(&path).await;
        let last = confirmed.last().unwrap();
        for field in ["description", "secret", "timeout_ms"] {
            assert_eq!(
                now[field], last[field],
                "{field} was undone after write {i}"
            );
        }
    }
    publisher.await.unwrap();
    assert!(receiver.count() > 50, "the worker was busy meanwhile");
}

/// One saturated endpoint's backlog does not hold back the same tenant's other
/// endpoint (it took 137 s with 400 queued before the lane scheduler).
#[tokio::test(flavor = "multi_thread")]
async fn a_saturated_endpoint_does_not_stall_its_tenants_other_endpoint() {
    let dir = TempDir::new("lanes");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let slow = Receiver::start(vec![], Reply::status(200).after(Duration::from_secs(1))).await;
    let fast = Receiver::answering(200).await;
    acme.endpoint(json!({"url": slow.url("/"), "event_types": ["slow.x"], "max_concurrency": 1}))
        .await;
    acme.endpoint(json!({"url": fast.url("/"), "event_types": ["fast.x"]}))
        .await;
    for i in 0..400 {
        acme.publish("slow.x", json!({ "i": i })).await;
    }
    eventually(Duration::from_secs(10), "the backlog queued", || async {
        (slow.count() >= 1).then_some(())
    })
    .await;
    // Keep the burst going while the fast endpoint's events are published: they must
    // not queue behind it (neither in the outbox nor in the delivery queue).
    let burst_until = Instant::now() + Duration::from_secs(3);
    let bursts: Vec<_> = (0..4)
        .map(|b| {
            let acme = acme.clone();
            tokio::spawn(async move {
                let mut i = 0;
                while Instant::now() < burst_until {
                    i += 1;
                    acme.publish("slow.x", json!({ "b": b, "i": i })).await;
                }
            })
        })
        .collect();
    let mut waited = Duration::ZERO;
    for n in 1..=5 {
        let started = Instant::now();
        acme.publish("fast.x", json!({ "n": n })).await;
        eventually(
            Duration::from_secs(10),
            "the fast endpoint's event",
            || async { (fast.count() == n).then_some(()) },
        )
        .await;
        waited = waited.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for b in bursts {
        b.await.unwrap();
    }
    assert!(slow.count() < 30, "the slow endpoint is still backlogged");
    eprintln!("fast endpoint beside a saturated one under a burst: worst {waited:?}");
}

/// A resend while the first attempt is running keeps both attempts in the log, and
/// goes out once the first has ended, not beside it (the event was on the wire twice
/// at once, even to an at-most-once endpoint), nor only when its lease ran out.
#[tokio::test(flavor = "multi_thread")]
async fn a_resend_during_an_attempt_keeps_both_attempts() {
    let dir = TempDir::new("resend-race");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::start(
        vec![],
        Reply::status(200).after(Duration::from_millis(1500)),
    )
    .await;
    acme.endpoint(json!({"url": receiver.url("/")})).await;
    let dlv = acme.resend_during_the_first_attempt(&receiver).await;
    let attempts = eventually(Duration::from_secs(10), "both attempts logged", || async {
        let (_, d) = acme.get(&format!("/v1/deliveries/{dlv}")).await;
        let attempts = d["attempts"].as_array().unwrap().clone();
        (attempts.len() == 2 && d["status"] == "delivered").then_some(attempts)
    })
    .await;
    assert_eq!(receiver.count(), 2);
    let generations: Vec<_> = attempts.iter().map(|a| a["generation"].clone()).collect();
    assert_eq!(generations, vec![json!(0), json!(1)]);
    let got = receiver.got();
    let apart = got[1].at - got[0].at;
    assert!(
        apart >= Duration::from_millis(1500),
        "the resend went out {apart:?} after the first request, which took 1.5 s"
    );
}

/// Past `--max-backlog` publishing answers 429 with `Retry-After`; nothing accepted is
/// lost; `/metrics` and `/healthz` show the backlog.
#[tokio::test(flavor = "multi_thread")]
async fn publishing_past_the_backlog_limit_is_refused_and_nothing_accepted_is_lost() {
    let dir = TempDir::new("backlog");
    let server = Server::start_loopback(&dir, &["--max-backlog", "20"]);
    let (_, acme) = server.admin().tenant("Acme").await;
    let (_, other) = server.admin().tenant("Other").await;
    let receiver = Receiver::answering(503).await;
    acme.endpoint(json!({"url": receiver.url("/"), "retry": "persistent"}))
        .await;
    let first = json!({"id": "order-1", "type": "a.b", "data": {"i": -1}});
    let (status, _) = acme.post("/v1/events", first.clone()).await;
    assert_eq!(status, 202);
    let (mut accepted, mut refused) = (vec![json!("order-1")], 0);
    for i in 0..60 {
        let resp = acme
            .client
            .post(format!("{}/v1/events", acme.base))
            .bearer_auth(&acme.key)
            .json(&json!({"type": "a.b", "data": {"i": i}}))
            .send()
            .await
            .unwrap();
        match resp.status().as_u16() {
            202 => accepted.push(resp.json::<Value>().await.unwrap()["id"].clone()),
            429 => {
                assert!(resp.headers().contains_key("retry-after"));
                refused += 1;
            }
            s => panic!("unexpected {s}"),
        }
    }
    assert!(
        refused > 0 && accepted.len() >= 20,
        "{} accepted, {refused} refused",
        accepted.len()
    );
    // Sent again (its 202 lost), an accepted event is still accepted, backlog full or
    // not; another event under its id is still a conflict, and a new one waits.
    let (status, again) = acme.post("/v1/events", first).await;
    assert_eq!(
        (status, again["id"].as_str()),
        (202, Some("order-1")),
        "{again}"
    );
    let changed = json!({"id": "order-1", "type": "a.b", "data": {"i": -2}});
    assert_eq!(acme.post("/v1/events", changed).await.0, 409);
    let new = json!({"id": "order-2", "type": "a.b", "data": {}});
    assert_eq!(acme.post("/v1/events", new).await.0, 429);
    // Another tenant is not held back by this one's backlog.
    assert_eq!(
        other
            .post("/v1/events", json!({"type": "a.b", "data": {}}))
            .await
            .0,
        202
    );
    let (_, health) = server.admin().get("/healthz").await;
    assert!(health["waiting"].as_u64().unwrap() >= 20, "{health}");
    let (_, metrics) = server.metrics(ADMIN_KEY).await;
    assert!(metrics.contains("entrega_backlog{"), "{metrics}");
    assert!(
        metrics.contains("entrega_response_seconds_bucket"),
        "{metrics}"
    );
    // Every accepted event has its delivery.
    for id in &accepted {
        let id = id.as_str().unwrap();
        eventually(
            Duration::from_secs(10),
            "a delivery per accepted event",
            || async { (!acme.deliveries_of(id).await.is_empty()).then_some(()) },
        )
        .await;
    }
}

/// A database at its size limit: publishing answers 503 with `Retry-After`, loses
/// nothing accepted, `/healthz` says degraded while publishes fail (and not for good
/// once none is tried), and the log says so once, not in a flood.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_database_degrades_cleanly_without_flooding_the_log() {
    let dir = TempDir::new("full");
    let server = Server::start_loopback(&dir, &["--max-db-size-mb", "1"]);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/")})).await;
    let blob = "x".repeat(60_000);
    let mut accepted = Vec::new();
    let mut full = false;
    for i in 0..200 {
        let resp = acme
            .client
            .post(format!("{}/v1/events", acme.base))
            .bearer_auth(&acme.key)
            .json(&json!({"type": "a.b", "data": {"i": i, "blob": blob}}))
            .send()
            .await
            .unwrap();
        match resp.status().as_u16() {
            202 => accepted.push(
                resp.json::<Value>().await.unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            ),
            503 => {
                assert!(resp.headers().contains_key("retry-after"));
                full = true;
                break;
            }
            s => panic!("unexpected {s}: {}", resp.text().await.unwrap()),
        }
    }
    assert!(full, "the 1 MiB limit was never reached");
    let (status, health) = server.admin().get("/healthz").await;
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["status"], "degraded");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = std::fs::read_to_string(&server.log).unwrap();
    let errors = log.lines().filter(|l| l.contains("ERROR")).count();
    assert!(errors < 20, "{errors} ERROR lines in 3 s:\n{log}");
    // What was accepted stays readable, and is delivered: new events are refused
    // while there is still room for the deliveries of the accepted ones.
    for id in accepted.iter().take(3) {
        assert_eq!(acme.get(&format!("/v1/events/{id}")).await.0, 200);
    }
    all_delivered(&receiver, &accepted, Duration::from_secs(30)).await;
    // Nothing has tried to publish since: no evidence the API's writes still fail, so
    // a balancer routing on `/healthz` lets requests through again (it never cleared
    // before, with no write to succeed)...
    let (status, health) = eventually(
        Duration::from_secs(30),
        "healthy once no write has failed for a while",
        || async {
            let (status, health) = server.admin().get("/healthz").await;
            (status == 200).then_some((status, health))
        },
    )
    .await;
    assert_eq!(health["status"], "ok", "{status} {health}");
    // ...and the next refusal reports it at once.
    let refused = acme
        .post("/v1/events", json!({"type": "a.b", "data": {"blob": blob}}))
        .await;
    assert_eq!(refused.0, 503, "{}", refused.1);
    let (status, health) = server.admin().get("/healthz").await;
    assert_eq!(
        (status, &health["status"]),
        (503, &json!("degraded")),
        "{health}"
    );
}

/// `/metrics` takes the admin key or the metrics token, never a tenant key.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_need_the_admin_key_or_the_metrics_token() {
    let dir = TempDir::new("metrics");
    let server = Server::start_loopback(&dir, &["--metrics-token", "scrape-token-123"]);
    let (_, acme) = server.admin().tenant("Acme").await;
    assert_eq!(server.metrics("scrape-token-123").await.0, 200);
    assert_eq!(server.metrics(ADMIN_KEY).await.0, 200);
    assert_eq!(server.metrics(&acme.key).await.0, 401);
    assert_eq!(server.metrics("wrong").await.0, 401);
}

/// A batch naming one delivery 1 000 times resends it once; a refused request frees
/// its Idempotency-Key for the corrected one.
#[tokio::test(flavor = "multi_thread")]
async fn batch_resend_deduplicates_and_a_refused_request_frees_its_key() {
    let dir = TempDir::new("batch-dedupe");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/")})).await;
    let evt = acme.publish("a.b", json!({})).await;
    let dlv = eventually(Duration::from_secs(5), "delivered", || async {
        let d = acme.deliveries_of(&evt).await;
        (d.first()?["status"] == "delivered").then(|| d[0]["id"].as_str().unwrap().to_owned())
    })
    .await;
    let send = |body: Value, key: &'static str| {
        let acme = acme.clone();
        async move { acme.post_keyed("/v1/deliveries/resend", body, key).await }
    };
    let (status, problem) = send(json!({"ids": [dlv], "status": "failed"}), "k-1").await;
    assert_eq!(status, 422, "{problem}");
    let (status, answer) = send(json!({"ids": vec![dlv.clone(); 1000]}), "k-1").await;
    assert_eq!(
        status, 200,
        "the corrected request may use the key at once: {answer}"
    );
    assert_eq!(answer["queued"], 1);
    eventually(Duration::from_secs(5), "sent once more", || async {
        (receiver.count() == 2).then_some(())
    })
    .await;
    let (_, d) = acme.get(&format!("/v1/deliveries/{dlv}")).await;
    assert_eq!(d["generation"], 1);
    // The same key again: the same request gets the same answer; another request is
    // refused rather than answered with the first one's answer.
    let (status, again) = send(json!({"ids": vec![dlv.clone(); 1000]}), "k-1").await;
    assert_eq!((status, again), (200, answer));
    let (status, problem) = send(json!({"ids": [dlv]}), "k-1").await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("Idempotency-Key")),
        "{problem}"
    );
}

/// A resend by id, or of a failure, repeated under one Idempotency-Key (a support
/// desk's script trying again after an answer it never got) resends once and answers
/// as it did the first time; the key named again for another delivery is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_resend_repeated_under_one_key_resends_once() {
    let dir = TempDir::new("resend-one-key");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::start(vec![Reply::status(400)], Reply::status(200)).await;
    acme.endpoint(json!({"url": receiver.url("/")})).await;
    let failed_event = acme.publish("a.b", json!({})).await;
    let failure = eventually(Duration::from_secs(10), "a failure", || async {
        let (_, page) = acme.get("/v1/failures").await;
        page["data"][0]["id"].as_str().map(str::to_owned)
    })
    .await;
    let delivered_event = acme.publish("a.b", json!({})).await;
    let dlv = eventually(Duration::from_secs(10), "delivered", || async {
        let d = acme.deliveries_of(&delivered_event).await;
        (d.first()?["status"] == "delivered").then(|| d[0]["id"].as_str().unwrap().to_owned())
    })
    .await;
    let post = |path: String, key: &'static str| {
        let acme = acme.clone();
        async move { acme.post_keyed(&path, json!({}), key).await }
    };
    for (path, key) in [
        (format!("/v1/failures/{failure}/resend"), "failure-1"),
        (format!("/v1/deliveries/{dlv}/resend"), "delivery-1"),
    ] {
        let (status, first) = post(path.clone(), key).await;
        assert_eq!(status, 202, "{first}");
        let (status, again) = post(path, key).await;
        assert_eq!((status, &again), (202, &first), "the first answer again");
    }
    eventually(Duration::from_secs(10), "each resent", || async {
        (receiver.count() == 4).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.count(), 4, "nothing resent twice");
    let (_, d) = acme.get(&format!("/v1/deliveries/{dlv}")).await;
    assert_eq!(d["generation"], 1);

    let other = acme.deliveries_of(&failed_event).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, problem) = post(format!("/v1/deliveries/{other}/resend"), "delivery-1").await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("Idempotency-Key")),
        "{problem}"
    );
}
