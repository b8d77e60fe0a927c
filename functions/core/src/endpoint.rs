//! Endpoints: where a tenant's customer receives webhooks, and what it subscribes to.

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{EndpointId, TenantId};
use crate::retry::RetrySpec;
use crate::signature::Secret;

pub use crate::endpoint_health::EndpointHealth;

/// Per-attempt timeout when the endpoint names none.
pub const DEFAULT_TIMEOUT_MS: u32 = 10_000;
/// Longest per-attempt timeout an endpoint may ask for: a slower receiver holds a
/// worker slot too long and should answer first and process later.
pub const MAX_TIMEOUT_MS: u32 = 30_000;
/// Shortest timeout worth configuring.
pub const MIN_TIMEOUT_MS: u32 = 100;
/// In-flight attempts per endpoint when it names none.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 8;
/// Upper bound on an endpoint's concurrency cap.
pub const MAX_CONCURRENCY_CAP: u32 = 256;
/// Endpoints one tenant may have. Each publish fans out to every one that subscribes,
/// and the fan-out reads them all: this bounds what one event costs and makes.
pub const MAX_ENDPOINTS_PER_TENANT: usize = 100;
/// How long a rotated-out secret keeps signing beside the new one.
pub const ROTATION_OVERLAP: ChronoDuration = ChronoDuration::hours(24);
/// Most rotated-out secrets signing at once, each for its own 24 h. Each is one more
/// signature on every request; a receiver needs no more than a few to move on. A
/// rotation past this still goes through (it may be urgent: a leaked secret), and the
/// oldest stops signing early.
pub const MAX_ROTATED_OUT_SECRETS: usize = 4;
/// Most event-type patterns one endpoint may list.
pub const MAX_EVENT_TYPE_PATTERNS: usize = 100;
/// Longest event type or pattern.
pub const MAX_EVENT_TYPE_LEN: usize = 128;
/// Longest endpoint description.
pub const MAX_DESCRIPTION_LEN: usize = 1024;

/// Delivery guarantee an endpoint asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryMode {
    /// Retried per policy; a crash may cause a duplicate (same `webhook-id`).
    #[default]
    AtLeastOnce,
    /// Never retried and never sent twice, even after a crash.
    AtMostOnce,
}

/// A secret that was rotated out and keeps signing until `expires_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviousSecret {
    pub secret: Secret,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub id: EndpointId,
    pub tenant_id: TenantId,
    pub url: String,
    pub event_types: Vec<String>,
    pub mode: DeliveryMode,
    pub retry: RetrySpec,
    pub timeout_ms: u32,
    pub max_concurrency: u32,
    pub disabled: bool,
    pub description: Option<String>,
    pub secret: Secret,
    /// The secret rotated out last, while it signs.
    pub previous_secret: Option<PreviousSecret>,
    /// Secrets rotated out before it whose overlap has not ended, newest first: a
    /// second rotation within 24 h cut the first secret off at once (a hostile test).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub older_secrets: Vec<PreviousSecret>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Why Entrega disabled it (410 Gone, failing too long); `None` if a human did.
    #[serde(default)]
    pub disabled_reason: Option<String>,
    /// When it was last enabled again after being disabled: a verdict on the endpoint
    /// from an attempt made before it (a 410) does not undo that enable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled_at: Option<DateTime<Utc>>,
    /// Optimistic-concurrency version of the configuration: every write names the
    /// version it read, so a change the API confirmed is never overwritten.
    #[serde(default)]
    pub version: u64,
    /// Health bookkeeping, stored apart from the configuration under its own version:
    /// the worker writes only this, so it can never undo a client's change.
    #[serde(skip)]
    pub health: EndpointHealth,
}

impl Endpoint {
    /// A new endpoint with every setting at its default and a fresh secret.
    pub fn new(tenant_id: TenantId, url: impl Into<String>, now: DateTime<Utc>) -> Self {
        Self {
            id: EndpointId::generate(),
            tenant_id,
            url: url.into(),
            event_types: Vec::new(),
            mode: DeliveryMode::default(),
            retry: RetrySpec::default(),
            timeout_ms: DEFAULT_TIMEOUT_MS,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            disabled: false,
            description: None,
            secret: Secret::generate(),
            previous_secret: None,
            older_secrets: Vec::new(),
            created_at: now,
            updated_at: now,
            disabled_reason: None,
            enabled_at: None,
            version: 0,
            health: EndpointHealth::default(),
        }
    }

    /// The secrets that sign an attempt made at `now`: the current one first, then
    /// each rotated-out one while its overlap lasts, newest first.
    pub fn signing_secrets(&self, now: DateTime<Utc>) -> Vec<&Secret> {
        let rotated_out = self.previous_secret.iter().chain(&self.older_secrets);
        std::iter::once(&self.secret)
            .chain(
                rotated_out
                    .filter(|p| p.expires_at > now)
                    .map(|p| &p.secret),
            )
            .collect()
    }

    /// Enable it again, if it is disabled, from `now`.
    pub fn enable(&mut self, now: DateTime<Utc>) {
        if self.disabled {
            self.disabled = false;
            self.disabled_reason = None;
            self.enabled_at = Some(now);
        }
    }

    /// Replace the secret; the old one signs alongside for [`ROTATION_OVERLAP`], as do
    /// those rotated out before it for what is left of theirs, the newest
    /// [`MAX_ROTATED_OUT_SECRETS`] of them.
    pub fn rotate_secret(&mut self, now: DateTime<Utc>) {
        let old = std::mem::replace(&mut self.secret, Secret::generate());
        let before: Vec<PreviousSecret> = self
            .previous_secret
            .take()
            .into_iter()
            .chain(std::mem::take(&mut self.older_secrets))
            .filter(|p| p.expires_at > now)
            .take(MAX_ROTATED_OUT_SECRETS - 1)
            .collect();
        self.previous_secret = Some(PreviousSecret {
            secret: old,
            expires_at: now + ROTATION_OVERLAP,
        });
        self.older_secrets = before;
        self.updated_at = now;
    }

    /// Entrega's own operational events (`entrega.*`) reach only endpoints that name
    /// them: an empty filter means every *producer* event, not those.
    pub fn subscribes_to(&self, event_type: &str) -> bool {
        if is_operational(event_type) {
            return self.event_types.iter().any(|p| {
                is_operational(p) && matches_event_type(std::slice::from_ref(p), event_type)
            });
        }
        matches_event_type(&self.event_types, event_type)
    }
}

/// Entrega's operational event types (opt-in per endpoint).
pub const OPERATIONAL_PREFIX: &str = "entrega.";

pub fn is_operational(event_type: &str) -> bool {
    event_type.starts_with(OPERATIONAL_PREFIX)
}

/// Whether a type a producer sends is in Entrega's own type space, in any case:
/// refused by the API and both outboxes, beside `notices::is_reserved_id`.
pub fn is_reserved_type(event_type: &str) -> bool {
    crate::text::starts_with_any_case(event_type, OPERATIONAL_PREFIX)
}

/// The subscription filter: empty means every type; otherwise an exact type or a
/// `prefix.*` wildcard that matches every type below `prefix.`.
pub fn matches_event_type(patterns: &[String], event_type: &str) -> bool {
    patterns.is_empty()
        || patterns.iter().any(|p| match p.strip_suffix(".*") {
            Some(prefix) => event_type
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('.')),
            None => p == event_type,
        })
}

/// Why an event type (or a pattern) is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventTypeError {
    #[error("must be 1 to {MAX_EVENT_TYPE_LEN} characters of letters, digits, `_`, `-` and `.`-separated parts")]
    Malformed,
    #[error("at most {MAX_EVENT_TYPE_PATTERNS} patterns")]
    TooMany,
}

/// An event type: dot-separated non-empty parts of `[A-Za-z0-9_-]`.
pub fn validate_event_type(t: &str) -> Result<(), EventTypeError> {
    let ok = !t.is_empty()
        && t.len() <= MAX_EVENT_TYPE_LEN
        && t.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(EventTypeError::Malformed)
    }
}

/// Patterns: event types, or event types followed by `.*`.
pub fn validate_event_type_patterns(patterns: &[String]) -> Result<(), EventTypeError> {
    if patterns.len() > MAX_EVENT_TYPE_PATTERNS {
        return Err(EventTypeError::TooMany);
    }
    for p in patterns {
        validate_event_type(p.strip_suffix(".*").unwrap_or(p))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TenantId;

    fn pats(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn subscription_filter() {
        assert!(matches_event_type(&[], "anything.at.all"));
        let f = pats(&["lead.*", "invoice.paid"]);
        assert!(matches_event_type(&f, "lead.created"));
        assert!(matches_event_type(&f, "lead.stage.changed"));
        assert!(matches_event_type(&f, "invoice.paid"));
        assert!(!matches_event_type(&f, "lead"));
        assert!(!matches_event_type(&f, "leads.created"));
        assert!(!matches_event_type(&f, "invoice.paid.late"));
        assert!(!matches_event_type(&f, "invoice.created"));
    }

    #[test]
    fn operational_events_are_opt_in() {
        let mut e = Endpoint::new(
            TenantId::generate(),
            "https://hooks.example.com/",
            chrono::Utc::now(),
        );
        assert!(e.subscribes_to("lead.created"));
        assert!(
            !e.subscribes_to("entrega.delivery.exhausted"),
            "an empty filter is not an opt-in"
        );
        e.event_types = pats(&["entrega.*"]);
        assert!(e.subscribes_to("entrega.endpoint.disabled"));
        assert!(!e.subscribes_to("lead.created"));
        e.event_types = pats(&["*.x", "entrega.endpoint.recovered"]);
        assert!(e.subscribes_to("entrega.endpoint.recovered"));
        assert!(!e.subscribes_to("entrega.delivery.exhausted"));
    }

    #[test]
    fn event_type_validation() {
        assert!(validate_event_type("lead.stage_changed").is_ok());
        for bad in ["", "lead.", ".lead", "lead..x", "lead stage", "lead.*"] {
            assert!(validate_event_type(bad).is_err(), "{bad:?}");
        }
        assert!(validate_event_type_patterns(&pats(&["lead.*", "a.b"])).is_ok());
        assert!(validate_event_type_patterns(&pats(&["*"])).is_err());
        assert!(validate_event_type_patterns(&pats(&["a.*.b"])).is_err());
        assert_eq!(
            validate_event_type_patterns(&vec!["a".to_string(); 101]),
            Err(EventTypeError::TooMany)
        );
    }

    /// Every secret rotated out in the last 24 h keeps signing, for its own 24 h: a
    /// second rotation within the day cut the first secret off at once (a hostile
    /// test). Past [`MAX_ROTATED_OUT_SECRETS`], the oldest stops early.
    #[test]
    fn every_secret_rotated_out_within_its_overlap_keeps_signing() {
        let t0 = chrono::Utc::now();
        let mut e = Endpoint::new(TenantId::generate(), "https://hooks.example.com/", t0);
        let mut secrets = vec![e.secret.clone()];
        for hour in 1..=MAX_ROTATED_OUT_SECRETS as i64 {
            e.rotate_secret(t0 + ChronoDuration::hours(hour));
            secrets.insert(0, e.secret.clone());
        }
        let now = t0 + ChronoDuration::hours(MAX_ROTATED_OUT_SECRETS as i64);
        let signing: Vec<Secret> = e.signing_secrets(now).into_iter().cloned().collect();
        assert_eq!(signing, secrets, "the current one first, then newest first");

        // Each stops when its own overlap ends: the first one rotated out, first.
        let first_ends = t0 + ChronoDuration::hours(1) + ROTATION_OVERLAP;
        let signing: Vec<Secret> = e.signing_secrets(first_ends).into_iter().cloned().collect();
        assert_eq!(signing, secrets[..MAX_ROTATED_OUT_SECRETS]);

        // One rotation more: the oldest stops early, the rest keep signing.
        e.rotate_secret(now);
        secrets.insert(0, e.secret.clone());
        let signing: Vec<Secret> = e.signing_secrets(now).into_iter().cloned().collect();
        assert_eq!(signing, secrets[..=MAX_ROTATED_OUT_SECRETS]);
        let later = now + ROTATION_OVERLAP;
        assert_eq!(e.signing_secrets(later), vec![&e.secret]);
    }

    /// A record written before rotated-out secrets were kept as a list reads as one
    /// with none older than its previous secret.
    #[test]
    fn an_endpoint_stored_without_older_secrets_reads() {
        let e = Endpoint::new(
            TenantId::generate(),
            "https://hooks.example.com/",
            chrono::Utc::now(),
        );
        let mut stored = serde_json::to_value(&e).unwrap();
        assert!(stored.get("older_secrets").is_none(), "none is not written");
        stored.as_object_mut().unwrap().remove("older_secrets");
        let read: Endpoint = serde_json::from_value(stored).unwrap();
        assert_eq!(read, e);
    }
}
