//! One slow customer never delays the others: an endpoint that hangs for its whole
//! timeout, with 2 000 deliveries waiting, does not hold up another tenant; nor do
//! several that hang at once with a cap as large as the worker's slots.

use std::time::{Duration, Instant};

use entrega_embedded::runtime::{KEPT_SLOTS_PER_TENANT, SHARED_SLOTS, WORKER_SLOTS};
use serde_json::json;

use crate::harness::*;

const BLOCKED_EVENTS: usize = 2_000;
const PUBLISHERS: usize = 16;
const PROBES: usize = 5;

/// A server with slow tenants, each with an endpoint (`slow_settings` beside its
/// URL) that never answers in time, and one tenant whose endpoint answers at once.
struct Tenants {
    _server: Server,
    slow_tenants: Vec<Api>,
    fast_tenant: Api,
    /// Every slow tenant's endpoint.
    hanging: Receiver,
    fast: Receiver,
}

impl Tenants {
    async fn start(dir: &TempDir, slow: usize, slow_settings: serde_json::Value) -> Self {
        let server = Server::start(dir);
        let hanging =
            Receiver::start(vec![], Reply::status(200).after(Duration::from_secs(120))).await;
        let mut slow_settings = slow_settings;
        slow_settings["url"] = json!(hanging.url("/"));
        let mut slow_tenants = Vec::new();
        for n in 0..slow {
            let (_, tenant) = server.admin().tenant(&format!("Slow {n} Inc")).await;
            tenant.endpoint(slow_settings.clone()).await;
            slow_tenants.push(tenant);
        }
        let (_, fast_tenant) = server.admin().tenant("Fast Ltd").await;
        let fast = Receiver::answering(200).await;
        fast_tenant.endpoint(json!({"url": fast.url("/")})).await;
        Self {
            _server: server,
            slow_tenants,
            fast_tenant,
            hanging,
            fast,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_endpoint_does_not_delay_another_tenant() {
    let dir = TempDir::new("fairness");
    let scene = Tenants::start(&dir, 1, json!({"timeout_ms": 2000})).await;
    let (slow_tenant, hanging) = (&scene.slow_tenants[0], &scene.hanging);

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

/// An endpoint's cap may be as large as the worker's slots, and several tenants'
/// endpoints may hang at once, but together they never take every slot: their
/// attempts hang for 30 s, and another tenant's still start at once.
#[tokio::test(flavor = "multi_thread")]
async fn tenants_hanging_with_the_largest_cap_leave_slots_for_another_tenant() {
    let dir = TempDir::new("fairness-cap");
    let settings = json!({"timeout_ms": 30_000, "max_concurrency": 256});
    let scene = Tenants::start(&dir, 3, settings).await;
    for tenant in &scene.slow_tenants {
        for i in 0..SHARED_SLOTS {
            tenant.publish("load.test", json!({"i": i})).await;
        }
    }
    let hanging = &scene.hanging;
    eventually(
        Duration::from_secs(20),
        "the hanging endpoints took the shared slots",
        || async { (hanging.count() >= SHARED_SLOTS).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Past the shared slots, each tenant took kept slots only up to its small share
    // (none if it had that many already): the rest stay free for others.
    let taken = hanging.count();
    assert!(
        (SHARED_SLOTS..=SHARED_SLOTS + 3 * KEPT_SLOTS_PER_TENANT).contains(&taken)
            && taken < WORKER_SLOTS,
        "{taken} attempts hanging at once"
    );
    let worst = probe(&scene.fast_tenant, &scene.fast).await;
    assert!(
        worst < Duration::from_secs(5),
        "another tenant waited {worst:?} behind three hanging endpoints with cap 256"
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
