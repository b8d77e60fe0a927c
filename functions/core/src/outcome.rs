//! What an attempt's result means: success, or a kind of failure.
//!
//! Failure kinds are an enum, not strings, so the retry policy, the metrics and the
//! delivery log all agree on what happened. Only 200–299 is success; a redirect is a
//! failure and is never followed (following it would send a signed payload to a URL
//! the tenant never registered).

use serde::{Deserialize, Serialize};

/// Why an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// No complete response within the endpoint's timeout.
    Timeout,
    /// The receiver's host refused or reset the connection.
    ConnectionRefused,
    /// The host name did not resolve.
    Dns,
    /// The TLS handshake failed (bad certificate, protocol mismatch).
    Tls,
    /// Any other transport error (connection dropped mid-response, protocol error).
    Transport,
    /// A 3xx answer. Never followed.
    Redirect,
    /// A 4xx answer.
    ClientError,
    /// A 5xx answer.
    ServerError,
    /// A status outside 200–599 (1xx as a final answer, non-standard codes).
    UnexpectedStatus,
    /// The SSRF guard refused the target address: a configuration problem, not a
    /// passing fault, so it is never retried.
    TargetRefused,
    /// The attempt started but its outcome is unknown (the worker crashed mid-send).
    Interrupted,
}

impl FailureKind {
    /// Every kind (for what is kept per kind, such as a metric's series).
    pub const ALL: [Self; 11] = [
        Self::Timeout,
        Self::ConnectionRefused,
        Self::Dns,
        Self::Tls,
        Self::Transport,
        Self::Redirect,
        Self::ClientError,
        Self::ServerError,
        Self::UnexpectedStatus,
        Self::TargetRefused,
        Self::Interrupted,
    ];

    /// The kind a final HTTP status means, or `None` for success.
    pub fn from_status(status: u16) -> Option<Self> {
        match status {
            200..=299 => None,
            300..=399 => Some(Self::Redirect),
            400..=499 => Some(Self::ClientError),
            500..=599 => Some(Self::ServerError),
            _ => Some(Self::UnexpectedStatus),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::ConnectionRefused => "connection_refused",
            Self::Dns => "dns",
            Self::Tls => "tls",
            Self::Transport => "transport",
            Self::Redirect => "redirect",
            Self::ClientError => "client_error",
            Self::ServerError => "server_error",
            Self::UnexpectedStatus => "unexpected_status",
            Self::TargetRefused => "target_refused",
            Self::Interrupted => "interrupted",
        }
    }
}

/// What the transport saw, before any policy is applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransportResult {
    /// A final HTTP response arrived.
    Response {
        status: u16,
        /// The raw `Retry-After` header, if any.
        retry_after: Option<String>,
        /// The first bytes of the body, lossily decoded, for the delivery log.
        excerpt: String,
    },
    /// No response: the request failed in transport.
    Failed { kind: FailureKind, message: String },
}

impl TransportResult {
    /// `None` on success, otherwise the kind of failure.
    pub fn failure_kind(&self) -> Option<FailureKind> {
        match self {
            Self::Response { status, .. } => FailureKind::from_status(*status),
            Self::Failed { kind, .. } => Some(*kind),
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Response { status, .. } => Some(*status),
            Self::Failed { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_2xx_is_success() {
        for status in [200, 201, 204, 299] {
            assert_eq!(FailureKind::from_status(status), None);
        }
        assert_eq!(FailureKind::from_status(302), Some(FailureKind::Redirect));
        assert_eq!(FailureKind::from_status(304), Some(FailureKind::Redirect));
        assert_eq!(
            FailureKind::from_status(400),
            Some(FailureKind::ClientError)
        );
        assert_eq!(
            FailureKind::from_status(429),
            Some(FailureKind::ClientError)
        );
        assert_eq!(
            FailureKind::from_status(503),
            Some(FailureKind::ServerError)
        );
        assert_eq!(
            FailureKind::from_status(101),
            Some(FailureKind::UnexpectedStatus)
        );
        assert_eq!(
            FailureKind::from_status(600),
            Some(FailureKind::UnexpectedStatus)
        );
    }

    #[test]
    fn transport_failures_keep_their_kind() {
        let r = TransportResult::Failed {
            kind: FailureKind::Dns,
            message: "no such host".into(),
        };
        assert_eq!(r.failure_kind(), Some(FailureKind::Dns));
        assert_eq!(r.status(), None);
        let ok = TransportResult::Response {
            status: 204,
            retry_after: None,
            excerpt: String::new(),
        };
        assert_eq!(ok.failure_kind(), None);
        assert_eq!(
            FailureKind::ConnectionRefused.as_str(),
            "connection_refused"
        );
    }
}
