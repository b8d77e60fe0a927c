//! API errors as RFC 9457 `application/problem+json`, each naming what was wrong.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use entrega_core::ports::StoreError;
use serde::Serialize;

/// An error the API returns. Nothing a client sends may produce a 5xx: only a failing
/// backend does, and then with a generic detail (internals stay in the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub title: &'static str,
    pub detail: String,
    /// The request field at fault, when there is one.
    pub field: Option<String>,
    /// Seconds to wait, for 429 and 503.
    pub retry_after: Option<u64>,
    /// For a 503: what failed, for the process's conditions (never shown to clients).
    pub backend_failure: Option<String>,
}

/// The response extension a 503 carries: what the store said, so a middleware can
/// track the condition (logged once, reported by `/healthz`) without logging per
/// request.
#[derive(Debug, Clone)]
pub struct BackendFailure(pub String);

/// How long a client should wait after a 503 before retrying.
pub const BACKEND_RETRY_AFTER_S: u64 = 5;

#[derive(Serialize)]
struct ProblemBody<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            title,
            detail: detail.into(),
            field: None,
            retry_after: None,
            backend_failure: None,
        }
    }

    /// An error answer made outside the handlers (axum's own rejections), with its
    /// status and what it said.
    pub fn from_status(status: StatusCode, detail: impl Into<String>) -> Self {
        Self::new(status, status.canonical_reason().unwrap_or("Error"), detail)
    }

    /// A field's value is not acceptable (422).
    pub fn invalid(field: &str, detail: impl std::fmt::Display) -> Self {
        let mut e = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid field",
            format!("`{field}`: {detail}"),
        );
        e.field = Some(field.to_owned());
        e
    }

    /// A query parameter or body field that cannot be used at all (400), named.
    pub fn bad_parameter(field: &str, detail: impl std::fmt::Display) -> Self {
        let mut e = Self::bad_request(format!("`{field}`: {detail}"));
        e.field = Some(field.to_owned());
        e
    }

    /// The body is not the JSON this route takes (400).
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Bad request", detail)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "send `Authorization: Bearer <api key>` with a valid key",
        )
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", detail)
    }

    /// Also what another tenant's resource looks like: it does not exist for you.
    pub fn not_found(what: &str, id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "Not found",
            format!("no {what} `{id}`"),
        )
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "Conflict", detail)
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Payload too large",
            format!("the request body is over the limit of {limit} bytes"),
        )
    }

    /// The request body did not arrive whole in time (408).
    pub fn body_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "Request timeout",
            super::extract::BodyTooSlow.to_string(),
        )
    }

    pub fn too_many_requests(retry_after: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many requests",
            format!("rate limit reached; retry in {retry_after} s"),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// The tenant's undelivered backlog is at the limit (429 with `Retry-After`).
    pub fn backlog_full(backlog: u64, retry_after: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "Backlog full",
            format!(
                "{backlog} deliveries of this tenant are waiting, the most the server takes \
                 (--max-backlog); retry in {retry_after} s, once they drain"
            ),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// The store could not do it (503 with `Retry-After`); `reason` stays internal.
    pub fn backend(reason: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Backend unavailable",
            "the store could not complete the request; nothing already accepted was lost, retry it",
        );
        e.retry_after = Some(BACKEND_RETRY_AFTER_S);
        e.backend_failure = Some(reason.into());
        e
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(detail) => Self::conflict(detail),
            StoreError::Backend(detail) => Self::backend(detail),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ProblemBody {
            kind: "about:blank",
            title: self.title,
            status: self.status.as_u16(),
            detail: &self.detail,
            field: self.field.as_deref(),
        };
        let mut response = (
            self.status,
            serde_json::to_string(&body).expect("a problem serialises"),
        )
            .into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(reason) = self.backend_failure {
            response.extensions_mut().insert(BackendFailure(reason));
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
