//! The SSRF guard, end to end: without an allowlist, no loopback spelling gets a
//! webhook out of Entrega. Private and metadata ranges are covered by address
//! classification tests in `entrega-http` only: no test sends traffic to them.

use std::time::Duration;

use serde_json::json;

use crate::harness::*;

const LOOPBACK_SPELLINGS: [&str; 9] = [
    "127.0.0.1",
    "localhost",
    "[::1]",
    "127.1",
    "0x7f000001",
    "2130706433",
    "[::ffff:127.0.0.1]",
    "0.0.0.0",
    "LocalHost.",
];

#[tokio::test(flavor = "multi_thread")]
async fn every_loopback_spelling_is_refused_at_create() {
    let dir = TempDir::new("ssrf-create");
    // http allowed so that only the address can be the reason for refusal.
    let server = Server::start_with(&dir, &["--allow-http"]);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    let port = receiver.addr.port();
    for host in LOOPBACK_SPELLINGS {
        let url = format!("http://{host}:{port}/");
        let (status, problem) = acme.post("/v1/endpoints", json!({"url": url})).await;
        assert_eq!(status, 422, "{url} was accepted: {problem}");
        assert_eq!(problem["field"], "url");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("forbidden range"),
            "{problem}"
        );
    }
    let (status, problem) = acme
        .post(
            "/v1/endpoints",
            json!({"url": "https://169.254.169.254/latest"}),
        )
        .await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("url")));
    let (status, _) = acme
        .post(
            "/v1/endpoints",
            json!({"url": "https://hooks.example.com/in"}),
        )
        .await;
    assert_eq!(
        status, 201,
        "a public name is accepted (it is checked again at connect time)"
    );
    assert_eq!(receiver.count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn http_targets_need_the_operator_flag() {
    let dir = TempDir::new("ssrf-http");
    let server = Server::start_with(&dir, &[]);
    let (_, acme) = server.admin().tenant("Acme").await;
    let (status, problem) = acme
        .post("/v1/endpoints", json!({"url": "http://hooks.example.com/"}))
        .await;
    assert_eq!(status, 422);
    assert!(
        problem["detail"].as_str().unwrap().contains("https"),
        "{problem}"
    );
}

/// A target that became forbidden after it was stored (the operator removed the
/// allowlist) is refused at connect time, recorded as an attempt, and not retried.
#[tokio::test(flavor = "multi_thread")]
async fn a_stored_loopback_target_is_refused_at_send_time() {
    let dir = TempDir::new("ssrf-send");
    let allow_all_spellings = [
        "--allow-target",
        "127.0.0.0/8",
        "--allow-target",
        "::1",
        "--allow-target",
        "0.0.0.0",
        "--allow-http",
    ];
    let mut server = Server::start_with(&dir, &allow_all_spellings);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    let mut endpoints = Vec::new();
    for host in LOOPBACK_SPELLINGS {
        let url = format!("http://{host}:{}/", receiver.addr.port());
        endpoints.push(
            acme.endpoint(json!({"url": url, "retry": "persistent"}))
                .await,
        );
    }
    server.stop();
    let server = Server::start_with(&dir, &["--allow-http"]);
    let acme = Api {
        base: server.base.clone(),
        ..acme
    };
    let id = acme.publish("a.b", json!({})).await;
    let rows = eventually(Duration::from_secs(10), "all refused", || async {
        let d = acme.deliveries_of(&id).await;
        (d.len() == endpoints.len() && d.iter().all(|d| d["status"] == "failed")).then_some(d)
    })
    .await;
    for row in rows {
        assert_eq!(
            row["attempt_count"], 1,
            "a refused target is not retried: {row}"
        );
        assert!(
            row["last_error"]
                .as_str()
                .unwrap()
                .starts_with("target_refused"),
            "{row}"
        );
    }
    assert_eq!(receiver.count(), 0, "nothing reached the listener");
}
