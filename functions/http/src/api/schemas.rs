//! Schema-only types: how the domain's own types (ids, the retry spec, enums) appear
//! in the OpenAPI document. The domain crate stays free of OpenAPI; each type here
//! mirrors one serde form exactly, and a test round-trips examples through the real
//! type to keep them equal.

#![allow(dead_code)]

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Id patterns: a prefix and a UUIDv7 as 32 lowercase hex digits.
pub const TENANT_ID: &str = "^ten_[0-9a-f]{32}$";
pub const ENDPOINT_ID: &str = "^ep_[0-9a-f]{32}$";
pub const DELIVERY_ID: &str = "^dlv_[0-9a-f]{32}$";
pub const FAILURE_ID: &str = "^fail_[0-9a-f]{32}$";
/// Producers may bring their own event ids (a UUID, say); never a `.`.
pub const EVENT_ID: &str = "^[A-Za-z0-9_:-]{1,128}$";
/// Event types: dot-separated parts of letters, digits, `_` and `-`.
pub const EVENT_TYPE: &str = "^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*$";
/// Subscription patterns: a type, or a type followed by `.*`.
pub const EVENT_TYPE_PATTERN: &str = "^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*(\\.\\*)?$";

/// The delivery guarantee of an endpoint.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryModeDoc {
    AtLeastOnce,
    AtMostOnce,
}

/// A named retry preset.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetryPresetDoc {
    Standard,
    Persistent,
    None,
}

/// A custom retry schedule: delays between attempts (1 s to 24 h each, at most 20),
/// a jitter fraction, and whether 3xx/4xx answers retry.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomRetryDoc {
    #[schema(min_items = 0, max_items = 20, value_type = Vec<u64>)]
    pub delays_s: Vec<u64>,
    #[schema(minimum = 0.0, maximum = 0.5)]
    #[serde(default)]
    pub jitter: f64,
    #[serde(default)]
    pub retry_4xx: bool,
}

/// A preset name or a custom schedule.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum RetrySpecDoc {
    Preset(RetryPresetDoc),
    Custom(CustomRetryDoc),
}

/// Why an attempt failed.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureKindDoc {
    Timeout,
    ConnectionRefused,
    Dns,
    Tls,
    Transport,
    Redirect,
    ClientError,
    ServerError,
    UnexpectedStatus,
    TargetRefused,
    Interrupted,
}

/// Why a delivery ended in the failures store.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureReasonDoc {
    Exhausted,
    NotRetryable,
    AtMostOnce,
}

/// What started an attempt.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TriggerDoc {
    Scheduled,
    Manual,
}

/// An error (RFC 9457 `application/problem+json`).
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// The request field or parameter at fault, when there is one.
    pub field: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use entrega_core::endpoint::DeliveryMode;
    use entrega_core::retry::RetrySpec;

    /// Each doc type reads exactly what the real type reads.
    #[test]
    fn schema_types_match_the_domain_types() {
        for v in [
            r#""standard""#,
            r#""none""#,
            r#"{"delays_s":[1,2],"jitter":0.1,"retry_4xx":true}"#,
        ] {
            assert!(serde_json::from_str::<RetrySpec>(v).is_ok());
            assert!(serde_json::from_str::<RetrySpecDoc>(v).is_ok());
        }
        for v in [r#""sometimes""#, r#"{"delays_s":[1],"colour":1}"#, "null"] {
            assert!(serde_json::from_str::<RetrySpec>(v).is_err(), "{v}");
            assert!(serde_json::from_str::<RetrySpecDoc>(v).is_err(), "{v}");
        }
        for v in [r#""at_least_once""#, r#""at_most_once""#] {
            assert!(serde_json::from_str::<DeliveryMode>(v).is_ok());
            assert!(serde_json::from_str::<DeliveryModeDoc>(v).is_ok());
        }
        // Every failure kind, reason and trigger the API can send reads as its doc type.
        use entrega_core::delivery::Trigger;
        use entrega_core::failure::FailureReason;
        use entrega_core::outcome::FailureKind;
        for kind in [
            FailureKind::Timeout,
            FailureKind::ConnectionRefused,
            FailureKind::Dns,
            FailureKind::Tls,
            FailureKind::Transport,
            FailureKind::Redirect,
            FailureKind::ClientError,
            FailureKind::ServerError,
            FailureKind::UnexpectedStatus,
            FailureKind::TargetRefused,
            FailureKind::Interrupted,
        ] {
            let v = serde_json::to_value(kind).unwrap();
            assert!(
                serde_json::from_value::<FailureKindDoc>(v).is_ok(),
                "{kind:?}"
            );
        }
        for reason in [
            FailureReason::Exhausted,
            FailureReason::NotRetryable,
            FailureReason::AtMostOnce,
        ] {
            let v = serde_json::to_value(reason).unwrap();
            assert!(
                serde_json::from_value::<FailureReasonDoc>(v).is_ok(),
                "{reason:?}"
            );
        }
        for trigger in [Trigger::Scheduled, Trigger::Manual] {
            let v = serde_json::to_value(trigger).unwrap();
            assert!(
                serde_json::from_value::<TriggerDoc>(v).is_ok(),
                "{trigger:?}"
            );
        }
        let id = entrega_core::ids::EndpointId::generate().to_string();
        assert!(regex_lite_match(ENDPOINT_ID, &id));
    }

    /// The id patterns are simple enough to check by hand: prefix + 32 hex.
    fn regex_lite_match(pattern: &str, s: &str) -> bool {
        let prefix = pattern.trim_start_matches('^').split('[').next().unwrap();
        s.strip_prefix(prefix).is_some_and(|rest| {
            rest.len() == 32
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
    }
}

/// The error answers every route may give (each is `application/problem+json`).
#[derive(utoipa::IntoResponses)]
pub enum ProblemResponses {
    /// The request cannot be read: not one JSON value, a bad cursor.
    #[response(status = 400, content_type = "application/problem+json")]
    BadRequest(Problem),
    /// No valid API key.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthorized(Problem),
    /// The key may not do this (an admin route).
    #[response(status = 403, content_type = "application/problem+json")]
    Forbidden(Problem),
    /// No such resource for this key (another tenant's is not found either).
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(Problem),
    /// The request took too long to arrive or to answer.
    #[response(status = 408, content_type = "application/problem+json")]
    Timeout(Problem),
    /// A conflict: an id in use with another body, a concurrent change, a limit
    /// reached (a tenant's 100 endpoints).
    #[response(status = 409, content_type = "application/problem+json")]
    Conflict(Problem),
    /// The body is over the size limit.
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(Problem),
    /// The body is encoded (`Content-Encoding`): the API reads plain JSON only.
    #[response(status = 415, content_type = "application/problem+json")]
    UnsupportedEncoding(Problem),
    /// A field's value is not acceptable (`field` names it).
    #[response(status = 422, content_type = "application/problem+json")]
    Invalid(Problem),
    /// Rate limit or backlog limit reached; see `Retry-After`.
    #[response(status = 429, content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds to wait")))]
    TooMany(Problem),
    /// The store could not complete it; nothing accepted was lost. See `Retry-After`.
    #[response(status = 503, content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds to wait")))]
    Unavailable(Problem),
}
