//! One slow customer never delays the others: an endpoint that hangs for its whole
//! timeout, with 2 000 deliveries waiting, does not hold up another tenant; nor does
//! one that hangs with a cap as large as the worker's slots.

use std::time::{Duration, Instant};

use entrega_embedded::runtime::TENANT_SLOTS;
use serde_json::json;

use crate::harness::*;

const BLOCKED_EVENTS: usize = 2_000;
const PUBLISHERS: usize = 16;
const PROBES: usize = 5;

/// A server with two tenants: one whose endpoint (`slow_settings` beside its URL)
/// never answers in time, one whose endpoint answers at once.
struct TwoTenants {
    _server: Server,
    slow_tenant: Api,
    fast_tenant: Api,
    hanging: Receiver,
    fast: Receiver,
}

impl TwoTenants {
    async fn start(dir: &TempDir, mut slow_settings: serde_json::Value) -> Self {
        let server = Server::start(dir);
        let (_, slow_tenant) = server.admin().tenant("Slow Inc").await;
        let (_, fast_tenant) = server.admin().tenant("Fast Ltd").await;
        let hanging =
            Receiver::start(vec![], Reply::status(200).after(Duration::from_secs(120))).await;
        let fast = Receiver::answering(200).await;
        slow_settings["url"] = json!(hanging.url("/"));
        slow_tenant.endpoint(slow_settings).await;
        fast_tenant.endpoint(json!({"url": fast.url("/")})).await;
        Self {
            _server: server,
            slow_tenant,
            fast_tenant,
            hanging,
            fast,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_endpoint_does_not_delay_another_tenant() {
    let dir = TempDir::new("fairness");
    let scene = TwoTenants::start(&dir, json!({"timeout_ms": 2000})).await;
    let (slow_tenant, hanging) = (&scene.slow_tenant, &scene.hanging);

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

    let worst = probe(&scene.fast_tenant, &scene.fast).await;
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

/// An endpoint's cap may be as large as the worker's slots, but one tenant never
/// takes them all: the attempts hang for 30 s, and another tenant's still start at
/// once.
#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_endpoint_with_the_largest_cap_leaves_slots_for_another_tenant() {
    let dir = TempDir::new("fairness-cap");
    let scene =
        TwoTenants::start(&dir, json!({"timeout_ms": 30_000, "max_concurrency": 256})).await;
    let (slow_tenant, hanging) = (&scene.slow_tenant, &scene.hanging);
    for i in 0..TENANT_SLOTS * 2 {
        slow_tenant.publish("load.test", json!({"i": i})).await;
    }
    eventually(
        Duration::from_secs(20),
        "the hanging endpoint took its tenant's share of the slots",
        || async { (hanging.count() >= TENANT_SLOTS).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        hanging.count(),
        TENANT_SLOTS,
        "one tenant holds at most its share of the worker's slots"
    );
    let worst = probe(&scene.fast_tenant, &scene.fast).await;
    assert!(
        worst < Duration::from_secs(5),
        "another tenant waited {worst:?} behind a hanging endpoint with cap 256"
    );
}

/// Publish [`PROBES`] events one at a time to `fast`, each once the last arrived;
/// the worst publish → receive.
async fn probe(tenant: &Api, fast: &Receiver) -> Duration {
    let mut worst = Duration::ZERO;
    for n in 0..PROBES {
        let sent = Instant::now();
        tenant.publish("probe", json!({"n": n})).await;
        eventually(
            Duration::from_secs(30),
            "the other tenant's webhook",
            || async { (fast.count() > n).then_some(()) },
        )
        .await;
        worst = worst.max(sent.elapsed());
    }
    worst
}
