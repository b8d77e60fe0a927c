//! The failure handler (the DLQ analyzer on AWS): turns a failure notice into a
//! durable failure record, counts failures per tenant per hour, and alerts once when a
//! tenant crosses the threshold in an hour.

use std::time::Duration;

use chrono::{DurationRound, TimeDelta};
use tracing::{info_span, Instrument};

use crate::event::format_timestamp;
use crate::failure::{Failure, FailureNotice};
use crate::ids::FailureId;
use crate::ports::{Notice, Services, StoreError, StoreResult};

/// Failures per tenant per hour above which on-call hears about it (DESIGN.md).
pub const DEFAULT_ALERT_THRESHOLD: u64 = 10;
/// Hourly counters are kept a little over a day, then expire.
const COUNTER_TTL: Duration = Duration::from_secs(26 * 3600);

/// Handle one failure notice. Idempotent: a redelivered notice finds its record and
/// neither counts nor alerts twice.
pub async fn handle_failure(
    services: &Services,
    body: &str,
    alert_threshold: u64,
) -> StoreResult<()> {
    let notice: FailureNotice = match serde_json::from_str(body) {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(error = %e, "dropping an unreadable failure notice");
            return Ok(());
        }
    };
    let span =
        info_span!("failure", delivery_id = %notice.delivery_id, tenant_id = %notice.tenant_id);
    record(services, &notice, alert_threshold)
        .instrument(span)
        .await
}

async fn record(services: &Services, notice: &FailureNotice, threshold: u64) -> StoreResult<()> {
    let store = &services.store;
    let Some(delivery) = store.get_delivery(&notice.delivery_id).await? else {
        tracing::warn!("failure notice for an unknown delivery");
        return Ok(());
    };
    let event = store
        .get_event(&delivery.event_id)
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
    };
    if !store.put_failure_if_absent(&failure).await? {
        return Ok(());
    }
    tracing::warn!(failure_id = %failure.id, reason = ?failure.reason, last_error = ?failure.last_error, "delivery failed");
    let window_start = notice
        .failed_at
        .duration_trunc(TimeDelta::hours(1))
        .unwrap_or(notice.failed_at);
    let key = format!("failures#{}#{}", notice.tenant_id, window_start.timestamp());
    let count = store.increment(&key, COUNTER_TTL).await?;
    // On the failure that passes the threshold, not on every one after it: one alert
    // per tenant per hour.
    if count == threshold + 1 {
        services
            .notifier
            .notify(&Notice {
                kind: "failure_threshold".into(),
                tenant_id: notice.tenant_id.clone(),
                summary: format!(
                    "more than {threshold} failed deliveries in the hour from {}",
                    format_timestamp(window_start)
                ),
                details: serde_json::json!({
                    "count": count,
                    "window_start": format_timestamp(window_start),
                }),
            })
            .await?;
    }
    Ok(())
}
