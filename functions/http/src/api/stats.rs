//! `GET /v1/endpoints/{id}/stats`: the last 24 hours of one endpoint — what a receiver
//! needs to see to stay well inside its timeout.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use entrega_core::delivery::Attempt;
use entrega_core::event::format_timestamp;
use serde_json::{json, Value};

use super::auth::Caller;
use super::endpoints::load_endpoint;
use super::problem::ApiResult;
use super::AppState;

/// The window the statistics cover.
const WINDOW: chrono::Duration = chrono::Duration::hours(24);
/// Attempts read at most: bounds the work of one request on a very busy endpoint.
pub const MAX_ATTEMPTS_READ: usize = 10_000;

/// The `q`-quantile (0–1) of sorted values, nearest rank.
fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank - 1).copied()
}

pub fn summarize(attempts: &[Attempt]) -> Value {
    let succeeded = attempts.iter().filter(|a| a.failure_kind.is_none()).count();
    let mut durations: Vec<u64> = attempts.iter().map(|a| a.duration_ms).collect();
    durations.sort_unstable();
    let last_failure = attempts
        .iter()
        .filter(|a| a.error.is_some())
        .max_by_key(|a| a.started_at);
    json!({
        "attempts": attempts.len(),
        "delivered": succeeded,
        "failed": attempts.len() - succeeded,
        "median_ms": quantile(&durations, 0.5),
        "p95_ms": quantile(&durations, 0.95),
        "last_error": last_failure.and_then(|a| a.error.clone()),
        "last_error_at": last_failure.map(|a| format_timestamp(a.started_at)),
        "truncated": attempts.len() >= MAX_ATTEMPTS_READ,
    })
}

#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
async fn endpoint_stats(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let endpoint = load_endpoint(&state, &caller, &id).await?;
    let since = state.services.clock.now() - WINDOW;
    let attempts = state
        .services
        .store
        .endpoint_attempts_since(&endpoint.id, since, MAX_ATTEMPTS_READ)
        .await?;
    let mut stats = summarize(&attempts);
    stats["endpoint_id"] = json!(endpoint.id);
    stats["window_start"] = json!(format_timestamp(since));
    Ok(Json(stats))
}

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/endpoints/{id}/stats", get(endpoint_stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.95), Some(95));
        assert_eq!(quantile(&[7], 0.95), Some(7));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
