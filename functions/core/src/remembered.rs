//! The keys of what the handlers and the API remember for a while in the store's
//! key-value space (claims, counters, markers, idempotent answers). Each is built here
//! from typed parts, so no two places can spell one key two ways, or two keys one way.
//!
//! A spelling never changes: what is stored under the old one would be orphaned by an
//! upgrade (a claim taken again, so a notice sent twice; an hour's count restarted).
//! The unit tests pin every spelling.

use std::fmt;

use chrono::{DateTime, Utc};

use crate::ids::{DeliveryId, EndpointId, FailureId, TenantId};

/// One remembered key. `Display` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RememberedKey<'a> {
    /// The count of a tenant's failures in the hour that starts at `hour`.
    FailuresInHour {
        tenant: &'a TenantId,
        hour: DateTime<Utc>,
    },
    /// The token that counts one failure in its hour once, however often its notice
    /// is handled.
    FailureCounted(&'a FailureId),
    /// On-call's one alert for a tenant's hour past the threshold.
    ThresholdAlert {
        tenant: &'a TenantId,
        hour: DateTime<Utc>,
    },
    /// The owner's one notice of a tenant's failed deliveries in the hour.
    OwnerNotice {
        tenant: &'a TenantId,
        hour: DateTime<Utc>,
    },
    /// The owner's one notice that an endpoint was disabled, on the day of `at`.
    DisabledNotice {
        endpoint: &'a EndpointId,
        at: DateTime<Utc>,
    },
    /// On-call's one alert for a failure left unacknowledged, on the day that starts
    /// at `day`.
    AgeAlert {
        failure: &'a FailureId,
        day: DateTime<Utc>,
    },
    /// A sweep's claim on queueing a delivery again.
    Sweep(&'a DeliveryId),
}

impl fmt::Display for RememberedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FailuresInHour { tenant, hour } => {
                write!(f, "failures#{tenant}#{}", hour.timestamp())
            }
            Self::FailureCounted(failure) => write!(f, "counted#{failure}"),
            Self::ThresholdAlert { tenant, hour } => {
                write!(f, "threshold-alert#{tenant}#{}", hour.timestamp())
            }
            Self::OwnerNotice { tenant, hour } => {
                write!(f, "owner-notice#{tenant}#{}", hour.timestamp())
            }
            Self::DisabledNotice { endpoint, at } => {
                write!(f, "disabled-notice#{endpoint}#{}", at.timestamp() / 86_400)
            }
            Self::AgeAlert { failure, day } => {
                write!(f, "age-alert#{failure}#{}", day.timestamp())
            }
            Self::Sweep(delivery) => write!(f, "sweep:{delivery}"),
        }
    }
}

impl RememberedKey<'_> {
    /// The marker that the notice claimed under this key left the process.
    pub fn sent_marker(&self) -> String {
        format!("{self}#sent")
    }
}

/// Where an API request made with an `Idempotency-Key` is remembered: per route, per
/// caller (the hash of its API key) and per key, so one caller's key never answers
/// another's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencySlot {
    pub route: String,
    pub caller: String,
    pub key: String,
}

/// How every claim of an [`IdempotencySlot`] ends.
pub const CLAIM_SUFFIX: &str = "#claim";

impl IdempotencySlot {
    /// The claim held while the first request with this key runs.
    pub fn claim(&self) -> String {
        format!("{self}{CLAIM_SUFFIX}")
    }

    /// The first request's answer, kept for the ones after it.
    pub fn answer(&self) -> String {
        format!("{self}#answer")
    }
}

impl fmt::Display for IdempotencySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}#{}", self.route, self.caller, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every spelling as it was stored before this module built them: an upgrade must
    /// find what the version before it remembered.
    #[test]
    fn the_spellings_are_the_stored_ones() {
        const HEX: &str = "0123456789abcdef0123456789abcdef";
        let tenant: TenantId = format!("ten_{HEX}").parse().unwrap();
        let failure: FailureId = format!("fail_{HEX}").parse().unwrap();
        let endpoint: EndpointId = format!("ep_{HEX}").parse().unwrap();
        let delivery: DeliveryId = format!("dlv_{HEX}").parse().unwrap();
        let hour = DateTime::from_timestamp(1_764_583_200, 0).unwrap();
        let at = DateTime::from_timestamp(1_764_586_799, 0).unwrap();
        let spelled = [
            (
                RememberedKey::FailuresInHour {
                    tenant: &tenant,
                    hour,
                },
                "failures#ten_0123456789abcdef0123456789abcdef#1764583200",
            ),
            (
                RememberedKey::FailureCounted(&failure),
                "counted#fail_0123456789abcdef0123456789abcdef",
            ),
            (
                RememberedKey::ThresholdAlert {
                    tenant: &tenant,
                    hour,
                },
                "threshold-alert#ten_0123456789abcdef0123456789abcdef#1764583200",
            ),
            (
                RememberedKey::OwnerNotice {
                    tenant: &tenant,
                    hour,
                },
                "owner-notice#ten_0123456789abcdef0123456789abcdef#1764583200",
            ),
            (
                RememberedKey::DisabledNotice {
                    endpoint: &endpoint,
                    at,
                },
                "disabled-notice#ep_0123456789abcdef0123456789abcdef#20423",
            ),
            (
                RememberedKey::AgeAlert {
                    failure: &failure,
                    day: hour,
                },
                "age-alert#fail_0123456789abcdef0123456789abcdef#1764583200",
            ),
            (
                RememberedKey::Sweep(&delivery),
                "sweep:dlv_0123456789abcdef0123456789abcdef",
            ),
        ];
        for (key, stored) in spelled {
            assert_eq!(key.to_string(), stored);
        }
        assert_eq!(
            RememberedKey::FailureCounted(&failure).sent_marker(),
            "counted#fail_0123456789abcdef0123456789abcdef#sent"
        );
        let slot = IdempotencySlot {
            route: "resend".into(),
            caller: "abc".into(),
            key: "k-1".into(),
        };
        assert_eq!(
            (slot.claim(), slot.answer()),
            (
                "resend#abc#k-1#claim".into(),
                "resend#abc#k-1#answer".into()
            )
        );
    }
}
