//! Support tools: resend (single, from a failure), failures, stats, rate limits (batch
//! resends: `batch_resend.rs`).

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
