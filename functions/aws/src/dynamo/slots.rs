//! Slots (an endpoint's cap, the slow endpoints' share) on DynamoDB: one item per slot, taken by a conditional write that
//! succeeds only on a free or expired slot, so two invocations never hold one slot.
//! Probing a few random slots (not all of them) bounds what a busy endpoint costs: a
//! failed conditional write is billed like a successful one.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use entrega_core::ports::StoreResult;
use entrega_core::slots::{EndpointSlots, SlotLease, SlotPool};

use super::*;

/// Slots one acquire tries before it reports the endpoint busy.
pub const SLOT_PROBES: u32 = 3;
/// A slot item outlives its lease by this much before TTL removes it: it is rewritten
/// in place while the endpoint is busy, and disappears when it has been idle a day.
const SLOT_ITEM_TTL: chrono::Duration = chrono::Duration::days(1);

#[async_trait]
impl EndpointSlots for DynamoStore {
    async fn acquire(
        &self,
        pool: &SlotPool,
        limit: u32,
        holder: &str,
        now: DateTime<Utc>,
        lease: std::time::Duration,
    ) -> StoreResult<Option<SlotLease>> {
        let limit = limit.max(1);
        let until = now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX);
        let first = rand::random::<u32>() % limit;
        for probe in 0..SLOT_PROBES.min(limit) {
            let slot = (first + probe) % limit;
            let taken = self
                .client
                .update_item()
                .table_name(&self.main_table)
                .set_key(Some(key(keys::slot(pool, slot))))
                .update_expression("SET holder = :holder, lease_until = :until, #ttl = :ttl")
                // Our own holder too: an SDK retry of a write that was applied, but
                // whose answer was lost, must find the slot ours, not taken.
                .condition_expression(
                    "attribute_not_exists(lease_until) OR lease_until <= :now OR holder = :holder",
                )
                .expression_attribute_names("#ttl", TTL_ATTRIBUTE)
                .expression_attribute_values(":holder", s(holder))
                .expression_attribute_values(":until", n(until.timestamp_millis()))
                .expression_attribute_values(":now", n(now.timestamp_millis()))
                .expression_attribute_values(":ttl", n((until + SLOT_ITEM_TTL).timestamp()))
                .send()
                .await;
            match taken {
                Ok(_) => {
                    return Ok(Some(SlotLease {
                        pool: pool.clone(),
                        slot,
                        holder: holder.to_owned(),
                        until,
                    }))
                }
                Err(e) if is_condition_failure(&e) => continue,
                Err(e) => return Err(backend(e)),
            }
        }
        Ok(None)
    }

    async fn release(&self, lease: &SlotLease) -> StoreResult<()> {
        let released = self
            .client
            .update_item()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::slot(&lease.pool, lease.slot))))
            .update_expression("REMOVE holder, lease_until")
            .condition_expression("holder = :holder")
            .expression_attribute_values(":holder", s(lease.holder.clone()))
            .send()
            .await;
        match released {
            Ok(_) => Ok(()),
            // Our lease ran out and another attempt holds the slot now: it is theirs.
            Err(e) if is_condition_failure(&e) => Ok(()),
            Err(e) => Err(backend(e)),
        }
    }
}
