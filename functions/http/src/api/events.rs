//! `/v1/events`: publish into the outbox, and read an event with its deliveries.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use entrega_core::endpoint::validate_event_type;
use entrega_core::event::{Event, MAX_PAYLOAD_BYTES};
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::Published;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::extract::JsonBody;
use super::problem::{ApiError, ApiResult};
use super::views::{delivery_view, event_view};
use super::AppState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishEvent {
    #[serde(rename = "type")]
    event_type: String,
    data: Value,
    id: Option<EventId>,
    tenant_id: Option<TenantId>,
}

#[tracing::instrument(skip_all, fields(event_id))]
async fn publish(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<PublishEvent>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let tenant_id = caller.owning_tenant(body.tenant_id)?;
    validate_event_type(&body.event_type).map_err(|e| ApiError::invalid("type", e))?;
    let payload = serde_json::to_string(&body.data).expect("a JSON value serialises");
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(ApiError::too_large(MAX_PAYLOAD_BYTES));
    }
    let event = Event {
        id: body.id.unwrap_or_else(EventId::generate),
        tenant_id,
        event_type: body.event_type,
        payload,
        created_at: state.services.clock.now(),
    };
    tracing::Span::current().record("event_id", tracing::field::display(&event.id));
    match state.services.store.publish(&event).await? {
        Published::Created => {}
        // Same id again: the same event, nothing sent twice.
        Published::Existing(existing) if existing.tenant_id == event.tenant_id => {}
        Published::Existing(_) => {
            return Err(ApiError::conflict(format!(
                "event id `{}` is already used",
                event.id
            )))
        }
    }
    Ok((StatusCode::ACCEPTED, Json(json!({ "id": event.id }))))
}

#[tracing::instrument(skip_all, fields(event_id = %id))]
async fn get_event(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let not_found = || ApiError::not_found("event", &id);
    let event_id: EventId = id.parse().map_err(|_| not_found())?;
    let event = match state.services.store.get_event(&event_id).await? {
        Some(e) if caller.can_see(&e.tenant_id) => e,
        _ => return Err(not_found()),
    };
    let deliveries = state.services.store.deliveries_of_event(&event.id).await?;
    let mut view = event_view(&event);
    view["deliveries"] = deliveries.iter().map(delivery_view).collect();
    Ok(Json(view))
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events", post(publish))
        .route("/v1/events/{id}", get(get_event))
}
