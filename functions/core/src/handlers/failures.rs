//! The failure handler (the DLQ analyzer on AWS): turns a failure notice into a
//! durable failure record, counts failures per tenant per hour, and alerts once when a
//! tenant crosses the threshold in an hour.

use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use tracing::{info_span, Instrument};

use crate::delivery::{Delivery, DeliveryState};
use crate::endpoint::is_operational;
use crate::event::format_timestamp;
use crate::failure::{Acknowledgement, Failure, FailureNotice, FailureReason, Reacknowledge};
use crate::ids::FailureId;
use crate::ports::{Audience, Notice, NoticeKind, Services, StoreError, StoreResult};
use crate::remembered::RememberedKey;

use super::notices::{
    mark_sent, notify_once, owner_of, publish_operational, send, take_claim, OperationalEvent,
};

/// Failures per tenant per hour above which on-call hears about it (DESIGN.md).
pub const DEFAULT_ALERT_THRESHOLD: u64 = 10;
/// Hourly counters are kept a little over a day, then expire.
const COUNTER_TTL: Duration = Duration::from_secs(26 * 3600);

/// Handle one failure notice. Idempotent: a redelivered notice finds its record and
/// neither counts nor alerts twice.
pub async fn handle_failure(services: &Services, body: &str) -> StoreResult<()> {
    let notice: FailureNotice = match serde_json::from_str(body) {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(error = %e, "dropping an unreadable failure notice");
            return Ok(());
        }
    };
    let span =
        info_span!("failure", delivery_id = %notice.delivery_id, tenant_id = %notice.tenant_id);
    record(services, &notice).instrument(span).await
}

async fn record(services: &Services, notice: &FailureNotice) -> StoreResult<()> {
    let store = &services.store;
    let Some(delivery) = store.get_delivery(&notice.delivery_id).await? else {
        tracing::warn!("failure notice for an unknown delivery");
        return Ok(());
    };
    let event = store
        .get_event(&delivery.tenant_id, &delivery.event_id)
        .await?
        .ok_or_else(|| StoreError::Backend(format!("event {} is missing", delivery.event_id)))?;
    let attempt_times = store
        .list_attempts(&delivery.id)
        .await?
        .into_iter()
        .filter(|a| a.generation == notice.generation)
        .map(|a| a.started_at)
        .collect();
    let failure = Failure {
        id: FailureId::for_delivery(
            &delivery.id,
            notice.generation,
            notice.failed_at.timestamp_millis(),
        ),
        tenant_id: delivery.tenant_id.clone(),
        delivery_id: delivery.id.clone(),
        event_id: delivery.event_id.clone(),
        event_type: delivery.event_type.clone(),
        endpoint_id: delivery.endpoint_id.clone(),
        reason: notice.reason,
        payload: event.payload,
        attempt_times,
        last_status_code: delivery.last_status_code,
        last_error: delivery.last_error.clone(),
        created_at: services.clock.now(),
        acknowledged_at: None,
        ack_note: None,
        acknowledged_by: None,
    };
    let created = store.put_failure_if_absent(&failure).await?;
    // A resend may have been delivered before this record existed, so the worker found
    // nothing to acknowledge: look again now that it does.
    if let Some(current) = store.get_delivery(&delivery.id).await? {
        if current.generation > notice.generation {
            acknowledge_resolved(services, &current).await?;
        }
    }
    if created {
        tracing::warn!(failure_id = %failure.id, reason = ?failure.reason, last_error = ?failure.last_error, "delivery failed");
        services.metrics.failure(&failure.tenant_id);
    }
    // The side effects run on every delivery of the notice, each once by its own
    // guard: a handler that died after writing the record (the notice comes back)
    // still counts, alerts, tells the owner and publishes, and one that finished does
    // none of it twice.
    side_effects(services, notice, &failure).await
}

/// Count the failure in its tenant's hour (exactly once: the count and the failure's
/// token commit together), alert on-call once per tenant and hour past the threshold,
/// tell the owner, and publish `entrega.delivery.exhausted` (idempotent by its id).
async fn side_effects(
    services: &Services,
    notice: &FailureNotice,
    failure: &Failure,
) -> StoreResult<()> {
    let store = &services.store;
    let window_start = notice
        .failed_at
        .duration_trunc(TimeDelta::hours(1))
        .unwrap_or(notice.failed_at);
    let tenant = &notice.tenant_id;
    let count = store
        .increment_once(
            &RememberedKey::FailuresInHour {
                tenant,
                hour: window_start,
            }
            .to_string(),
            &RememberedKey::FailureCounted(&failure.id).to_string(),
            COUNTER_TTL,
        )
        .await?;
    let threshold = services.settings.alert_threshold;
    if count > threshold {
        // Claimed once per tenant and hour: one alert, not one per failure after it.
        let alert = Notice {
            kind: NoticeKind::FailureThreshold,
            audience: Audience::OnCall,
            tenant_id: notice.tenant_id.clone(),
            summary: format!(
                "more than {threshold} failed deliveries in the hour from {}",
                format_timestamp(window_start)
            ),
            details: serde_json::json!({
                "count": count,
                "threshold": threshold,
                "window_start": format_timestamp(window_start),
            }),
        };
        let claim = RememberedKey::ThresholdAlert {
            tenant,
            hour: window_start,
        };
        notify_once(
            services,
            claim,
            Some(failure.id.as_str()),
            COUNTER_TTL,
            alert,
        )
        .await?;
    }
    if is_operational(&failure.event_type) {
        // Entrega's own event to an opted-in endpoint: its owner hears about that
        // endpoint's failures through the deliveries that raised the event.
        return Ok(());
    }
    tell_owner(services, failure, window_start).await?;
    if failure.reason == FailureReason::Exhausted {
        let kind = OperationalEvent::DeliveryExhausted;
        let id = kind.id(&failure.delivery_id, notice.generation);
        let data = serde_json::json!({
            "delivery_id": failure.delivery_id,
            "event_id": failure.event_id,
            "event_type": failure.event_type,
            "endpoint_id": failure.endpoint_id,
            "last_error": failure.last_error,
        });
        publish_operational(services, &failure.tenant_id, kind, &id, data).await?;
    }
    Ok(())
}

/// The owner hears about deliveries that failed for good, whatever the reason (used
/// up their retries, a failure the policy does not retry, an at-most-once attempt
/// that failed: each is an event that will not arrive unless someone acts), at most
/// once per hour (the first one, with where to find the rest): an endpoint down with
/// thousands of events sends one e-mail, not thousands.
async fn tell_owner(
    services: &Services,
    failure: &Failure,
    hour: DateTime<Utc>,
) -> StoreResult<()> {
    // Claimed before the owner is looked up: the rest of the hour's failures cost no read.
    let claim = RememberedKey::OwnerNotice {
        tenant: &failure.tenant_id,
        hour,
    };
    if !take_claim(services, claim, Some(failure.id.as_str()), COUNTER_TTL).await? {
        return Ok(());
    }
    let Some(owner) = owner_of(services, &failure.tenant_id).await? else {
        return Ok(());
    };
    let notice = Notice {
        kind: match failure.reason {
            FailureReason::Exhausted => NoticeKind::DeliveryExhausted,
            FailureReason::NotRetryable | FailureReason::AtMostOnce => NoticeKind::DeliveryFailed,
        },
        audience: owner,
        tenant_id: failure.tenant_id.clone(),
        summary: format!(
            "a webhook to endpoint {} could not be delivered",
            failure.endpoint_id
        ),
        details: serde_json::json!({
            "event_id": failure.event_id,
            "endpoint_id": failure.endpoint_id,
            "reason": failure.reason,
            "last_error": failure.last_error,
            "resend": format!("entrega resend {}", failure.delivery_id),
            "api": format!("POST /v1/failures/{}/resend", failure.id),
            "more": "further failures this hour: GET /v1/failures?acknowledged=false",
        }),
    };
    send(services, &notice).await;
    mark_sent(services, claim, COUNTER_TTL).await
}

/// A resend that was delivered settles the failure records of the generations before
/// it: the problem is fixed, so the 24-hour rule must not keep firing for it. The
/// record says who resent it and when it arrived; a person's own acknowledgement is
/// never overwritten.
pub async fn acknowledge_resolved(services: &Services, delivery: &Delivery) -> StoreResult<()> {
    if delivery.state != DeliveryState::Delivered || delivery.generation == 0 {
        return Ok(());
    }
    let ack = Acknowledgement {
        note: format!(
            "delivered by a resend (generation {})",
            delivery.generation + 1
        ),
        by: delivery
            .requested_by
            .clone()
            .unwrap_or_else(|| "resend".into()),
        at: delivery
            .delivered_at
            .unwrap_or_else(|| services.clock.now()),
    };
    for failure in services.store.failures_of_delivery(&delivery.id).await? {
        if failure.acknowledged_at.is_none() {
            services
                .store
                .acknowledge_failure(&failure.id, &ack, Reacknowledge::KeepFirst)
                .await?;
        }
    }
    Ok(())
}
