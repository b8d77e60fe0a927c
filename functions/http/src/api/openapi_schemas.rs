//! The component schemas of the OpenAPI document: every request and response body,
//! and the problem shape every error uses.

use serde_json::{json, Value};

pub(super) fn string() -> Value {
    json!({ "type": "string" })
}
fn nullable(kind: &str) -> Value {
    json!({ "type": [kind, "null"] })
}
fn time() -> Value {
    json!({ "type": "string", "format": "date-time" })
}
fn nullable_time() -> Value {
    json!({ "type": ["string", "null"], "format": "date-time" })
}
pub(super) fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}
fn object(required: &[&str], properties: Value) -> Value {
    json!({ "type": "object", "required": required, "properties": properties })
}
fn page_of(item: &str) -> Value {
    object(
        &["data", "next_cursor"],
        json!({
            "data": { "type": "array", "items": reference(item) },
            "next_cursor": nullable("string"),
        }),
    )
}

pub(super) fn schemas() -> Value {
    let delivery = json!({
        "id": string(), "event_id": string(), "event_type": string(), "endpoint_id": string(),
        "tenant_id": string(),
        "status": { "type": "string", "enum": ["pending", "delivered", "failed", "exhausted"] },
        "attempt_count": { "type": "integer", "minimum": 0 },
        "generation": { "type": "integer", "minimum": 0 },
        "last_status_code": nullable("integer"), "last_error": nullable("string"),
        "next_attempt_at": nullable_time(), "created_at": time(), "delivered_at": nullable_time(),
        "requested_by": nullable("string"),
    });
    let mut detail = delivery.clone();
    detail["attempts"] = json!({ "type": "array", "items": reference("Attempt") });
    let retry = json!({ "oneOf": [
        { "type": "string", "enum": ["standard", "persistent", "none"] },
        object(&["delays_s"], json!({
            "delays_s": { "type": "array", "maxItems": 20, "items": { "type": "integer", "minimum": 1, "maximum": 86400 } },
            "jitter": { "type": "number", "minimum": 0, "maximum": 0.5 },
            "retry_4xx": { "type": "boolean" },
        })),
    ]});
    let endpoint_fields = json!({
        "url": { "type": "string", "format": "uri" },
        "event_types": { "type": "array", "items": string() },
        "mode": { "type": "string", "enum": ["at_least_once", "at_most_once"] },
        "retry": reference("RetrySpec"),
        "timeout_ms": { "type": "integer", "minimum": 100, "maximum": 30000 },
        "max_concurrency": { "type": "integer", "minimum": 1, "maximum": 256 },
        "disabled": { "type": "boolean" },
        "description": nullable("string"),
    });
    let mut endpoint = endpoint_fields.clone();
    for (k, v) in [
        ("id", string()),
        ("tenant_id", string()),
        ("secret", string()),
        ("previous_secret_expires_at", nullable_time()),
        ("created_at", time()),
        ("updated_at", time()),
    ] {
        endpoint[k] = v;
    }
    let mut create_endpoint = endpoint_fields.clone();
    create_endpoint["tenant_id"] = json!({ "type": "string", "description": "admin keys only" });
    json!({
        "Problem": object(&["type", "title", "status", "detail"], json!({
            "type": string(), "title": string(), "status": { "type": "integer" }, "detail": string(),
            "field": { "type": "string", "description": "the request field at fault" },
        })),
        "Health": object(&["status"], json!({ "status": string() })),
        "OpenApi": { "type": "object" },
        "CreateTenant": object(&["name", "owner_email"], json!({
            "name": string(), "owner_email": { "type": "string", "format": "email" }, "id": string(),
        })),
        "Tenant": object(&["id", "name", "owner_email", "created_at"], json!({
            "id": string(), "name": string(), "owner_email": string(), "created_at": time(),
        })),
        "TenantCreated": object(&["tenant", "api_key"], json!({ "tenant": reference("Tenant"), "api_key": string() })),
        "RetrySpec": retry,
        "CreateEndpoint": object(&["url"], create_endpoint),
        "PatchEndpoint": object(&[], endpoint_fields),
        "Endpoint": object(&["id", "tenant_id", "url", "secret", "created_at"], endpoint),
        "EndpointPage": page_of("Endpoint"),
        "EndpointStats": object(&["attempts", "delivered", "failed"], json!({
            "endpoint_id": string(), "window_start": time(),
            "attempts": { "type": "integer" }, "delivered": { "type": "integer" }, "failed": { "type": "integer" },
            "median_ms": nullable("integer"), "p95_ms": nullable("integer"),
            "last_error": nullable("string"), "last_error_at": nullable_time(), "truncated": { "type": "boolean" },
        })),
        "PublishEvent": object(&["type", "data"], json!({
            "type": string(), "data": {}, "id": { "type": "string", "pattern": "^[A-Za-z0-9_:-]{1,128}$" },
            "tenant_id": { "type": "string", "description": "admin keys only" },
        })),
        "EventAccepted": object(&["id"], json!({ "id": string() })),
        "EventWithDeliveries": object(&["id", "type", "data", "deliveries"], json!({
            "id": string(), "tenant_id": string(), "type": string(), "data": {}, "created_at": time(),
            "deliveries": { "type": "array", "items": reference("Delivery") },
        })),
        "Delivery": object(&["id", "event_id", "endpoint_id", "status", "attempt_count"], delivery),
        "DeliveryDetail": object(&["id", "attempts"], detail),
        "DeliveryPage": page_of("Delivery"),
        "Attempt": object(&["number", "started_at", "duration_ms", "trigger"], json!({
            "number": { "type": "integer" }, "generation": { "type": "integer" }, "started_at": time(),
            "duration_ms": { "type": "integer" }, "status_code": nullable("integer"), "error": nullable("string"),
            "failure_kind": nullable("string"), "response_excerpt": nullable("string"),
            "trigger": { "type": "string", "enum": ["scheduled", "manual"] }, "requested_by": nullable("string"),
        })),
        "BatchResend": object(&[], json!({
            "ids": { "type": "array", "maxItems": 1000, "items": string() },
            "endpoint_id": string(), "status": { "type": "string", "enum": ["pending", "delivered", "failed", "exhausted"] },
            "event_type": string(), "since": time(), "until": time(), "cursor": string(),
        })),
        "BatchResendResult": object(&["queued", "next_cursor"], json!({
            "queued": { "type": "integer" }, "not_found": { "type": "array", "items": string() },
            "next_cursor": nullable("string"),
        })),
        "Failure": object(&["id", "delivery_id", "event_id", "reason"], json!({
            "id": string(), "tenant_id": string(), "delivery_id": string(), "event_id": string(),
            "event_type": string(), "endpoint_id": string(),
            "reason": { "type": "string", "enum": ["exhausted", "not_retryable", "at_most_once"] },
            "payload": {}, "attempt_times": { "type": "array", "items": time() },
            "last_status_code": nullable("integer"), "last_error": nullable("string"), "created_at": time(),
            "acknowledged_at": nullable_time(), "ack_note": nullable("string"),
        })),
        "FailurePage": page_of("Failure"),
        "Ack": object(&[], json!({ "note": { "type": "string", "maxLength": 2000 } })),
    })
}
