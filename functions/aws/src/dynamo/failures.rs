//! Failure records and counters in DynamoDB.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnValue;
use entrega_core::failure::Failure;
use entrega_core::ids::FailureId;
use entrega_core::ports::{CounterStore, EventStore, FailureStore, StoreError, StoreResult};

use super::*;

fn failure_pk(id: &FailureId) -> String {
    format!("FAIL#{id}")
}

#[async_trait]
impl FailureStore for DynamoStore {
    async fn put_failure_if_absent(&self, failure: &Failure) -> StoreResult<bool> {
        // The payload stays where it already is, in the event's outbox item (kept as
        // long): copied in here, escaped inside JSON, a 256 KiB payload could pass
        // DynamoDB's 400 KB item limit.
        let stored = Failure {
            payload: String::new(),
            ..failure.clone()
        };
        let mut item = key(failure_pk(&failure.id));
        item.insert("json".into(), to_json(&stored));
        item.insert("tenant_id".into(), s(failure.tenant_id.as_str()));
        item.insert("gsi1pk".into(), s(format!("TF#{}", failure.tenant_id)));
        item.insert("gsi1sk".into(), s(failure.id.as_str()));
        item.insert(TTL_ATTRIBUTE.into(), self.expires_at());
        match self
            .client
            .put_item()
            .table_name(&self.main_table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failure(&e) => Ok(false),
            Err(e) => Err(backend(e)),
        }
    }

    async fn get_failure(&self, id: &FailureId) -> StoreResult<Option<Failure>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.main_table)
            .set_key(Some(key(failure_pk(id))))
            .consistent_read(true)
            .send()
            .await
            .map_err(backend)?;
        let Some(item) = out.item() else {
            return Ok(None);
        };
        let mut failure: Failure = from_json(item)?;
        if let Some(event) = self.get_event(&failure.event_id).await? {
            failure.payload = event.payload;
        }
        Ok(Some(failure))
    }
}

#[async_trait]
impl CounterStore for DynamoStore {
    async fn increment(&self, counter: &str, ttl: Duration) -> StoreResult<u64> {
        let expires = self.clock.now().timestamp() + ttl.as_secs() as i64;
        let out = self
            .client
            .update_item()
            .table_name(&self.main_table)
            .set_key(Some(key(format!("CNT#{counter}"))))
            .update_expression("ADD #v :one SET #ttl = if_not_exists(#ttl, :exp)")
            .expression_attribute_names("#v", "value")
            .expression_attribute_names("#ttl", TTL_ATTRIBUTE)
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":exp", n(expires))
            .return_values(ReturnValue::UpdatedNew)
            .send()
            .await
            .map_err(backend)?;
        out.attributes()
            .and_then(|a| a.get("value"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| StoreError::Backend("the counter update returned no value".into()))
    }
}
