//! The HTTP API (v1), one file per resource. The same router serves `entrega serve`
//! and the API Lambda; it reaches storage and queues only through the core's ports.

pub mod auth;
pub mod deliveries;
pub mod endpoints;
pub mod events;
pub mod extract;
pub mod failures;
pub mod openapi;
mod openapi_schemas;
pub mod problem;
pub mod rate_limit;
pub mod resend;
pub mod stats;
pub mod tenants;
pub mod views;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use axum::{Json, Router};
use entrega_core::ports::{Services, MAX_PAGE_SIZE};
use serde_json::json;

use crate::transport::TargetPolicy;
use extract::{QueryMap, MAX_BODY_BYTES};
use problem::{ApiError, ApiResult};

/// Rows per page when the client names no `limit`.
pub const DEFAULT_PAGE_SIZE: usize = 50;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub services: Services,
    /// Checked when an endpoint's URL is written, so a refused target is a clear 422
    /// at once rather than a failed delivery later.
    pub targets: Arc<TargetPolicy>,
    /// Per-key API rate limit; `None` turns it off.
    pub limiter: Option<Arc<rate_limit::RateLimiter>>,
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

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

async fn no_route() -> ApiError {
    ApiError::not_found("route", "for this method and path")
}

/// The whole v1 API.
pub fn router(state: AppState) -> Router {
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
        .fallback(no_route)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            rate_limit::limit,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
