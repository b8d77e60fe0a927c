//! `POST /v1/tenants` (admin): create a tenant and its first API key.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use entrega_core::ids::TenantId;
use entrega_core::ports::StoreError;
use entrega_core::tenant::{generate_api_key, hash_api_key, Tenant};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::extract::JsonBody;
use super::problem::{ApiError, ApiResult};
use super::views::tenant_view;
use super::AppState;

/// Longest tenant name.
const MAX_NAME_LEN: usize = 200;
/// Longest e-mail address (RFC 5321 path limit).
const MAX_EMAIL_LEN: usize = 254;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTenant {
    name: String,
    owner_email: String,
    id: Option<TenantId>,
}

#[tracing::instrument(skip_all, fields(tenant_id))]
async fn create_tenant(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateTenant>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    caller.require_admin()?;
    let name = body.name.trim();
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(ApiError::invalid("name", "must be 1 to 200 characters"));
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
        Json(json!({ "tenant": tenant_view(&tenant), "api_key": api_key })),
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

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/tenants", post(create_tenant))
}
