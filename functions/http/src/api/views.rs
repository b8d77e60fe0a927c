//! The JSON shapes the API returns (DESIGN.md's contract), built from domain types.
//! Kept apart from the domain so storage fields (versions, leases) never leak out.

use entrega_core::delivery::{Attempt, Delivery};
use entrega_core::endpoint::Endpoint;
use entrega_core::event::{format_timestamp, Event};
use entrega_core::failure::Failure;
use entrega_core::tenant::Tenant;
use serde_json::{json, Value};

fn ts(t: Option<chrono::DateTime<chrono::Utc>>) -> Value {
    t.map(|t| Value::String(format_timestamp(t)))
        .unwrap_or(Value::Null)
}

pub fn tenant_view(t: &Tenant) -> Value {
    json!({
        "id": t.id,
        "name": t.name,
        "owner_email": t.owner_email,
        "created_at": format_timestamp(t.created_at),
    })
}

/// The endpoint as its owner sees it, secret included (it is theirs to verify with).
pub fn endpoint_view(e: &Endpoint) -> Value {
    json!({
        "id": e.id,
        "tenant_id": e.tenant_id,
        "url": e.url,
        "event_types": e.event_types,
        "mode": e.mode,
        "retry": e.retry,
        "timeout_ms": e.timeout_ms,
        "max_concurrency": e.max_concurrency,
        "disabled": e.disabled,
        "description": e.description,
        "secret": e.secret.expose(),
        "previous_secret_expires_at": ts(e.previous_secret.as_ref().map(|p| p.expires_at)),
        "created_at": format_timestamp(e.created_at),
        "updated_at": format_timestamp(e.updated_at),
    })
}

/// One row of the delivery log.
pub fn delivery_view(d: &Delivery) -> Value {
    json!({
        "id": d.id,
        "event_id": d.event_id,
        "event_type": d.event_type,
        "endpoint_id": d.endpoint_id,
        "tenant_id": d.tenant_id,
        "status": d.state.status().as_str(),
        "attempt_count": d.attempt_count,
        "last_status_code": d.last_status_code,
        "last_error": d.last_error,
        "next_attempt_at": ts(d.next_attempt_at.filter(|_| !d.state.is_terminal())),
        "created_at": format_timestamp(d.created_at),
        "delivered_at": ts(d.delivered_at),
        "generation": d.generation,
        "requested_by": d.requested_by,
    })
}

/// A dead-letter record, with its payload as JSON.
pub fn failure_view(f: &Failure) -> Value {
    let payload: Value = serde_json::from_str(&f.payload).unwrap_or(Value::Null);
    json!({
        "id": f.id,
        "tenant_id": f.tenant_id,
        "delivery_id": f.delivery_id,
        "event_id": f.event_id,
        "event_type": f.event_type,
        "endpoint_id": f.endpoint_id,
        "reason": f.reason,
        "payload": payload,
        "attempt_times": f.attempt_times.iter().map(|t| format_timestamp(*t)).collect::<Vec<_>>(),
        "last_status_code": f.last_status_code,
        "last_error": f.last_error,
        "created_at": format_timestamp(f.created_at),
        "acknowledged_at": ts(f.acknowledged_at),
        "ack_note": f.ack_note,
    })
}

pub fn attempt_view(a: &Attempt) -> Value {
    json!({
        "number": a.number,
        "generation": a.generation,
        "started_at": format_timestamp(a.started_at),
        "duration_ms": a.duration_ms,
        "status_code": a.status_code,
        "error": a.error,
        "failure_kind": a.failure_kind,
        "response_excerpt": a.response_excerpt,
        "trigger": a.trigger,
        "requested_by": a.requested_by,
    })
}

pub fn event_view(e: &Event) -> Value {
    let data: Value = serde_json::from_str(&e.payload).unwrap_or(Value::Null);
    json!({
        "id": e.id,
        "tenant_id": e.tenant_id,
        "type": e.event_type,
        "data": data,
        "created_at": format_timestamp(e.created_at),
    })
}
