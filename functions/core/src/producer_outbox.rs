//! A producer's transactional outbox in its own database: what one row must hold to
//! become an event, and why a row that cannot is quarantined. The same rules as
//! `POST /v1/events`; the adapter that reads the rows (PostgreSQL) lives with the
//! embedded runtime.

use chrono::{DateTime, Utc};

use crate::endpoint::{is_reserved_type, validate_event_type};
use crate::event::{Event, MAX_PAYLOAD_BYTES};
use crate::handlers::notices::is_reserved_id;
use crate::ids::{EventId, TenantId};
use crate::raw_json::raw_json_problem;

/// One row of the producer's outbox table, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub id: String,
    pub tenant_id: String,
    pub event_type: String,
    /// The JSON text (the column is `jsonb`, so it is valid JSON); `None` when it is
    /// over [`MAX_PAYLOAD_BYTES`], which the reader does not fetch.
    pub payload: Option<String>,
}

/// Why a row can never become an event: it is moved to quarantine with this reason,
/// so it neither blocks the rows behind it nor disappears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuarantineReason {
    /// No tenant has this id.
    UnknownTenant,
    /// Not an event id (1 to 128 of `[A-Za-z0-9_:-]`, or a UUID).
    BadId,
    /// Not a dot-separated event type of at most 128 characters.
    BadType,
    /// A type under `entrega.`, which only Entrega's own events may use.
    ReservedType,
    /// An id starting `entrega-`, which only Entrega's own events may use.
    ReservedId,
    /// A payload over 256 KiB.
    TooLarge,
    /// A payload the API refuses although it is JSON (see [`crate::raw_json`]):
    /// nested deeper than receivers' parsers take, or a lone surrogate escape.
    BadPayload,
    /// The id was already published with another type or payload.
    IdReused,
}

impl QuarantineReason {
    /// The reason as stored in the quarantine table and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownTenant => "unknown_tenant",
            Self::BadId => "bad_id",
            Self::BadType => "bad_type",
            Self::ReservedType => "reserved_type",
            Self::ReservedId => "reserved_id",
            Self::TooLarge => "too_large",
            Self::BadPayload => "bad_payload",
            Self::IdReused => "id_reused",
        }
    }
}

/// The event a row stands for, accepted at `now`, or why it can never be one. Whether
/// its tenant exists is the caller's to check (it needs the store).
///
/// The event's time is when Entrega accepts it, as for `POST /v1/events`, not the
/// row's `created_at`: that is the producer's clock, which may be ahead of Entrega's,
/// `infinity`, or years off, and the fan-out poller orders and waits by event time.
pub fn event_of_row(row: &OutboxRow, now: DateTime<Utc>) -> Result<Event, QuarantineReason> {
    let id: EventId = row.id.parse().map_err(|_| QuarantineReason::BadId)?;
    if is_reserved_id(id.as_str()) {
        return Err(QuarantineReason::ReservedId);
    }
    let tenant_id: TenantId = row
        .tenant_id
        .parse()
        .map_err(|_| QuarantineReason::UnknownTenant)?;
    validate_event_type(&row.event_type).map_err(|_| QuarantineReason::BadType)?;
    if is_reserved_type(&row.event_type) {
        return Err(QuarantineReason::ReservedType);
    }
    let payload = row
        .payload
        .as_ref()
        .filter(|p| p.len() <= MAX_PAYLOAD_BYTES)
        .ok_or(QuarantineReason::TooLarge)?;
    if raw_json_problem(payload.as_bytes()).is_some() {
        return Err(QuarantineReason::BadPayload);
    }
    Ok(Event {
        id,
        tenant_id,
        event_type: row.event_type.clone(),
        payload: payload.clone(),
        created_at: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> OutboxRow {
        OutboxRow {
            id: "0b4e6f8a-1f3c-4c1e-9d7e-6a2b5c3d4e5f".into(),
            tenant_id: TenantId::generate().to_string(),
            event_type: "lead.created".into(),
            payload: Some(r#"{"lead":1}"#.into()),
        }
    }

    #[test]
    fn a_good_row_is_its_event_byte_for_byte() {
        let (r, now) = (row(), Utc::now());
        let event = event_of_row(&r, now).unwrap();
        assert_eq!(event.id.as_str(), r.id);
        assert_eq!(Some(event.payload), r.payload);
        assert_eq!(event.created_at, now, "accepted now, whatever the row says");
    }

    #[test]
    fn each_bad_field_is_named() {
        let bad = |f: fn(&mut OutboxRow)| {
            let mut r = row();
            f(&mut r);
            event_of_row(&r, Utc::now()).unwrap_err()
        };
        assert_eq!(bad(|r| r.id = "a.b".into()), QuarantineReason::BadId);
        assert_eq!(
            bad(|r| r.id = "entrega-exhausted-dlv_1-0".into()),
            QuarantineReason::ReservedId
        );
        assert_eq!(
            bad(|r| r.tenant_id = "acme".into()),
            QuarantineReason::UnknownTenant
        );
        assert_eq!(
            bad(|r| r.event_type = "a..b".into()),
            QuarantineReason::BadType
        );
        assert_eq!(
            bad(|r| r.event_type = "Entrega.endpoint.disabled".into()),
            QuarantineReason::ReservedType
        );
        assert_eq!(
            bad(|r| r.payload = Some(format!("\"{}\"", "x".repeat(MAX_PAYLOAD_BYTES)))),
            QuarantineReason::TooLarge
        );
        assert_eq!(bad(|r| r.payload = None), QuarantineReason::TooLarge);
        fn nested(depth: usize) -> Option<String> {
            Some(format!("{}{}", "[".repeat(depth), "]".repeat(depth)))
        }
        assert_eq!(
            bad(|r| r.payload = nested(crate::raw_json::MAX_RAW_NESTING + 1)),
            QuarantineReason::BadPayload,
            "as deep as the API refuses"
        );
        let mut r = row();
        r.payload = nested(crate::raw_json::MAX_RAW_NESTING);
        assert!(event_of_row(&r, Utc::now()).is_ok(), "as deep as it takes");
        assert_eq!(
            bad(|r| r.payload = Some(r#"{"a":"\ud800"}"#.into())),
            QuarantineReason::BadPayload
        );
    }
}
