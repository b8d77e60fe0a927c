//! `/v1/deliveries`: the delivery log, filtered and paged, and one delivery with
//! every attempt.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use entrega_core::delivery::{Delivery, DeliveryStatus};
use entrega_core::ids::{DeliveryId, EndpointId, TenantId};
use entrega_core::ports::DeliveryQuery;
use serde_json::{json, Value};

use super::auth::Caller;
use super::extract::QueryMap;
use super::problem::{ApiError, ApiResult};
use super::views::{attempt_view, delivery_view};
use super::{page_cursor, page_limit, AppState};

#[tracing::instrument(skip_all)]
async fn list_deliveries(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryMap,
) -> ApiResult<Json<Value>> {
    let status = query
        .0
        .get("status")
        .map(|s| {
            s.parse::<DeliveryStatus>().map_err(|_| {
                ApiError::invalid("status", "expected pending, delivered, failed or exhausted")
            })
        })
        .transpose()?;
    let since: Option<DateTime<Utc>> = query.parse("since", "an RFC 3339 timestamp")?;
    let until: Option<DateTime<Utc>> = query.parse("until", "an RFC 3339 timestamp")?;
    if let (Some(s), Some(u)) = (since, until) {
        if s > u {
            return Err(ApiError::invalid("until", "must not be before `since`"));
        }
    }
    let q = DeliveryQuery {
        tenant: caller.list_scope(query.parse::<TenantId>("tenant_id", "a tenant id")?),
        endpoint_id: query.parse::<EndpointId>("endpoint_id", "an endpoint id")?,
        event_type: query.0.get("event_type").cloned(),
        status,
        since,
        until,
        limit: page_limit(&query)?,
        cursor: page_cursor::<DeliveryId>(&query)?,
    };
    let page = state.services.store.list_deliveries(&q).await?;
    let data: Vec<Value> = page.data.iter().map(delivery_view).collect();
    Ok(Json(
        json!({ "data": data, "next_cursor": page.next_cursor }),
    ))
}

/// The delivery `raw` names, if the caller may see it.
pub(super) async fn load_delivery(
    state: &AppState,
    caller: &Caller,
    raw: &str,
) -> ApiResult<Delivery> {
    let not_found = || ApiError::not_found("delivery", raw);
    let id: DeliveryId = raw.parse().map_err(|_| not_found())?;
    match state.services.store.get_delivery(&id).await? {
        Some(d) if caller.can_see(&d.tenant_id) => Ok(d),
        _ => Err(not_found()),
    }
}

#[tracing::instrument(skip_all, fields(delivery_id = %id))]
async fn get_delivery(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let delivery = load_delivery(&state, &caller, &id).await?;
    let attempts = state.services.store.list_attempts(&delivery.id).await?;
    let mut view = delivery_view(&delivery);
    view["attempts"] = attempts.iter().map(attempt_view).collect();
    Ok(Json(view))
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/deliveries", get(list_deliveries))
        .route("/v1/deliveries/{id}", get(get_delivery))
}
