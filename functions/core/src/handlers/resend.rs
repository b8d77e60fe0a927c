//! Resending: "try now" for one delivery, and batches of them. The attempt counter
//! starts again, the event id (and so `webhook-id`) stays, and the request is signed
//! with the endpoint's secrets as they are now.

use std::time::Duration;

use chrono::{DateTime, Duration as ChronoDuration, Utc};

use crate::delivery::Delivery;
use crate::endpoint::DeliveryMode;
use crate::ports::{Services, StoreError};
use crate::state_machine;

use super::task::DeliveryTask;

/// Writes lost to a concurrent change before a resend gives up with a conflict.
const RESEND_TRIES: usize = 3;
/// How long a message of a generation the store does not show yet is kept waiting for
/// the resend's write; past this, the write never happened and the message is dropped.
pub const FUTURE_GENERATION_GRACE: ChronoDuration = ChronoDuration::seconds(60);

/// Why a resend could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResendError {
    #[error("the endpoint of this delivery was deleted")]
    EndpointGone,
    /// The endpoint takes each event at most once and an attempt is still under way
    /// (or its worker died and its lease has not run out): were the resend queued, it
    /// would go out once that attempt ended, whatever its answer, and the event could
    /// reach the receiver twice. Refused until `until`, when the attempt has reported
    /// back or is presumed dead.
    #[error(
        "an attempt of this delivery is under way and its endpoint takes each event at most \
         once; resend after it ends (its lease runs out at {})",
        crate::event::format_timestamp(*until)
    )]
    AttemptUnderWay { until: DateTime<Utc> },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Start a new generation of `delivery` now. The message is queued *before* the new
/// generation is written: a crash in between leaves a message the worker drops after
/// [`FUTURE_GENERATION_GRACE`], never a pending delivery without a message.
pub async fn resend_delivery(
    services: &Services,
    delivery: &Delivery,
    requested_by: &str,
) -> Result<Delivery, ResendError> {
    resend_delivery_for(services, delivery, requested_by, None).await
}

/// [`resend_delivery`] for the request `request` marks (an idempotent one, see
/// [`Delivery::resent_for`]): a delivery this request already resent is answered as
/// it stands, not resent again.
pub async fn resend_delivery_for(
    services: &Services,
    delivery: &Delivery,
    requested_by: &str,
    request: Option<&str>,
) -> Result<Delivery, ResendError> {
    if request.is_some() && delivery.resent_for.as_deref() == request {
        return Ok(delivery.clone());
    }
    let endpoint = services
        .store
        .get_endpoint(&delivery.endpoint_id)
        .await?
        .ok_or(ResendError::EndpointGone)?;
    let mut current = delivery.clone();
    for _ in 0..RESEND_TRIES {
        let now = services.clock.now();
        if endpoint.mode == DeliveryMode::AtMostOnce {
            if let Some(until) = current.lease_until.filter(|until| *until > now) {
                return Err(ResendError::AttemptUnderWay { until });
            }
        }
        if request.is_some() && current.resent_for.as_deref() == request {
            // Read again after a conflict: this request's own resend, already made.
            return Ok(current);
        }
        let mut next = state_machine::resend(&current, requested_by, now);
        next.resent_for = request.map(str::to_owned);
        next.resend_token = Some(services.random.next_u64());
        let message =
            DeliveryTask::for_resend(&next, now).message(endpoint.max_concurrency, Duration::ZERO);
        services.deliveries.send(vec![message]).await?;
        match services.store.save_delivery(&next, &[]).await {
            Ok(saved) => {
                if !current.state.is_waiting() {
                    services.backlog.record(&saved.tenant_id, 1).await?;
                }
                return Ok(saved);
            }
            Err(StoreError::Conflict(_)) => {
                current = services
                    .store
                    .get_delivery(&delivery.id)
                    .await?
                    .ok_or_else(|| StoreError::Conflict("the delivery vanished".into()))?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict(format!("delivery {} kept changing; try again", delivery.id)).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_lease_end_as_the_api_writes_times() {
        let until = DateTime::parse_from_rfc3339("2026-12-02T10:58:25.095273202Z")
            .unwrap()
            .with_timezone(&Utc);
        let refused = ResendError::AttemptUnderWay { until }.to_string();
        assert!(
            refused.ends_with("(its lease runs out at 2026-12-02T10:58:25.095Z)"),
            "{refused}"
        );
    }
}
