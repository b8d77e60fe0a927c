//! The sweeper: a delivery whose message was lost is found and queued again.
//!
//! A delivery moves only when its queue message comes back. Every path keeps one (the
//! fan-out queues before it reports success, a retry is hidden, re-sent or scheduled
//! before its message is let go), but a message can still vanish outside our code: a
//! queue purged by hand, a schedule deleted, a message moved to the dead-letter queue
//! after a run of backend errors. Without a sweep such a delivery would wait forever,
//! and nobody would be told. So on a timer (a schedule on AWS, a loop in `entrega
//! serve`) the sweeper asks the store for waiting deliveries whose next attempt is well
//! overdue and queues each once more.
//!
//! Idempotent: the worker drops a message for a delivery that has moved on, and two
//! messages for one delivery make at most one attempt at a time (the delivery lease),
//! at-most-once included (its "delivering" write). The sweep never writes the delivery
//! itself, so nothing the API or the worker wrote is undone; a claim per delivery keeps
//! it from being queued again for [`SWEEP_CLAIM`], so a delivery that is only late
//! (a deep backlog, not a lost message) gains at most one extra message that often.
//! A queued delivery is also left out of the sweeper's question for that long
//! ([`crate::ports::DeliveryStore::postpone_sweep`]): otherwise, behind a deep backlog, every run
//! would read the same most overdue [`SWEEP_BATCH`] again, all claimed, and never
//! reach a lost message behind them.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use tracing::{info_span, Instrument};

use crate::delivery::Delivery;
use crate::event::format_timestamp;
use crate::ids::EndpointId;
use crate::ports::{Services, StoreResult};
use crate::remembered::RememberedKey;

use super::task::DeliveryTask;

/// How overdue a delivery must be before the sweeper touches it. Far beyond how late a
/// healthy message runs (a retry's visibility wait, a slot backoff, a schedule firing),
/// so a sweep queues the lost, not the merely busy.
pub const SWEEP_GRACE: ChronoDuration = ChronoDuration::minutes(15);
/// Deliveries examined per run: bounds one run's reads and messages; a larger set is
/// worked through on the following runs, most overdue first.
pub const SWEEP_BATCH: usize = 500;
/// How often the sweeper runs (the AWS schedule's rate and the embedded loop's timer).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(300);
/// A delivery queued by a sweep is not queued again for this long: its message may
/// simply be waiting behind others, and every extra message follows the delivery
/// until it finishes (the worker cannot tell the copy from the original).
pub const SWEEP_CLAIM: Duration = Duration::from_secs(6 * 3_600);

/// What one run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Overdue deliveries the store returned.
    pub examined: usize,
    /// Deliveries queued again.
    pub requeued: usize,
}

/// One sweep: queue every delivery overdue by more than [`SWEEP_GRACE`] once more.
pub async fn sweep_overdue(services: &Services) -> StoreResult<SweepReport> {
    async {
        let now = services.clock.now();
        let cutoff = now - SWEEP_GRACE;
        // A failed preparation must not stop the sweep of what the index already
        // holds; it is counted, and the metric pages (it may hide lost messages).
        if let Err(e) = services.store.prepare_sweep(cutoff).await {
            tracing::error!(error = %e, "the store could not prepare the sweep; sweeping what its index holds");
            services.metrics.sweep_preparation_failed();
        }
        let overdue = services
            .store
            .overdue_deliveries(cutoff, SWEEP_BATCH)
            .await?;
        let mut report = SweepReport {
            examined: overdue.len(),
            ..SweepReport::default()
        };
        let mut postponed = Vec::new();
        for delivery in overdue {
            // The store's index may be a moment behind the delivery itself.
            if delivery.due_at().is_none_or(|due| due > cutoff) {
                continue;
            }
            // One delivery's failure does not stop the others'.
            match requeue_once(services, &delivery, now).await {
                Ok(claim) => {
                    report.requeued += usize::from(claim.queued);
                    // Claimed now or by an earlier run: out of the next runs' way until
                    // its claim ends.
                    let claim_ends =
                        claim.at + ChronoDuration::from_std(SWEEP_CLAIM).unwrap_or_default();
                    postponed.push((delivery, claim_ends));
                }
                Err(e) => {
                    tracing::error!(delivery_id = %delivery.id, error = %e, "could not queue an overdue delivery again; the next sweep retries")
                }
            }
        }
        if report.requeued > 0 {
            services.metrics.deliveries_swept(report.requeued as u64);
        }
        // All in one store call (one transaction on SQLite). If it fails, the next run
        // finds them claimed and postpones them then.
        if let Err(e) = services.store.postpone_sweep(&postponed).await {
            tracing::warn!(error = %e, count = postponed.len(), "could not postpone the swept deliveries");
        }
        Ok(report)
    }
    .instrument(info_span!("sweep"))
    .await
}

/// A delivery's sweep claim: when it was made, and whether this run made it (and so
/// queued the delivery).
struct Claim {
    at: DateTime<Utc>,
    queued: bool,
}

/// Queue `delivery` again unless a sweep did within [`SWEEP_CLAIM`].
async fn requeue_once(
    services: &Services,
    delivery: &Delivery,
    now: DateTime<Utc>,
) -> StoreResult<Claim> {
    let claim = RememberedKey::Sweep(&delivery.id).to_string();
    // The claim records when it was made, so a later run postpones to its end, not
    // to a claim period from whenever that run happens to see the delivery.
    if let Some(earlier) = services
        .store
        .remember_once(&claim, &format_timestamp(now), SWEEP_CLAIM)
        .await?
    {
        return Ok(Claim {
            // A claim from before claims recorded their time counts from now.
            at: earlier.parse().unwrap_or(now),
            queued: false,
        });
    }
    if let Err(e) = queue_again(services, std::slice::from_ref(delivery)).await {
        // Not queued: the next sweep must be free to try again.
        services.store.forget(&claim).await?;
        return Err(e);
    }
    tracing::warn!(
        delivery_id = %delivery.id,
        tenant_id = %delivery.tenant_id,
        due_at = ?delivery.due_at(),
        "queued an overdue delivery again (its message was lost)"
    );
    Ok(Claim {
        at: now,
        queued: true,
    })
}

/// Queue a message for each of `deliveries` once more (their own were lost), in one
/// send, each to its endpoint's cap as it is now (read once per endpoint). One deleted
/// meanwhile still needs the message, so that the worker ends its delivery.
pub async fn queue_again(services: &Services, deliveries: &[Delivery]) -> StoreResult<()> {
    let mut caps: HashMap<&EndpointId, u32> = HashMap::new();
    let mut messages = Vec::with_capacity(deliveries.len());
    for delivery in deliveries {
        let cap = match caps.get(&delivery.endpoint_id) {
            Some(cap) => *cap,
            None => {
                let cap = services
                    .store
                    .get_endpoint(&delivery.endpoint_id)
                    .await?
                    .map_or(crate::endpoint::DEFAULT_MAX_CONCURRENCY, |e| {
                        e.max_concurrency
                    });
                caps.insert(&delivery.endpoint_id, cap);
                cap
            }
        };
        messages.push(DeliveryTask::for_delivery(delivery).message(cap, Duration::ZERO));
    }
    services.deliveries.send(messages).await
}

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;
