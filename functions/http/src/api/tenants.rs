//! `/v1/tenants`: create a tenant and its first API key, list them (admin), and read
//! one (admin, or the tenant itself).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use entrega_core::ids::TenantId;
use entrega_core::ports::StoreError;
use entrega_core::tenant::{generate_api_key, hash_api_key, Tenant};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::auth::Caller;
use super::extract::{JsonBody, QueryMap};
use super::problem::{ApiError, ApiResult};
use super::schemas::ProblemResponses;
use super::views::{Page, TenantCreated, TenantView};
use super::{page_cursor, page_limit, AppState};

/// Longest tenant name.
const MAX_NAME_LEN: usize = 200;
/// Longest e-mail address (RFC 5321 path limit).
const MAX_EMAIL_LEN: usize = 254;

/// A new tenant (admin).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateTenant {
    #[schema(min_length = 1, max_length = 200)]
    name: String,
    /// Where owner notices go.
    #[schema(max_length = 254, format = Email)]
    owner_email: String,
    /// Choose the id (`ten_` + 32 hex); generated otherwise.
    #[serde(default, deserialize_with = "super::endpoints::not_null")]
    #[schema(value_type = String, pattern = "^ten_[0-9a-f]{32}$")]
    id: Option<TenantId>,
}

#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", request_body = CreateTenant,
    responses((status = 201, description = "Created; the API key is shown only here", body = TenantCreated), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(tenant_id))]
pub(super) async fn create_tenant(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateTenant>,
) -> ApiResult<(StatusCode, Json<TenantCreated>)> {
    caller.require_admin()?;
    let name = body.name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_LEN {
        return Err(ApiError::invalid("name", "must be 1 to 200 characters"));
    }
    if !super::extract::is_plain_text(name) {
        return Err(ApiError::invalid(
            "name",
            "must not contain control characters, or invisible or direction-changing ones",
        ));
    }
    let email = body.owner_email.trim();
    if email.len() > MAX_EMAIL_LEN || !looks_like_email(email) {
        return Err(ApiError::invalid(
            "owner_email",
            "must be an e-mail address",
        ));
    }
    let tenant = Tenant {
        id: body.id.unwrap_or_else(TenantId::generate),
        name: name.to_owned(),
        owner_email: email.to_owned(),
        created_at: state.services.clock.now(),
    };
    tracing::Span::current().record("tenant_id", tracing::field::display(&tenant.id));
    let api_key = generate_api_key();
    match state
        .services
        .store
        .create_tenant(&tenant, &hash_api_key(&api_key))
        .await
    {
        Ok(()) => {}
        Err(StoreError::Conflict(_)) => {
            return Err(ApiError::conflict(format!(
                "tenant `{}` exists already",
                tenant.id
            )))
        }
        Err(e) => return Err(e.into()),
    }
    Ok((
        StatusCode::CREATED,
        Json(TenantCreated {
            tenant: TenantView::from(&tenant),
            api_key,
        }),
    ))
}

fn looks_like_email(s: &str) -> bool {
    match s.split_once('@') {
        Some((local, domain)) => {
            !local.is_empty()
                && domain.contains('.')
                && !domain.starts_with('.')
                && !domain.ends_with('.')
                && !s.chars().any(|c| c.is_whitespace() || c.is_control())
        }
        None => false,
    }
}

/// `GET /v1/tenants` parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ListTenants {
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^ten_[0-9a-f]{32}$")]
    cursor: Option<String>,
}

#[utoipa::path(get, path = "/v1/tenants", tag = "tenants", params(ListTenants),
    responses((status = 200, description = "A page, newest first", body = Page<TenantView>), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all)]
pub(super) async fn list_tenants(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryMap,
) -> ApiResult<Json<Page<TenantView>>> {
    caller.require_admin()?;
    let limit = page_limit(&query)?;
    let page = state
        .services
        .store
        .list_tenants(limit, page_cursor::<TenantId>(&query)?.as_deref())
        .await?;
    Ok(Json(Page::of(page, |t| TenantView::from(t))))
}

#[utoipa::path(get, path = "/v1/tenants/{id}", tag = "tenants",
    params(("id" = String, Path, pattern = "^ten_[0-9a-f]{32}$")),
    responses((status = 200, description = "The tenant", body = TenantView), ProblemResponses),
    security(("api_key" = [])))]
#[tracing::instrument(skip_all, fields(tenant_id = %id))]
pub(super) async fn get_tenant(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<TenantView>> {
    // Another tenant's id is a 404, as for every resource: a key learns nothing of
    // the tenants it does not belong to.
    let not_found = || ApiError::not_found("tenant", &id);
    let tenant_id: TenantId = id.parse().map_err(|_| not_found())?;
    if !caller.can_see(&tenant_id) {
        return Err(not_found());
    }
    let tenant = state
        .services
        .store
        .get_tenant(&tenant_id)
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(TenantView::from(&tenant)))
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/tenants", post(create_tenant).get(list_tenants))
        .route("/v1/tenants/{id}", get(get_tenant))
}
