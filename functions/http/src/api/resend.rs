//! Resending: `POST /v1/deliveries/{id}/resend` ("try now") and the batch
//! `POST /v1/deliveries/resend`, by ids or by filter and time window.
//!
//! A batch does bounded work per request: at most [`MAX_BATCH`] deliveries, then a
//! `next_cursor` to continue from (the CLI follows it with a progress bar). Paging by
//! the client, not in the background, works the same on Lambda, which has no
//! background once the response is sent.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use entrega_core::delivery::{Delivery, DeliveryStatus};
use entrega_core::handlers::resend::{resend_delivery_for, ResendError};
use entrega_core::ids::{DeliveryId, EndpointId, TenantId};
use entrega_core::ports::DeliveryQuery;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Caller;
use super::deliveries::{event_type_filter, load_delivery};
use super::extract::{JsonBody, NoBody};
use super::idempotency::{fingerprint, IdempotentRequest};
use super::problem::{ApiError, ApiResult};
use super::schemas::ProblemResponses;
use super::views::{BatchResent, DeliveryStatusDoc, DeliveryView};
use super::AppState;

/// Most deliveries one batch request resends (by ids, or per page of a window).
pub const MAX_BATCH: usize = 1_000;
/// Longest window a filtered batch may cover.
pub const MAX_WINDOW_DAYS: i64 = 14;
/// The routes' names in their `Idempotency-Key` slots (see [`IdempotentRequest`]);
/// the batch's is the one it has always had, so keys used before an upgrade hold.
const RESEND_BATCH: &str = "resend";
const RESEND_DELIVERY: &str = "resend-delivery";
pub(super) const RESEND_FAILURE: &str = "resend-failure";
/// Rows read per store call while walking a window.
const PAGE: usize = 200;

/// Resend one delivery now for `request`, answering with its new state.
async fn resend_one(
    state: &AppState,
    caller: &Caller,
    request: &IdempotentRequest,
    delivery: &Delivery,
) -> ApiResult<Delivery> {
    let mark = request.mark();
    resend_delivery_for(&state.services, delivery, &caller.label(), mark.as_deref())
        .await
        .map_err(|e| match e {
            ResendError::EndpointGone => {
                ApiError::conflict("the endpoint of this delivery was deleted")
            }
            e @ ResendError::AttemptUnderWay { .. } => ApiError::conflict(e.to_string()),
            ResendError::Store(e) => e.into(),
        })
}

#[utoipa::path(post, path = "/v1/deliveries/{id}/resend", tag = "deliveries",
    params(("id" = String, Path, pattern = "^dlv_[0-9a-f]{32}$"),
        ("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the first answer and resends nothing twice")),
    responses((status = 202, description = "Queued now: a new generation, same webhook-id", body = DeliveryView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(delivery_id = %id))]
pub(super) async fn resend_single(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    _: NoBody,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    let delivery = load_delivery(&state, &caller, &id).await?;
    let request = IdempotentRequest::new(&headers, &caller, RESEND_DELIVERY, fingerprint(&id))?;
    resend_once(&state, &caller, &request, &delivery).await
}

/// Resend `delivery` under `request`'s key, if it has one: once, however often the
/// request is repeated, each repeat answered as the first was.
pub(super) async fn resend_once(
    state: &AppState,
    caller: &Caller,
    request: &IdempotentRequest,
    delivery: &Delivery,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    let store = state.services.store.as_ref();
    if let Some(first) = request.first_answer(store).await? {
        return Ok((StatusCode::ACCEPTED, Json(first)));
    }
    match resend_one(state, caller, request, delivery).await {
        Ok(resent) => {
            let answer =
                serde_json::to_value(DeliveryView::from(&resent)).expect("a delivery serialises");
            request.answered(store, &answer).await?;
            Ok((StatusCode::ACCEPTED, Json(answer)))
        }
        Err(e) => {
            // A refusal changed nothing; a store failure may have resent it already.
            request.failed(store, e.status.is_server_error()).await?;
            Err(e)
        }
    }
}

/// A batch: `ids` (at most 1 000), or a filter with a window of at most 14 days.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BatchResend {
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(min_items = 1, max_items = 1000, value_type = Vec<String>)]
    ids: Option<Vec<String>>,
    /// Admin only: one tenant's deliveries (a tenant's key always means its own).
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = String, pattern = "^ten_[0-9a-f]{32}$")]
    tenant_id: Option<TenantId>,
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = String, pattern = "^ep_[0-9a-f]{32}$")]
    endpoint_id: Option<EndpointId>,
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = DeliveryStatusDoc)]
    status: Option<DeliveryStatus>,
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = String, max_length = 128, pattern = "^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*$")]
    event_type: Option<String>,
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = String, format = DateTime)]
    since: Option<DateTime<Utc>>,
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = String, format = DateTime)]
    until: Option<DateTime<Utc>>,
    /// The `next_cursor` of the previous answer.
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = String, pattern = "^dlv_[0-9a-f]{32}$")]
    cursor: Option<DeliveryId>,
}

#[utoipa::path(post, path = "/v1/deliveries/resend", tag = "deliveries", request_body = BatchResend,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the first answer and resends nothing twice")),
    responses((status = 200, description = "What was queued, and where to continue", body = BatchResent), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all)]
pub(super) async fn resend_batch(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(body): JsonBody<BatchResend>,
) -> ApiResult<Json<BatchResent>> {
    let request = IdempotentRequest::new(&headers, &caller, RESEND_BATCH, fingerprint(&body))?;
    let store = state.services.store.as_ref();
    if let Some(first) = request.first_answer(store).await? {
        let first = serde_json::from_value(first)
            .map_err(|e| ApiError::backend(format!("a remembered answer is unreadable: {e}")))?;
        return Ok(Json(first));
    }
    let mut answer = BatchResent::default();
    let batch = Batch {
        state: &state,
        caller: &caller,
        mark: request.mark(),
    };
    let done = match &body.ids {
        Some(ids) => batch.by_ids(ids, &body, &mut answer).await,
        None => batch.by_window(&body, &mut answer).await,
    };
    if let Err(e) = done {
        // One that failed part-way keeps its key claimed (see `failed`).
        request.failed(store, answer.queued > 0).await?;
        return Err(e);
    }
    request.answered(store, &answer).await?;
    Ok(Json(answer))
}

/// One batch request: who asks, and the mark its resends record (see
/// [`IdempotentRequest::mark`]).
struct Batch<'a> {
    state: &'a AppState,
    caller: &'a Caller,
    mark: Option<String>,
}

impl Batch<'_> {
    /// Resend `delivery` as part of a batch, counting it in `answer`; a delivery whose
    /// endpoint was deleted, or whose at-most-once attempt is under way, is listed and
    /// skipped, not an error for the whole batch. One this request resent before it died
    /// part-way is counted, not resent again.
    async fn resend_in_batch(
        &self,
        delivery: &Delivery,
        answer: &mut BatchResent,
    ) -> ApiResult<()> {
        let (state, caller) = (self.state, self.caller);
        match resend_delivery_for(
            &state.services,
            delivery,
            &caller.label(),
            self.mark.as_deref(),
        )
        .await
        {
            Ok(_) => answer.queued += 1,
            Err(ResendError::EndpointGone) => answer.endpoint_deleted.push(delivery.id.to_string()),
            Err(ResendError::AttemptUnderWay { .. }) => {
                answer.attempt_under_way.push(delivery.id.to_string())
            }
            Err(ResendError::Store(e)) => return Err(e.into()),
        }
        Ok(())
    }

    async fn by_ids(
        &self,
        ids: &[String],
        body: &BatchResend,
        answer: &mut BatchResent,
    ) -> ApiResult<()> {
        let (state, caller) = (self.state, self.caller);
        if body.endpoint_id.is_some()
            || body.tenant_id.is_some()
            || body.event_type.is_some()
            || body.status.is_some()
            || body.since.is_some()
            || body.until.is_some()
        {
            return Err(ApiError::invalid(
                "ids",
                "give either `ids` or a filter with a window, not both",
            ));
        }
        if ids.is_empty() || ids.len() > MAX_BATCH {
            return Err(ApiError::invalid(
                "ids",
                format!("1 to {MAX_BATCH} delivery ids"),
            ));
        }
        // The same id twice is one resend: a second would only supersede the first.
        let mut seen = std::collections::HashSet::new();
        for raw in ids.iter().filter(|raw| seen.insert(raw.as_str())) {
            let found = match raw.parse::<DeliveryId>() {
                Ok(id) => state
                    .services
                    .store
                    .get_delivery(&id)
                    .await?
                    .filter(|d| caller.can_see(&d.tenant_id)),
                Err(_) => None,
            };
            match found {
                Some(d) => self.resend_in_batch(&d, answer).await?,
                None => answer.not_found.push(raw.clone()),
            }
        }
        Ok(())
    }

    async fn by_window(&self, body: &BatchResend, answer: &mut BatchResent) -> ApiResult<()> {
        let (state, caller) = (self.state, self.caller);
        let (Some(since), Some(until)) = (body.since, body.until) else {
            return Err(ApiError::invalid(
                "since",
                "a filtered resend needs `since` and `until` (or give `ids`)",
            ));
        };
        if until <= since {
            return Err(ApiError::invalid("until", "must be after `since`"));
        }
        if until - since > chrono::Duration::days(MAX_WINDOW_DAYS) {
            return Err(ApiError::invalid(
                "until",
                format!("a window spans at most {MAX_WINDOW_DAYS} days"),
            ));
        }
        let mut query = DeliveryQuery {
            tenant: caller.list_scope(body.tenant_id.clone())?,
            endpoint_id: body.endpoint_id.clone(),
            event_type: event_type_filter(body.event_type.as_ref())?,
            status: body.status,
            since: Some(since),
            until: Some(until),
            limit: PAGE,
            cursor: body.cursor.as_ref().map(ToString::to_string),
        };
        let mut walked = 0;
        loop {
            let page = state.services.store.list_deliveries(&query).await?;
            for d in &page.data {
                self.resend_in_batch(d, answer).await?;
            }
            walked += page.data.len();
            query.cursor = page.next_cursor;
            if query.cursor.is_none() || walked + PAGE > MAX_BATCH {
                break;
            }
        }
        answer.next_cursor = query.cursor;
        Ok(())
    }
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/deliveries/resend", post(resend_batch))
        .route("/v1/deliveries/{id}/resend", post(resend_single))
}
