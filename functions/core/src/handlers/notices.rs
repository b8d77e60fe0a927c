//! Telling humans, once: each notice is claimed under a key before it is sent, so a
//! redelivered message or a concurrent handler never sends it twice. A notifier that
//! keeps failing is logged, not retried forever: the failure record itself is durable
//! and the CloudWatch alarms watch the same numbers independently.

use std::time::Duration;

use crate::event::Event;
use crate::ids::{EventId, TenantId};
use crate::ports::{Audience, Notice, Services, StoreResult};
use crate::remembered::RememberedKey;

/// Attempts to hand a notice to the notifier (each adapter also retries with backoff
/// inside, as the AWS SDK does).
const NOTIFY_TRIES: u32 = 3;

/// Send `notice` unless `claim` was taken within `ttl`.
pub async fn notify_once(
    services: &Services,
    claim: RememberedKey<'_>,
    holder: Option<&str>,
    ttl: Duration,
    notice: Notice,
) -> StoreResult<()> {
    if take_claim(services, claim, holder, ttl).await? {
        send(services, &notice).await;
        mark_sent(services, claim, ttl).await?;
    }
    Ok(())
}

/// Take `claim` for `ttl`; `false` if someone else holds it, or it was sent. A
/// `holder` (the failure that raised the notice) may take its own claim again until
/// [`mark_sent`]: a handler that died between the claim and the send, run again for
/// the same failure, sends it then instead of never (and twice only if it died
/// between sending and marking). Claim before building a notice that costs a read
/// (the owner's address), so a storm of failures reads once.
pub async fn take_claim(
    services: &Services,
    claim: RememberedKey<'_>,
    holder: Option<&str>,
    ttl: Duration,
) -> StoreResult<bool> {
    let value = holder.unwrap_or(ANONYMOUS_HOLDER);
    Ok(
        match services
            .store
            .remember_once(&claim.to_string(), value, ttl)
            .await?
        {
            None => true,
            Some(existing) if holder.is_some_and(|h| h == existing) => {
                services.store.recall(&claim.sent_marker()).await?.is_none()
            }
            Some(_) => false,
        },
    )
}

/// Record that the notice of `claim` left the process.
pub async fn mark_sent(
    services: &Services,
    claim: RememberedKey<'_>,
    ttl: Duration,
) -> StoreResult<()> {
    services
        .store
        .remember_once(&claim.sent_marker(), "1", ttl)
        .await
        .map(|_| ())
}

/// The claim value when no holder is named: nobody may take it again.
const ANONYMOUS_HOLDER: &str = "sent";

/// Hand `notice` to the notifier; a notifier that keeps failing is logged.
pub async fn send(services: &Services, notice: &Notice) {
    for attempt in 1..=NOTIFY_TRIES {
        match services.notifier.notify(notice).await {
            Ok(()) => return,
            Err(e) if attempt == NOTIFY_TRIES => {
                tracing::error!(kind = %notice.kind, tenant_id = %notice.tenant_id, error = %e, "a notice could not be sent");
            }
            Err(_) => {}
        }
    }
}

/// The owner of `tenant`, for an owner notice (`None` if the tenant is gone).
pub async fn owner_of(services: &Services, tenant: &TenantId) -> StoreResult<Option<Audience>> {
    Ok(services
        .store
        .get_tenant(tenant)
        .await?
        .map(|t| Audience::Owner {
            email: t.owner_email,
        }))
}

/// The start of every id Entrega gives its own events. The API refuses it to
/// producers: a tenant that published `entrega-exhausted-<its delivery>-0` first made
/// the real event a replay, never sent (a hostile test).
pub const OPERATIONAL_ID_PREFIX: &str = "entrega-";

/// Whether `id` is in Entrega's own id space (any case): refused to producers, by the
/// API and by both outboxes.
pub fn is_reserved_id(id: &str) -> bool {
    crate::text::starts_with_any_case(id, OPERATIONAL_ID_PREFIX)
}

/// Entrega's own events (`entrega.*`), which an endpoint receives only if it names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationalEvent {
    DeliveryExhausted,
    EndpointDisabled,
    EndpointRecovered,
}

impl OperationalEvent {
    pub fn event_type(self) -> &'static str {
        match self {
            Self::DeliveryExhausted => "entrega.delivery.exhausted",
            Self::EndpointDisabled => "entrega.endpoint.disabled",
            Self::EndpointRecovered => "entrega.endpoint.recovered",
        }
    }

    /// Its id: what it tells (its type's last word), about which record, at which
    /// point of it (a generation, a time), so that telling it again is a replay, not a
    /// second event.
    pub fn id(self, about: impl std::fmt::Display, at: impl std::fmt::Display) -> String {
        let what = self.event_type().rsplit('.').next().unwrap_or_default();
        format!("{OPERATIONAL_ID_PREFIX}{what}-{about}-{at}")
    }
}

/// Publish one of Entrega's own events for the tenant's opted-in endpoints, once:
/// `id` ([`OperationalEvent::id`]) makes it idempotent, a replay publishes nothing new.
pub async fn publish_operational(
    services: &Services,
    tenant: &TenantId,
    kind: OperationalEvent,
    id: &str,
    data: serde_json::Value,
) -> StoreResult<()> {
    let Ok(id) = id.parse::<EventId>() else {
        tracing::error!(%id, "an operational event id is malformed");
        return Ok(());
    };
    let event = Event {
        id,
        tenant_id: tenant.clone(),
        event_type: kind.event_type().to_owned(),
        payload: data.to_string(),
        created_at: services.clock.now(),
    };
    services.store.publish(&event).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::is_operational;

    /// Ids already given stay what they were (a replay after an upgrade is still one
    /// event), and each kind's id and type are in the reserved spaces.
    #[test]
    fn operational_ids_keep_their_form_and_their_reserved_prefix() {
        let kinds = [
            (
                OperationalEvent::DeliveryExhausted,
                "entrega-exhausted-dlv_1-2",
            ),
            (
                OperationalEvent::EndpointDisabled,
                "entrega-disabled-dlv_1-2",
            ),
            (
                OperationalEvent::EndpointRecovered,
                "entrega-recovered-dlv_1-2",
            ),
        ];
        for (kind, id) in kinds {
            assert_eq!(kind.id("dlv_1", 2), id);
            assert!(id.parse::<EventId>().is_ok(), "{id}");
            assert!(is_reserved_id(&kind.id("x", 0)));
            assert!(is_operational(kind.event_type()), "{kind:?}");
        }
    }

    #[test]
    fn the_reserved_ids_are_those_starting_entrega_dash_in_any_case() {
        for reserved in ["entrega-x", "Entrega-disabled-ep_1-2", "ENTREGA-"] {
            assert!(is_reserved_id(reserved), "{reserved}");
        }
        for free in ["entrega", "entregas-1", "evt_1", "my-entrega-1", "é"] {
            assert!(!is_reserved_id(free), "{free}");
        }
    }
}
