//! The slots an attempt holds while its request is out: taking them before the
//! attempt, what a message does when none is free, and giving them back.

use std::sync::Mutex;
use std::time::Duration;

use crate::delivery::Delivery;
use crate::endpoint::Endpoint;
use crate::ports::{Services, StoreResult};
use crate::slots::{SlotLease, SlotPool};

use super::task::DeliveryTask;
use super::worker::Disposition;

/// Every slot of the endpoint is taken: the message is hidden for this on its first
/// receive, doubling per receive ([`super::backoff`]). The slots free up as attempts
/// finish; the doubling keeps a deep backlog behind one slow endpoint from asking for
/// slots many times a second (every ask is a conditional write on AWS).
pub const SLOTS_BUSY_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait for a slot. Under a minute, so the wait is a visibility change
/// and a message comes back soon after its endpoint recovers.
pub const SLOTS_BUSY_BACKOFF_MAX: Duration = Duration::from_secs(50);
/// Receives of one message spent waiting for a slot before it is sent again instead
/// (delayed, the received copy deleted): every receive counts towards the queue's
/// redrive limit (100), and a long wait for a busy endpoint is not a poison message.
pub const SLOTS_BUSY_RESEND_AFTER: u32 = 20;

/// Slots taken for one attempt, given back once its request is over.
pub(super) struct HeldSlots(Mutex<Vec<SlotLease>>);

impl HeldSlots {
    /// Give the slots back, if they are still held. Called as soon as the response is
    /// in, before the outcome is recorded: a slot bounds the requests an endpoint has
    /// to answer at once, and the outcome's write (a sync of the disk, a DynamoDB
    /// write) puts no load on the endpoint, so its next attempt may go out meanwhile.
    /// Called again once the attempt ended, whichever way (a no-op if given back).
    pub(super) async fn release(&self, services: &Services) {
        let slots = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        release(services, &slots).await;
    }
}

/// The slots an attempt holds while its request runs: one of its endpoint's
/// `max_concurrency`, and, for an endpoint slow lately where the runtime keeps a share
/// for them, one of the slow endpoints' share. Or, when a pool has none free, what to do with the
/// message meanwhile.
///
/// Why the share: on AWS an invocation lasts as long as its slowest attempt, so
/// endpoints that hang, a few attempts each up to their caps, could hold every
/// invocation of the worker, and every other tenant's messages would wait behind them.
/// The share bounds how many invocations they hold together; the rest stay for
/// endpoints that answer.
pub(super) async fn take_slots(
    services: &Services,
    task: &DeliveryTask,
    endpoint: &Endpoint,
    delivery: &Delivery,
    receive_count: u32,
    lease: Duration,
) -> StoreResult<Result<HeldSlots, Disposition>> {
    // Unique per ask: a duplicate message's attempt must not release this one's slot,
    // and a store that retries a write it already applied recognises it as ours.
    let holder = format!(
        "{}#{}#{}#{:016x}",
        delivery.id,
        delivery.generation,
        delivery.attempt_count,
        services.random.next_u64()
    );
    let now = services.clock.now();
    let mut pools = Vec::with_capacity(2);
    let share = services.settings.slow_endpoint_share;
    if share > 0 && endpoint.health.is_slow(now) {
        // The share first: while slow endpoints hang it is the pool that is full, and
        // a message that must wait then costs no write of its endpoint's slot.
        pools.push((SlotPool::SlowEndpoints, share));
    }
    pools.push((
        SlotPool::Endpoint(endpoint.id.clone()),
        endpoint_cap(endpoint, services.settings.one_endpoint_share),
    ));
    let mut held = Vec::with_capacity(pools.len());
    for (pool, limit) in pools {
        match services
            .slots
            .acquire(&pool, limit, &holder, now, lease)
            .await
        {
            Ok(Some(slot)) => held.push(slot),
            Ok(None) => {
                release(services, &held).await;
                tracing::debug!(?pool, "every slot of the pool is taken");
                return busy(services, task, endpoint, receive_count).await.map(Err);
            }
            Err(e) => {
                release(services, &held).await;
                return Err(e);
            }
        }
    }
    Ok(Ok(HeldSlots(Mutex::new(held))))
}

/// The attempts `endpoint` may have in flight at once: its `max_concurrency`, held to
/// the runtime's `one_endpoint_share` where it keeps one (0: none).
///
/// Why both: an endpoint that starts hanging is marked slow only when one of its
/// attempts ends, a timeout later, and until then its attempts each hold a worker
/// invocation. Its own cap may be more than the worker has (64 against the sixteen
/// invocations of `serve --backend aws`), so the share is what leaves the others
/// theirs during that first timeout. An endpoint that answers feels it only with
/// more than the share in flight at once: on AWS a quarter of the worker's
/// concurrency, 25 requests by default, 1 000 a second at 25 ms each.
pub fn endpoint_cap(endpoint: &Endpoint, one_endpoint_share: u32) -> u32 {
    match one_endpoint_share {
        0 => endpoint.max_concurrency,
        share => endpoint.max_concurrency.min(share),
    }
}

/// What becomes of a message whose attempt found no free slot: hidden for a while,
/// longer on each receive, or sent again after many.
async fn busy(
    services: &Services,
    task: &DeliveryTask,
    endpoint: &Endpoint,
    receive_count: u32,
) -> StoreResult<Disposition> {
    let wait = super::backoff(
        receive_count,
        SLOTS_BUSY_BACKOFF,
        SLOTS_BUSY_BACKOFF_MAX,
        services.random.as_ref(),
    );
    if receive_count >= SLOTS_BUSY_RESEND_AFTER {
        let fresh = task.message(endpoint.max_concurrency, wait);
        services.deliveries.send(vec![fresh]).await?;
        return Ok(Disposition::Done);
    }
    Ok(Disposition::RetryIn(wait))
}

/// Give `slots` back. One that cannot be frees itself when its lease ends; only that
/// much capacity is lost meanwhile.
async fn release(services: &Services, slots: &[SlotLease]) {
    for slot in slots {
        if let Err(e) = services.slots.release(slot).await {
            tracing::warn!(error = %e, pool = ?slot.pool, "could not release a slot");
        }
    }
}

#[cfg(test)]
#[path = "attempt_slots_tests.rs"]
mod tests;
