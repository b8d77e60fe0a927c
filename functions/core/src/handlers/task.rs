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
}

impl DeliveryTask {
    pub fn for_delivery(delivery: &Delivery) -> Self {
        Self {
            delivery_id: delivery.id.clone(),
            tenant_id: delivery.tenant_id.clone(),
            endpoint_id: delivery.endpoint_id.clone(),
            generation: delivery.generation,
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
