//! Events in the outbox table, exactly as DESIGN.md's producer contract writes them.

use async_trait::async_trait;
use entrega_core::event::Event;
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::{EventStore, OutboxPage, Published, StoreResult};

use super::*;
use crate::outbox::{event_from_item, outbox_item, outbox_key};

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
                let existing = self
                    .get_event(&event.tenant_id, &event.id)
                    .await?
                    .ok_or_else(|| {
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

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> StoreResult<Option<Event>> {
        if let Some(event) = self.outbox_get(outbox_key(tenant, id)).await? {
            return Ok(Some(event));
        }
        // A producer may have written the bare id: it is this tenant's only if the
        // item says so.
        Ok(self
            .outbox_get(id.to_string())
            .await?
            .filter(|e| &e.tenant_id == tenant))
    }

    /// The outbox scanned in pages (a replay walks it once; it holds the retention's
    /// events, and a page is bounded).
    async fn outbox_page(
        &self,
        since: chrono::DateTime<chrono::Utc>,
        cursor: Option<&str>,
        limit: usize,
    ) -> StoreResult<OutboxPage> {
        let out = self
            .client
            .scan()
            .table_name(&self.outbox_table)
            .limit(limit.clamp(1, 1000) as i32)
            .set_exclusive_start_key(cursor.map(|pk| HashMap::from([(PK.to_owned(), s(pk))])))
            .send()
            .await
            .map_err(backend)?;
        let mut page = OutboxPage::default();
        for item in out.items() {
            match event_from_item(item) {
                Ok(event) if event.created_at >= since => page.events.push(event),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(
                        pk = get_s(item, PK).unwrap_or_default(),
                        error = %e,
                        "a malformed outbox item is not replayed"
                    );
                    page.malformed += 1;
                }
            }
        }
        Ok(OutboxPage {
            next_cursor: out
                .last_evaluated_key()
                .and_then(|k| get_s(k, PK))
                .map(str::to_owned),
            ..page
        })
    }
}

impl DynamoStore {
    async fn outbox_get(&self, pk: String) -> StoreResult<Option<Event>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.outbox_table)
            .key(PK, s(pk))
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
