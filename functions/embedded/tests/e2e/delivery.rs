//! The happy path: publish → the receiver gets a signed webhook within a second.

use std::time::{Duration, Instant};

use entrega_core::signature::{verify, Secret};
use serde_json::json;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread")]
async fn published_event_arrives_signed_and_is_logged() {
    let dir = TempDir::new("happy");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme CRM").await;
    let receiver = Receiver::answering(200).await;
    let endpoint = acme.endpoint(json!({"url": receiver.url("/hooks")})).await;
    let secret: Secret = endpoint["secret"].as_str().unwrap().parse().unwrap();

    let published = Instant::now();
    let event_id = acme
        .publish("lead.stage_changed", json!({"lead": 42, "stage": "won"}))
        .await;
    eventually(Duration::from_secs(5), "the webhook", || async {
        (receiver.count() == 1).then_some(())
    })
    .await;
    let got = &receiver.got()[0];
    let latency = got.at - published;
    assert!(latency < Duration::from_secs(1), "took {latency:?}");

    assert_eq!(got.path, "/hooks");
    assert_eq!(got.header("webhook-id"), event_id);
    assert_eq!(got.header("idempotency-key"), event_id);
    assert_eq!(got.header("content-type"), "application/json");
    assert!(got.header("user-agent").starts_with("Entrega/"));
    let ts: i64 = got.header("webhook-timestamp").parse().unwrap();
    let now = chrono::Utc::now().timestamp();
    verify(
        &[secret],
        &event_id,
        ts,
        got.body.as_bytes(),
        got.header("webhook-signature"),
        now,
        300,
    )
    .expect("the signature verifies with the endpoint's secret");
    let body: serde_json::Value = serde_json::from_str(&got.body).unwrap();
    assert_eq!(body["type"], "lead.stage_changed");
    assert_eq!(body["data"], json!({"lead": 42, "stage": "won"}));
    assert!(body["timestamp"].as_str().unwrap().ends_with('Z'));

    let deliveries = eventually(Duration::from_secs(5), "the log row", || async {
        let d = acme.deliveries_of(&event_id).await;
        (d.len() == 1 && d[0]["status"] == "delivered").then_some(d)
    })
    .await;
    let (status, detail) = acme
        .get(&format!(
            "/v1/deliveries/{}",
            deliveries[0]["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 200);
    assert_eq!(detail["attempt_count"], 1);
    assert_eq!(detail["last_status_code"], 200);
    assert_eq!(detail["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(detail["attempts"][0]["status_code"], 200);
    assert_eq!(detail["attempts"][0]["trigger"], "scheduled");
    assert_eq!(
        detail["attempts"][0]["response_excerpt"],
        "receiver says hi"
    );
    println!("publish → receiver latency: {latency:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn subscription_filters_idempotent_publish_and_log_filters() {
    let dir = TempDir::new("filters");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let leads = Receiver::answering(204).await;
    let invoices = Receiver::answering(204).await;
    let lead_ep = acme
        .endpoint(json!({"url": leads.url("/"), "event_types": ["lead.*"]}))
        .await;
    acme.endpoint(json!({"url": invoices.url("/"), "event_types": ["invoice.paid"]}))
        .await;

    let (status, first) = acme
        .post(
            "/v1/events",
            json!({"type": "lead.created", "data": {}, "id": "order-7"}),
        )
        .await;
    assert_eq!((status, first["id"].as_str()), (202, Some("order-7")));
    let (status, again) = acme
        .post(
            "/v1/events",
            json!({"type": "lead.created", "data": {}, "id": "order-7"}),
        )
        .await;
    assert_eq!((status, again["id"].as_str()), (202, Some("order-7")));
    acme.publish("invoice.paid", json!({"amount": 10})).await;
    acme.publish("invoice.created", json!({})).await;

    eventually(Duration::from_secs(5), "two deliveries", || async {
        (leads.count() == 1 && invoices.count() == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(leads.count(), 1, "the same event id is delivered once");
    assert_eq!(
        invoices.count(),
        1,
        "invoice.created matches no subscription"
    );

    let ep = lead_ep["id"].as_str().unwrap();
    let (_, page) = acme
        .get(&format!("/v1/deliveries?endpoint_id={ep}&status=delivered"))
        .await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    assert_eq!(page["data"][0]["event_id"], "order-7");
    let (_, page) = acme.get("/v1/deliveries?event_type=invoice.paid").await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    let (_, page) = acme.get("/v1/deliveries?status=failed").await;
    assert!(page["data"].as_array().unwrap().is_empty());
    let (_, page) = acme.get("/v1/deliveries?limit=1").await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a second page")
        .to_owned();
    let (_, next) = acme
        .get(&format!("/v1/deliveries?limit=1&cursor={cursor}"))
        .await;
    assert_eq!(next["data"].as_array().unwrap().len(), 1);
    assert_ne!(next["data"][0]["id"], page["data"][0]["id"]);
    assert!(next["next_cursor"].is_null());
    let (_, later) = acme.get("/v1/deliveries?since=2999-01-01T00:00:00Z").await;
    assert!(later["data"].as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn disabled_endpoint_keeps_deliveries_and_resumes_when_enabled() {
    let dir = TempDir::new("disabled");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    let ep = acme
        .endpoint(json!({"url": receiver.url("/"), "disabled": true}))
        .await;
    let ep_id = ep["id"].as_str().unwrap();
    let ids = [
        acme.publish("a.b", json!(1)).await,
        acme.publish("a.b", json!(2)).await,
    ];
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.count(), 0, "a disabled endpoint receives nothing");
    for id in &ids {
        let d = acme.deliveries_of(id).await;
        assert_eq!(d[0]["status"], "pending", "kept, not lost");
    }
    acme.enable_endpoint(ep_id).await;
    eventually(Duration::from_secs(5), "both resumed", || async {
        (receiver.count() == 2).then_some(())
    })
    .await;
}

/// 5 000 paused deliveries: enabling the endpoint answers at once and they resume in
/// the background, a bounded step per queue message, each delivered once.
#[tokio::test(flavor = "multi_thread")]
async fn five_thousand_paused_deliveries_resume_in_the_background() {
    const EVENTS: usize = 5_000;
    let dir = TempDir::new("resume");
    let server = Server::start_loopback(&dir, &["--api-rate-limit", "100000"]);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    let ep = acme
        .endpoint(json!({"url": receiver.url("/"), "disabled": true, "max_concurrency": 64}))
        .await;
    let ep_id = ep["id"].as_str().unwrap();
    let mut published = 0;
    while published < EVENTS {
        let mut set = tokio::task::JoinSet::new();
        for n in published..(published + 50).min(EVENTS) {
            let api = acme.clone();
            set.spawn(async move { api.publish("a.b", json!({ "n": n })).await });
        }
        while let Some(done) = set.join_next().await {
            done.unwrap();
            published += 1;
        }
    }
    assert_eq!(receiver.count(), 0, "nothing goes to a disabled endpoint");
    acme.enable_endpoint(ep_id).await;
    eventually(Duration::from_secs(120), "all 5 000 delivered", || async {
        (receiver.count() >= EVENTS).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        (receiver.count(), receiver.distinct_webhook_ids().len()),
        (EVENTS, EVENTS),
        "each once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_cleanly_and_a_restart_keeps_everything() {
    let dir = TempDir::new("sigterm");
    let mut server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/")})).await;
    let id = acme.publish("a.b", json!({})).await;
    eventually(Duration::from_secs(5), "delivery", || async {
        (receiver.count() == 1).then_some(())
    })
    .await;
    assert!(server.stop().success(), "exit status after SIGTERM");
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("stopped"), "{log}");
    let server = Server::start(&dir);
    let acme = Api {
        base: server.base.clone(),
        ..acme
    };
    assert_eq!(acme.deliveries_of(&id).await[0]["status"], "delivered");
}

/// `data` reaches the receiver as the producer wrote it: a number past what an `f64`
/// holds is not rounded (`12345678901234567890123` arrived as `1.2345678901234568e22`,
/// and two events differing only there were one to the idempotency check), keys keep
/// their order; `GET /v1/events/{id}` shows it so too. So is `1e400`. A lone surrogate
/// escape is refused, naming `data`.
#[tokio::test(flavor = "multi_thread")]
async fn data_is_delivered_as_written_and_big_numbers_are_not_rounded() {
    let dir = TempDir::new("raw-data");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/")})).await;
    let data = r#"{"z":1,"order_id":12345678901234567890123,"price":1E2,"a":[-0,0.10]}"#;
    let publish = |id: &'static str, data: String| {
        let acme = acme.clone();
        async move {
            let body = format!(r#"{{"id":"{id}","type":"order.created","data":{data}}}"#);
            acme.post_text("/v1/events", body).await
        }
    };
    let (status, answer) = publish("big-1", data.to_owned()).await;
    assert_eq!(status, 202, "{answer}");
    eventually(Duration::from_secs(30), "delivered", || async {
        (receiver.count() == 1).then_some(())
    })
    .await;
    let body = receiver.got()[0].body.clone();
    assert!(body.ends_with(&format!(r#""data":{data}}}"#)), "{body}");

    let (status, shown) = acme.get_text("/v1/events/big-1").await;
    assert_eq!(status, 200, "{shown}");
    assert!(shown.contains(&format!(r#""data":{data}"#)), "{shown}");

    let (status, answer) = publish("big-1", data.to_owned()).await;
    assert_eq!(status, 202, "the same event again: {answer}");
    let other = data.replace("890123", "890124");
    let (status, answer) = publish("big-1", other).await;
    assert_eq!(status, 409, "another number is another event: {answer}");

    let (status, problem) = publish("lone", r#"{"s":"\ud800"}"#.to_owned()).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["field"], "data", "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("surrogate"),
        "{problem}"
    );
    // Nested past what receivers' parsers take (and what the body's parse took before).
    let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
    let (status, problem) = publish("deep", deep).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["field"], "data", "{problem}");
    // Valid JSON past what an `f64` holds is taken as written, like any number.
    let (status, answer) = publish("huge", r#"{"n":1e400}"#.to_owned()).await;
    assert_eq!(status, 202, "{answer}");
    eventually(Duration::from_secs(30), "delivered", || async {
        (receiver.count() == 2).then_some(())
    })
    .await;
    let body = receiver.got()[1].body.clone();
    assert!(body.ends_with(r#""data":{"n":1e400}}"#), "{body}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        receiver.count(),
        2,
        "nothing sent twice, nothing refused sent"
    );
}
