//! `kill -9` with hundreds of events in flight: after a restart on the same database
//! every event is delivered at least once, none lost, none without a log row.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use crate::harness::*;

const EVENTS: usize = 500;
const PUBLISHERS: usize = 8;

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_mid_flight_loses_nothing() {
    let dir = TempDir::new("crash");
    let mut server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    // Slow enough that the kill lands with many attempts in flight.
    let receiver =
        Receiver::start(vec![], Reply::status(200).after(Duration::from_millis(40))).await;
    acme.endpoint(json!({"url": receiver.url("/"), "retry": {"delays_s": [1, 1, 1, 1, 1]}}))
        .await;

    let mut publishers = tokio::task::JoinSet::new();
    for p in 0..PUBLISHERS {
        let acme = acme.clone();
        publishers.spawn(async move {
            let mut ids = Vec::new();
            for i in (p..EVENTS).step_by(PUBLISHERS) {
                ids.push(acme.publish("lead.created", json!({"n": i})).await);
            }
            ids
        });
    }
    let mut published = HashSet::new();
    while let Some(ids) = publishers.join_next().await {
        published.extend(ids.unwrap());
    }
    assert_eq!(published.len(), EVENTS);
    eventually(
        Duration::from_secs(30),
        "some deliveries before the crash",
        || async { (receiver.count() >= 60).then_some(()) },
    )
    .await;
    server.kill_hard();
    let before_restart = receiver.count();
    assert!(
        before_restart < EVENTS,
        "the kill must land mid-flight (got {before_restart})"
    );

    let server = Server::start(&dir);
    let acme = Api {
        base: server.base.clone(),
        ..acme
    };
    let seen = eventually(
        Duration::from_secs(60),
        "every event at the receiver",
        || async {
            let seen: HashSet<String> = receiver
                .got()
                .iter()
                .map(|r| r.header("webhook-id").to_owned())
                .collect();
            (seen.len() >= EVENTS).then_some(seen)
        },
    )
    .await;
    assert_eq!(
        seen, published,
        "exactly the published events arrived, none invented"
    );

    // Every event has its delivery recorded as delivered (the last outcomes may still
    // be being written when the receiver has seen everything).
    let delivered = eventually(Duration::from_secs(30), "every delivery logged", || async {
        let n = count_delivered(&acme).await;
        (n == EVENTS).then_some(n)
    })
    .await;
    assert_eq!(delivered, EVENTS, "one delivered row per event");
    for id in published.iter().take(50) {
        let d = acme.deliveries_of(id).await;
        let (_, detail) = acme
            .get(&format!("/v1/deliveries/{}", d[0]["id"].as_str().unwrap()))
            .await;
        let attempts = detail["attempts"].as_array().unwrap();
        assert!(attempts.iter().any(|a| a["status_code"] == 200), "{detail}");
    }
    let duplicates = receiver.count() - EVENTS;
    println!("kill -9 after {before_restart} of {EVENTS} deliveries; duplicates after restart: {duplicates}");
}

/// Delivered rows in the log, paging through it.
async fn count_delivered(api: &Api) -> usize {
    let mut delivered = 0;
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/deliveries?status=delivered&limit=200&cursor={c}"),
            None => "/v1/deliveries?status=delivered&limit=200".to_owned(),
        };
        let (_, page) = api.get(&path).await;
        for row in page["data"].as_array().unwrap() {
            assert!(row["attempt_count"].as_u64().unwrap() >= 1);
            delivered += 1;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return delivered,
        }
    }
}
