//! Which query parameters each `/v1` route takes, and the refusal of any other: read
//! from the served OpenAPI document (derived from the handlers' typed parameters), so
//! what a route accepts and what its documentation says cannot drift apart.
//!
//! Why refuse: a parameter ignored is a promise broken quietly. `POST
//! /v1/events?dry_run=true` published a real event, `?statuss=failed` listed every
//! delivery, and `status=delivered&status=failed` listed the failed ones only.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::Caller;
use super::openapi::DOCUMENT_JSON;
use super::problem::ApiError;
use super::AppState;

/// `(method, path template)` → the query parameters the document gives it.
type Documented = HashMap<(String, String), Vec<String>>;

static DOCUMENTED: LazyLock<Documented> = LazyLock::new(|| documented(DOCUMENT_JSON));

fn documented(document: &str) -> Documented {
    let doc: serde_json::Value = serde_json::from_str(document).expect("the served document");
    let mut routes = Documented::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for (method, operation) in item.as_object().into_iter().flatten() {
            let names = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect();
            routes.insert((method.to_ascii_uppercase(), path.clone()), names);
        }
    }
    routes
}

/// Middleware (a route layer, so the route is known): a `/v1` request with a query
/// parameter its route does not take, or one given twice, is a 400 naming it.
///
/// A caller without a valid key is told that first (401), as on every other refusal:
/// the 400 named the route's parameters to anyone who asked. The key is looked up only
/// on this path, so a request the check lets through is authenticated once, by its
/// handler.
pub async fn refuse_undocumented(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Err(refused) = check(&request) else {
        return next.run(request).await;
    };
    let (mut parts, _) = request.into_parts();
    match Caller::from_request_parts(&mut parts, &state).await {
        Ok(_) => refused.into_response(),
        Err(unauthenticated) => unauthenticated.into_response(),
    }
}

fn check(request: &Request) -> Result<(), ApiError> {
    let Some(query) = request.uri().query() else {
        return Ok(());
    };
    let Some(route) = request.extensions().get::<MatchedPath>() else {
        return Ok(());
    };
    if !route.as_str().starts_with("/v1/") {
        return Ok(());
    }
    // A HEAD is answered by the route's GET.
    let method = match request.method().as_str() {
        "HEAD" => "GET",
        other => other,
    };
    let key = (method.to_owned(), route.as_str().to_owned());
    let Some(taken) = DOCUMENTED.get(&key) else {
        // A method the route does not have: the router's 405 says so.
        return Ok(());
    };
    let mut seen = Vec::new();
    for (name, _) in url::form_urlencoded::parse(query.as_bytes()) {
        if !taken.iter().any(|t| *t == name) {
            let takes = if taken.is_empty() {
                "none".to_owned()
            } else {
                taken
                    .iter()
                    .map(|t| format!("`{t}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(ApiError::bad_parameter(
                &name,
                format!("not a parameter of this route; it takes {takes}"),
            ));
        }
        if seen.contains(&name) {
            return Err(ApiError::bad_parameter(&name, "give it once"));
        }
        seen.push(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lists take what their documentation says, and nothing else does.
    #[test]
    fn the_routes_taking_query_parameters_are_the_documented_lists() {
        let mut taking: Vec<(String, String, Vec<String>)> = DOCUMENTED
            .iter()
            .filter(|(_, names)| !names.is_empty())
            .map(|((m, p), names)| {
                let mut names = names.clone();
                names.sort();
                (m.clone(), p.clone(), names)
            })
            .collect();
        taking.sort();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            taking,
            vec![
                (
                    "GET".into(),
                    "/v1/deliveries".into(),
                    names(&[
                        "cursor",
                        "endpoint_id",
                        "event_type",
                        "limit",
                        "since",
                        "status",
                        "tenant_id",
                        "until"
                    ])
                ),
                (
                    "GET".into(),
                    "/v1/endpoints".into(),
                    names(&["cursor", "limit", "tenant_id"])
                ),
                (
                    "GET".into(),
                    "/v1/events/{id}".into(),
                    names(&["tenant_id"])
                ),
                (
                    "GET".into(),
                    "/v1/failures".into(),
                    names(&["acknowledged", "cursor", "limit", "tenant_id"])
                ),
                (
                    "GET".into(),
                    "/v1/tenants".into(),
                    names(&["cursor", "limit"])
                ),
            ]
        );
        assert_eq!(
            DOCUMENTED.get(&("POST".to_owned(), "/v1/events".to_owned())),
            Some(&Vec::new())
        );
    }
}
