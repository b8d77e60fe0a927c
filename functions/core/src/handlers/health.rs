//! Endpoint health: an endpoint that answers `410 Gone`, or has failed every attempt
//! for [`DEFAULT_UNHEALTHY_AFTER`], is disabled — its deliveries are kept (paused), the
//! owner is told, and opted-in endpoints get `entrega.endpoint.disabled`. The end of a
//! real outage (see [`crate::endpoint_health`] for the hysteresis) sends
//! `entrega.endpoint.recovered`.
//!
//! The health record is written under its own version and the configuration under
//! another, so this bookkeeping can never undo a change a client made: disabling is a
//! configuration change, made conditionally on the version just read and retried on a
//! conflict with the client's change applied.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::endpoint::Endpoint;
use crate::endpoint_health::{self, HealthEvent};
use crate::ports::{Notice, NoticeKind, Services, StoreError, StoreResult};
use crate::remembered::RememberedKey;

use super::notices::{notify_once, owner_of, publish_operational, OperationalEvent};

/// Failing this long, every attempt, disables an endpoint.
pub const DEFAULT_UNHEALTHY_AFTER: Duration = Duration::from_secs(5 * 24 * 3600);
/// A disable notice is sent once per endpoint per day at most.
const NOTICE_CLAIM_TTL: Duration = Duration::from_secs(24 * 3600);
/// Conditional writes lost to concurrent changes before the bookkeeping gives up (it
/// is redone by the next attempt's outcome anyway).
const WRITE_TRIES: usize = 5;

/// Record the outcome of an attempt at `endpoint`, and whether it was `slow`
/// ([`endpoint_health::SLOW_ATTEMPT`] or more): a slow one marks the endpoint slow, a
/// success in time clears an old mark.
pub async fn observe(
    services: &Services,
    endpoint: &Endpoint,
    succeeded: bool,
    slow: bool,
    now: DateTime<Utc>,
) -> StoreResult<()> {
    let mut health = endpoint.health.clone();
    let mut events = Vec::new();
    for _ in 0..WRITE_TRIES {
        let (mut next, happened) =
            endpoint_health::observe(&health, succeeded, now, services.settings.unhealthy_after);
        events = happened;
        let current = next.as_ref().unwrap_or(&health);
        let speed = if slow {
            endpoint_health::mark_slow(current, now)
        } else if succeeded {
            endpoint_health::clear_slow(current, now)
        } else {
            None
        };
        if let Some(changed) = speed {
            next = Some(changed);
        }
        let Some(next) = next else { break };
        match services
            .store
            .update_endpoint_health(&endpoint.id, &next)
            .await
        {
            Ok(_) => break,
            Err(StoreError::Conflict(_)) => {
                // Another worker recorded an outcome meanwhile: apply ours to theirs.
                match services.store.get_endpoint(&endpoint.id).await? {
                    Some(current) => health = current.health,
                    None => return Ok(()),
                }
                events.clear();
            }
            Err(e) => return Err(e),
        }
    }
    for event in events {
        match event {
            HealthEvent::Recovered { since } => {
                let kind = OperationalEvent::EndpointRecovered;
                let id = kind.id(&endpoint.id, now.timestamp());
                let data =
                    serde_json::json!({ "endpoint_id": endpoint.id, "failing_since": since });
                publish_operational(services, &endpoint.tenant_id, kind, &id, data).await?;
            }
            HealthEvent::FailingTooLong { days } => {
                disable(
                    services,
                    endpoint,
                    &format!("every attempt failed for {days} days"),
                    now,
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// Disable `endpoint` for `reason`, tell its owner and opted-in endpoints.
pub async fn disable(
    services: &Services,
    endpoint: &Endpoint,
    reason: &str,
    now: DateTime<Utc>,
) -> StoreResult<()> {
    let Some(newly) = set_disabled(services, endpoint, reason, now).await? else {
        return Ok(());
    };
    if !newly {
        return Ok(());
    }
    tracing::warn!(endpoint_id = %endpoint.id, reason, "endpoint disabled");
    if let Some(owner) = owner_of(services, &endpoint.tenant_id).await? {
        let notice = Notice {
            kind: NoticeKind::EndpointDisabled,
            audience: owner,
            tenant_id: endpoint.tenant_id.clone(),
            summary: format!("endpoint {} was disabled: {reason}", endpoint.url),
            details: serde_json::json!({
                "endpoint_id": endpoint.id,
                "url": endpoint.url,
                "reason": reason,
                "deliveries": "kept, and sent when the endpoint is enabled again",
                "enable": format!("entrega endpoints enable {}", endpoint.id),
            }),
        };
        let claim = RememberedKey::DisabledNotice {
            endpoint: &endpoint.id,
            at: now,
        };
        notify_once(services, claim, None, NOTICE_CLAIM_TTL, notice).await?;
    }
    let kind = OperationalEvent::EndpointDisabled;
    let id = kind.id(&endpoint.id, now.timestamp());
    let data =
        serde_json::json!({ "endpoint_id": endpoint.id, "url": endpoint.url, "reason": reason });
    publish_operational(services, &endpoint.tenant_id, kind, &id, data).await
}

/// Mark the endpoint as stored now disabled, conditionally on the version read.
/// `Some(true)`: this call disabled it; `Some(false)`: it already was; `None`: gone.
async fn set_disabled(
    services: &Services,
    endpoint: &Endpoint,
    reason: &str,
    now: DateTime<Utc>,
) -> StoreResult<Option<bool>> {
    for _ in 0..WRITE_TRIES {
        let Some(mut current) = services.store.get_endpoint(&endpoint.id).await? else {
            return Ok(None);
        };
        if current.disabled {
            return Ok(Some(false));
        }
        if current.url != endpoint.url || current.enabled_at != endpoint.enabled_at {
            // The verdict is about an endpoint that is no longer as it was: while the
            // attempt ran, someone pointed it elsewhere (the new URL has not failed),
            // or disabled and enabled it again, and that enable, answered 200, is not
            // undone by an answer to a request sent before it. Its next attempt gives
            // a verdict of its own. (Any other change, a description, stands with the
            // 410: voided by it, a Gone receiver had a second request.)
            return Ok(None);
        }
        current.disabled = true;
        current.disabled_reason = Some(reason.to_owned());
        current.updated_at = now;
        match services.store.update_endpoint(&current).await {
            Ok(_) => return Ok(Some(true)),
            Err(StoreError::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Conflict(format!(
        "endpoint {} kept changing while being disabled",
        endpoint.id
    )))
}
