//! Endpoint health: an endpoint that answers `410 Gone`, or has failed every attempt
//! for [`DEFAULT_UNHEALTHY_AFTER`], is disabled — its deliveries are kept (paused), the
//! owner is told, and opted-in endpoints get `entrega.endpoint.disabled`. The first
//! success after a failing stretch sends `entrega.endpoint.recovered`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::endpoint::Endpoint;
use crate::ports::{Notice, Services, StoreResult};

use super::notices::{notify_once, owner_of, publish_operational};

/// Failing this long, every attempt, disables an endpoint.
pub const DEFAULT_UNHEALTHY_AFTER: Duration = Duration::from_secs(5 * 24 * 3600);
/// A disable notice is sent once per endpoint per day at most.
const NOTICE_CLAIM_TTL: Duration = Duration::from_secs(24 * 3600);

/// Record the outcome of an attempt at `endpoint`: success clears the failing stretch,
/// a failure starts or extends it, and a stretch past the limit disables it.
pub async fn observe(
    services: &Services,
    endpoint: &Endpoint,
    succeeded: bool,
    now: DateTime<Utc>,
) -> StoreResult<()> {
    match (succeeded, endpoint.failing_since) {
        (true, Some(since)) => {
            update(services, endpoint, |e| e.failing_since = None).await?;
            let id = format!("entrega-recovered-{}-{}", endpoint.id, now.timestamp());
            let data = serde_json::json!({ "endpoint_id": endpoint.id, "failing_since": since });
            publish_operational(
                services,
                &endpoint.tenant_id,
                "entrega.endpoint.recovered",
                &id,
                data,
            )
            .await
        }
        (false, None) => {
            update(services, endpoint, |e| {
                e.failing_since = e.failing_since.or(Some(now))
            })
            .await
        }
        (false, Some(since)) => {
            let limit = chrono::Duration::from_std(services.settings.unhealthy_after)
                .unwrap_or(chrono::Duration::MAX);
            if now - since > limit {
                let days = services.settings.unhealthy_after.as_secs() / 86_400;
                disable(
                    services,
                    endpoint,
                    &format!("every attempt failed for {days} days"),
                    now,
                )
                .await?;
            }
            Ok(())
        }
        (true, None) => Ok(()),
    }
}

/// Disable `endpoint` for `reason`, tell its owner and opted-in endpoints.
pub async fn disable(
    services: &Services,
    endpoint: &Endpoint,
    reason: &str,
    now: DateTime<Utc>,
) -> StoreResult<()> {
    let mut newly = false;
    update(services, endpoint, |e| {
        newly = !e.disabled;
        e.disabled = true;
        e.disabled_reason = Some(reason.to_owned());
        e.updated_at = now;
    })
    .await?;
    if !newly {
        return Ok(());
    }
    tracing::warn!(endpoint_id = %endpoint.id, reason, "endpoint disabled");
    if let Some(owner) = owner_of(services, &endpoint.tenant_id).await? {
        let notice = Notice {
            kind: "endpoint_disabled".into(),
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
        let claim = format!(
            "disabled-notice#{}#{}",
            endpoint.id,
            now.timestamp() / 86_400
        );
        notify_once(services, &claim, NOTICE_CLAIM_TTL, notice).await?;
    }
    let id = format!("entrega-disabled-{}-{}", endpoint.id, now.timestamp());
    let data =
        serde_json::json!({ "endpoint_id": endpoint.id, "url": endpoint.url, "reason": reason });
    publish_operational(
        services,
        &endpoint.tenant_id,
        "entrega.endpoint.disabled",
        &id,
        data,
    )
    .await
}

/// Change the endpoint as stored now (not the worker's snapshot, which a human may have
/// changed meanwhile); a deleted endpoint is left deleted.
async fn update(
    services: &Services,
    endpoint: &Endpoint,
    change: impl FnOnce(&mut Endpoint),
) -> StoreResult<()> {
    let Some(mut current) = services.store.get_endpoint(&endpoint.id).await? else {
        return Ok(());
    };
    change(&mut current);
    match services.store.update_endpoint(&current).await {
        Ok(()) | Err(crate::ports::StoreError::Conflict(_)) => Ok(()),
        Err(e) => Err(e),
    }
}
