//! Deliveries and attempts in DynamoDB.
//!
//! A delivery item is indexed four ways: by tenant (gsi1), endpoint (gsi2), day
//! (gsi3, the admin's all-tenants log) and event (gsi4). Attempts live in the
//! delivery's own partition, so "the row plus every attempt" is one Query.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use chrono::{DateTime, Duration as ChronoDuration, TimeZone, Utc};
use entrega_core::delivery::{Attempt, Delivery, DeliveryState};
use entrega_core::event::format_timestamp;
use entrega_core::ids::{DeliveryId, EndpointId, EventId, TenantId};
use entrega_core::ports::{DeliveryQuery, DeliveryStore, Page, StoreError, StoreResult};

use super::*;

fn delivery_pk(id: &DeliveryId) -> String {
    format!("DLV#{id}")
}

/// The deliveries of one event: event ids are scoped to their tenant.
fn event_partition(tenant: &TenantId, event: &EventId) -> String {
    format!("EV#{tenant}#{event}")
}

/// The day partition a delivery id falls in (from the time inside the id).
fn day_of(id_ms: i64) -> String {
    Utc.timestamp_millis_opt(id_ms)
        .single()
        .unwrap_or_default()
        .format("D#%Y-%m-%d")
        .to_string()
}

impl DynamoStore {
    fn delivery_item(&self, d: &Delivery) -> Item {
        let mut item = key(delivery_pk(&d.id));
        let id = d.id.as_str();
        item.extend([
            ("json".to_owned(), to_json(d)),
            ("version".to_owned(), n(d.version)),
            ("tenant_id".to_owned(), s(d.tenant_id.as_str())),
            ("endpoint_id".to_owned(), s(d.endpoint_id.as_str())),
            ("event_type".to_owned(), s(d.event_type.clone())),
            ("state".to_owned(), s(d.state.as_str())),
            ("status".to_owned(), s(d.state.status().as_str())),
            ("created_at".to_owned(), s(format_timestamp(d.created_at))),
            ("gsi1pk".to_owned(), s(format!("T#{}", d.tenant_id))),
            ("gsi1sk".to_owned(), s(id)),
            ("gsi2pk".to_owned(), s(format!("E#{}", d.endpoint_id))),
            ("gsi2sk".to_owned(), s(id)),
            ("gsi3pk".to_owned(), s(day_of(d.id.timestamp_ms()))),
            ("gsi3sk".to_owned(), s(id)),
            (
                "gsi4pk".to_owned(),
                s(event_partition(&d.tenant_id, &d.event_id)),
            ),
            ("gsi4sk".to_owned(), s(id)),
            (TTL_ATTRIBUTE.to_owned(), self.expires_at()),
        ]);
        item
    }

    fn attempt_item(&self, a: &Attempt) -> Item {
        Item::from([
            (PK.to_owned(), s(delivery_pk(&a.delivery_id))),
            (
                SK.to_owned(),
                s(format!("ATT#{:05}#{:05}#{}", a.generation, a.number, a.id)),
            ),
            ("json".to_owned(), to_json(a)),
            // Per-endpoint statistics read an endpoint's attempts by time.
            ("gsi2pk".to_owned(), s(format!("EA#{}", a.endpoint_id))),
            (
                "gsi2sk".to_owned(),
                s(format!("{}#{}", format_timestamp(a.started_at), a.id)),
            ),
            (TTL_ATTRIBUTE.to_owned(), self.expires_at()),
        ])
    }
}

/// Whether an item passes the query's non-key filters.
fn matches(item: &Item, q: &DeliveryQuery) -> bool {
    let eq = |attr: &str, want: Option<&str>| want.is_none_or(|w| get_s(item, attr) == Some(w));
    let created = get_s(item, "created_at").unwrap_or("");
    eq("tenant_id", q.tenant.as_ref().map(|t| t.as_str()))
        && eq("endpoint_id", q.endpoint_id.as_ref().map(|e| e.as_str()))
        && eq("event_type", q.event_type.as_deref())
        && eq("status", q.status.map(|s| s.as_str()))
        && q.since
            .is_none_or(|s| created >= format_timestamp(s).as_str())
        && q.until
            .is_none_or(|u| created < format_timestamp(u).as_str())
}

#[async_trait]
impl DeliveryStore for DynamoStore {
    async fn create_delivery_if_absent(
        &self,
        delivery: &Delivery,
    ) -> StoreResult<(Delivery, bool)> {
        let result = self
            .client
            .put_item()
            .table_name(&self.main_table)
            .set_item(Some(self.delivery_item(delivery)))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match result {
            Ok(_) => Ok((delivery.clone(), true)),
            Err(e) if is_condition_failure(&e) => self
                .get_delivery(&delivery.id)
                .await?
                .map(|stored| (stored, false))
                .ok_or_else(|| StoreError::Conflict(format!("delivery {} vanished", delivery.id))),
            Err(e) => Err(backend(e)),
        }
    }

    async fn get_delivery(&self, id: &DeliveryId) -> StoreResult<Option<Delivery>> {
        self.get_main(delivery_pk(id))
            .await?
            .as_ref()
            .map(from_json)
            .transpose()
    }

    async fn save_delivery(
        &self,
        delivery: &Delivery,
        attempts: &[Attempt],
    ) -> StoreResult<Delivery> {
        let mut next = delivery.clone();
        next.version += 1;
        let put = Put::builder()
            .table_name(&self.main_table)
            .set_item(Some(self.delivery_item(&next)))
            .condition_expression("#v = :expected")
            .expression_attribute_names("#v", "version")
            .expression_attribute_values(":expected", n(delivery.version))
            .build()
            .expect("table and item are set");
        // The state and the attempts that led to it commit together (one transaction),
        // so the log never shows a state without the attempt that explains it.
        let mut tx = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(put).build());
        for a in attempts {
            let put = Put::builder()
                .table_name(&self.main_table)
                .set_item(Some(self.attempt_item(a)))
                .build()
                .expect("table and item are set");
            tx = tx.transact_items(TransactWriteItem::builder().put(put).build());
        }
        tx.send().await.map_err(|e| {
            if is_condition_failure(&e) {
                StoreError::Conflict(format!("delivery {} changed meanwhile", delivery.id))
            } else {
                backend(e)
            }
        })?;
        Ok(next)
    }

    async fn append_attempts(&self, attempts: &[Attempt]) -> StoreResult<()> {
        for a in attempts {
            self.client
                .put_item()
                .table_name(&self.main_table)
                .set_item(Some(self.attempt_item(a)))
                .send()
                .await
                .map_err(backend)?;
        }
        Ok(())
    }

    async fn list_attempts(&self, id: &DeliveryId) -> StoreResult<Vec<Attempt>> {
        let items = self
            .query_partition(None, PK, delivery_pk(id), Some((SK, "ATT#")))
            .await?;
        items.iter().map(from_json).collect()
    }

    async fn list_deliveries(&self, q: &DeliveryQuery) -> StoreResult<Page<Delivery>> {
        let partitions: Vec<Partition> = if let Some(ep) = &q.endpoint_id {
            vec![Partition {
                index: Some("gsi2"),
                pk_attr: "gsi2pk",
                pk: format!("E#{ep}"),
                sk_attr: "gsi2sk",
            }]
        } else if let Some(t) = &q.tenant {
            vec![Partition {
                index: Some("gsi1"),
                pk_attr: "gsi1pk",
                pk: format!("T#{t}"),
                sk_attr: "gsi1sk",
            }]
        } else {
            // The admin's all-tenant log: walk day partitions newest first, from the
            // cursor's day (or `until`, or today) back to `since` (or the retention).
            let now = self.clock.now();
            let cursor_time = q
                .cursor
                .as_deref()
                .and_then(|c| c.parse::<DeliveryId>().ok())
                .and_then(|id| Utc.timestamp_millis_opt(id.timestamp_ms()).single());
            let newest: DateTime<Utc> = cursor_time.or(q.until).unwrap_or(now).min(now);
            let oldest = q
                .since
                .unwrap_or(now - ChronoDuration::days(self.retention_days));
            let mut days = Vec::new();
            let mut day = newest;
            while day.date_naive() >= oldest.date_naive()
                && days.len() as i64 <= self.retention_days + 1
            {
                days.push(Partition {
                    index: Some("gsi3"),
                    pk_attr: "gsi3pk",
                    pk: day_of(day.timestamp_millis()),
                    sk_attr: "gsi3sk",
                });
                day -= ChronoDuration::days(1);
            }
            days
        };
        let mut pages = 0;
        let mut items = Vec::new();
        let mut resume = None;
        for part in &partitions {
            let found = self
                .collect_desc(
                    part,
                    q.cursor.as_deref(),
                    q.limit + 1 - items.len(),
                    &|item| matches(item, q),
                    &mut pages,
                )
                .await?;
            items.extend(found.items);
            if items.len() > q.limit {
                break;
            }
            if found.more {
                // Out of page budget: resume after the last item read.
                resume = found.last_seen;
                break;
            }
        }
        let data = items
            .iter()
            .map(from_json)
            .collect::<Result<Vec<Delivery>, _>>()?;
        Ok(Page::from_rows(data, q.limit, |d| d.id.to_string(), resume))
    }

    async fn deliveries_of_event(
        &self,
        tenant: &TenantId,
        id: &EventId,
    ) -> StoreResult<Vec<Delivery>> {
        let items = self
            .query_partition(Some("gsi4"), "gsi4pk", event_partition(tenant, id), None)
            .await?;
        items.iter().map(from_json).collect()
    }

    async fn endpoint_attempts_since(
        &self,
        endpoint: &EndpointId,
        since: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Attempt>> {
        let mut attempts = Vec::new();
        let mut start = None;
        while attempts.len() < limit {
            let out = self
                .client
                .query()
                .table_name(&self.main_table)
                .index_name("gsi2")
                .key_condition_expression("gsi2pk = :pk AND gsi2sk >= :since")
                .expression_attribute_values(":pk", s(format!("EA#{endpoint}")))
                .expression_attribute_values(":since", s(format_timestamp(since)))
                .scan_index_forward(false)
                .limit((limit - attempts.len()).min(500) as i32)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(backend)?;
            for item in out.items() {
                attempts.push(from_json(item)?);
            }
            match out.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => break,
            }
        }
        Ok(attempts)
    }

    async fn paused_deliveries(
        &self,
        endpoint: &EndpointId,
        limit: usize,
    ) -> StoreResult<Vec<Delivery>> {
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.main_table)
                .index_name("gsi2")
                .key_condition_expression("gsi2pk = :pk")
                .expression_attribute_values(":pk", s(format!("E#{endpoint}")))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(backend)?;
            for item in out.items() {
                if get_s(item, "state") == Some("paused") {
                    // The index is eventually consistent: read the item itself.
                    let d: Delivery = from_json(item)?;
                    if let Some(current) = self.get_delivery(&d.id).await? {
                        if current.state == DeliveryState::Paused {
                            found.push(current);
                        }
                    }
                    if found.len() >= limit {
                        return Ok(found);
                    }
                }
            }
            match out.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => return Ok(found),
            }
        }
    }
}
