//! `GET /v1/endpoints/{id}/stats`: the last 24 hours of one endpoint — what a receiver
//! needs to see to stay well inside its timeout.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use entrega_core::delivery::Attempt;
use entrega_core::event::format_timestamp;
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::Caller;
use super::endpoints::load_endpoint;
use super::problem::ApiResult;
use super::schemas::ProblemResponses;
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

/// One endpoint's last 24 hours.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointStats {
    pub endpoint_id: String,
    #[schema(format = DateTime)]
    pub window_start: String,
    pub attempts: usize,
    pub delivered: usize,
    pub failed: usize,
    pub median_ms: Option<u64>,
    pub p95_ms: Option<u64>,
    pub last_error: Option<String>,
    #[schema(format = DateTime)]
    pub last_error_at: Option<String>,
    /// More attempts than one request reads; the figures cover the newest.
    pub truncated: bool,
    /// The window hour by hour, oldest first: what the console's response-time chart
    /// draws.
    pub hours: Vec<HourStats>,
}

/// One hour of the window.
#[derive(Debug, Serialize, ToSchema)]
pub struct HourStats {
    #[schema(format = DateTime)]
    pub start: String,
    pub attempts: usize,
    pub failed: usize,
    pub median_ms: Option<u64>,
}

/// Hours in [`WINDOW`].
const HOURS: i64 = 24;

/// `attempts` grouped into the window's hours, each summarised.
fn by_hour(since: DateTime<Utc>, attempts: &[Attempt]) -> Vec<HourStats> {
    let mut hours: Vec<Vec<&Attempt>> = (0..HOURS).map(|_| Vec::new()).collect();
    for a in attempts {
        // Before the window is not hour 0: `num_hours` rounds -59 min towards zero.
        let offset = a.started_at - since;
        if offset < chrono::Duration::zero() {
            continue;
        }
        if let Some(bucket) = usize::try_from(offset.num_hours())
            .ok()
            .and_then(|h| hours.get_mut(h))
        {
            bucket.push(a);
        }
    }
    hours
        .into_iter()
        .enumerate()
        .map(|(i, bucket)| {
            let mut durations: Vec<u64> = bucket.iter().map(|a| a.duration_ms).collect();
            durations.sort_unstable();
            HourStats {
                start: format_timestamp(since + chrono::Duration::hours(i as i64)),
                attempts: bucket.len(),
                failed: bucket.iter().filter(|a| a.failure_kind.is_some()).count(),
                median_ms: quantile(&durations, 0.5),
            }
        })
        .collect()
}

/// The figures of `attempts`, for `endpoint` since `since`.
pub fn summarize(endpoint: &str, since: DateTime<Utc>, attempts: &[Attempt]) -> EndpointStats {
    let succeeded = attempts.iter().filter(|a| a.failure_kind.is_none()).count();
    let mut durations: Vec<u64> = attempts.iter().map(|a| a.duration_ms).collect();
    durations.sort_unstable();
    let last_failure = attempts
        .iter()
        .filter(|a| a.error.is_some())
        .max_by_key(|a| a.started_at);
    EndpointStats {
        endpoint_id: endpoint.to_owned(),
        window_start: format_timestamp(since),
        attempts: attempts.len(),
        delivered: succeeded,
        failed: attempts.len() - succeeded,
        median_ms: quantile(&durations, 0.5),
        p95_ms: quantile(&durations, 0.95),
        last_error: last_failure.and_then(|a| a.error.clone()),
        last_error_at: last_failure.map(|a| format_timestamp(a.started_at)),
        truncated: attempts.len() >= MAX_ATTEMPTS_READ,
        hours: by_hour(since, attempts),
    }
}

#[utoipa::path(get, path = "/v1/endpoints/{id}/stats", tag = "endpoints",
    params(("id" = String, Path, pattern = "^ep_[0-9a-f]{32}$")),
    responses((status = 200, description = "Attempts, outcomes and response times of the last 24 h", body = EndpointStats), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
pub(super) async fn endpoint_stats(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<EndpointStats>> {
    let endpoint = load_endpoint(&state, &caller, &id).await?;
    let since = state.services.clock.now() - WINDOW;
    let attempts = state
        .services
        .store
        .endpoint_attempts_since(&endpoint.id, since, MAX_ATTEMPTS_READ)
        .await?;
    Ok(Json(summarize(endpoint.id.as_str(), since, &attempts)))
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

    fn attempt_at(started_at: DateTime<Utc>, duration_ms: u64, failed: bool) -> Attempt {
        use entrega_core::ids::{AttemptId, DeliveryId, EndpointId, TenantId};
        Attempt {
            id: AttemptId::generate(),
            delivery_id: DeliveryId::generate(),
            tenant_id: TenantId::generate(),
            endpoint_id: EndpointId::generate(),
            generation: 1,
            number: 1,
            started_at,
            duration_ms,
            status_code: Some(if failed { 503 } else { 204 }),
            failure_kind: failed.then_some(entrega_core::outcome::FailureKind::ServerError),
            error: failed.then(|| "503".to_owned()),
            response_excerpt: None,
            trigger: entrega_core::delivery::Trigger::Scheduled,
            requested_by: None,
        }
    }

    #[test]
    fn the_window_is_cut_into_its_hours() {
        let since: DateTime<Utc> = "2026-11-30T00:00:00Z".parse().unwrap();
        let minutes = |m: i64| since + chrono::Duration::minutes(m);
        let attempts = [
            attempt_at(minutes(0), 10, false),
            attempt_at(minutes(59), 30, true),
            attempt_at(minutes(60), 50, false),
            attempt_at(minutes(23 * 60 + 59), 70, false),
            // Outside the window on either side: counted by no hour.
            attempt_at(minutes(-1), 1, false),
            attempt_at(minutes(24 * 60), 1, false),
        ];
        let stats = summarize("ep", since, &attempts);
        assert_eq!(stats.hours.len(), 24);
        assert_eq!(stats.hours[0].start, "2026-11-30T00:00:00.000Z");
        assert_eq!(stats.hours[0].attempts, 2);
        assert_eq!(stats.hours[0].failed, 1);
        assert_eq!(stats.hours[0].median_ms, Some(10));
        assert_eq!(stats.hours[1].attempts, 1);
        assert_eq!(stats.hours[1].median_ms, Some(50));
        assert_eq!(stats.hours[2].attempts, 0);
        assert_eq!(stats.hours[2].median_ms, None);
        assert_eq!(stats.hours[23].median_ms, Some(70));
        let counted: usize = stats.hours.iter().map(|h| h.attempts).sum();
        assert_eq!(counted, 4);
    }
}
