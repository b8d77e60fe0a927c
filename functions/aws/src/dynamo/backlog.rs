//! Each tenant's waiting work on AWS: a counter item per tenant, moved by the handlers
//! as deliveries enter and leave the waiting set (SQS cannot count one tenant's
//! messages). A handler that dies between its state write and the counter's leaves the
//! figure off by one; it is a brake against runaway publishing, not a ledger.

use async_trait::async_trait;
use entrega_core::ids::TenantId;
use entrega_core::ports::{Backlog, StoreResult};

use super::*;

#[async_trait]
impl Backlog for DynamoStore {
    async fn tenant_backlog(&self, tenant: &TenantId) -> StoreResult<u64> {
        // Every shard in one eventually consistent batch read: a brake needs no more.
        let shard_keys: Vec<Item> = (0..keys::BACKLOG_SHARDS)
            .map(|shard| key(keys::backlog(tenant, shard)))
            .collect();
        let items = self.fetch_items(&shard_keys).await?;
        let waiting: i64 = items
            .iter()
            .filter_map(|i| i.get("waiting"))
            .filter_map(|v| v.as_n().ok())
            .filter_map(|v| v.parse::<i64>().ok())
            .sum();
        Ok(waiting.max(0) as u64)
    }

    async fn record(&self, tenant: &TenantId, delta: i64) -> StoreResult<()> {
        // A random shard: one tenant's two updates per delivery would otherwise all
        // land on one item, which takes about 1 000 writes a second.
        let shard = rand::random::<u8>() % keys::BACKLOG_SHARDS;
        self.client
            .update_item()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::backlog(tenant, shard))))
            .update_expression("ADD waiting :delta")
            .expression_attribute_values(":delta", n(delta))
            .send()
            .await
            .map_err(backend)?;
        Ok(())
    }
}
