//! Telling humans: who a notice is for, what it is about, and the port that sends it
//! (SNS and SES on AWS; the alert webhook, SMTP or the log embedded).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreResult;
use crate::ids::TenantId;

/// Who a notice is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "to", rename_all = "snake_case")]
pub enum Audience {
    /// On-call (SNS topic; the embedded alert webhook).
    OnCall,
    /// The tenant's owner (e-mail on AWS; a logged notice embedded).
    Owner { email: String },
}

/// What a notice is about. Its name (`as_str`, the same in JSON) is what alert
/// receivers, mail filters and the log see, so a variant is never renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// On-call: a tenant's failures passed the hourly threshold.
    FailureThreshold,
    /// On-call: a failure has waited 24 hours unacknowledged.
    FailureUnacknowledged,
    /// The owner: a delivery used up every retry of its policy.
    DeliveryExhausted,
    /// The owner: a delivery failed for good without using up retries (its policy
    /// does not retry the failure, or its endpoint takes each event at most once).
    DeliveryFailed,
    /// The owner: an endpoint was disabled.
    EndpointDisabled,
}

impl NoticeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailureThreshold => "failure_threshold",
            Self::FailureUnacknowledged => "failure_unacknowledged",
            Self::DeliveryExhausted => "delivery_exhausted",
            Self::DeliveryFailed => "delivery_failed",
            Self::EndpointDisabled => "endpoint_disabled",
        }
    }
}

impl std::fmt::Display for NoticeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something a human must hear about (an alert or an owner notice).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    pub kind: NoticeKind,
    pub audience: Audience,
    pub tenant_id: TenantId,
    pub summary: String,
    pub details: serde_json::Value,
}

#[async_trait]
pub trait Notifier: Send + Sync {
    async fn notify(&self, notice: &Notice) -> StoreResult<()>;
}
