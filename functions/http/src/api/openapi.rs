//! `GET /openapi.json`: the OpenAPI 3.1 document of the whole API, derived (utoipa)
//! from the handlers' own `#[utoipa::path]` attributes and the request and response
//! types they take and return: what the document says is what the code does.

use axum::routing::get;
use axum::Router;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::AppState;

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Entrega",
        description = "Reliable webhook delivery. Errors are application/problem+json (RFC 9457) \
                       naming the field at fault. Authenticate with `Authorization: Bearer <api key>`."
    ),
    paths(
        super::healthz,
        openapi_json,
        super::tenants::create_tenant,
        super::tenants::list_tenants,
        super::tenants::get_tenant,
        super::endpoints::create_endpoint,
        super::endpoints::list_endpoints,
        super::endpoints::get_endpoint,
        super::endpoints::patch_endpoint,
        super::endpoints::delete_endpoint,
        super::endpoints::rotate_secret,
        super::stats::endpoint_stats,
        super::events::publish,
        super::events::get_event,
        super::deliveries::list_deliveries,
        super::deliveries::get_delivery,
        super::resend::resend_single,
        super::resend::resend_batch,
        super::failures::list_failures,
        super::failures::get_failure,
        super::failures::resend_failure,
        super::failures::ack_failure,
    ),
    components(schemas(super::schemas::Problem)),
    modifiers(&BearerKey),
    tags(
        (name = "tenants", description = "Tenants and their API keys (admin; a tenant may read its own)"),
        (name = "endpoints", description = "Where webhooks go"),
        (name = "events", description = "Publishing, and what became of an event"),
        (name = "deliveries", description = "The delivery log and resending"),
        (name = "failures", description = "Dead-letter records"),
        (name = "operations", description = "Liveness and this document"),
    )
)]
pub struct ApiDoc;

/// The `api_key` security scheme the operations name: a bearer API key.
struct BearerKey;

impl Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.info.version = env!("CARGO_PKG_VERSION").to_owned();
    }
}

/// The whole document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as served: derived from the code by [`document`] and committed as
/// `functions/http/openapi.json` (a test keeps the two equal). Serving the file, the
/// binaries carry a string instead of the code that derives it, half a megabyte of
/// every API bootstrap.
pub const DOCUMENT_JSON: &str = include_str!("../../openapi.json");

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json")))]
pub(super) async fn openapi_json() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        DOCUMENT_JSON,
    )
}

pub fn router() -> Router<AppState> {
    Router::new().route("/openapi.json", get(openapi_json))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The served file is the document the code derives. When the API changes, write
    /// it again: `ENTREGA_WRITE_OPENAPI=1 cargo test -p entrega-http openapi`.
    #[test]
    fn the_served_document_is_the_derived_one() {
        let derived = serde_json::to_string_pretty(&document()).unwrap() + "\n";
        if std::env::var_os("ENTREGA_WRITE_OPENAPI").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
            std::fs::write(path, &derived).unwrap();
            return;
        }
        let served: serde_json::Value = serde_json::from_str(DOCUMENT_JSON).unwrap();
        let derived: serde_json::Value = serde_json::from_str(&derived).unwrap();
        assert!(
            served == derived,
            "functions/http/openapi.json is stale: ENTREGA_WRITE_OPENAPI=1 cargo test -p entrega-http openapi"
        );
    }

    /// Every path a resource file routes is documented, and nothing else is: the
    /// router and the document cannot drift apart unnoticed.
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
        let doc = serde_json::to_value(document()).unwrap();
        let documented = doc["paths"].as_object().unwrap();
        let mut routed = std::collections::BTreeSet::new();
        for source in sources {
            for piece in source.split(".route(").skip(1) {
                let Some(rest) = piece.trim_start().strip_prefix('"') else {
                    continue;
                };
                let path = rest.split('"').next().unwrap();
                if !path.starts_with('/') {
                    continue;
                }
                routed.insert(path.to_owned());
                assert!(
                    documented.contains_key(path),
                    "{path} is routed but not documented"
                );
            }
        }
        let extra: Vec<_> = documented.keys().filter(|p| !routed.contains(*p)).collect();
        assert!(extra.is_empty(), "documented but not routed: {extra:?}");
        assert_eq!(doc["openapi"], "3.1.0");
        // Request bodies refuse unknown fields, as the server does.
        let create = &doc["components"]["schemas"]["CreateEndpoint"];
        assert_eq!(create["additionalProperties"], false, "{create}");
        assert_eq!(
            create["properties"]["timeout_ms"]["maximum"], 30000,
            "{create}"
        );
    }
}
