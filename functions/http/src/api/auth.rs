//! Bearer-key authentication and tenant isolation.
//!
//! Keys are looked up by their SHA-256 hash; the key itself is never stored or logged.
//! A tenant key sees only its tenant's resources, and another tenant's resource is a
//! 404 (not a 403), so ids cannot be probed across tenants.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use entrega_core::ids::TenantId;
use entrega_core::tenant::{hash_api_key, Principal};

use super::problem::{ApiError, ApiResult};
use super::AppState;

/// Who is calling, established from the `Authorization` header.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: Principal,
    /// The key's hash: identifies the caller for rate limits and audit without the key.
    pub key_hash: String,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let key = bearer_key(&parts.headers)?.ok_or_else(ApiError::unauthorized)?;
        let key_hash = hash_api_key(key);
        let principal = state
            .services
            .store
            .principal_for_key(&key_hash)
            .await?
            .ok_or_else(ApiError::unauthorized)?;
        Ok(Caller {
            principal,
            key_hash,
        })
    }
}

/// The bearer token of the request's `Authorization` header, if it has one; 400 for
/// two headers. Why refuse rather than take the first: which key would it be? A
/// tenant's key then the admin's acted as the tenant, the other order as the admin.
pub fn bearer_key(headers: &axum::http::HeaderMap) -> ApiResult<Option<&str>> {
    if headers.get_all(AUTHORIZATION).iter().nth(1).is_some() {
        return Err(ApiError::bad_request(
            "give one `Authorization` header, with one API key",
        ));
    }
    // The scheme is case-insensitive (RFC 9110, 11.1): `bearer <key>` is the same.
    Ok(headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim())
        .filter(|k| !k.is_empty()))
}

impl Caller {
    pub fn is_admin(&self) -> bool {
        self.principal == Principal::Admin
    }

    /// Who this is, for the log of a resend: `admin` or `tenant:<id>`.
    pub fn label(&self) -> String {
        match &self.principal {
            Principal::Admin => "admin".to_owned(),
            Principal::Tenant(t) => format!("tenant:{t}"),
        }
    }

    pub fn require_admin(&self) -> ApiResult<()> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(ApiError::forbidden("this route needs an admin key"))
        }
    }

    /// Whether a resource of `tenant` exists for this caller.
    pub fn can_see(&self, tenant: &TenantId) -> bool {
        match &self.principal {
            Principal::Admin => true,
            Principal::Tenant(own) => own == tenant,
        }
    }

    /// The tenant a list is limited to: the caller's own, or for admin the one asked
    /// for (`None`: all tenants). A tenant key naming another tenant is a 422, as it
    /// is when it publishes: it answered its own list, or an empty one.
    pub fn list_scope(&self, asked: Option<TenantId>) -> ApiResult<Option<TenantId>> {
        match &self.principal {
            Principal::Admin => Ok(asked),
            Principal::Tenant(_) => self.owning_tenant(asked).map(Some),
        }
    }

    /// [`Self::owning_tenant`], and for the admin, a tenant that exists: an event of a
    /// tenant nobody created would be accepted and never seen again. (A tenant's own
    /// key always names an existing one, so publishing reads nothing more for it.)
    pub async fn owning_existing_tenant(
        &self,
        state: &AppState,
        asked: Option<TenantId>,
    ) -> ApiResult<TenantId> {
        let tenant = self.owning_tenant(asked)?;
        if self.is_admin() && state.services.store.get_tenant(&tenant).await?.is_none() {
            return Err(ApiError::invalid("tenant_id", "no such tenant"));
        }
        Ok(tenant)
    }

    /// The tenant a new resource belongs to: the caller's own; an admin must name one.
    pub fn owning_tenant(&self, asked: Option<TenantId>) -> ApiResult<TenantId> {
        match (&self.principal, asked) {
            (Principal::Tenant(own), None) => Ok(own.clone()),
            (Principal::Tenant(own), Some(t)) if &t == own => Ok(t),
            (Principal::Tenant(_), Some(_)) => Err(ApiError::invalid(
                "tenant_id",
                "a tenant key acts only for its own tenant",
            )),
            (Principal::Admin, Some(t)) => Ok(t),
            (Principal::Admin, None) => Err(ApiError::invalid(
                "tenant_id",
                "an admin key must say which tenant the resource belongs to",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    fn key_of(authorization: &str) -> Option<String> {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(authorization).unwrap());
        bearer_key(&headers).unwrap().map(str::to_owned)
    }

    /// The scheme's case does not matter (a hostile test's `bearer <key>` got 401);
    /// another scheme, or none, is no key.
    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for header in ["Bearer k1", "bearer k1", "BEARER k1", "Bearer  k1 "] {
            assert_eq!(key_of(header).as_deref(), Some("k1"), "{header}");
        }
        for header in ["Basic k1", "Bearerk1", "k1", "Bearer ", "Bearer"] {
            assert_eq!(key_of(header), None, "{header}");
        }
    }
}
