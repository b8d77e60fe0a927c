//! `/v1/failures`: the dead-letter records — list, read, resend, acknowledge.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use entrega_core::failure::{Acknowledgement, Failure, FailureQuery, Reacknowledge};
use entrega_core::ids::{FailureId, TenantId};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::auth::Caller;
use super::extract::{JsonBody, NoBody, QueryMap};
use super::idempotency::{fingerprint, IdempotentRequest};
use super::problem::{ApiError, ApiResult};
use super::resend::{resend_once, RESEND_FAILURE};
use super::schemas::ProblemResponses;
use super::views::{DeliveryView, FailureView, Page};

/// `GET /v1/failures` filters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ListFailures {
    /// Admin only: one tenant's failures.
    #[param(pattern = "^ten_[0-9a-f]{32}$")]
    tenant_id: Option<String>,
    /// `false`: only those nobody has acknowledged.
    acknowledged: Option<bool>,
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^fail_[0-9a-f]{32}$")]
    cursor: Option<String>,
}
use super::{page_cursor, page_limit, AppState};

/// Longest acknowledgement note.
const MAX_NOTE_LEN: usize = 2_000;

#[utoipa::path(get, path = "/v1/failures", tag = "failures", params(ListFailures),
    responses((status = 200, description = "Dead-letter records, newest first (without payloads: read one for it)", body = Page<FailureView>), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all)]
pub(super) async fn list_failures(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryMap,
) -> ApiResult<Json<Page<FailureView>>> {
    let q = FailureQuery {
        tenant: caller.list_scope(query.parse::<TenantId>("tenant_id", "a tenant id")?)?,
        acknowledged: query.parse::<bool>("acknowledged", "true or false")?,
        limit: page_limit(&query)?,
        cursor: page_cursor::<FailureId>(&query)?,
    };
    let page = state.services.store.list_failures(&q).await?;
    Ok(Json(Page::of(page, FailureView::summary)))
}

async fn load_failure(state: &AppState, caller: &Caller, raw: &str) -> ApiResult<Failure> {
    let not_found = || ApiError::not_found("failure", raw);
    let id: FailureId = raw.parse().map_err(|_| not_found())?;
    match state.services.store.get_failure(&id).await? {
        Some(f) if caller.can_see(&f.tenant_id) => Ok(f),
        _ => Err(not_found()),
    }
}

#[utoipa::path(get, path = "/v1/failures/{id}", tag = "failures",
    params(("id" = String, Path, pattern = "^fail_[0-9a-f]{32}$")),
    responses((status = 200, description = "The record: payload, every attempt's time, last error", body = FailureView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(failure_id = %id))]
pub(super) async fn get_failure(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<FailureView>> {
    Ok(Json(FailureView::from(
        &load_failure(&state, &caller, &id).await?,
    )))
}

/// The support desk's "resend button": the failed delivery, tried again now.
#[utoipa::path(post, path = "/v1/failures/{id}/resend", tag = "failures",
    params(("id" = String, Path, pattern = "^fail_[0-9a-f]{32}$"),
        ("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the first answer and resends nothing twice")),
    responses((status = 202, description = "The failed delivery, queued again now", body = DeliveryView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(failure_id = %id))]
pub(super) async fn resend_failure(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    _: NoBody,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    let failure = load_failure(&state, &caller, &id).await?;
    let request = IdempotentRequest::new(&headers, &caller, RESEND_FAILURE, fingerprint(&id))?;
    let delivery = state
        .services
        .store
        .get_delivery(&failure.delivery_id)
        .await?
        .ok_or_else(|| ApiError::conflict("the delivery of this failure is past retention"))?;
    resend_once(&state, &caller, &request, &delivery).await
}

/// An acknowledgement, with an optional note (who fixed what).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Ack {
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(max_length = 2000, value_type = String)]
    note: Option<String>,
}

#[utoipa::path(post, path = "/v1/failures/{id}/ack", tag = "failures", request_body = Ack,
    params(("id" = String, Path, pattern = "^fail_[0-9a-f]{32}$")),
    responses((status = 200, description = "The record, acknowledged", body = FailureView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(failure_id = %id))]
pub(super) async fn ack_failure(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Ack>,
) -> ApiResult<Json<FailureView>> {
    let note = body.note.unwrap_or_default();
    if note.len() > MAX_NOTE_LEN {
        return Err(ApiError::invalid(
            "note",
            format!("at most {MAX_NOTE_LEN} bytes"),
        ));
    }
    // Line breaks are part of a note; other control and hidden characters are not.
    if !entrega_core::text::is_plain(&note, &['\n', '\r', '\t']) {
        return Err(ApiError::invalid(
            "note",
            "must not hold control or hidden characters (line breaks and tabs are fine)",
        ));
    }
    let failure = load_failure(&state, &caller, &id).await?;
    let acked = state
        .services
        .store
        .acknowledge_failure(
            &failure.id,
            &Acknowledgement {
                note,
                by: caller.label(),
                at: state.services.clock.now(),
            },
            Reacknowledge::Replace,
        )
        .await?
        .ok_or_else(|| ApiError::not_found("failure", &id))?;
    Ok(Json(FailureView::from(&acked)))
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/failures", get(list_failures))
        .route("/v1/failures/{id}", get(get_failure))
        .route("/v1/failures/{id}/resend", post(resend_failure))
        .route("/v1/failures/{id}/ack", post(ack_failure))
}
