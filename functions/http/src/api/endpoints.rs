//! `/v1/endpoints`: create, list, read, change, delete, rotate the secret.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use entrega_core::endpoint::{
    validate_event_type_patterns, DeliveryMode, Endpoint, DEFAULT_MAX_CONCURRENCY,
    DEFAULT_TIMEOUT_MS, MAX_CONCURRENCY_CAP, MAX_DESCRIPTION_LEN, MAX_ENDPOINTS_PER_TENANT,
    MAX_TIMEOUT_MS, MIN_TIMEOUT_MS,
};
use entrega_core::handlers::resume::start_resume;
use entrega_core::ids::{EndpointId, TenantId};
use entrega_core::ports::{EndpointCreated, StoreError};
use entrega_core::retry::RetrySpec;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::auth::Caller;
use super::extract::{JsonBody, NoBody, QueryMap};
use super::problem::{ApiError, ApiResult};
use super::schemas::{DeliveryModeDoc, ProblemResponses, RetrySpecDoc};
use super::views::{EndpointView, Page};
use super::{page_cursor, page_limit, AppState};

/// A new endpoint.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateEndpoint {
    /// Where to POST: `https` (or `http` where the operator allows it), checked by
    /// the SSRF guard.
    #[schema(max_length = 2048, format = "uri")]
    url: String,
    /// Event types or `prefix.*` patterns; empty: every type (not Entrega's own).
    #[serde(default)]
    #[schema(max_items = 100, value_type = Vec<String>, pattern = "^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*(\\.\\*)?$")]
    event_types: Vec<String>,
    #[serde(default)]
    #[schema(value_type = DeliveryModeDoc)]
    mode: DeliveryMode,
    #[serde(default)]
    #[schema(value_type = RetrySpecDoc)]
    retry: RetrySpec,
    #[serde(default, deserialize_with = "not_null")]
    #[schema(minimum = 100, maximum = 30000, value_type = u32)]
    timeout_ms: Option<u32>,
    #[serde(default, deserialize_with = "not_null")]
    #[schema(minimum = 1, maximum = 256, value_type = u32)]
    max_concurrency: Option<u32>,
    #[serde(default)]
    disabled: bool,
    #[schema(max_length = 1024)]
    description: Option<String>,
    /// Whose endpoint it is: required with an admin key, the key's own otherwise.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = String, pattern = "^ten_[0-9a-f]{32}$")]
    tenant_id: Option<TenantId>,
}

/// A JSON merge patch: absent fields stay, `description: null` clears it, and a null
/// for a field that cannot be empty is refused (naming it) rather than ignored.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PatchEndpoint {
    #[serde(default, deserialize_with = "not_null")]
    #[schema(max_length = 2048, format = "uri", value_type = String)]
    url: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    #[schema(max_items = 100, value_type = Vec<String>, pattern = "^[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*(\\.\\*)?$")]
    event_types: Option<Vec<String>>,
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = DeliveryModeDoc)]
    mode: Option<DeliveryMode>,
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = RetrySpecDoc)]
    retry: Option<RetrySpec>,
    #[serde(default, deserialize_with = "not_null")]
    #[schema(minimum = 100, maximum = 30000, value_type = u32)]
    timeout_ms: Option<u32>,
    #[serde(default, deserialize_with = "not_null")]
    #[schema(minimum = 1, maximum = 256, value_type = u32)]
    max_concurrency: Option<u32>,
    /// `false` re-enables it and resumes its paused deliveries.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = bool)]
    disabled: Option<bool>,
    /// `null` clears it.
    #[serde(default, deserialize_with = "nullable")]
    #[schema(max_length = 1024, value_type = Option<String>)]
    description: Option<Option<String>>,
}

/// `GET /v1/endpoints` parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ListEndpoints {
    /// Admin only: one tenant's endpoints.
    #[param(pattern = "^ten_[0-9a-f]{32}$")]
    tenant_id: Option<String>,
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^ep_[0-9a-f]{32}$")]
    cursor: Option<String>,
}

/// A field that may be absent but not `null`.
pub(super) fn not_null<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A field that may be absent (`None`), or `null` (`Some(None)`: clear it).
fn nullable<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Longest endpoint URL.
pub const MAX_URL_LEN: usize = 2048;
/// Tries of a client's change against concurrent bookkeeping before a 409.
const CHANGE_TRIES: usize = 5;

/// The URL as it will be delivered to: checked by the SSRF guard and normalised. What
/// is stored is exactly what is sent to, so whitespace or control characters (which a
/// URL parser would silently strip or move) are refused instead.
fn normalize_url(raw: &str, state: &AppState) -> ApiResult<String> {
    if raw.len() > MAX_URL_LEN {
        return Err(ApiError::invalid(
            "url",
            format!("at most {MAX_URL_LEN} bytes"),
        ));
    }
    if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(ApiError::invalid(
            "url",
            "must not contain spaces, tabs, line breaks or other control characters",
        ));
    }
    let url = state
        .targets
        .check_url(raw)
        .map_err(|e| ApiError::invalid("url", e))?;
    if url.port() == Some(0) {
        return Err(ApiError::invalid("url", "port 0 cannot be connected to"));
    }
    Ok(url.to_string())
}

/// Every rule an endpoint must satisfy, checked on create and on every change.
fn validate(endpoint: &mut Endpoint, state: &AppState) -> ApiResult<()> {
    endpoint.url = normalize_url(&endpoint.url, state)?;
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
    if endpoint
        .description
        .as_ref()
        .is_some_and(|d| !super::extract::is_plain_text(d))
    {
        return Err(ApiError::invalid(
            "description",
            "must not contain control characters, or invisible or direction-changing ones",
        ));
    }
    Ok(())
}

#[utoipa::path(post, path = "/v1/endpoints", tag = "endpoints", request_body = CreateEndpoint,
    responses((status = 201, description = "Created", body = EndpointView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(endpoint_id))]
pub(super) async fn create_endpoint(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateEndpoint>,
) -> ApiResult<(StatusCode, Json<EndpointView>)> {
    let tenant_id = caller.owning_tenant(body.tenant_id)?;
    if state.services.store.get_tenant(&tenant_id).await?.is_none() {
        return Err(ApiError::invalid("tenant_id", "no such tenant"));
    }
    let now = state.services.clock.now();
    let mut endpoint = Endpoint {
        event_types: body.event_types,
        mode: body.mode,
        retry: body.retry,
        timeout_ms: body.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
        max_concurrency: body.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY),
        disabled: body.disabled,
        description: body.description,
        ..Endpoint::new(tenant_id, body.url, now)
    };

    validate(&mut endpoint, &state)?;
    tracing::Span::current().record("endpoint_id", tracing::field::display(&endpoint.id));
    match state
        .services
        .store
        .create_endpoint(&endpoint, MAX_ENDPOINTS_PER_TENANT)
        .await?
    {
        EndpointCreated::Stored => {}
        EndpointCreated::TenantFull => {
            return Err(ApiError::conflict(format!(
                "a tenant has at most {MAX_ENDPOINTS_PER_TENANT} endpoints: delete one it no longer needs first"
            )))
        }
    }
    Ok((StatusCode::CREATED, Json(EndpointView::from(&endpoint))))
}

#[utoipa::path(get, path = "/v1/endpoints", tag = "endpoints", params(ListEndpoints),
    responses((status = 200, description = "A page, newest first", body = Page<EndpointView>), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all)]
pub(super) async fn list_endpoints(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryMap,
) -> ApiResult<Json<Page<EndpointView>>> {
    let scope = caller.list_scope(query.parse("tenant_id", "a tenant id")?)?;
    let limit = page_limit(&query)?;
    let page = state
        .services
        .store
        .list_endpoints(
            scope.as_ref(),
            limit,
            page_cursor::<EndpointId>(&query)?.as_deref(),
        )
        .await?;
    Ok(Json(Page::of(page, |e| EndpointView::from(e))))
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

#[utoipa::path(get, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = String, Path, pattern = "^ep_[0-9a-f]{32}$")),
    responses((status = 200, description = "The endpoint", body = EndpointView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
pub(super) async fn get_endpoint(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<EndpointView>> {
    Ok(Json(EndpointView::from(
        &load_endpoint(&state, &caller, &id).await?,
    )))
}

/// Apply `change` to the endpoint as stored now and write it conditionally on the
/// version read; on a conflict (the worker's bookkeeping, another client) read and
/// apply again. What is answered 200 is what is stored.
async fn change_endpoint(
    state: &AppState,
    caller: &Caller,
    raw: &str,
    change: impl Fn(&mut Endpoint) -> ApiResult<()>,
) -> ApiResult<(Endpoint, Endpoint)> {
    for _ in 0..CHANGE_TRIES {
        let before = load_endpoint(state, caller, raw).await?;
        let mut next = before.clone();
        change(&mut next)?;
        validate(&mut next, state)?;
        // A change that changes nothing is not written: `updated_at` would say the
        // endpoint was edited, and the new version would fail a client's conditional
        // write made from the same read.
        if next == before {
            return Ok((before.clone(), before));
        }
        next.updated_at = state.services.clock.now();
        match state.services.store.update_endpoint(&next).await {
            Ok(saved) => return Ok((before, saved)),
            Err(StoreError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::conflict(
        "the endpoint kept changing while this change was applied; retry it",
    ))
}

#[utoipa::path(patch, path = "/v1/endpoints/{id}", tag = "endpoints", request_body = PatchEndpoint,
    params(("id" = String, Path, pattern = "^ep_[0-9a-f]{32}$")),
    responses((status = 200, description = "The endpoint as changed", body = EndpointView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
pub(super) async fn patch_endpoint(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<PatchEndpoint>,
) -> ApiResult<Json<EndpointView>> {
    let now = state.services.clock.now();
    let (before, endpoint) = change_endpoint(&state, &caller, &id, |endpoint| {
        if let Some(url) = &body.url {
            endpoint.url = url.clone();
        }
        if let Some(types) = &body.event_types {
            endpoint.event_types = types.clone();
        }
        if let Some(mode) = body.mode {
            endpoint.mode = mode;
        }
        if let Some(retry) = &body.retry {
            endpoint.retry = retry.clone();
        }
        if let Some(timeout) = body.timeout_ms {
            endpoint.timeout_ms = timeout;
        }
        if let Some(cap) = body.max_concurrency {
            endpoint.max_concurrency = cap;
        }
        match body.disabled {
            Some(true) => endpoint.disabled = true,
            Some(false) => endpoint.enable(now),
            None => {}
        }
        if let Some(description) = &body.description {
            endpoint.description = description.clone();
        }
        Ok(())
    })
    .await?;
    if before.disabled && !endpoint.disabled {
        // In the background, a bounded step per message: enabling answers at once
        // however many deliveries wait.
        start_resume(&state.services, &endpoint).await?;
        tracing::info!("endpoint re-enabled; its paused deliveries resume");
    }
    Ok(Json(EndpointView::from(&endpoint)))
}

#[utoipa::path(delete, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = String, Path, pattern = "^ep_[0-9a-f]{32}$")),
    responses((status = 204, description = "Deleted; its waiting deliveries end as failed"), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
pub(super) async fn delete_endpoint(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let endpoint = load_endpoint(&state, &caller, &id).await?;
    state.services.store.delete_endpoint(&endpoint.id).await?;
    state
        .services
        .metrics
        .endpoint_deleted(&endpoint.tenant_id, &endpoint.id);
    // Its paused deliveries would wait for an enable that cannot come: the task ends
    // them in the background (after the delete, so it finds the endpoint gone).
    start_resume(&state.services, &endpoint).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/endpoints/{id}/rotate-secret", tag = "endpoints",
    params(("id" = String, Path, pattern = "^ep_[0-9a-f]{32}$")),
    responses((status = 200, description = "The new secret; the old one signs for 24 h more", body = EndpointView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(endpoint_id = %id))]
pub(super) async fn rotate_secret(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    _: NoBody,
) -> ApiResult<Json<EndpointView>> {
    let now = state.services.clock.now();
    let (_, endpoint) = change_endpoint(&state, &caller, &id, |endpoint| {
        endpoint.rotate_secret(now);
        Ok(())
    })
    .await?;
    Ok(Json(EndpointView::from(&endpoint)))
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
