//! Each tenant's waiting work on AWS: a counter item per tenant, moved by the handlers
//! as deliveries enter and leave the waiting set (SQS cannot count one tenant's
//! messages). A handler that dies between its state write and the counter's leaves the
//! figure off by one; it is a brake against runaway publishing, not a ledger.

use async_trait::async_trait;
use entrega_core::ids::TenantId;
use entrega_core::ports::{Backlog, StoreResult};

use super::*;

fn backlog_pk(tenant: &TenantId) -> String {
    format!("BACKLOG#{tenant}")
}

#[async_trait]
impl Backlog for DynamoStore {
    async fn tenant_backlog(&self, tenant: &TenantId) -> StoreResult<u64> {
        let item = self.get_main(backlog_pk(tenant)).await?;
        Ok(item
            .as_ref()
            .and_then(|i| i.get("waiting"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .map_or(0, |v| v.max(0) as u64))
    }

    async fn record(&self, tenant: &TenantId, delta: i64) -> StoreResult<()> {
        self.client
            .update_item()
            .table_name(&self.main_table)
            .set_key(Some(key(backlog_pk(tenant))))
            .update_expression("ADD waiting :delta")
            .expression_attribute_values(":delta", n(delta))
            .send()
            .await
            .map_err(backend)?;
        Ok(())
    }
}
