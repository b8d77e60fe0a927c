//! Failure records and counters in DynamoDB.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnValue;
use entrega_core::failure::{Acknowledgement, Failure, FailureQuery, Reacknowledge};
use entrega_core::ids::{DeliveryId, FailureId};
use entrega_core::ports::{CounterStore, EventStore, FailureStore, Page, StoreError, StoreResult};

use super::*;

/// Reads and conditional writes an acknowledgement tries before reporting a conflict.
const ACK_TRIES: usize = 3;

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
        let mut item = key(keys::failure(&failure.id));
        item.insert("json".into(), to_json(&stored));
        // Every failure is in the admin's list, one partition of [`keys::BY_KIND`]:
        // failures are the rare case by design (a partition per day is the step if
        // they stop being); and a delivered resend finds its delivery's records.
        item.insert(
            keys::BY_TENANT.pk.into(),
            s(keys::tenant_failures(&failure.tenant_id)),
        );
        item.insert(keys::BY_TENANT.sk.into(), s(failure.id.as_str()));
        item.insert(keys::BY_KIND.pk.into(), s(keys::ALL_FAILURES));
        item.insert(keys::BY_KIND.sk.into(), s(failure.id.as_str()));
        item.insert(
            keys::BY_PARENT.pk.into(),
            s(keys::delivery_failures(&failure.delivery_id)),
        );
        item.insert(keys::BY_PARENT.sk.into(), s(failure.id.as_str()));
        if failure.acknowledged_at.is_none() {
            item.insert(keys::BY_ENDPOINT.pk.into(), s(keys::UNACKNOWLEDGED));
            item.insert(keys::BY_ENDPOINT.sk.into(), s(failure.id.as_str()));
        }
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

    async fn list_failures(&self, q: &FailureQuery) -> StoreResult<Page<Failure>> {
        let part = match &q.tenant {
            Some(t) => Partition::new(keys::BY_TENANT, keys::tenant_failures(t)),
            None => Partition::new(keys::BY_KIND, keys::ALL_FAILURES),
        };
        let keep = |item: &Item| match (q.acknowledged, from_json::<Failure>(item)) {
            (None, _) => true,
            (Some(want), Ok(f)) => f.acknowledged_at.is_some() == want,
            (Some(_), Err(_)) => false,
        };
        // No payloads in a list (the API shows them one failure at a time): a page is
        // one batch read, not one more read per row.
        self.page_of(
            &part,
            q.cursor.as_deref(),
            q.limit,
            &keep,
            from_json,
            |f: &Failure| f.id.to_string(),
        )
        .await
    }

    async fn oldest_unacknowledged(
        &self,
        limit: usize,
        after: Option<&str>,
    ) -> StoreResult<Page<Failure>> {
        let condition = if after.is_some() {
            "#pk = :pk AND #sk > :after"
        } else {
            "#pk = :pk"
        };
        let mut query = self
            .client
            .query()
            .table_name(&self.main_table)
            .index_name(keys::BY_ENDPOINT.name)
            .key_condition_expression(condition)
            .expression_attribute_names("#pk", keys::BY_ENDPOINT.pk)
            .expression_attribute_values(":pk", s(keys::UNACKNOWLEDGED))
            .scan_index_forward(true)
            .limit((limit + 1) as i32);
        if let Some(after) = after {
            query = query
                .expression_attribute_names("#sk", keys::BY_ENDPOINT.sk)
                .expression_attribute_values(":after", s(after));
        }
        let out = query.send().await.map_err(backend)?;
        // The index lags the table a little: keep only what is still unacknowledged.
        let data = self
            .fetch_items(out.items())
            .await?
            .iter()
            .map(from_json::<Failure>)
            .filter(|f| f.as_ref().is_ok_and(|f| f.acknowledged_at.is_none()))
            .collect::<Result<Vec<_>, _>>()?;
        let resume = out
            .last_evaluated_key()
            .and_then(|k| get_s(k, keys::BY_ENDPOINT.sk))
            .map(str::to_owned);
        Ok(Page::from_rows(data, limit, |f| f.id.to_string(), resume))
    }

    async fn failures_of_delivery(&self, delivery: &DeliveryId) -> StoreResult<Vec<Failure>> {
        let items = self
            .query_partition(
                Some(keys::BY_PARENT),
                keys::delivery_failures(delivery),
                None,
            )
            .await?;
        items.iter().map(from_json).collect()
    }

    async fn acknowledge_failure(
        &self,
        id: &FailureId,
        ack: &Acknowledgement,
        again: Reacknowledge,
    ) -> StoreResult<Option<Failure>> {
        for _ in 0..ACK_TRIES {
            let item = self.get_main(keys::failure(id)).await?;
            let Some(item) = item.as_ref() else {
                return Ok(None);
            };
            let read: Failure = from_json(item)?;
            if read.acknowledged_at.is_some() && again == Reacknowledge::KeepFirst {
                return Ok(Some(self.with_payload(read).await?));
            }
            let failure = read.acknowledged(ack);
            // Conditional on the record as read: two acknowledgements at once (a person
            // and a delivered resend) never lose one to the other unseen.
            let written = self
                .client
                .update_item()
                .table_name(&self.main_table)
                .set_key(Some(key(keys::failure(id))))
                .condition_expression("#json = :read")
                // Out of the unacknowledged index, with the acknowledgement.
                .update_expression("SET #json = :json REMOVE #unpk, #unsk")
                .expression_attribute_names("#json", "json")
                .expression_attribute_names("#unpk", keys::BY_ENDPOINT.pk)
                .expression_attribute_names("#unsk", keys::BY_ENDPOINT.sk)
                .expression_attribute_values(":json", to_json(&failure))
                .expression_attribute_values(":read", item["json"].clone())
                .send()
                .await;
            match written {
                Ok(_) => return Ok(Some(self.with_payload(failure).await?)),
                Err(e) if is_condition_failure(&e) => continue,
                Err(e) => return Err(backend(e)),
            }
        }
        Err(StoreError::Conflict(format!(
            "failure {id} kept changing; try again"
        )))
    }

    async fn get_failure(&self, id: &FailureId) -> StoreResult<Option<Failure>> {
        let item = self.get_main(keys::failure(id)).await?;
        let Some(item) = item.as_ref() else {
            return Ok(None);
        };
        Ok(Some(self.with_payload(from_json(item)?).await?))
    }
}

impl DynamoStore {
    /// Attach the payload, which lives once, in the event's outbox item.
    async fn with_payload(&self, mut failure: Failure) -> StoreResult<Failure> {
        if let Some(event) = self
            .get_event(&failure.tenant_id, &failure.event_id)
            .await?
        {
            failure.payload = event.payload;
        }
        Ok(failure)
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
            .set_key(Some(key(keys::counter(counter))))
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

    async fn increment_once(&self, counter: &str, token: &str, ttl: Duration) -> StoreResult<u64> {
        use aws_sdk_dynamodb::types::{Put, TransactWriteItem, Update};
        let expires = self.clock.now().timestamp() + ttl.as_secs() as i64;
        let mut marker = key(keys::remembered(token));
        marker.insert("value".into(), s("counted"));
        marker.insert(TTL_ATTRIBUTE.into(), n(expires));
        let claim = Put::builder()
            .table_name(&self.main_table)
            .set_item(Some(marker))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .expect("table and item are set");
        let count = Update::builder()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::counter(counter))))
            .update_expression("ADD #v :one SET #ttl = if_not_exists(#ttl, :exp)")
            .expression_attribute_names("#v", "value")
            .expression_attribute_names("#ttl", TTL_ATTRIBUTE)
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":exp", n(expires))
            .build()
            .expect("table, key and expression are set");
        // The token and the count commit together: counted once, or not at all.
        match self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(claim).build())
            .transact_items(TransactWriteItem::builder().update(count).build())
            .send()
            .await
        {
            Ok(_) => {}
            Err(e) if is_condition_failure(&e) => {}
            Err(e) => return Err(backend(e)),
        }
        let item = self.get_main(keys::counter(counter)).await?;
        Ok(item
            .as_ref()
            .and_then(|i| i.get("value"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    async fn remember_once(
        &self,
        remembered: &str,
        value: &str,
        ttl: Duration,
    ) -> StoreResult<Option<String>> {
        let now = self.clock.now().timestamp();
        let mut item = key(keys::remembered(remembered));
        item.insert("value".into(), s(value));
        item.insert(TTL_ATTRIBUTE.into(), n(now + ttl.as_secs() as i64));
        // DynamoDB deletes expired items lazily (up to days late): an expired one counts
        // as absent here.
        match self
            .client
            .put_item()
            .table_name(&self.main_table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk) OR #ttl < :now")
            .expression_attribute_names("#ttl", TTL_ATTRIBUTE)
            .expression_attribute_values(":now", n(now))
            .send()
            .await
        {
            Ok(_) => Ok(None),
            Err(e) if is_condition_failure(&e) => self.recall(remembered).await,
            Err(e) => Err(backend(e)),
        }
    }

    async fn forget(&self, remembered: &str) -> StoreResult<()> {
        self.client
            .delete_item()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::remembered(remembered))))
            .send()
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn recall(&self, remembered: &str) -> StoreResult<Option<String>> {
        let item = self.get_main(keys::remembered(remembered)).await?;
        let now = self.clock.now().timestamp();
        Ok(item
            .as_ref()
            .filter(|i| {
                i.get(TTL_ATTRIBUTE)
                    .and_then(|v| v.as_n().ok())
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_none_or(|exp| exp >= now)
            })
            .and_then(|i| get_s(i, "value"))
            .map(str::to_owned))
    }
}
