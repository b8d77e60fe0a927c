//! `GET /openapi.json`: the OpenAPI 3.1 document of the whole API, built from
//! [`OPERATIONS`], the table of every route with its request and response shapes. A
//! test sends a request to each listed operation to prove it is routed, and validates
//! the document.

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::AppState;

/// One operation: method, path, summary, request body schema (if any), success
/// status and its schema, and the query parameters it reads.
pub struct Operation {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    pub request: Option<&'static str>,
    pub status: u16,
    pub response: &'static str,
    pub query: &'static [(&'static str, &'static str)],
    pub admin_only: bool,
}

const PAGE: [(&str, &str); 2] = [("limit", "integer"), ("cursor", "string")];

/// Every route of the API.
pub const OPERATIONS: &[Operation] = &[
    Operation {
        method: "get",
        path: "/healthz",
        summary: "Liveness",
        request: None,
        status: 200,
        response: "Health",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "get",
        path: "/openapi.json",
        summary: "This document",
        request: None,
        status: 200,
        response: "OpenApi",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "post",
        path: "/v1/tenants",
        summary: "Create a tenant and its first API key (shown once)",
        request: Some("CreateTenant"),
        status: 201,
        response: "TenantCreated",
        query: &[],
        admin_only: true,
    },
    Operation {
        method: "post",
        path: "/v1/endpoints",
        summary: "Create an endpoint",
        request: Some("CreateEndpoint"),
        status: 201,
        response: "Endpoint",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "get",
        path: "/v1/endpoints",
        summary: "List endpoints, newest first",
        request: None,
        status: 200,
        response: "EndpointPage",
        query: &[("tenant_id", "string"), PAGE[0], PAGE[1]],
        admin_only: false,
    },
    Operation {
        method: "get",
        path: "/v1/endpoints/{id}",
        summary: "Read an endpoint",
        request: None,
        status: 200,
        response: "Endpoint",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "patch",
        path: "/v1/endpoints/{id}",
        summary: "Change an endpoint (disabled: false resumes its paused deliveries)",
        request: Some("PatchEndpoint"),
        status: 200,
        response: "Endpoint",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "delete",
        path: "/v1/endpoints/{id}",
        summary: "Delete an endpoint",
        request: None,
        status: 204,
        response: "",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "post",
        path: "/v1/endpoints/{id}/rotate-secret",
        summary: "New secret; the old one signs alongside for 24 h",
        request: None,
        status: 200,
        response: "Endpoint",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "get",
        path: "/v1/endpoints/{id}/stats",
        summary: "The last 24 hours of an endpoint",
        request: None,
        status: 200,
        response: "EndpointStats",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "post",
        path: "/v1/events",
        summary: "Publish an event (idempotent by id)",
        request: Some("PublishEvent"),
        status: 202,
        response: "EventAccepted",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "get",
        path: "/v1/events/{id}",
        summary: "An event and every delivery of it",
        request: None,
        status: 200,
        response: "EventWithDeliveries",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "get",
        path: "/v1/deliveries",
        summary: "The delivery log, newest first",
        request: None,
        status: 200,
        response: "DeliveryPage",
        query: &[
            ("tenant_id", "string"),
            ("endpoint_id", "string"),
            ("event_type", "string"),
            ("status", "string"),
            ("since", "string"),
            ("until", "string"),
            PAGE[0],
            PAGE[1],
        ],
        admin_only: false,
    },
    Operation {
        method: "get",
        path: "/v1/deliveries/{id}",
        summary: "A delivery with every attempt",
        request: None,
        status: 200,
        response: "DeliveryDetail",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "post",
        path: "/v1/deliveries/{id}/resend",
        summary: "Try now: a new generation, counter reset, same event id",
        request: None,
        status: 202,
        response: "Delivery",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "post",
        path: "/v1/deliveries/resend",
        summary: "Resend a batch, by ids or by filter and window (Idempotency-Key honoured)",
        request: Some("BatchResend"),
        status: 200,
        response: "BatchResendResult",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "get",
        path: "/v1/failures",
        summary: "Dead-letter records, newest first",
        request: None,
        status: 200,
        response: "FailurePage",
        query: &[
            ("tenant_id", "string"),
            ("acknowledged", "boolean"),
            PAGE[0],
            PAGE[1],
        ],
        admin_only: false,
    },
    Operation {
        method: "get",
        path: "/v1/failures/{id}",
        summary: "A failure with its payload and every attempt time",
        request: None,
        status: 200,
        response: "Failure",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "post",
        path: "/v1/failures/{id}/resend",
        summary: "Resend the failed delivery now",
        request: None,
        status: 202,
        response: "Delivery",
        query: &[],
        admin_only: false,
    },
    Operation {
        method: "post",
        path: "/v1/failures/{id}/ack",
        summary: "Mark a failure analyzed, with a note",
        request: Some("Ack"),
        status: 200,
        response: "Failure",
        query: &[],
        admin_only: false,
    },
];

fn string() -> Value {
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
fn reference(name: &str) -> Value {
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

fn schemas() -> Value {
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

fn problem(description: &str) -> Value {
    json!({ "description": description, "content": { "application/problem+json": { "schema": reference("Problem") } } })
}

fn operation(op: &Operation) -> Value {
    let mut responses = Map::new();
    let success = if op.response.is_empty() {
        json!({ "description": "done" })
    } else {
        json!({ "description": op.summary, "content": { "application/json": { "schema": reference(op.response) } } })
    };
    responses.insert(op.status.to_string(), success);
    let public = matches!(op.path, "/healthz" | "/openapi.json");
    if !public {
        responses.insert("401".into(), problem("no valid API key"));
        responses.insert(
            "404".into(),
            problem("no such resource (or another tenant's)"),
        );
        responses.insert(
            "422".into(),
            problem("a field or parameter is invalid; `field` names it"),
        );
        responses.insert("429".into(), problem("rate limit reached; see Retry-After"));
        responses.insert("503".into(), problem("the store did not answer; retry"));
    }
    if op.admin_only {
        responses.insert("403".into(), problem("needs an admin key"));
    }
    if op.request.is_some() {
        responses.insert("400".into(), problem("the body is not JSON"));
        responses.insert("413".into(), problem("the body is over 256 KiB"));
    }
    if matches!(op.method, "post" | "patch") && !public {
        responses.insert(
            "409".into(),
            problem("a conflicting write (an id in use, a concurrent change)"),
        );
    }
    let mut parameters: Vec<Value> = Vec::new();
    if op.path.contains("{id}") {
        parameters
            .push(json!({ "name": "id", "in": "path", "required": true, "schema": string() }));
    }
    for (name, kind) in op.query {
        parameters.push(
            json!({ "name": name, "in": "query", "required": false, "schema": { "type": kind } }),
        );
    }
    if op.path == "/v1/deliveries/resend" {
        parameters.push(json!({ "name": "Idempotency-Key", "in": "header", "required": false, "schema": string() }));
    }
    let mut doc =
        json!({ "summary": op.summary, "parameters": parameters, "responses": responses });
    if let Some(schema) = op.request {
        doc["requestBody"] = json!({ "required": true, "content": { "application/json": { "schema": reference(schema) } } });
    }
    if public {
        doc["security"] = json!([]);
    }
    doc
}

/// The whole document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for op in OPERATIONS {
        let path = paths.entry(op.path.to_owned()).or_insert_with(|| json!({}));
        path[op.method] = operation(op);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Entrega",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Reliable webhook delivery. Errors are application/problem+json (RFC 9457).",
        },
        "paths": paths,
        "components": {
            "schemas": schemas(),
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        },
        "security": [{ "bearer": [] }],
    })
}

async fn openapi_json() -> Json<Value> {
    Json(document())
}

pub fn router() -> Router<AppState> {
    Router::new().route("/openapi.json", get(openapi_json))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path a resource file routes is documented: the router and the document
    /// cannot drift apart unnoticed.
    #[test]
    fn every_routed_path_is_documented() {
        let sources = [
            include_str!("mod.rs"),
            include_str!("tenants.rs"),
            include_str!("endpoints.rs"),
            include_str!("events.rs"),
            include_str!("deliveries.rs"),
            include_str!("resend.rs"),
            include_str!("failures.rs"),
            include_str!("stats.rs"),
            include_str!("openapi.rs"),
        ];
        let mut routed = 0;
        for source in sources {
            for piece in source.split(".route(\"").skip(1) {
                let path = piece.split('"').next().unwrap();
                routed += 1;
                assert!(
                    OPERATIONS.iter().any(|op| op.path == path),
                    "{path} is routed but not documented"
                );
            }
        }
        assert!(routed >= 15, "found {routed} routes");
        let doc = document();
        assert_eq!(
            doc["paths"].as_object().unwrap().len(),
            OPERATIONS
                .iter()
                .map(|o| o.path)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
    }
}
