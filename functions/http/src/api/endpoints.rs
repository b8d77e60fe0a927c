//! `/v1/endpoints`: create, list, read, change, delete, rotate the secret.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use entrega_core::endpoint::{
    validate_event_type_patterns, DeliveryMode, Endpoint, DEFAULT_MAX_CONCURRENCY,
    DEFAULT_TIMEOUT_MS, MAX_CONCURRENCY_CAP, MAX_DESCRIPTION_LEN, MAX_TIMEOUT_MS, MIN_TIMEOUT_MS,
};
use entrega_core::handlers::resume::resume_paused;
use entrega_core::ids::{EndpointId, TenantId};
use entrega_core::retry::RetrySpec;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::extract::{JsonBody, QueryMap};
use super::problem::{ApiError, ApiResult};
use super::views::endpoint_view;
use super::{page_limit, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateEndpoint {
    url: String,
    #[serde(default)]
    event_types: Vec<String>,
    #[serde(default)]
    mode: DeliveryMode,
    #[serde(default)]
    retry: RetrySpec,
    timeout_ms: Option<u32>,
    max_concurrency: Option<u32>,
    #[serde(default)]
    disabled: bool,
    description: Option<String>,
    tenant_id: Option<TenantId>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchEndpoint {
    url: Option<String>,
    event_types: Option<Vec<String>>,
    mode: Option<DeliveryMode>,
    retry: Option<RetrySpec>,
    timeout_ms: Option<u32>,
    max_concurrency: Option<u32>,
    disabled: Option<bool>,
    description: Option<String>,
}

/// Every rule an endpoint must satisfy, checked on create and on every change.
fn validate(endpoint: &Endpoint, state: &AppState) -> ApiResult<()> {
    state
        .targets
        .check_url(&endpoint.url)
        .map_err(|e| ApiError::invalid("url", e))?;
    validate_event_type_patterns(&endpoint.event_types)
        .map_err(|e| ApiError::invalid("event_types", e))?;
    endpoint
        .retry
        .policy()
        .map_err(|e| ApiError::invalid("retry", e))?;
    if !(MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS).contains(&endpoint.timeout_ms) {
        return Err(ApiError::invalid(
            "timeout_ms",
            format!("must be between {MIN_TIMEOUT_MS} and {MAX_TIMEOUT_MS}"),
        ));
    }
    if !(1..=MAX_CONCURRENCY_CAP).contains(&endpoint.max_concurrency) {
        return Err(ApiError::invalid(
            "max_concurrency",
            format!("must be between 1 and {MAX_CONCURRENCY_CAP}"),
        ));
    }
    if endpoint
        .description
        .as_ref()
        .is_some_and(|d| d.len() > MAX_DESCRIPTION_LEN)
    {
        return Err(ApiError::invalid(
            "description",
            format!("at most {MAX_DESCRIPTION_LEN} bytes"),
        ));
    }
    Ok(())
}

#[tracing::instrument(skip_all, fields(endpoint_id))]
async fn create_endpoint(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateEndpoint>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let tenant_id = caller.owning_tenant(body.tenant_id)?;
    if state.services.store.get_tenant(&tenant_id).await?.is_none() {
        return Err(ApiError::invalid("tenant_id", "no such tenant"));
    }
    let now = state.services.clock.now();
    let endpoint = Endpoint {
        event_types: body.event_types,
        mode: body.mode,
        retry: body.retry,
        timeout_ms: body.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
        max_concurrency: body.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY),
        disabled: body.disabled,
        description: body.description,
        ..Endpoint::new(tenant_id, body.url, now)
    };

    validate(&endpoint, &state)?;
    tracing::Span::current().record("endpoint_id", tracing::field::display(&endpoint.id));
    state.services.store.create_endpoint(&endpoint).await?;
    Ok((StatusCode::CREATED, Json(endpoint_view(&endpoint))))
}

#[tracing::instrument(skip_all)]
async fn list_endpoints(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryMap,
) -> ApiResult<Json<Value>> {
    let scope = caller.list_scope(query.parse("tenant_id", "a tenant id")?);
    let limit = page_limit(&query)?;
    let page = state
        .services
        .store
        .list_endpoints(
            scope.as_ref(),
            limit,
            query.0.get("cursor").map(String::as_str),
        )
        .await?;
    let data: Vec<Value> = page.data.iter().map(endpoint_view).collect();
    Ok(Json(
        json!({ "data": data, "next_cursor": page.next_cursor }),
    ))
}

/// The endpoint `raw` names, if the caller may see it.
pub(super) async fn load_endpoint(
    state: &AppState,
    caller: &Caller,
    raw: &str,
) -> ApiResult<Endpoint> {
    let not_found = || ApiError::not_found("endpoint", raw);
    let id: EndpointId = raw.parse().map_err(|_| not_found())?;
    match state.services.store.get_endpoint(&id).await? {
        Some(e) if caller.can_see(&e.tenant_id) => Ok(e),
        _ => Err(not_found()),
    }
}

#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
async fn get_endpoint(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(endpoint_view(
        &load_endpoint(&state, &caller, &id).await?,
    )))
}

#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
async fn patch_endpoint(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<PatchEndpoint>,
) -> ApiResult<Json<Value>> {
    let before = load_endpoint(&state, &caller, &id).await?;
    let mut endpoint = before.clone();
    if let Some(url) = body.url {
        endpoint.url = url;
    }
    if let Some(types) = body.event_types {
        endpoint.event_types = types;
    }
    if let Some(mode) = body.mode {
        endpoint.mode = mode;
    }
    if let Some(retry) = body.retry {
        endpoint.retry = retry;
    }
    if let Some(timeout) = body.timeout_ms {
        endpoint.timeout_ms = timeout;
    }
    if let Some(cap) = body.max_concurrency {
        endpoint.max_concurrency = cap;
    }
    if let Some(disabled) = body.disabled {
        endpoint.disabled = disabled;
    }
    if let Some(description) = body.description {
        endpoint.description = Some(description);
    }
    validate(&endpoint, &state)?;
    endpoint.updated_at = state.services.clock.now();
    state.services.store.update_endpoint(&endpoint).await?;
    if before.disabled && !endpoint.disabled {
        let resumed = resume_paused(&state.services, &endpoint).await?;
        tracing::info!(resumed, "endpoint re-enabled");
    }
    Ok(Json(endpoint_view(&endpoint)))
}

#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
async fn delete_endpoint(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let endpoint = load_endpoint(&state, &caller, &id).await?;
    state.services.store.delete_endpoint(&endpoint.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
async fn rotate_secret(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let mut endpoint = load_endpoint(&state, &caller, &id).await?;
    endpoint.rotate_secret(state.services.clock.now());
    state.services.store.update_endpoint(&endpoint).await?;
    Ok(Json(endpoint_view(&endpoint)))
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/endpoints", post(create_endpoint).get(list_endpoints))
        .route(
            "/v1/endpoints/{id}",
            get(get_endpoint)
                .patch(patch_endpoint)
                .delete(delete_endpoint),
        )
        .route("/v1/endpoints/{id}/rotate-secret", post(rotate_secret))
}
