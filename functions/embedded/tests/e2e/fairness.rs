//! One slow customer never delays the others: an endpoint that hangs for its whole
//! timeout, with 2 000 deliveries waiting, does not hold up another tenant.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::*;

const BLOCKED_EVENTS: usize = 2_000;
const PUBLISHERS: usize = 16;
const PROBES: usize = 5;

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_endpoint_does_not_delay_another_tenant() {
    let dir = TempDir::new("fairness");
    let server = Server::start(&dir);
    let (_, slow_tenant) = server.admin().tenant("Slow Inc").await;
    let (_, fast_tenant) = server.admin().tenant("Fast Ltd").await;
    let hanging = Receiver::start(vec![], Reply::status(200).after(Duration::from_secs(120))).await;
    let fast = Receiver::answering(200).await;
    slow_tenant
        .endpoint(json!({"url": hanging.url("/"), "timeout_ms": 2000}))
        .await;
    fast_tenant.endpoint(json!({"url": fast.url("/")})).await;

    let mut publishers = tokio::task::JoinSet::new();
    for p in 0..PUBLISHERS {
        let api = slow_tenant.clone();
        publishers.spawn(async move {
            for i in (p..BLOCKED_EVENTS).step_by(PUBLISHERS) {
                api.publish("load.test", json!({"i": i})).await;
            }
        });
    }
    while publishers.join_next().await.is_some() {}
    eventually(
        Duration::from_secs(30),
        "the hanging endpoint saturated",
        || async { (hanging.count() >= 8).then_some(()) },
    )
    .await;

    let mut worst = Duration::ZERO;
    for n in 0..PROBES {
        let sent = Instant::now();
        fast_tenant.publish("probe", json!({"n": n})).await;
        eventually(
            Duration::from_secs(30),
            "the other tenant's webhook",
            || async { (fast.count() > n).then_some(()) },
        )
        .await;
        worst = worst.max(sent.elapsed());
    }
    println!(
        "with {BLOCKED_EVENTS} deliveries stuck behind a hanging endpoint, another tenant's worst publish→receive: {worst:?}"
    );
    assert!(
        worst < Duration::from_secs(5),
        "another tenant waited {worst:?}"
    );
    assert!(
        hanging.count() <= 8 * 3,
        "the cap held the hanging endpoint to 8 at a time"
    );
}
