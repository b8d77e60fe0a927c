//! Support tools: resend (single, batch, from a failure), failures, stats, rate limits.

use std::time::Duration;

use entrega_core::signature::{verify, Secret};
use serde_json::json;

use crate::harness::*;

/// The status of the event's (one) delivery; empty until fan-out has made it.
async fn status_of(api: &Api, event_id: &str) -> String {
    let deliveries = api.deliveries_of(event_id).await;
    deliveries
        .first()
        .and_then(|d| d["status"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn resend_after_recovery_restarts_the_count_and_signs_with_the_rotated_secret() {
    let dir = TempDir::new("resend");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::start(
        vec![Reply::status(500), Reply::status(500)],
        Reply::status(200),
    )
    .await;
    let ep = acme
        .endpoint(json!({"url": receiver.url("/"), "retry": {"delays_s": [1]}}))
        .await;
    let ep_id = ep["id"].as_str().unwrap();
    let id = acme.publish("a.b", json!({"n": 1})).await;
    eventually(Duration::from_secs(15), "exhausted", || async {
        (status_of(&acme, &id).await == "exhausted").then_some(())
    })
    .await;
    let dlv = acme.deliveries_of(&id).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let (_, rotated) = acme
        .post(&format!("/v1/endpoints/{ep_id}/rotate-secret"), json!({}))
        .await;
    let new_secret: Secret = rotated["secret"].as_str().unwrap().parse().unwrap();
    assert_ne!(rotated["secret"], ep["secret"]);

    let (status, resent) = acme
        .post(&format!("/v1/deliveries/{dlv}/resend"), json!({}))
        .await;
    assert_eq!(status, 202, "{resent}");
    assert_eq!(resent["attempt_count"], 0, "the counter starts again");
    eventually(Duration::from_secs(10), "delivered", || async {
        (status_of(&acme, &id).await == "delivered").then_some(())
    })
    .await;

    let got = receiver.got();
    assert_eq!(got.len(), 3);
    assert!(
        got.iter().all(|r| r.header("webhook-id") == id),
        "same webhook-id on the resend"
    );
    let last = &got[2];
    let ts: i64 = last.header("webhook-timestamp").parse().unwrap();
    verify(
        &[new_secret],
        &id,
        ts,
        last.body.as_bytes(),
        last.header("webhook-signature"),
        chrono::Utc::now().timestamp(),
        300,
    )
    .expect("the resend is signed with the rotated secret");

    let (_, detail) = acme.get(&format!("/v1/deliveries/{dlv}")).await;
    assert_eq!(detail["attempt_count"], 1);
    assert_eq!(detail["generation"], 1);
    let attempts = detail["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "the earlier attempts stay in the log");
    assert_eq!(attempts[0]["trigger"], "scheduled");
    assert_eq!(attempts[2]["trigger"], "manual");
    assert!(attempts[2]["requested_by"]
        .as_str()
        .unwrap()
        .starts_with("tenant:"));

    // The failure of the first generation is settled by the resend that delivered it,
    // saying who resent it: the 24-hour rule no longer fires for a fixed problem.
    let settled = eventually(Duration::from_secs(10), "acknowledged", || async {
        let (_, page) = acme.get("/v1/failures").await;
        page["data"]
            .as_array()
            .and_then(|d| d.first().cloned())
            .filter(|f| f["acknowledged_at"].is_string())
    })
    .await;
    assert_eq!(settled["delivery_id"], dlv.as_str());
    assert_eq!(settled["acknowledged_by"], attempts[2]["requested_by"]);
    assert!(settled["ack_note"].as_str().unwrap().contains("resend"));
    let (_, open) = acme.get("/v1/failures?acknowledged=false").await;
    assert!(open["data"].as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_can_be_listed_read_acknowledged_and_resent() {
    let dir = TempDir::new("failures");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let (_, other) = server.admin().tenant("Other").await;
    let receiver = Receiver::start(vec![Reply::status(400)], Reply::status(200)).await;
    let ep = acme
        .endpoint(json!({"url": receiver.url("/"), "retry": "standard"}))
        .await;
    let id = acme.publish("invoice.paid", json!({"amount": 42})).await;
    let failure = eventually(Duration::from_secs(10), "a failure record", || async {
        let (_, page) = acme.get("/v1/failures").await;
        page["data"].as_array().and_then(|d| d.first().cloned())
    })
    .await;
    let fid = failure["id"].as_str().unwrap();
    assert_eq!(failure["event_id"], id.as_str());
    assert_eq!(failure["reason"], "not_retryable");
    assert!(
        failure.get("payload").is_none(),
        "a list carries no payloads: {failure}"
    );
    assert_eq!(failure["attempt_times"].as_array().unwrap().len(), 1);
    assert_eq!(failure["last_status_code"], 400);

    let (status, one) = acme.get(&format!("/v1/failures/{fid}")).await;
    assert_eq!((status, &one["payload"]), (200, &json!({"amount": 42})));
    assert_eq!(
        other.get(&format!("/v1/failures/{fid}")).await.0,
        404,
        "another tenant's failure"
    );
    assert_eq!(
        other
            .post(&format!("/v1/failures/{fid}/resend"), json!({}))
            .await
            .0,
        404
    );
    let (_, none) = other.get("/v1/failures").await;
    assert!(none["data"].as_array().unwrap().is_empty());
    let (_, admin_view) = server
        .admin()
        .get(&format!(
            "/v1/failures?tenant_id={}",
            ep["tenant_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        admin_view["data"].as_array().unwrap().len(),
        1,
        "admin filters by tenant"
    );

    let (status, acked) = acme
        .post(
            &format!("/v1/failures/{fid}/ack"),
            json!({"note": "receiver fixed"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(acked["ack_note"], "receiver fixed");
    assert!(acked["acknowledged_at"].is_string());
    assert!(acked["acknowledged_by"]
        .as_str()
        .unwrap()
        .starts_with("tenant:ten_"));
    let (_, open) = acme.get("/v1/failures?acknowledged=false").await;
    assert!(
        open["data"].as_array().unwrap().is_empty(),
        "acknowledged ones leave the open list"
    );

    let (status, _) = acme
        .post(&format!("/v1/failures/{fid}/resend"), json!({}))
        .await;
    assert_eq!(status, 202);
    eventually(Duration::from_secs(10), "redelivered", || async {
        (receiver.count() == 2).then_some(())
    })
    .await;
    eventually(Duration::from_secs(5), "delivered", || async {
        (status_of(&acme, &id).await == "delivered").then_some(())
    })
    .await;

    let (_, stats) = acme
        .get(&format!(
            "/v1/endpoints/{}/stats",
            ep["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        (
            stats["attempts"].as_u64(),
            stats["delivered"].as_u64(),
            stats["failed"].as_u64()
        ),
        (Some(2), Some(1), Some(1))
    );
    assert!(stats["median_ms"].is_u64() && stats["p95_ms"].is_u64());
    assert_eq!(stats["last_error"], "client_error: HTTP 400");
    let (_, kept) = acme.get(&format!("/v1/failures/{fid}")).await;
    assert_eq!(
        kept["ack_note"], "receiver fixed",
        "a delivered resend never overwrites a person's acknowledgement"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_resend_of_300_failures_in_a_window_is_idempotent() {
    let dir = TempDir::new("batch");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let (_, other) = server.admin().tenant("Other").await;
    let receiver = Receiver::answering(500).await;
    acme.endpoint(json!({"url": receiver.url("/"), "retry": "none"}))
        .await;
    let start = chrono::Utc::now() - chrono::Duration::seconds(5);
    let mut publishers = tokio::task::JoinSet::new();
    for p in 0..6 {
        let api = acme.clone();
        publishers.spawn(async move {
            for i in 0..50 {
                api.publish("bulk.item", json!({"p": p, "i": i})).await;
            }
        });
    }
    while publishers.join_next().await.is_some() {}
    eventually(Duration::from_secs(30), "300 exhausted", || async {
        let (_, page) = acme.get("/v1/failures?limit=200").await;
        let first = page["data"].as_array().unwrap().len();
        let more = page["next_cursor"].as_str().map(str::to_owned)?;
        let (_, rest) = acme
            .get(&format!("/v1/failures?limit=200&cursor={more}"))
            .await;
        (first + rest["data"].as_array().unwrap().len() == 300).then_some(())
    })
    .await;
    let recovered = Receiver::answering(200).await;
    for ep in acme.get("/v1/endpoints").await.1["data"]
        .as_array()
        .unwrap()
    {
        let (status, _) = acme
            .call(
                "PATCH",
                &format!("/v1/endpoints/{}", ep["id"].as_str().unwrap()),
                Some(json!({"url": recovered.url("/")})),
            )
            .await;
        assert_eq!(status, 200);
    }

    let window = json!({
        "status": "exhausted",
        "since": start.to_rfc3339(),
        "until": (chrono::Utc::now() + chrono::Duration::seconds(5)).to_rfc3339(),
    });
    let send = |api: Api, key: &'static str| {
        let window = window.clone();
        async move { api.post_keyed("/v1/deliveries/resend", window, key).await }
    };
    let (status, first) = send(acme.clone(), "batch-1").await;
    assert_eq!(
        (status, first["queued"].as_u64()),
        (200, Some(300)),
        "{first}"
    );
    assert!(first["next_cursor"].is_null());
    eventually(Duration::from_secs(30), "300 redelivered", || async {
        (recovered.count() == 300).then_some(())
    })
    .await;
    let (status, again) = send(acme.clone(), "batch-1").await;
    assert_eq!(
        (status, &again),
        (200, &first),
        "the same key gets the same answer"
    );
    let (_, other_batch) = other.post("/v1/deliveries/resend", window.clone()).await;
    assert_eq!(
        other_batch["queued"], 0,
        "another tenant's window is empty for it"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(recovered.count(), 300, "nothing sent twice");

    let (status, problem) = acme.post("/v1/deliveries/resend", json!({"status": "exhausted", "since": "2026-01-01T00:00:00Z", "until": "2026-02-01T00:00:00Z"})).await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("until")),
        "windows are at most 14 days"
    );
    let (status, _) = acme.post("/v1/deliveries/resend", json!({"ids": []})).await;
    assert_eq!(status, 422);
    let some_id = acme.get("/v1/deliveries?limit=1").await.1["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, by_other) = other
        .post("/v1/deliveries/resend", json!({"ids": [some_id]}))
        .await;
    assert_eq!(
        (
            by_other["queued"].as_u64(),
            by_other["not_found"][0].as_str()
        ),
        (Some(0), Some(some_id.as_str()))
    );
    assert_eq!(
        other
            .post(&format!("/v1/deliveries/{some_id}/resend"), json!({}))
            .await
            .0,
        404
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_rate_limit_answers_429_with_retry_after() {
    let dir = TempDir::new("ratelimit");
    let server = Server::start_with(&dir, &["--api-rate-limit", "1"]);
    let (_, acme) = server.admin().tenant("Acme").await;
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..4 {
        let resp = acme
            .client
            .get(format!("{}/v1/endpoints", server.base))
            .bearer_auth(&acme.key)
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
        if resp.status() == 429 {
            retry_after = resp
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            assert_eq!(resp.headers()["content-type"], "application/problem+json");
        }
    }
    assert_eq!(&statuses[..2], &[200, 200], "a burst of 2 × 1/s");
    assert!(statuses[2..].contains(&429), "{statuses:?}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    let (status, _) = server.admin().get("/v1/endpoints").await;
    assert_eq!(status, 200, "limits are per key");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(acme.get("/v1/endpoints").await.0, 200, "the bucket refills");
}

/// Deliveries paused behind a disabled endpoint end when the endpoint is deleted (they
/// would otherwise answer "pending" to "did this event arrive?" forever).
#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_disabled_endpoint_ends_its_paused_deliveries() {
    let dir = TempDir::new("delete-paused");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    let ep = acme
        .endpoint(json!({"url": receiver.url("/off"), "disabled": true}))
        .await;
    let events: Vec<String> = futures_util::future::join_all(
        (0..3).map(|n| acme.publish("order.shipped", json!({ "n": n }))),
    )
    .await;
    // How many of the events' deliveries `matching` holds for.
    let count = |matching: fn(&serde_json::Value) -> bool| {
        let (acme, events) = (&acme, &events);
        async move {
            let mut n = 0;
            for e in events {
                n += acme
                    .deliveries_of(e)
                    .await
                    .iter()
                    .filter(|d| matching(d))
                    .count();
            }
            n
        }
    };
    // Paused behind the disabled endpoint (the API shows them pending).
    eventually(Duration::from_secs(30), "3 made", || async {
        let paused = count(|d| d["status"] == "pending" && d["attempt_count"] == 0).await;
        (paused == 3).then_some(())
    })
    .await;
    let path = format!("/v1/endpoints/{}", ep["id"].as_str().unwrap());
    assert_eq!(acme.call("DELETE", &path, None).await.0, 204);
    eventually(Duration::from_secs(30), "3 ended", || async {
        let ended =
            count(|d| d["status"] == "failed" && d["last_error"] == "the endpoint was deleted")
                .await;
        (ended == 3).then_some(())
    })
    .await;
    assert_eq!(receiver.count(), 0, "nothing was sent");
}

/// A batch that meets a delivery whose endpoint was deleted lists it and goes on; the
/// Idempotency-Key holds for the whole batch (it used to stop with a 409 after
/// resending the rows before it, free its key, and resend them again on repeat).
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_resend_skips_deliveries_of_a_deleted_endpoint_and_resends_the_rest_once() {
    let dir = TempDir::new("batch-deleted");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/kept")})).await;
    let gone = acme.endpoint(json!({"url": receiver.url("/gone")})).await;
    let since = chrono::Utc::now() - chrono::Duration::seconds(5);
    let mut events = Vec::new();
    for n in 0..3 {
        events.push(acme.publish("order.shipped", json!({ "n": n })).await);
    }
    eventually(Duration::from_secs(30), "6 delivered", || async {
        (receiver.count() == 6).then_some(())
    })
    .await;
    let (status, _) = acme
        .call(
            "DELETE",
            &format!("/v1/endpoints/{}", gone["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, 204);

    let until = chrono::Utc::now() + chrono::Duration::seconds(5);
    let window = json!({"since": since.to_rfc3339(), "until": until.to_rfc3339()});
    let mut answers = Vec::new();
    for _ in 0..2 {
        let response = acme
            .client
            .post(format!("{}/v1/deliveries/resend", acme.base))
            .bearer_auth(&acme.key)
            .header("Idempotency-Key", "window-1")
            .json(&window)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        answers.push(response.json::<serde_json::Value>().await.unwrap());
    }
    assert_eq!(answers[0], answers[1], "the same answer under the same key");
    assert_eq!(answers[0]["queued"], 3, "{}", answers[0]);
    assert_eq!(answers[0]["endpoint_deleted"].as_array().unwrap().len(), 3);
    eventually(Duration::from_secs(30), "3 resent", || async {
        (receiver.count() == 9).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.count(), 9, "nothing resent twice");
    let resent: Vec<_> = receiver.got()[6..].iter().map(|r| r.path.clone()).collect();
    assert!(resent.iter().all(|p| p == "/kept"), "{resent:?}");

    // By ids: the same, one of each.
    let deliveries = acme.deliveries_of(&events[0]).await;
    let ids: Vec<_> = deliveries.iter().map(|d| d["id"].clone()).collect();
    let (status, answer) = acme
        .post("/v1/deliveries/resend", json!({ "ids": ids }))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["queued"], 1, "{answer}");
    assert_eq!(answer["endpoint_deleted"].as_array().unwrap().len(), 1);
}

/// Input the hostile test found accepted: an admin's event or endpoint for a tenant
/// nobody created, and an acknowledgement note with a NUL.
#[tokio::test(flavor = "multi_thread")]
async fn a_made_up_tenant_and_a_control_character_in_a_note_are_refused() {
    let dir = TempDir::new("refused");
    let server = Server::start(&dir);
    let admin = server.admin();
    let nobody = "ten_00000000000000000000000000000000";
    for (path, body) in [
        (
            "/v1/events",
            json!({"tenant_id": nobody, "type": "a.b", "data": {}}),
        ),
        (
            "/v1/endpoints",
            json!({"tenant_id": nobody, "url": "https://example.com/"}),
        ),
    ] {
        let (status, problem) = admin.post(path, body).await;
        assert_eq!(status, 422, "{path}: {problem}");
        assert_eq!(problem["field"], "tenant_id", "{problem}");
    }
    let (_, acme) = admin.tenant("Acme").await;
    let receiver = Receiver::answering(500).await;
    acme.endpoint(json!({"url": receiver.url("/"), "retry": "none"}))
        .await;
    acme.publish("a.b", json!({})).await;
    let failure = eventually(Duration::from_secs(30), "a failure", || async {
        let (_, page) = acme.get("/v1/failures").await;
        page["data"][0]["id"].as_str().map(str::to_owned)
    })
    .await;
    let ack = format!("/v1/failures/{failure}/ack");
    let (status, problem) = acme.post(&ack, json!({"note": "fixed\u{0}"})).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["field"], "note");
    let (status, acked) = acme
        .post(&ack, json!({"note": "fixed the receiver\nand resent"}))
        .await;
    assert_eq!(status, 200, "{acked}");
}

/// At most once, a resend while the attempt is out is refused, singly (409 naming
/// when to try again) and in a batch (listed, the rest queued): queued, it went once
/// the attempt ended, whatever its answer, and the receiver had the event twice (a
/// hostile test). After the attempt, the receiver has had it once.
#[tokio::test(flavor = "multi_thread")]
async fn a_resend_while_an_at_most_once_attempt_is_out_is_refused() {
    let dir = TempDir::new("resend-at-most-once");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::start(vec![], Reply::status(200).after(Duration::from_secs(2))).await;
    acme.endpoint(json!({"url": receiver.url("/"), "mode": "at_most_once"}))
        .await;
    let event = acme.publish("order.shipped", json!({"n": 1})).await;
    eventually(Duration::from_secs(30), "the attempt is out", || async {
        (receiver.count() == 1).then_some(())
    })
    .await;
    let delivery = acme.deliveries_of(&event).await.remove(0);
    let id = delivery["id"].as_str().unwrap();

    let (status, problem) = acme
        .post(&format!("/v1/deliveries/{id}/resend"), json!({}))
        .await;
    assert_eq!(status, 409, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("at most once"),
        "{problem}"
    );
    let (status, answer) = acme
        .post("/v1/deliveries/resend", json!({ "ids": [id] }))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["queued"], 0, "{answer}");
    assert_eq!(answer["attempt_under_way"], json!([id]), "{answer}");

    eventually(Duration::from_secs(30), "delivered", || async {
        let d = acme.deliveries_of(&event).await.remove(0);
        (d["status"] == "delivered").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.count(), 1, "the event reached the receiver once");
}
