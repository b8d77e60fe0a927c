//! `/v1/failures`: the dead-letter records — list, read, resend, acknowledge.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use entrega_core::failure::{Failure, FailureQuery};
use entrega_core::ids::{FailureId, TenantId};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::extract::{JsonBody, QueryMap};
use super::problem::{ApiError, ApiResult};
use super::resend::resend_one;
use super::views::{delivery_view, failure_view};
use super::{page_cursor, page_limit, AppState};

/// Longest acknowledgement note.
const MAX_NOTE_LEN: usize = 2_000;

#[tracing::instrument(skip_all)]
async fn list_failures(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryMap,
) -> ApiResult<Json<Value>> {
    let q = FailureQuery {
        tenant: caller.list_scope(query.parse::<TenantId>("tenant_id", "a tenant id")?),
        acknowledged: query.parse::<bool>("acknowledged", "true or false")?,
        limit: page_limit(&query)?,
        cursor: page_cursor::<FailureId>(&query)?,
    };
    let page = state.services.store.list_failures(&q).await?;
    let data: Vec<Value> = page.data.iter().map(failure_view).collect();
    Ok(Json(
        json!({ "data": data, "next_cursor": page.next_cursor }),
    ))
}

async fn load_failure(state: &AppState, caller: &Caller, raw: &str) -> ApiResult<Failure> {
    let not_found = || ApiError::not_found("failure", raw);
    let id: FailureId = raw.parse().map_err(|_| not_found())?;
    match state.services.store.get_failure(&id).await? {
        Some(f) if caller.can_see(&f.tenant_id) => Ok(f),
        _ => Err(not_found()),
    }
}

#[tracing::instrument(skip_all, fields(failure_id = %id))]
async fn get_failure(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(failure_view(
        &load_failure(&state, &caller, &id).await?,
    )))
}

/// The support desk's "resend button": the failed delivery, tried again now.
#[tracing::instrument(skip_all, fields(failure_id = %id))]
async fn resend_failure(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let failure = load_failure(&state, &caller, &id).await?;
    let delivery = state
        .services
        .store
        .get_delivery(&failure.delivery_id)
        .await?
        .ok_or_else(|| ApiError::conflict("the delivery of this failure is past retention"))?;
    let resent = resend_one(&state, &caller, &delivery).await?;
    Ok((StatusCode::ACCEPTED, Json(delivery_view(&resent))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Ack {
    #[serde(default)]
    note: String,
}

#[tracing::instrument(skip_all, fields(failure_id = %id))]
async fn ack_failure(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Ack>,
) -> ApiResult<Json<Value>> {
    if body.note.len() > MAX_NOTE_LEN {
        return Err(ApiError::invalid(
            "note",
            format!("at most {MAX_NOTE_LEN} bytes"),
        ));
    }
    let failure = load_failure(&state, &caller, &id).await?;
    let acked = state
        .services
        .store
        .acknowledge_failure(&failure.id, &body.note, state.services.clock.now())
        .await?
        .ok_or_else(|| ApiError::not_found("failure", &id))?;
    Ok(Json(failure_view(&acked)))
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/failures", get(list_failures))
        .route("/v1/failures/{id}", get(get_failure))
        .route("/v1/failures/{id}/resend", post(resend_failure))
        .route("/v1/failures/{id}/ack", post(ack_failure))
}
