//! Failure records: the dead letters a human can read, acknowledge and resend.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{DeliveryId, EndpointId, EventId, FailureId, TenantId};

/// Why a delivery ended up in the failures store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// Every attempt of the policy failed.
    Exhausted,
    /// The policy does not retry this failure (a 4xx under `standard`, a refused target).
    NotRetryable,
    /// An at-most-once delivery failed or its outcome is unknown.
    AtMostOnce,
}

/// The message the worker puts on the failures queue. Small on purpose: the analyzer
/// reads the rest (payload, attempts) from the store, where it is durable already.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureNotice {
    pub delivery_id: DeliveryId,
    pub tenant_id: TenantId,
    pub generation: u32,
    pub reason: FailureReason,
    pub failed_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub id: FailureId,
    pub tenant_id: TenantId,
    pub delivery_id: DeliveryId,
    pub event_id: EventId,
    pub event_type: String,
    pub endpoint_id: EndpointId,
    pub reason: FailureReason,
    pub payload: String,
    /// When each attempt of the failed generation started.
    pub attempt_times: Vec<DateTime<Utc>>,
    pub last_status_code: Option<u16>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub acknowledged_at: Option<DateTime<Utc>>,
    pub ack_note: Option<String>,
    /// Who acknowledged it: `admin`, `tenant:<id>`, or the resend that delivered it.
    #[serde(default)]
    pub acknowledged_by: Option<String>,
}

impl Failure {
    /// This record, marked analyzed. An acknowledgement without a note keeps the
    /// earlier note: acknowledging again must not erase what someone wrote.
    pub fn acknowledged(mut self, ack: &Acknowledgement) -> Self {
        self.acknowledged_at = Some(ack.at);
        if !ack.note.is_empty() || self.ack_note.is_none() {
            self.ack_note = Some(ack.note.clone());
        }
        self.acknowledged_by = Some(ack.by.clone());
        self
    }
}

/// A human (or a resend that delivered) marking a failure analyzed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acknowledgement {
    pub note: String,
    /// `admin`, `tenant:<id>`.
    pub by: String,
    pub at: DateTime<Utc>,
}

/// What acknowledging a record that is acknowledged already does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reacknowledge {
    /// The later note wins (a person adding to what they found).
    Replace,
    /// The first acknowledgement stays (an automatic one never overwrites a person's).
    KeepFirst,
}

/// Filters of the failures list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailureQuery {
    /// `None`: every tenant (admin).
    pub tenant: Option<TenantId>,
    /// `Some(false)`: only failures nobody has acknowledged yet.
    pub acknowledged: Option<bool>,
    pub limit: usize,
    pub cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{DeliveryId, EndpointId, EventId, TenantId};

    #[test]
    fn acknowledging_without_a_note_keeps_the_earlier_note() {
        let delivery = DeliveryId::generate();
        let failure = Failure {
            id: FailureId::for_delivery(&delivery, 0, 0),
            tenant_id: TenantId::generate(),
            delivery_id: delivery,
            event_id: EventId::generate(),
            event_type: "a.b".into(),
            endpoint_id: EndpointId::generate(),
            reason: FailureReason::Exhausted,
            payload: "{}".into(),
            attempt_times: vec![],
            last_status_code: None,
            last_error: None,
            created_at: Utc::now(),
            acknowledged_at: None,
            ack_note: None,
            acknowledged_by: None,
        };
        let ack = |note: &str, by: &str| Acknowledgement {
            note: note.into(),
            by: by.into(),
            at: Utc::now(),
        };
        let first = failure.acknowledged(&ack("receiver fixed", "admin"));
        let again = first.clone().acknowledged(&ack("", "tenant:x"));
        assert_eq!(again.ack_note.as_deref(), Some("receiver fixed"));
        assert_eq!(again.acknowledged_by.as_deref(), Some("tenant:x"));
        let replaced = again.acknowledged(&ack("more", "admin"));
        assert_eq!(replaced.ack_note.as_deref(), Some("more"));
    }
}
