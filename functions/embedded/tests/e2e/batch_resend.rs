//! Batch resends by filter and window: idempotent under one key, and past a deleted
//! endpoint's deliveries.

use std::time::Duration;

use serde_json::json;

use crate::harness::*;

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

/// A batch resend under an `Idempotency-Key` cut by a `kill -9`, then repeated at once
/// after the restart: the repeat runs (the dead request's claim went with its process;
/// it answered 409 "still running" for five minutes) and resends only what the first
/// run had not reached (it resent the whole window again: a hostile test).
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_resend_cut_by_a_crash_is_finished_by_its_repeat_resending_each_once() {
    const EVENTS: usize = 800;
    let dir = TempDir::new("batch-crash");
    let mut server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/")})).await;
    let since = chrono::Utc::now() - chrono::Duration::seconds(5);
    let mut publishers = tokio::task::JoinSet::new();
    for p in 0..8 {
        let api = acme.clone();
        publishers.spawn(async move {
            for i in 0..EVENTS / 8 {
                api.publish("bulk.item", json!({"p": p, "i": i})).await;
            }
        });
    }
    while publishers.join_next().await.is_some() {}
    eventually(Duration::from_secs(60), "every event delivered", || async {
        (receiver.count() >= EVENTS).then_some(())
    })
    .await;
    let until = chrono::Utc::now() + chrono::Duration::seconds(5);
    let window = json!({"since": since.to_rfc3339(), "until": until.to_rfc3339()});

    let cut = tokio::spawn({
        let (api, window) = (acme.clone(), window.clone());
        async move {
            let _ = api
                .client
                .post(format!("{}/v1/deliveries/resend", api.base))
                .bearer_auth(&api.key)
                .header("Idempotency-Key", "cut-1")
                .json(&window)
                .send()
                .await;
        }
    });
    let delivered_before = receiver.count();
    eventually(Duration::from_secs(30), "the first resends", || async {
        (receiver.count() > delivered_before).then_some(())
    })
    .await;
    server.kill_hard();
    let _ = cut.await;

    server = Server::start(&dir);
    let acme = server.api(&acme.key);
    let (status, answer) = acme
        .post_keyed("/v1/deliveries/resend", window, "cut-1")
        .await;
    assert_eq!(status, 200, "the repeat runs at once: {answer}");
    assert_eq!(answer["queued"], EVENTS, "{answer}");
    let mut generations = std::collections::BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/deliveries?limit=200&cursor={c}"),
            None => "/v1/deliveries?limit=200".to_owned(),
        };
        let (_, page) = acme.get(&path).await;
        for d in page["data"].as_array().unwrap() {
            *generations
                .entry(d["generation"].as_u64().unwrap())
                .or_insert(0) += 1;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(
        generations,
        std::collections::BTreeMap::from([(1, EVENTS)]),
        "each delivery resent once by the request and its repeat together"
    );
}
