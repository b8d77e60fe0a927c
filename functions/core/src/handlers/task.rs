//! The delivery queue's message: which delivery to attempt, of which generation.

use serde::{Deserialize, Serialize};

use crate::delivery::Delivery;
use crate::ids::{DeliveryId, EndpointId, TenantId};
use crate::ports::OutgoingMessage;

/// Kept small (ids only): the store holds the payload, so a message never nears the
/// queue's size limit whatever the event's size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryTask {
    pub delivery_id: DeliveryId,
    pub tenant_id: TenantId,
    pub endpoint_id: EndpointId,
    pub generation: u32,
    /// When a resend queued this (unix ms), before writing its generation: the worker
    /// waits for that write counting from here. The delivery's own `updated_at` is the
    /// old generation's, which may be long past; counting from it dropped every resend
    /// of a delivery untouched for a minute whose message the worker saw first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resent_at_ms: Option<i64>,
    /// The resend's token ([`Delivery::resend_token`]): of two messages naming one
    /// generation, the one whose resend lost the race to write it carries another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resend_token: Option<u64>,
}

impl DeliveryTask {
    pub fn for_delivery(delivery: &Delivery) -> Self {
        Self {
            delivery_id: delivery.id.clone(),
            tenant_id: delivery.tenant_id.clone(),
            endpoint_id: delivery.endpoint_id.clone(),
            generation: delivery.generation,
            resent_at_ms: None,
            resend_token: delivery.resend_token,
        }
    }

    /// The task of a resend's new generation, queued at `now`.
    pub fn for_resend(delivery: &Delivery, now: chrono::DateTime<chrono::Utc>) -> Self {
        Self {
            resent_at_ms: Some(now.timestamp_millis()),
            ..Self::for_delivery(delivery)
        }
    }

    /// The queue message: grouped by tenant (fairness), at most `cap` of one endpoint's
    /// handed out at once (where the queue can hold a cap; the worker's slots hold it
    /// everywhere).
    pub fn message(&self, cap: u32, delay: std::time::Duration) -> OutgoingMessage {
        OutgoingMessage {
            body: serde_json::to_string(self).expect("a task serialises"),
            group: self.tenant_id.to_string(),
            delay,
            concurrency_key: Some(self.endpoint_id.to_string()),
            concurrency_limit: cap,
        }
    }
}
