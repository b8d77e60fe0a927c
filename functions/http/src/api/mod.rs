//! The HTTP API (v1), one file per resource. The same router serves `entrega serve`
//! and the API Lambda; it reaches storage and queues only through the core's ports.

pub mod auth;
pub mod deliveries;
pub mod endpoints;
pub mod events;
pub mod extract;
pub use extract::BodyTooSlow;
pub mod failures;
mod idempotency;
pub mod openapi;
pub mod problem;
mod query_params;
pub mod rate_limit;
pub mod resend;
pub mod schemas;
pub mod stats;
pub mod tenants;
pub mod views;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use entrega_core::conditions::{Component, Conditions};
use entrega_core::ports::{Services, MAX_PAGE_SIZE};

use crate::transport::TargetPolicy;
use extract::{QueryMap, MAX_BODY_BYTES};
use problem::{ApiError, ApiResult};

/// Rows per page when the client names no `limit`.
pub const DEFAULT_PAGE_SIZE: usize = 50;

/// What every handler can reach, as axum hands it out: a clone per extractor and
/// middleware of every request, so one shared reference, not the services' dozen
/// (cloning those was a twelfth of a worker thread's time under load).
#[derive(Clone)]
pub struct AppState(Arc<App>);

impl From<App> for AppState {
    fn from(app: App) -> Self {
        Self(Arc::new(app))
    }
}

impl std::ops::Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}

/// The parts of [`AppState`].
pub struct App {
    pub services: Services,
    /// Checked when an endpoint's URL is written, so a refused target is a clear 422
    /// at once rather than a failed delivery later.
    pub targets: Arc<TargetPolicy>,
    /// Per-key API rate limit; `None` turns it off.
    pub limiter: Option<Arc<rate_limit::RateLimiter>>,
    /// What is failing in this process (`/healthz` reports it).
    pub conditions: Arc<Conditions>,
    /// All tenants' waiting work, where the runtime can count it cheaply.
    pub waiting: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
    /// How a runtime commits an event the API accepted. `None`: the store's
    /// [`EventStore::publish`](entrega_core::ports::EventStore::publish), the outbox
    /// item alone (on AWS its stream fans it out). The embedded runtime commits the
    /// event with its deliveries queued.
    pub publisher: Option<Arc<dyn Publisher>>,
}

/// A runtime's way to commit a published event (see [`App::publisher`]); it answers
/// as [`EventStore::publish`](entrega_core::ports::EventStore::publish) does.
#[async_trait::async_trait]
pub trait Publisher: Send + Sync {
    async fn publish(
        &self,
        event: &entrega_core::event::Event,
    ) -> entrega_core::ports::StoreResult<entrega_core::ports::Published>;
}

/// `limit` from the query: 1 to [`MAX_PAGE_SIZE`], default [`DEFAULT_PAGE_SIZE`].
pub(crate) fn page_limit(query: &QueryMap) -> ApiResult<usize> {
    let limit = query
        .parse::<usize>("limit", "a whole number")?
        .unwrap_or(DEFAULT_PAGE_SIZE);
    if (1..=MAX_PAGE_SIZE).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::invalid(
            "limit",
            format!("must be between 1 and {MAX_PAGE_SIZE}"),
        ))
    }
}

/// The `cursor` query parameter of a list whose rows have ids of type `T`: absent, or
/// a cursor this list handed out. A made-up or empty one is a 400 naming it, never a
/// silently different page.
pub(crate) fn page_cursor<T: std::str::FromStr>(query: &QueryMap) -> ApiResult<Option<String>> {
    match query.0.get("cursor") {
        None => Ok(None),
        Some(c) if c.parse::<T>().is_ok() => Ok(Some(c.clone())),
        Some(_) => Err(ApiError::bad_parameter(
            "cursor",
            "not a cursor of this list; pass the `next_cursor` of the previous page, or omit it",
        )),
    }
}

/// How long `/healthz` reports a failed API write after the last one. The API learns
/// of its store only from the requests it serves: kept until a write succeeded, as it
/// was, a balancer that stops routing on the 503 let no write through to clear it (a
/// disk given space again still read degraded a minute later, a hostile test).
/// Forgotten, the next request tells again: if writes still fail, it is back at once.
/// The store's own writers (the worker's, the sweeper's) report their own conditions.
pub const API_FAILURE_HOLDS: std::time::Duration = std::time::Duration::from_secs(10);

/// Liveness: `ok`, or `degraded` (503) with what is failing, e.g. a store refusing
/// writes. Names no tenant: it needs no key.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses(
        (status = 200, description = "Serving", body = views::Health),
        (status = 503, description = "Degraded: something is failing (see `reasons`)", body = views::Health),
    ))]
pub(crate) async fn healthz(State(state): State<AppState>) -> Response {
    state.conditions.forget_if_quiet(
        Component::Api,
        API_FAILURE_HOLDS,
        state.services.clock.now(),
    );
    let failing = state.conditions.current();
    let health = views::Health {
        status: if failing.is_empty() { "ok" } else { "degraded" }.to_owned(),
        waiting: state.waiting.as_ref().map(|w| w()),
        reasons: failing
            .iter()
            .map(|f| views::HealthReason {
                component: serde_json::to_value(f.component)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                reason: f.reason.clone(),
                since: entrega_core::event::format_timestamp(f.since),
                occurrences: f.occurrences,
            })
            .collect(),
    };
    let status = if failing.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(health)).into_response()
}

/// Store failures behind 503 answers become a condition (logged once, in `/healthz`);
/// a successful write clears it.
async fn track_backend(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let writes = request.method() != Method::GET;
    let response = next.run(request).await;
    if let Some(problem::BackendFailure(reason)) = response.extensions().get() {
        state
            .conditions
            .failing(Component::Api, reason, state.services.clock.now());
    } else if writes && response.status().is_success() {
        state.conditions.recovered(Component::Api);
    }
    response
}

/// The policy of every answer that is not a console file: JSON and problems are never
/// meant to be rendered, so nothing at all is allowed.
const NOTHING_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";

/// Headers every answer carries, API and console alike: never framed, never
/// content-sniffed, and (unless the route chose its own caching) never stored, since
/// API answers hold tenants' payloads and secrets.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(NOTHING_POLICY));
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// The longest text of a rejection kept as a problem's detail (axum's are a line).
const REJECTION_TEXT_MAX: usize = 4 * 1024;

/// Every error answer is problem+json, also those axum's router and extractors make
/// themselves (a 405 for a method a route does not have, a 400 for a path that is not
/// UTF-8): a client reads one kind of error, whatever went wrong. Only plain text and
/// empty bodies are turned: a JSON answer (a degraded `/healthz`, a problem) says
/// what it means already.
async fn problems_only(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_none_or(|t| t.as_bytes().starts_with(b"text/plain"));
    if !plain || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, REJECTION_TEXT_MAX)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let detail = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let mut problem = ApiError::from_status(status, detail).into_response();
    // What the answer said beside its body stays (the methods a 405's route has).
    if let Some(allow) = parts.headers.remove(header::ALLOW) {
        problem.headers_mut().insert(header::ALLOW, allow);
    }
    problem
}

async fn no_route() -> ApiError {
    ApiError::from_status(StatusCode::NOT_FOUND, "no route for this method and path")
}

/// The whole v1 API, and the console that uses it.
pub fn router(state: impl Into<AppState>) -> Router {
    let state = state.into();
    Router::new()
        .route("/healthz", get(healthz))
        .merge(tenants::router())
        .merge(endpoints::router())
        .merge(events::router())
        .merge(deliveries::router())
        .merge(resend::router())
        .merge(failures::router())
        .merge(stats::router())
        .merge(openapi::router())
        .merge(crate::console::router())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            query_params::refuse_undocumented,
        ))
        .fallback(no_route)
        .layer(axum::middleware::from_fn(problems_only))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            rate_limit::limit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            track_backend,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}
