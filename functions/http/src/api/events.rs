//! `/v1/events`: publish into the outbox, and read an event with its deliveries.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use entrega_core::endpoint::{is_reserved_type, validate_event_type, OPERATIONAL_PREFIX};
use entrega_core::event::{Event, MAX_PAYLOAD_BYTES};
use entrega_core::handlers::notices::{is_reserved_id, OPERATIONAL_ID_PREFIX};
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::Published;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::auth::Caller;
use super::extract::{JsonBody, QueryMap};
use super::problem::{ApiError, ApiResult};
use super::schemas::ProblemResponses;
use super::views::{Accepted, EventView};
use super::AppState;
use entrega_core::raw_json::raw_json_problem;

/// An event to deliver to the tenant's subscribed endpoints.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PublishEvent {
    /// Dot-separated; the `entrega.` prefix is reserved.
    #[serde(rename = "type")]
    #[schema(max_length = 128, pattern = "^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*$")]
    event_type: String,
    /// Any JSON, at most 256 KiB; forwarded as the webhook's `data`, as sent.
    // Kept as its text: parsed into a value, a number past what an `f64` holds
    // (`12345678901234567890123`) reached the receiver rounded, and two events
    // differing only there were one event to the idempotency check (a hostile test).
    #[schema(value_type = Value)]
    data: Box<serde_json::value::RawValue>,
    /// Makes publishing idempotent: the same id with the same body again is one event;
    /// with another body, 409. Scoped to the tenant.
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = String, pattern = "^[A-Za-z0-9_:-]{1,128}$")]
    id: Option<EventId>,
    /// Admin keys name the tenant; a tenant key publishes for itself.
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = String, pattern = "^ten_[0-9a-f]{32}$")]
    tenant_id: Option<TenantId>,
}

/// `GET /v1/events/{id}` parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct EventQuery {
    /// Admin only, and required for admin: whose event (ids are per tenant).
    #[param(pattern = "^ten_[0-9a-f]{32}$")]
    tenant_id: Option<String>,
}

#[utoipa::path(post, path = "/v1/events", tag = "events", request_body = PublishEvent,
    responses((status = 202, description = "Accepted: committed to the outbox", body = Accepted), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(event_id))]
pub(super) async fn publish(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<PublishEvent>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    let tenant_id = caller
        .owning_existing_tenant(&state, body.tenant_id)
        .await?;
    validate_event_type(&body.event_type).map_err(|e| ApiError::invalid("type", e))?;
    if is_reserved_type(&body.event_type) {
        return Err(ApiError::invalid(
            "type",
            format!(
                "types starting with `{OPERATIONAL_PREFIX}` are reserved for Entrega's own events"
            ),
        ));
    }
    if body
        .id
        .as_ref()
        .is_some_and(|id| is_reserved_id(id.as_str()))
    {
        return Err(ApiError::invalid(
            "id",
            format!(
                "ids starting with `{OPERATIONAL_ID_PREFIX}` are reserved for Entrega's own events"
            ),
        ));
    }
    if let Some(problem) = raw_json_problem(body.data.get().as_bytes()) {
        return Err(ApiError::invalid("data", problem.describe()));
    }
    let payload = String::from(Box::<str>::from(body.data));
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(ApiError::too_large(MAX_PAYLOAD_BYTES));
    }
    let id_given = body.id.is_some();
    let event = Event {
        id: body.id.unwrap_or_else(EventId::generate),
        tenant_id,
        event_type: body.event_type,
        payload,
        created_at: state.services.clock.now(),
    };
    tracing::Span::current().record("event_id", tracing::field::display(&event.id));
    let backlog = state
        .services
        .backlog
        .tenant_backlog(&event.tenant_id)
        .await?;
    let published = if backlog < state.services.settings.max_backlog {
        match &state.publisher {
            Some(publisher) => publisher.publish(&event).await?,
            None => state.services.store.publish(&event).await?,
        }
    } else {
        // A producer sending an accepted event again (its 202 was lost) is told it was
        // accepted, backlog or not: a 429 said it was not.
        let existing = if id_given {
            let store = &state.services.store;
            store.get_event(&event.tenant_id, &event.id).await?
        } else {
            None
        };
        match existing {
            Some(existing) => Published::Existing(existing),
            None => return Err(ApiError::backlog_full(backlog, BACKLOG_RETRY_AFTER_S)),
        }
    };
    match published {
        Published::Created => {}
        // Same id again with the same body: the same event, nothing sent twice.
        Published::Existing(existing) if existing.same_as(&event) => {}
        Published::Existing(_) => {
            return Err(ApiError::conflict(format!(
                "event id `{}` was already published with a different type or data; \
                 use a new id for a different event",
                event.id
            )))
        }
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            id: event.id.to_string(),
        }),
    ))
}

/// How long a client held back by the backlog limit should wait.
const BACKLOG_RETRY_AFTER_S: u64 = 5;

#[utoipa::path(get, path = "/v1/events/{id}", tag = "events",
    params(("id" = String, Path, pattern = "^[A-Za-z0-9_:-]{1,128}$"), EventQuery),
    responses((status = 200, description = "The event and each of its deliveries", body = EventView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(event_id = %id))]
pub(super) async fn get_event(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: QueryMap,
) -> ApiResult<Json<EventView>> {
    let not_found = || ApiError::not_found("event", &id);
    // Event ids are scoped to their tenant: an admin names the tenant.
    let tenant = match caller.list_scope(query.parse::<TenantId>("tenant_id", "a tenant id")?)? {
        Some(t) => t,
        None => {
            return Err(ApiError::invalid(
                "tenant_id",
                "event ids are per tenant: an admin key must say which tenant's event",
            ))
        }
    };
    let event_id: EventId = id.parse().map_err(|_| not_found())?;
    let Some(event) = state.services.store.get_event(&tenant, &event_id).await? else {
        return Err(not_found());
    };
    let deliveries = state.services.store.deliveries_of_event(&event).await?;
    Ok(Json(EventView::new(&event, &deliveries)))
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events", post(publish))
        .route("/v1/events/{id}", get(get_event))
}
