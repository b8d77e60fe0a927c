//! `/v1/deliveries`: the delivery log, filtered and paged, and one delivery with
//! every attempt.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use entrega_core::delivery::{Delivery, DeliveryStatus};
use entrega_core::endpoint::validate_event_type;
use entrega_core::ids::{DeliveryId, EndpointId, TenantId};
use entrega_core::ports::DeliveryQuery;
use utoipa::IntoParams;

use super::auth::Caller;
use super::extract::QueryMap;
use super::problem::{ApiError, ApiResult};
use super::schemas::ProblemResponses;
use super::views::{AttemptView, DeliveryDetail, DeliveryStatusDoc, DeliveryView, Page};

/// `GET /v1/deliveries` filters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ListDeliveries {
    /// Admin only: one tenant's deliveries.
    #[param(pattern = "^ten_[0-9a-f]{32}$")]
    tenant_id: Option<String>,
    #[param(pattern = "^ep_[0-9a-f]{32}$")]
    endpoint_id: Option<String>,
    #[param(max_length = 128, pattern = "^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*$")]
    event_type: Option<String>,
    #[param(inline)]
    status: Option<DeliveryStatusDoc>,
    /// Created at or after (RFC 3339).
    #[param(format = DateTime)]
    since: Option<String>,
    /// Created before (RFC 3339).
    #[param(format = DateTime)]
    until: Option<String>,
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^dlv_[0-9a-f]{32}$")]
    cursor: Option<String>,
}
use super::{page_cursor, page_limit, AppState};

#[utoipa::path(get, path = "/v1/deliveries", tag = "deliveries", params(ListDeliveries),
    responses((status = 200, description = "The delivery log, newest first", body = Page<DeliveryView>), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all)]
pub(super) async fn list_deliveries(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryMap,
) -> ApiResult<Json<Page<DeliveryView>>> {
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
        tenant: caller.list_scope(query.parse::<TenantId>("tenant_id", "a tenant id")?)?,
        endpoint_id: query.parse::<EndpointId>("endpoint_id", "an endpoint id")?,
        event_type: event_type_filter(query.0.get("event_type"))?,
        status,
        since,
        until,
        limit: page_limit(&query)?,
        cursor: page_cursor::<DeliveryId>(&query)?,
    };
    let page = state.services.store.list_deliveries(&q).await?;
    Ok(Json(Page::of(page, |d| DeliveryView::from(d))))
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

#[utoipa::path(get, path = "/v1/deliveries/{id}", tag = "deliveries",
    params(("id" = String, Path, pattern = "^dlv_[0-9a-f]{32}$")),
    responses((status = 200, description = "The delivery and every attempt", body = DeliveryDetail), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(delivery_id = %id))]
pub(super) async fn get_delivery(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<DeliveryDetail>> {
    let delivery = load_delivery(&state, &caller, &id).await?;
    let attempts = state.services.store.list_attempts(&delivery.id).await?;
    Ok(Json(DeliveryDetail {
        delivery: DeliveryView::from(&delivery),
        attempts: attempts.iter().map(AttemptView::from).collect(),
    }))
}

/// An `event_type` filter (the log's, a batch resend's), checked: a type no event can
/// have matches nothing, so say so rather than answer an empty page (a misspelt
/// filter looked like no deliveries).
pub(super) fn event_type_filter(asked: Option<&String>) -> ApiResult<Option<String>> {
    asked
        .map(|t| {
            validate_event_type(t)
                .map(|()| t.clone())
                .map_err(|e| ApiError::invalid("event_type", e))
        })
        .transpose()
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/deliveries", get(list_deliveries))
        .route("/v1/deliveries/{id}", get(get_delivery))
}
