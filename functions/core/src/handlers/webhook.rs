//! Building the signed request of one attempt (Standard Webhooks headers).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::endpoint::Endpoint;
use crate::event::Event;
use crate::ports::SignedRequest;
use crate::signature::signature_header;

/// `user-agent` of every attempt.
pub const USER_AGENT: &str = concat!("Entrega/", env!("CARGO_PKG_VERSION"));

/// The request for an attempt made at `now`: freshly timestamped and signed by every
/// active secret, with the event id as both `webhook-id` and `idempotency-key` so the
/// receiver can drop duplicates across retries and resends.
pub fn signed_request(endpoint: &Endpoint, event: &Event, now: DateTime<Utc>) -> SignedRequest {
    let body = event.webhook_body();
    let timestamp = now.timestamp();
    let signature = signature_header(
        endpoint.signing_secrets(now),
        event.id.as_str(),
        timestamp,
        body.as_bytes(),
    );
    SignedRequest {
        url: endpoint.url.clone(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("webhook-id".into(), event.id.to_string()),
            ("idempotency-key".into(), event.id.to_string()),
            ("webhook-timestamp".into(), timestamp.to_string()),
            ("webhook-signature".into(), signature),
            ("user-agent".into(), USER_AGENT.into()),
        ],
        body,
        timeout: Duration::from_millis(u64::from(endpoint.timeout_ms)),
    }
}
