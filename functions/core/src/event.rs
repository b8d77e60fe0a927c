//! Events: what a producer says happened, and the webhook body built from it.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{EventId, TenantId};

/// Largest event payload accepted (DESIGN.md: refused with 413 above this, never
/// truncated).
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// An event as stored in the outbox. `payload` is the producer's JSON text, kept as
/// bytes so every attempt signs and sends exactly the same body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub id: EventId,
    pub tenant_id: TenantId,
    #[serde(rename = "type")]
    pub event_type: String,
    pub payload: String,
    pub created_at: DateTime<Utc>,
}

impl Event {
    /// The webhook body: `{"type", "timestamp", "data"}`. Built by concatenation so
    /// the producer's JSON is forwarded byte for byte (re-serialising could reorder
    /// keys or change number formatting between attempts).
    pub fn webhook_body(&self) -> String {
        let event_type = serde_json::to_string(&self.event_type).expect("a string serialises");
        format!(
            r#"{{"type":{event_type},"timestamp":"{}","data":{}}}"#,
            format_timestamp(self.created_at),
            self.payload
        )
    }
}

impl Event {
    /// Whether `other`, published again under this one's id, is the same event: same
    /// type, same data (compared as JSON values, so key order and number spelling do
    /// not matter).
    pub fn same_as(&self, other: &Event) -> bool {
        let data = |e: &Event| serde_json::from_str::<serde_json::Value>(&e.payload).ok();
        self.event_type == other.event_type && data(self) == data(other)
    }
}

/// RFC 3339 UTC with millisecond precision, the one timestamp format of the API.
pub fn format_timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn body_forwards_payload_bytes_verbatim() {
        let event = Event {
            id: EventId::generate(),
            tenant_id: TenantId::generate(),
            event_type: "lead.stage_changed".into(),
            payload: r#"{"z": 1, "a": 1.50}"#.into(),
            created_at: Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap(),
        };
        let body = event.webhook_body();
        assert_eq!(
            body,
            r#"{"type":"lead.stage_changed","timestamp":"2026-11-30T12:00:00.000Z","data":{"z": 1, "a": 1.50}}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed["data"]["a"], 1.5);
    }
}
