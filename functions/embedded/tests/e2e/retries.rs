//! Retries and failure classification, observed at the receiver and in the log.

use std::time::Duration;

use serde_json::json;

use crate::harness::*;

async fn attempts(api: &Api, event_id: &str) -> Vec<serde_json::Value> {
    let d = api.deliveries_of(event_id).await;
    let (_, detail) = api
        .get(&format!("/v1/deliveries/{}", d[0]["id"].as_str().unwrap()))
        .await;
    detail["attempts"].as_array().cloned().unwrap_or_default()
}

async fn settled(api: &Api, event_id: &str, status: &str) -> serde_json::Value {
    eventually(Duration::from_secs(15), status, || async {
        let d = api.deliveries_of(event_id).await;
        (d.first().is_some_and(|d| d["status"] == status)).then(|| d[0].clone())
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn two_503s_then_200_under_a_custom_policy() {
    let dir = TempDir::new("retry503");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::start(
        vec![Reply::status(503), Reply::status(503)],
        Reply::status(200),
    )
    .await;
    acme.endpoint(json!({"url": receiver.url("/"), "retry": {"delays_s": [1, 1, 1]}}))
        .await;
    let id = acme.publish("a.b", json!({"n": 1})).await;
    let row = settled(&acme, &id, "delivered").await;
    assert_eq!(row["attempt_count"], 3);

    let got = receiver.got();
    assert_eq!(got.len(), 3);
    assert!(
        got.iter().all(|r| r.header("webhook-id") == id),
        "same webhook-id on every attempt"
    );
    assert!(
        got.iter().all(|r| r.body == got[0].body),
        "same body on every attempt"
    );
    for pair in got.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= Duration::from_millis(950),
            "retried after {gap:?}, policy says 1 s"
        );
    }
    let a = attempts(&acme, &id).await;
    let codes: Vec<_> = a
        .iter()
        .map(|a| a["status_code"].as_u64().unwrap())
        .collect();
    assert_eq!(codes, [503, 503, 200]);
    assert_eq!(a[0]["error"], "server_error: HTTP 503");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_400_fails_under_standard_and_retries_under_persistent() {
    let dir = TempDir::new("retry400");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let strict = Receiver::answering(400).await;
    acme.endpoint(json!({"url": strict.url("/"), "retry": "standard"}))
        .await;
    let id = acme.publish("a.b", json!({})).await;
    let row = settled(&acme, &id, "failed").await;
    assert_eq!(row["attempt_count"], 1);
    assert_eq!(row["last_status_code"], 400);

    let (_, globex) = server.admin().tenant("Globex").await;
    let flaky = Receiver::start(vec![Reply::status(400)], Reply::status(200)).await;
    globex
        .endpoint(json!({"url": flaky.url("/"), "retry": "persistent"}))
        .await;
    let id = globex.publish("a.b", json!({})).await;
    // persistent waits 5 s ± 10 % before the second attempt.
    let row = settled(&globex, &id, "delivered").await;
    assert_eq!(row["attempt_count"], 2);
    let got = flaky.got();
    assert!(got[1].at - got[0].at >= Duration::from_millis(4400));
    assert_eq!(strict.count(), 1, "standard never retried the 400");
}

#[tokio::test(flavor = "multi_thread")]
async fn redirects_are_failures_and_never_followed() {
    let dir = TempDir::new("redirect");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let elsewhere = Receiver::answering(200).await;
    let redirector = Receiver::start(
        vec![],
        Reply::status(302).header("location", &elsewhere.url("/stolen")),
    )
    .await;
    acme.endpoint(json!({"url": redirector.url("/"), "retry": "standard"}))
        .await;
    let id = acme.publish("a.b", json!({})).await;
    let row = settled(&acme, &id, "failed").await;
    assert_eq!(row["last_status_code"], 302);
    assert!(row["last_error"].as_str().unwrap().starts_with("redirect"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(elsewhere.count(), 0, "the Location was never fetched");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_slower_than_the_timeout_is_recorded_and_retried() {
    let dir = TempDir::new("timeout");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let slow = Receiver::start(
        vec![Reply::status(200).after(Duration::from_secs(3))],
        Reply::status(200),
    )
    .await;
    acme.endpoint(json!({"url": slow.url("/"), "timeout_ms": 500, "retry": {"delays_s": [1]}}))
        .await;
    let id = acme.publish("a.b", json!({})).await;
    let row = settled(&acme, &id, "delivered").await;
    assert_eq!(row["attempt_count"], 2);
    let a = attempts(&acme, &id).await;
    assert_eq!(a[0]["failure_kind"], "timeout");
    assert!(a[0]["status_code"].is_null());
    let ms = a[0]["duration_ms"].as_u64().unwrap();
    assert!(
        (450..2500).contains(&ms),
        "the attempt was cut at its timeout, took {ms} ms"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_after_on_429_is_never_undercut() {
    let dir = TempDir::new("retryafter");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let limited = Receiver::start(
        vec![Reply::status(429).header("retry-after", "3")],
        Reply::status(200),
    )
    .await;
    acme.endpoint(json!({"url": limited.url("/"), "retry": {"delays_s": [1]}}))
        .await;
    let id = acme.publish("a.b", json!({})).await;
    settled(&acme, &id, "delivered").await;
    let got = limited.got();
    let gap = got[1].at - got[0].at;
    assert!(
        gap >= Duration::from_secs(3),
        "second attempt after {gap:?}, receiver asked for 3 s"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_connection_is_retried_then_exhausted() {
    let dir = TempDir::new("refused");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    // A port nothing listens on: bind, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    acme.endpoint(json!({"url": format!("http://127.0.0.1:{port}/"), "retry": {"delays_s": [1]}}))
        .await;
    let id = acme.publish("a.b", json!({})).await;
    let row = settled(&acme, &id, "exhausted").await;
    assert_eq!(row["attempt_count"], 2);
    let a = attempts(&acme, &id).await;
    assert!(
        a.iter().all(|a| a["failure_kind"] == "connection_refused"),
        "{a:?}"
    );
}
