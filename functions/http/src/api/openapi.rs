//! `GET /openapi.json`: the OpenAPI 3.1 document of the whole API, built from
//! [`OPERATIONS`], the table of every route with its request and response shapes. A
//! test sends a request to each listed operation to prove it is routed, and validates
//! the document.

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::openapi_schemas::{reference, schemas, string};
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
