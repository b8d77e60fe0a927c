//! Small builders for the core's unit tests.

use chrono::Utc;

use crate::endpoint::{DeliveryMode, Endpoint, DEFAULT_MAX_CONCURRENCY, DEFAULT_TIMEOUT_MS};
use crate::ids::{EndpointId, TenantId};
use crate::retry::RetrySpec;
use crate::signature::Secret;

pub fn endpoint(event_types: Vec<String>) -> Endpoint {
    let now = Utc::now();
    Endpoint {
        id: EndpointId::generate(),
        tenant_id: TenantId::generate(),
        url: "https://hooks.example.com/".into(),
        event_types,
        mode: DeliveryMode::AtLeastOnce,
        retry: RetrySpec::default(),
        timeout_ms: DEFAULT_TIMEOUT_MS,
        max_concurrency: DEFAULT_MAX_CONCURRENCY,
        disabled: false,
        description: None,
        secret: Secret::generate(),
        previous_secret: None,
        created_at: now,
        updated_at: now,
        failing_since: None,
        disabled_reason: None,
    }
}
