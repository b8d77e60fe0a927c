//! Deliveries (one event to one endpoint) and their attempts.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, DeliveryId, EndpointId, EventId, TenantId};
use crate::outcome::FailureKind;

/// Bytes of a response body kept in the delivery log.
pub const RESPONSE_EXCERPT_BYTES: usize = 1024;

/// Where a delivery is in its life. The API shows the coarser [`DeliveryStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Created, waiting for its first attempt.
    Pending,
    /// An attempt has started; its outcome is not recorded yet.
    Delivering,
    /// A failed attempt; the next one is due at `next_attempt_at`.
    Retrying,
    /// The endpoint is disabled: kept, and queued again when it is re-enabled.
    Paused,
    Delivered,
    /// Given up after a failure the policy does not retry.
    Failed,
    /// Every attempt of the policy failed.
    Exhausted,
}

/// The delivery status clients filter and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    Pending,
    Delivered,
    Failed,
    Exhausted,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::Exhausted => "exhausted",
        }
    }
}

impl std::str::FromStr for DeliveryStatus {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "pending" => Ok(Self::Pending),
            "delivered" => Ok(Self::Delivered),
            "failed" => Ok(Self::Failed),
            "exhausted" => Ok(Self::Exhausted),
            _ => Err(()),
        }
    }
}

impl DeliveryState {
    /// The stored name (the serde name), for indexes and queries.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivering => "delivering",
            Self::Retrying => "retrying",
            Self::Paused => "paused",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::Exhausted => "exhausted",
        }
    }

    pub fn status(self) -> DeliveryStatus {
        match self {
            Self::Pending | Self::Delivering | Self::Retrying | Self::Paused => {
                DeliveryStatus::Pending
            }
            Self::Delivered => DeliveryStatus::Delivered,
            Self::Failed => DeliveryStatus::Failed,
            Self::Exhausted => DeliveryStatus::Exhausted,
        }
    }

    /// No attempt will be made unless a human resends it.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Delivered | Self::Failed | Self::Exhausted)
    }

    /// Counts as waiting work (the tenant's backlog): it will be attempted without
    /// anyone asking.
    pub fn is_waiting(self) -> bool {
        !self.is_terminal() && self != Self::Paused
    }
}

/// What started an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Scheduled,
    Manual,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: DeliveryId,
    pub tenant_id: TenantId,
    pub event_id: EventId,
    pub event_type: String,
    pub endpoint_id: EndpointId,
    pub state: DeliveryState,
    /// Attempts in the current generation (a resend starts a new generation at 0).
    pub attempt_count: u32,
    /// Bumped by every resend; queue messages of an older generation are stale.
    pub generation: u32,
    /// What started the current generation.
    pub trigger: Trigger,
    // The stored record leaves out what is unset (the API has views of its own): a
    // DynamoDB delivery item, keys and all, stays under the 1 KiB of one write unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status_code: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// While `Delivering`: until when the attempt in progress may still be running.
    /// Past it, the worker that started it is presumed dead. Kept by a resend made
    /// while that attempt runs, which waits it out (`state_machine::resend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<DateTime<Utc>>,
    /// The attempt a resend superseded while it ran, as an interrupted one: recorded
    /// so when the resend's own attempt starts, unless the superseded attempt's worker
    /// reported back first. After a crash it is the only trace of a request that may
    /// have reached the receiver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded: Option<Box<Attempt>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<DateTime<Utc>>,
    /// Optimistic-concurrency version: every write names the version it read.
    pub version: u64,
    /// Who asked for the current generation when it was a resend (`admin`, or
    /// `tenant:<id>`); `None` for the original schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// The request under an `Idempotency-Key` whose resend started the current
    /// generation (its mark), so that request, repeated after it died part-way, resends
    /// only what it had not reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resent_for: Option<String>,
    /// Drawn by the resend that started the current generation, and carried by the
    /// message it queued: resends racing on one delivery each queue a message before
    /// their conditional write, so the loser's names the winner's generation too, and
    /// the worker keeps only the one whose token the delivery holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resend_token: Option<u64>,
}

impl Delivery {
    /// When a worker should next look at this delivery without anyone asking: its next
    /// attempt, or the end of the lease of the attempt under way. `None` when nothing is
    /// due (delivered, failed, exhausted, paused).
    pub fn due_at(&self) -> Option<DateTime<Utc>> {
        if !self.state.is_waiting() {
            return None;
        }
        self.next_attempt_at.or(self.lease_until)
    }

    /// A new delivery, waiting for its first attempt (or paused, for a disabled
    /// endpoint).
    pub fn new(
        id: DeliveryId,
        event: &crate::event::Event,
        endpoint_id: EndpointId,
        paused: bool,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            id,
            tenant_id: event.tenant_id.clone(),
            event_id: event.id.clone(),
            event_type: event.event_type.clone(),
            endpoint_id,
            state: if paused {
                DeliveryState::Paused
            } else {
                DeliveryState::Pending
            },
            attempt_count: 0,
            generation: 0,
            trigger: Trigger::Scheduled,
            last_status_code: None,
            last_error: None,
            next_attempt_at: Some(now),
            lease_until: None,
            created_at: now,
            updated_at: now,
            delivered_at: None,
            version: 0,
            requested_by: None,
            resent_for: None,
            resend_token: None,
            superseded: None,
        }
    }
}

/// One HTTP attempt, as the delivery log shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub id: AttemptId,
    pub delivery_id: DeliveryId,
    pub tenant_id: TenantId,
    /// The endpoint attempted (per-endpoint statistics read attempts by it).
    pub endpoint_id: EndpointId,
    pub generation: u32,
    /// 1-based within its generation.
    pub number: u32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: u64,
    pub status_code: Option<u16>,
    pub failure_kind: Option<FailureKind>,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    pub trigger: Trigger,
    /// Who asked, for attempts of a resend.
    #[serde(default)]
    pub requested_by: Option<String>,
}

/// Cut `text` to at most `max` bytes on a character boundary.
pub fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_status_folds_in_flight_states_into_pending() {
        assert_eq!(DeliveryState::Retrying.status(), DeliveryStatus::Pending);
        assert_eq!(DeliveryState::Paused.status(), DeliveryStatus::Pending);
        assert_eq!(DeliveryState::Exhausted.status(), DeliveryStatus::Exhausted);
        assert!(DeliveryState::Failed.is_terminal());
        assert!(!DeliveryState::Delivering.is_terminal());
        for state in [
            DeliveryState::Pending,
            DeliveryState::Delivering,
            DeliveryState::Retrying,
            DeliveryState::Paused,
        ] {
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                state.as_str(),
                "the stored name is the serde name"
            );
        }
        assert_eq!("exhausted".parse(), Ok(DeliveryStatus::Exhausted));
        assert!("retrying".parse::<DeliveryStatus>().is_err());
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("héllo", 3), "hé");
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }
}
