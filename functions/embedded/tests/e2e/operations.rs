//! Failures reach humans: one threshold alert per tenant and hour on the alert
//! webhook, batched owner notices, 410 Gone disabling an endpoint, and metrics.

use std::time::Duration;

use entrega_core::signature::{verify, Secret};
use serde_json::json;

use crate::harness::*;
use entrega_testkit::SmtpSink;

const ALERT_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn publish_n(api: &Api, n: usize) {
    for i in 0..n {
        api.publish("order.placed", json!({ "i": i })).await;
    }
}

async fn failures_of(api: &Api) -> usize {
    api.get("/v1/failures?limit=200").await.1["data"]
        .as_array()
        .map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread")]
async fn twelve_failures_raise_one_alert_and_three_raise_none() {
    let dir = TempDir::new("alerts");
    let alerts = Receiver::answering(204).await;
    let hook = alerts.url("/alerts");
    let mail = SmtpSink::start().await;
    let smtp = mail.url();
    let server = Server::start_with(
        &dir,
        &[
            "--allow-target",
            "127.0.0.0/8",
            "--allow-http",
            "--alert-threshold",
            "10",
            "--alert-webhook",
            &hook,
            "--alert-webhook-secret",
            ALERT_SECRET,
            "--smtp-url",
            &smtp,
            "--smtp-from",
            "Entrega <notices@example.com>",
        ],
    );
    let (noisy_id, noisy) = server.admin().tenant("Noisy").await;
    let (_, quiet) = server.admin().tenant("Quiet").await;
    let down = Receiver::answering(500).await;
    noisy
        .endpoint(json!({"url": down.url("/"), "retry": "none"}))
        .await;
    quiet
        .endpoint(json!({"url": down.url("/"), "retry": "none"}))
        .await;
    let watcher = Receiver::answering(200).await;
    noisy
        .endpoint(
            json!({"url": watcher.url("/ops"), "event_types": ["entrega.delivery.exhausted"]}),
        )
        .await;
    // Its event ids are Entrega's alone: a tenant that took `entrega-exhausted-<its
    // delivery>-0` first made the real event a replay, never sent.
    for id in ["entrega-exhausted-dlv_x-0", "Entrega-disabled-ep_x-1"] {
        let event = json!({"id": id, "type": "a.b", "data": {}});
        let (status, problem) = noisy.post("/v1/events", event).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (422, Some("id")),
            "{id}: {problem}"
        );
    }
    publish_n(&noisy, 12).await;
    publish_n(&quiet, 3).await;
    eventually(Duration::from_secs(20), "15 failure records", || async {
        (failures_of(&noisy).await == 12 && failures_of(&quiet).await == 3).then_some(())
    })
    .await;
    eventually(Duration::from_secs(10), "the alert", || async {
        (alerts.count() >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let got = alerts.got();
    assert_eq!(
        got.len(),
        1,
        "exactly one alert for the noisy tenant, none for the quiet one"
    );
    let alert: serde_json::Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(alert["kind"], "failure_threshold");
    assert_eq!(alert["tenant_id"], noisy_id.as_str());
    assert_eq!(alert["count"], 11);
    assert!(alert["window_start"].is_string());
    let secret: Secret = ALERT_SECRET.parse().unwrap();
    let ts: i64 = got[0].header("webhook-timestamp").parse().unwrap();
    verify(
        &[secret],
        got[0].header("webhook-id"),
        ts,
        got[0].body.as_bytes(),
        got[0].header("webhook-signature"),
        chrono::Utc::now().timestamp(),
        300,
    )
    .expect("alerts are signed with the operator's secret");

    // Owner notices are e-mailed and batched: one per tenant in the hour, not one per
    // failure (12 failures for one tenant, 3 for the other: 2 e-mails).
    let mails = eventually(Duration::from_secs(10), "two owner e-mails", || async {
        let m = mail.messages();
        (m.len() >= 2).then_some(m)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mail.messages().len(), 2, "{mails:?}");
    for m in &mails {
        assert!(m.contains("To: owner@example.com"), "{m}");
        assert!(m.contains("From: Entrega <notices@example.com>"), "{m}");
        assert!(
            m.contains("entrega resend dlv_"),
            "the notice says how to resend: {m}"
        );
    }
    // The opted-in endpoint hears of each exhausted delivery.
    eventually(
        Duration::from_secs(10),
        "12 entrega.delivery.exhausted",
        || async { (watcher.count() == 12).then_some(()) },
    )
    .await;
    assert!(watcher
        .got()
        .iter()
        .all(|r| r.body.contains("\"type\":\"entrega.delivery.exhausted\"")));
    let open = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap();
    assert_eq!(open.status(), 401, "/metrics names tenants: it needs a key");
    let (_, metrics) = server.metrics(ADMIN_KEY).await;
    assert!(
        metrics.contains(&format!(
            "entrega_failures_total{{tenant=\"{noisy_id}\"}} 12"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("outcome=\"server_error\"} 12"),
        "{metrics}"
    );
    assert!(metrics.contains("entrega_oldest_unacknowledged_failure_age_seconds"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_410_disables_the_endpoint_and_keeps_its_deliveries_for_re_enabling() {
    let dir = TempDir::new("gone");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::start(vec![Reply::status(410)], Reply::status(200)).await;
    let ep = acme
        .endpoint(json!({"url": receiver.url("/"), "retry": "standard"}))
        .await;
    let ep_id = ep["id"].as_str().unwrap();
    let watcher = Receiver::answering(200).await;
    acme.endpoint(json!({"url": watcher.url("/ops"), "event_types": ["entrega.*"]}))
        .await;

    let first = acme.publish("a.b", json!({"n": 1})).await;
    let disabled = eventually(Duration::from_secs(10), "disabled", || async {
        let (_, e) = acme.get(&format!("/v1/endpoints/{ep_id}")).await;
        (e["disabled"] == true).then_some(e)
    })
    .await;
    assert_eq!(disabled["disabled"], true);
    let second = acme.publish("a.b", json!({"n": 2})).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        receiver.count(),
        1,
        "nothing more is sent to a gone endpoint"
    );
    for id in [&first, &second] {
        let d = acme.deliveries_of(id).await;
        let mine = d.iter().find(|d| d["endpoint_id"] == ep_id).unwrap();
        assert_eq!(mine["status"], "pending", "kept, not failed: {mine}");
    }
    eventually(
        Duration::from_secs(10),
        "entrega.endpoint.disabled",
        || async {
            watcher
                .got()
                .iter()
                .find(|r| r.body.contains("entrega.endpoint.disabled"))
                .map(|_| ())
        },
    )
    .await;
    let (_, none) = acme.get("/v1/failures").await;
    assert!(
        none["data"].as_array().unwrap().is_empty(),
        "a 410 is not a failure"
    );

    acme.enable_endpoint(ep_id).await;
    eventually(Duration::from_secs(10), "both delivered", || async {
        (receiver.count() == 3).then_some(())
    })
    .await;
    for id in [&first, &second] {
        eventually(Duration::from_secs(5), "delivered", || async {
            let d = acme.deliveries_of(id).await;
            d.iter()
                .any(|d| d["endpoint_id"] == ep_id && d["status"] == "delivered")
                .then_some(())
        })
        .await;
    }
}

/// `/metrics` shows the worker's slots in use: attempts under way at an endpoint are
/// counted in the worker's slots (or the slow ones, past a second), and given back
/// when they end, so an operator sees a worker that is full.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_the_worker_slots_in_use() {
    let dir = TempDir::new("slots-metrics");
    let server = Server::start(&dir);
    let (_, tenant) = server.admin().tenant("Acme").await;
    let slow = Receiver::start(vec![], Reply::status(200).after(Duration::from_secs(3))).await;
    tenant.endpoint(json!({"url": slow.url("/")})).await;
    for i in 0..3 {
        tenant.publish("slots.test", json!({"i": i})).await;
    }
    eventually(
        Duration::from_secs(10),
        "three attempts under way",
        || async { (slow.count() == 3).then_some(()) },
    )
    .await;
    let in_use = |metrics: &str| -> u64 {
        ["entrega_worker_slots_in_use ", "entrega_slow_slots_in_use "]
            .iter()
            .map(|name| {
                let line = metrics
                    .lines()
                    .find(|l| l.starts_with(name))
                    .unwrap_or_else(|| panic!("no {name}in {metrics}"));
                line[name.len()..].trim().parse::<u64>().unwrap()
            })
            .sum()
    };
    let (_, metrics) = server.metrics(ADMIN_KEY).await;
    assert_eq!(in_use(&metrics), 3, "{metrics}");
    eventually(Duration::from_secs(15), "the slots given back", || async {
        let (_, metrics) = server.metrics(ADMIN_KEY).await;
        (in_use(&metrics) == 0).then_some(())
    })
    .await;
}

/// A deleted endpoint's series leave `/metrics` with it: a tenant that created, used
/// and deleted endpoints in a loop grew every scrape without bound.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_endpoints_metrics_go_with_it() {
    let dir = TempDir::new("metrics-deleted");
    let server = Server::start(&dir);
    let (_, tenant) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    let mut ids = Vec::new();
    for round in 0..3 {
        let endpoint = tenant.endpoint(json!({"url": receiver.url("/")})).await;
        let id = endpoint["id"].as_str().unwrap().to_owned();
        tenant
            .publish("metrics.test", json!({"round": round}))
            .await;
        eventually(Duration::from_secs(10), "the attempt counted", || async {
            let (_, metrics) = server.metrics(ADMIN_KEY).await;
            metrics.contains(&id).then_some(())
        })
        .await;
        let (status, _) = tenant
            .call("DELETE", &format!("/v1/endpoints/{id}"), None)
            .await;
        assert_eq!(status, 204);
        ids.push(id);
    }
    let (_, metrics) = server.metrics(ADMIN_KEY).await;
    for id in &ids {
        assert!(!metrics.contains(id.as_str()), "{id} still in {metrics}");
    }
}
