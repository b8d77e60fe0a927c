//! The producer contract: the outbox item, exactly as DESIGN.md lays it out, so a
//! producer in any language can commit an event in the same `TransactWriteItems` as
//! its business write — and the helpers to build and read it.
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `pk` | S | `<tenant_id>:<event id>` (ids scoped to their tenant), or the bare event id |
//! | `tenant_id` | S | whose endpoints receive it |
//! | `type` | S | event type |
//! | `payload` | S | the event data as JSON text |
//! | `created_at` | S | RFC 3339 UTC |
//! | `expires_at` | N | optional TTL, epoch seconds |

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use chrono::{DateTime, Utc};
use entrega_core::endpoint::{is_reserved_type, validate_event_type};
use entrega_core::event::{format_timestamp, Event, MAX_PAYLOAD_BYTES};
use entrega_core::handlers::notices::is_reserved_id;
use entrega_core::ids::{EventId, TenantId};
use entrega_core::json_keys::duplicate_key;
use entrega_core::raw_json::raw_json_problem;
use serde_json::Value;

use crate::dynamo::{get_s, n, s, Item, PK, TTL_ATTRIBUTE};

/// Why an outbox item cannot become an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboxError {
    #[error("the outbox item has no `{0}` string")]
    Missing(&'static str),
    #[error("the outbox item's `{0}` is invalid: {1}")]
    Invalid(&'static str, String),
}

/// The outbox key of an event: its id prefixed with its tenant, so two tenants may
/// use the same id. (A producer may also write the bare id as `pk`: it is then unique
/// across the table, and is read the same way.)
pub fn outbox_key(tenant: &TenantId, id: &EventId) -> String {
    format!("{tenant}:{id}")
}

/// The event id a `pk` carries for `tenant`: the part after `<tenant_id>:`, or the
/// whole key when it is a bare id.
fn event_id_of<'a>(pk: &'a str, tenant: &str) -> &'a str {
    pk.strip_prefix(tenant)
        .and_then(|rest| rest.strip_prefix(':'))
        .unwrap_or(pk)
}

/// The outbox item of `event`.
pub fn outbox_item(event: &Event, expires_at: Option<DateTime<Utc>>) -> Item {
    let mut item = Item::from([
        (PK.to_owned(), s(outbox_key(&event.tenant_id, &event.id))),
        ("tenant_id".to_owned(), s(event.tenant_id.as_str())),
        ("type".to_owned(), s(event.event_type.clone())),
        ("payload".to_owned(), s(event.payload.clone())),
        (
            "created_at".to_owned(),
            s(format_timestamp(event.created_at)),
        ),
    ]);
    if let Some(at) = expires_at {
        item.insert(TTL_ATTRIBUTE.to_owned(), n(at.timestamp()));
    }
    item
}

/// The producer helper: the `TransactWriteItem` that commits `event` into the outbox
/// `table`. Put it in the same `TransactWriteItems` as the business write: if the
/// transaction is cancelled there is no event; if it commits, the event is delivered.
/// The condition makes a reused event id cancel the transaction instead of
/// overwriting an event already sent.
pub fn outbox_put(table: &str, event: &Event) -> TransactWriteItem {
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(outbox_item(event, None)))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .expect("table and item are set");
    TransactWriteItem::builder().put(put).build()
}

/// Decode an outbox item read with the DynamoDB SDK.
pub fn event_from_item(item: &Item) -> Result<Event, OutboxError> {
    let field = |name: &'static str| get_s(item, name).ok_or(OutboxError::Missing(name));
    decode(
        field(PK)?,
        field("tenant_id")?,
        field("type")?,
        field("payload")?,
        field("created_at")?,
    )
}

/// Decode a stream record's `NewImage` in DynamoDB JSON (`{"pk": {"S": "…"}, …}`), the
/// form both a Lambda stream event and our conversion of stream SDK records use.
pub fn event_from_dynamo_json(image: &Value) -> Result<Event, OutboxError> {
    let field = |name: &'static str| {
        image
            .get(name)
            .and_then(|v| v.get("S"))
            .and_then(Value::as_str)
            .ok_or(OutboxError::Missing(name))
    };
    decode(
        field(PK)?,
        field("tenant_id")?,
        field("type")?,
        field("payload")?,
        field("created_at")?,
    )
}

fn decode(
    id: &str,
    tenant: &str,
    event_type: &str,
    payload: &str,
    created_at: &str,
) -> Result<Event, OutboxError> {
    let invalid = |field, e: &dyn std::fmt::Display| OutboxError::Invalid(field, e.to_string());
    let id: EventId = event_id_of(id, tenant)
        .parse()
        .map_err(|e| invalid(PK, &e))?;
    let tenant_id: TenantId = tenant.parse().map_err(|e| invalid("tenant_id", &e))?;
    validate_event_type(event_type).map_err(|e| invalid("type", &e))?;
    // Entrega's own events are written here too, with its id and its type both; a
    // producer's item with one of the two was a forged `entrega.*` event delivered as
    // genuine, or an id that made the real one a replay (a hostile test).
    match (is_reserved_type(event_type), is_reserved_id(id.as_str())) {
        (true, false) => return Err(invalid("type", &"reserved for Entrega's own events")),
        (false, true) => return Err(invalid(PK, &"reserved for Entrega's own events")),
        _ => {}
    }
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(invalid("payload", &"over 256 KiB"));
    }
    serde_json::from_str::<serde::de::IgnoredAny>(payload).map_err(|e| invalid("payload", &e))?;
    // By the rules the API holds a published `data` to, so an event from the outbox
    // reaches receivers as one from the API would.
    if let Some(problem) = raw_json_problem(payload.as_bytes()) {
        return Err(invalid("payload", &problem.describe()));
    }
    if let Some(path) = duplicate_key(payload.as_bytes()) {
        return Err(invalid("payload", &format!("`{path}` is given twice")));
    }
    let created_at = DateTime::parse_from_rfc3339(created_at)
        .map_err(|e| invalid("created_at", &e))?
        .with_timezone(&Utc);
    Ok(Event {
        id,
        tenant_id,
        event_type: event_type.to_owned(),
        payload: payload.to_owned(),
        created_at,
    })
}

/// DynamoDB JSON of a scalar attribute (the outbox only has S and N).
pub fn scalar_json(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::S(v) => serde_json::json!({ "S": v }),
        AttributeValue::N(v) => serde_json::json!({ "N": v }),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> Event {
        Event {
            id: EventId::generate(),
            tenant_id: TenantId::generate(),
            event_type: "lead.stage_changed".into(),
            payload: r#"{"lead":42}"#.into(),
            created_at: DateTime::parse_from_rfc3339("2026-11-30T12:00:00.123Z")
                .unwrap()
                .with_timezone(&Utc),
        }
    }

    #[test]
    fn the_item_round_trips_through_sdk_items_and_dynamo_json() {
        let e = event();
        let item = outbox_item(&e, None);
        assert_eq!(event_from_item(&item).unwrap(), e);
        let json: serde_json::Map<String, Value> = item
            .iter()
            .map(|(k, v)| (k.clone(), scalar_json(v)))
            .collect();
        assert_eq!(event_from_dynamo_json(&Value::Object(json)).unwrap(), e);
    }

    #[test]
    fn a_foreign_producer_item_with_a_uuid_id_is_accepted_and_bad_ones_are_named() {
        let image = serde_json::json!({
            "pk": {"S": "0b4e6f8a-1f3c-4c1e-9d7e-6a2b5c3d4e5f"},
            "tenant_id": {"S": TenantId::generate().to_string()},
            "type": {"S": "lead.created"},
            "payload": {"S": "{\"x\":1}"},
            "created_at": {"S": "2026-11-30T12:00:00Z"},
            "expires_at": {"N": "1796000000"}
        });
        assert!(event_from_dynamo_json(&image).is_ok());
        let mut bad = image.clone();
        for payload in ["{not json", r#"{"x":1,"x":2}"#, r#"{"s":"\ud800"}"#] {
            bad["payload"] = serde_json::json!({ "S": payload });
            assert!(
                matches!(
                    event_from_dynamo_json(&bad),
                    Err(OutboxError::Invalid("payload", _))
                ),
                "{payload}"
            );
        }
        let mut bad = image.clone();
        bad["pk"] = serde_json::json!({"S": "a.b"});
        assert!(matches!(
            event_from_dynamo_json(&bad),
            Err(OutboxError::Invalid("pk", _))
        ));
        // Entrega's id space and type space go together: only its own events have both.
        let with = |pk: &str, event_type: &str| {
            let mut item = image.clone();
            item["pk"] = serde_json::json!({ "S": pk });
            item["type"] = serde_json::json!({ "S": event_type });
            event_from_dynamo_json(&item)
        };
        assert!(matches!(
            with("evt_1", "entrega.delivery.exhausted"),
            Err(OutboxError::Invalid("type", _))
        ));
        assert!(matches!(
            with("entrega-exhausted-dlv_1-0", "lead.created"),
            Err(OutboxError::Invalid("pk", _))
        ));
        assert!(with("entrega-exhausted-dlv_1-0", "entrega.delivery.exhausted").is_ok());
        let mut bad = image;
        bad.as_object_mut().unwrap().remove("tenant_id");
        assert_eq!(
            event_from_dynamo_json(&bad),
            Err(OutboxError::Missing("tenant_id"))
        );
    }
}
