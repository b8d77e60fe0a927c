//! Events in the outbox table, exactly as DESIGN.md's producer contract writes them.

use async_trait::async_trait;
use entrega_core::event::Event;
use entrega_core::ids::EventId;
use entrega_core::ports::{EventStore, Published, StoreResult};

use super::*;
use crate::outbox::{event_from_item, outbox_item};

#[async_trait]
impl EventStore for DynamoStore {
    async fn publish(&self, event: &Event) -> StoreResult<Published> {
        let result = self
            .client
            .put_item()
            .table_name(&self.outbox_table)
            .set_item(Some(outbox_item(
                event,
                Some(self.clock.now() + chrono::Duration::days(self.retention_days)),
            )))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match result {
            Ok(_) => Ok(Published::Created),
            Err(e) if is_condition_failure(&e) => {
                let existing = self.get_event(&event.id).await?.ok_or_else(|| {
                    entrega_core::ports::StoreError::Conflict(format!(
                        "event {} vanished",
                        event.id
                    ))
                })?;
                Ok(Published::Existing(existing))
            }
            Err(e) => Err(backend(e)),
        }
    }

    async fn get_event(&self, id: &EventId) -> StoreResult<Option<Event>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.outbox_table)
            .key(PK, s(id.as_str()))
            .consistent_read(true)
            .send()
            .await
            .map_err(backend)?;
        out.item()
            .map(|item| {
                event_from_item(item)
                    .map_err(|e| entrega_core::ports::StoreError::Backend(e.to_string()))
            })
            .transpose()
    }
}
