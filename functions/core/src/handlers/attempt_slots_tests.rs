//! The slots an attempt takes, on the in-memory world: a busy endpoint's message is
//! hidden, one endpoint's share and the slow endpoints' share hold where a runtime
//! keeps them, and a slot goes back as soon as the response is in.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::delivery::DeliveryState;
use crate::handlers::worker::Disposition;
use crate::handlers::worker_case::case;
use crate::outcome::FailureKind;
use crate::ports::{Clock, StoreResult};
use crate::slots::SlotPool;

#[tokio::test]
async fn a_busy_endpoint_hides_the_message_instead_of_waiting() {
    let c = case(|e| e.max_concurrency = 1).await;
    let d = c.publish().await;
    // Another attempt holds the endpoint's only slot.
    assert!(c.hold_endpoint_slot("another").await.is_some());
    // Hidden for the first step of the backoff (jittered over its upper half).
    match c.handle_next().await {
        Disposition::RetryIn(wait) => {
            assert!(
                wait >= SLOTS_BUSY_BACKOFF / 2 && wait <= SLOTS_BUSY_BACKOFF,
                "{wait:?}"
            )
        }
        other => panic!("a busy endpoint's message is kept: {other:?}"),
    }
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Pending);
    assert!(c.world.transport.requests().is_empty());
}

/// Where the runtime keeps one endpoint's share (AWS), an endpoint whose own cap is
/// larger has no more than the share in flight: before it is known slow, that is all
/// an endpoint that starts hanging can hold of the worker.
#[tokio::test]
async fn one_endpoint_holds_no_more_than_its_share_whatever_its_cap() {
    let mut c = case(|e| e.max_concurrency = 64).await;
    c.world.services.settings.one_endpoint_share = 1;
    let held = c
        .hold_endpoint_slot("a hanging attempt")
        .await
        .expect("the share's one place");
    let waiting = c.publish().await;
    assert!(matches!(c.handle_next().await, Disposition::RetryIn(_)));
    assert!(c.world.transport.requests().is_empty(), "nothing sent");
    assert_eq!(c.delivery(&waiting.id).await.state, DeliveryState::Pending);

    // Its cap alone (no share kept: the embedded runtime) lets it go at once.
    c.world.services.settings.one_endpoint_share = 0;
    c.advance(SLOTS_BUSY_BACKOFF.as_secs() + 1);
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(
        c.delivery(&waiting.id).await.state,
        DeliveryState::Delivered
    );
    c.world.services.slots.release(&held).await.unwrap();
}

/// Where the runtime keeps a share for endpoints slow lately (AWS), an attempt that
/// timed out marks its endpoint slow, and its next attempts wait for a place in the
/// share instead of holding another invocation.
#[tokio::test]
async fn attempts_at_an_endpoint_slow_lately_wait_for_the_slow_share() {
    let mut c = case(|_| {}).await;
    c.world.services.settings.slow_endpoint_share = 1;
    c.world
        .transport
        .then([crate::outcome::TransportResult::Failed {
            kind: FailureKind::Timeout,
            message: "no answer within 10 s".into(),
        }]);
    c.publish().await;
    assert!(matches!(c.handle_next().await, Disposition::RetryIn(_)));
    let marked = c.stored_endpoint().await;
    assert!(marked.health.is_slow(c.world.clock.now()), "marked slow");

    // Another slow endpoint's attempt holds the share's one place.
    let held = c
        .hold_slow_share("another")
        .await
        .expect("the share's place");
    let waiting = c.publish().await;
    assert!(matches!(c.handle_next().await, Disposition::RetryIn(_)));
    assert_eq!(c.world.transport.requests().len(), 1, "nothing more sent");
    assert_eq!(c.delivery(&waiting.id).await.state, DeliveryState::Pending);

    // The place given back, it goes; and with no share kept (the embedded runtime),
    // a slow endpoint's attempt never waits for one.
    c.world.services.slots.release(&held).await.unwrap();
    c.advance(SLOTS_BUSY_BACKOFF.as_secs() + 1);
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(
        c.delivery(&waiting.id).await.state,
        DeliveryState::Delivered
    );
    c.world.services.settings.slow_endpoint_share = 0;
    assert!(c.hold_slow_share("again").await.is_some());
    let unshared = c.publish().await;
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(
        c.delivery(&unshared.id).await.state,
        DeliveryState::Delivered
    );
    let still = c.stored_endpoint().await;
    assert!(still.health.is_slow(c.world.clock.now()));

    // Once the mark has held a while, a success answered in time clears it (here the
    // first delivery's retry, due by now): a recovered endpoint leaves the share.
    c.advance(crate::endpoint_health::SLOW_MARK_HOLD.as_secs());
    assert_eq!(c.handle_next().await, Disposition::Done);
    let recovered = c.stored_endpoint().await;
    assert!(!recovered.health.is_slow(c.world.clock.now()));
}

/// The slots port as the worker sees it, noting the delivery's state in the store each
/// time a slot is given back.
struct StateAtRelease {
    inner: Arc<dyn crate::slots::EndpointSlots>,
    store: crate::memory::MemoryStore,
    delivery: crate::ids::DeliveryId,
    seen: std::sync::Mutex<Vec<DeliveryState>>,
}

#[async_trait::async_trait]
impl crate::slots::EndpointSlots for StateAtRelease {
    async fn acquire(
        &self,
        pool: &SlotPool,
        limit: u32,
        holder: &str,
        now: chrono::DateTime<chrono::Utc>,
        lease: Duration,
    ) -> StoreResult<Option<crate::slots::SlotLease>> {
        self.inner.acquire(pool, limit, holder, now, lease).await
    }

    async fn release(&self, lease: &crate::slots::SlotLease) -> StoreResult<()> {
        use crate::ports::DeliveryStore;
        let stored = self.store.get_delivery(&self.delivery).await?;
        self.seen.lock().unwrap().push(stored.unwrap().state);
        self.inner.release(lease).await
    }
}

/// An endpoint's slot bounds the requests it answers at once: it is given back as soon
/// as the response is in, not after the outcome is written (held through that write,
/// `max_concurrency` capped the worker well below what the endpoint could take).
#[tokio::test]
async fn the_slot_is_given_back_before_the_outcome_is_recorded() {
    let mut c = case(|e| e.max_concurrency = 1).await;
    let d = c.publish().await;
    let watching = Arc::new(StateAtRelease {
        inner: c.world.services.slots.clone(),
        store: c.world.store.clone(),
        delivery: d.id.clone(),
        seen: Default::default(),
    });
    c.world.services.slots = watching.clone();
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.delivery(&d.id).await.state, DeliveryState::Delivered);
    assert_eq!(
        *watching.seen.lock().unwrap(),
        vec![DeliveryState::Delivering],
        "given back once, while the attempt's lease was the last write"
    );
    // And free again for the next attempt.
    c.publish().await;
    assert_eq!(c.handle_next().await, Disposition::Done);
    assert_eq!(c.world.transport.requests().len(), 2);
}
