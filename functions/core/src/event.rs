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
    /// type, same data. The data is compared as JSON values (the API's text and
    /// PostgreSQL's `jsonb` differ in spacing and key order, and `1` is `1.0`), but only where parsing
    /// loses nothing: a number past what an `f64` holds exactly (more than 15
    /// significant digits, or out of range) would make two different payloads equal,
    /// so such payloads must match byte for byte.
    pub fn same_as(&self, other: &Event) -> bool {
        if self.event_type != other.event_type {
            return false;
        }
        if self.payload == other.payload {
            return true;
        }
        match (exact_json(&self.payload), exact_json(&other.payload)) {
            (Some(a), Some(b)) => same_json(&a, &b),
            _ => false,
        }
    }
}

/// JSON equality in which numbers are equal by value: `1`, `1.0` and `1e0` are one
/// number (a producer's JSON library may write any of them on a retry). Exact here:
/// the numbers compared have passed [`exact_json`].
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// The JSON value of `text` if parsing it keeps every number exact.
fn exact_json(text: &str) -> Option<serde_json::Value> {
    numbers_are_exact(text)
        .then(|| serde_json::from_str(text).ok())
        .flatten()
}

/// Significant decimal digits an `f64` always tells apart (`DBL_DIG`).
const EXACT_DIGITS: usize = 15;
/// Decimal exponents an `f64` holds without overflow or subnormal loss, with margin.
const EXACT_EXPONENT: i64 = 300;

/// Whether every number token of the JSON `text` (outside strings) has at most
/// [`EXACT_DIGITS`] significant digits and a magnitude within [`EXACT_EXPONENT`].
fn numbers_are_exact(text: &str) -> bool {
    let bytes = text.as_bytes();
    let (mut i, mut in_string) = (0, false);
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => i += 2,
                b'"' => {
                    in_string = false;
                    i += 1;
                }
                _ => i += 1,
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                if !number_is_exact(&text[start..i]) {
                    return false;
                }
            }
            _ => i += 1,
        }
    }
    true
}

fn number_is_exact(number: &str) -> bool {
    let (mantissa, exponent) = match number.find(['e', 'E']) {
        Some(at) => match number[at + 1..].parse::<i64>() {
            Ok(e) => (&number[..at], e),
            Err(_) => return false,
        },
        None => (number, 0),
    };
    let integer_digits = mantissa
        .trim_start_matches('-')
        .split('.')
        .next()
        .unwrap_or("")
        .trim_start_matches('0')
        .len() as i64;
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0');
    significant.len() <= EXACT_DIGITS && (exponent + integer_digits).abs() <= EXACT_EXPONENT
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
    #[test]
    fn the_same_event_is_the_same_data_but_never_by_lossy_numbers() {
        let with = |payload: &str| Event {
            id: "lead-7".parse().unwrap(),
            tenant_id: TenantId::generate(),
            event_type: "lead.created".into(),
            payload: payload.into(),
            created_at: Utc::now(),
        };
        let same = |a: &str, b: &str| with(a).same_as(&with(b));
        assert!(same(r#"{"b":1,"a":[2.5]}"#, r#"{"a": [2.5], "b": 1}"#));
        assert!(!same(r#"{"a":1}"#, r#"{"a":2}"#));
        assert!(same(r#"{"a":[1, {"b": 2}]}"#, r#"{"a":[1.0, {"b": 2e0}]}"#));
        assert!(!same(r#"{"a":[1]}"#, r#"{"a":[1, 1]}"#));
        assert!(!same(r#"{"a":1}"#, r#"{"a":1, "b":1}"#));
        assert!(same(r#"{"a":1e400}"#, r#"{"a":1e400}"#), "byte for byte");
        assert!(!same(r#"{"a":1e400}"#, r#"{"b":2e500}"#));
        assert!(!same("12345678901234567890123", "12345678901234567890124"));
        assert!(!same("0.1", "0.10000000000000000001"));
        assert!(same(
            r#"{"n": 123456789012345}"#,
            r#"{"n":123456789012345}"#
        ));
        assert!(same(r#"{"s":"1e400 \" 9"}"#, r#"{"s": "1e400 \" 9"}"#));
        let mut other_type = with("{}");
        other_type.event_type = "lead.deleted".into();
        assert!(!with("{}").same_as(&other_type));
    }
}
