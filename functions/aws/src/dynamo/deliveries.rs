//! Deliveries and attempts in DynamoDB.
//!
//! A delivery item lives in its day's partition of the table (the admin's all-tenant
//! log is the table itself), and is indexed by tenant and endpoint ([`keys`]) and,
//! while it waits past its first minutes, by due time (the sweeper's index,
//! [`super::due_scan`]). An event's deliveries need no
//! index of their own: their ids start with the event's creation time and a hash of
//! its id, so they are the tenant's log entries that start so.
//! Attempts live in the delivery's own partition, so "the row plus every attempt" is
//! one Query.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use entrega_core::delivery::{Attempt, Delivery, DeliveryState};
use entrega_core::event::format_timestamp;
use entrega_core::event::Event;
use entrega_core::ids::{DeliveryId, EndpointId};
use entrega_core::ports::{DeliveryQuery, DeliveryStore, Page, StoreError, StoreResult};

use super::*;

impl DynamoStore {
    /// A delivery item: the record and its version (for conditional writes), and its
    /// index keys. The filter fields are read from the record itself, so the item
    /// carries nothing twice and stays under 1 KiB (one write unit).
    async fn delivery_item(&self, d: &Delivery) -> StoreResult<Item> {
        let now = self.clock.now();
        let young = due_scan::is_young(&d.id, now);
        if young {
            self.before_unindexed_write(now).await?;
        }
        let (pk, sk) = keys::delivery(&d.id);
        let mut item = key_of(pk, sk);
        let id = d.id.as_str();
        let owner_shard = keys::shard(id, keys::OWNER_SHARDS);
        item.extend([
            ("json".to_owned(), to_json(d)),
            ("version".to_owned(), n(d.version)),
            (
                keys::BY_TENANT.pk.to_owned(),
                s(keys::sharded(
                    &keys::tenant_deliveries(&d.tenant_id),
                    owner_shard,
                )),
            ),
            (keys::BY_TENANT.sk.to_owned(), s(id)),
            (
                keys::BY_ENDPOINT.pk.to_owned(),
                s(keys::sharded(
                    &keys::endpoint_deliveries(&d.endpoint_id),
                    owner_shard,
                )),
            ),
            (keys::BY_ENDPOINT.sk.to_owned(), s(id)),
        ]);
        // Expires only once settled: a delivery still waiting or paused (behind an
        // endpoint disabled for longer than the retention period) is never dropped
        // unsent; the write that settles it starts its retention.
        if d.state.is_terminal() {
            item.insert(TTL_ATTRIBUTE.to_owned(), self.expires_at());
        }
        // Only while it waits, and not while young (the sweeper's scan indexes it if
        // it still waits then, `due_scan`): the write that ends the wait takes it out.
        if let Some(due) = d.due_at().filter(|_| !young) {
            item.extend([
                (keys::BY_DUE.pk.to_owned(), s(keys::due(&d.id))),
                (
                    keys::BY_DUE.sk.to_owned(),
                    s(keys::due_slot(due.timestamp_millis())),
                ),
            ]);
        } else if d.state == DeliveryState::Paused {
            // Only while paused: a resume reads these, not the endpoint's whole log.
            item.extend([
                (
                    keys::BY_DUE.pk.to_owned(),
                    s(keys::sharded(
                        &keys::endpoint_paused(&d.endpoint_id),
                        owner_shard,
                    )),
                ),
                (keys::BY_DUE.sk.to_owned(), s(id)),
            ]);
        }
        Ok(item)
    }

    fn attempt_item(&self, a: &Attempt) -> Item {
        Item::from([
            (PK.to_owned(), s(keys::delivery_attempts(&a.delivery_id))),
            (SK.to_owned(), s(keys::attempt(a))),
            ("json".to_owned(), to_json(a)),
            // Per-endpoint statistics read an endpoint's attempts by time.
            (
                keys::BY_ENDPOINT.pk.to_owned(),
                s(keys::sharded(
                    &keys::endpoint_attempts(&a.endpoint_id),
                    keys::shard(a.id.as_str(), keys::OWNER_SHARDS),
                )),
            ),
            (keys::BY_ENDPOINT.sk.to_owned(), s(keys::attempt_time(a))),
            (TTL_ATTRIBUTE.to_owned(), self.expires_at()),
        ])
    }

    /// Attempts are keyed by generation, number and id: writing one again overwrites
    /// it, so a record written twice stays one.
    async fn put_attempts(&self, attempts: &[Attempt]) -> StoreResult<()> {
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
}

/// Postponements sent at once by one sweep (each is an UpdateItem of its own).
const POSTPONE_AT_ONCE: usize = 16;

impl DynamoStore {
    /// Move a delivery's due-index sort key to `until`'s slot. Only the sort key, and
    /// only on the version read: a save since then wrote the key its state says,
    /// which is what we leave alone.
    async fn postpone_one(&self, delivery: &Delivery, until: DateTime<Utc>) -> StoreResult<()> {
        self.write_due_entry(delivery, until, DueWrite::Move).await
    }

    /// Write `delivery`'s due index entry for `due` (its 10-minute slot), on the
    /// version read; a failed condition (a write since then, or an entry not as the
    /// write expects) leaves the item as it is and is no error.
    pub(super) async fn write_due_entry(
        &self,
        delivery: &Delivery,
        due: DateTime<Utc>,
        write: DueWrite,
    ) -> StoreResult<()> {
        let (pk, sk) = keys::delivery(&delivery.id);
        let update = self
            .client
            .update_item()
            .table_name(&self.main_table)
            .set_key(Some(key_of(pk, sk)))
            .expression_attribute_names("#duepk", keys::BY_DUE.pk)
            .expression_attribute_names("#duesk", keys::BY_DUE.sk)
            .expression_attribute_names("#v", "version")
            .expression_attribute_values(":slot", s(keys::due_slot(due.timestamp_millis())))
            .expression_attribute_values(":version", n(delivery.version));
        let update = match write {
            DueWrite::Enter => update
                .update_expression("SET #duepk = :duepk, #duesk = :slot")
                .condition_expression("#v = :version AND attribute_not_exists(#duepk)")
                .expression_attribute_values(":duepk", s(keys::due(&delivery.id))),
            DueWrite::Move => update
                .update_expression("SET #duesk = :slot")
                .condition_expression("#v = :version AND attribute_exists(#duepk)"),
        };
        match update.send().await {
            Ok(_) => Ok(()),
            Err(e) if is_condition_failure(&e) => Ok(()),
            Err(e) => Err(backend(e)),
        }
    }
}

/// What a due index write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DueWrite {
    /// Enter a delivery left out while young (the sweeper's scan).
    Enter,
    /// Move an entry to another slot (the sweeper's postponement).
    Move,
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
            .set_item(Some(self.delivery_item(delivery).await?))
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
        let (pk, sk) = keys::delivery(id);
        self.get_keyed(key_of(pk, sk))
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
        // The attempts first, then the state they explain: the log never shows a state
        // without its attempt, and a state write that loses to a concurrent one leaves
        // attempts that did happen. Two plain writes cost half a transaction of them.
        self.put_attempts(attempts).await?;
        self.client
            .put_item()
            .table_name(&self.main_table)
            .set_item(Some(self.delivery_item(&next).await?))
            .condition_expression("#v = :expected")
            .expression_attribute_names("#v", "version")
            .expression_attribute_values(":expected", n(delivery.version))
            .send()
            .await
            .map_err(|e| {
                if is_condition_failure(&e) {
                    StoreError::Conflict(format!("delivery {} changed meanwhile", delivery.id))
                } else {
                    backend(e)
                }
            })?;
        Ok(next)
    }

    async fn list_attempts(&self, id: &DeliveryId) -> StoreResult<Vec<Attempt>> {
        let items = self
            .query_partition(
                None,
                keys::delivery_attempts(id),
                Some(keys::ATTEMPT_PREFIX),
            )
            .await?;
        items.iter().map(from_json).collect()
    }

    async fn list_deliveries(&self, q: &DeliveryQuery) -> StoreResult<Page<Delivery>> {
        self.delivery_log_page(q).await
    }

    async fn deliveries_of_event(&self, event: &Event) -> StoreResult<Vec<Delivery>> {
        // The tenant's log entries whose ids start as the event's deliveries' do (its
        // creation time and 18 bits of its id's hash), every shard: a handful of keys,
        // read instead of an index entry written for every delivery.
        let prefix = DeliveryId::prefix_of_event(&event.id, event.created_at.timestamp_millis());
        let mut found = Vec::new();
        for pk in Partition::sharded(
            keys::BY_TENANT,
            keys::tenant_deliveries(&event.tenant_id),
            keys::OWNER_SHARDS,
        )
        .keys()
        {
            for item in self
                .query_partition(Some(keys::BY_TENANT), pk, Some(&prefix))
                .await?
            {
                let d: Delivery = from_json(&item)?;
                if d.event_id == event.id {
                    found.push(d);
                }
            }
        }
        found.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        Ok(found)
    }

    async fn endpoint_attempts_since(
        &self,
        endpoint: &EndpointId,
        since: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Attempt>> {
        // Each shard's newest `limit`, merged: the newest `limit` of them all.
        let mut entries: Vec<Item> = Vec::new();
        for shard in 0..keys::OWNER_SHARDS {
            let pk = keys::sharded(&keys::endpoint_attempts(endpoint), shard);
            let mut start = None;
            let mut taken = 0;
            while taken < limit {
                let out = self
                    .client
                    .query()
                    .table_name(&self.main_table)
                    .index_name(keys::BY_ENDPOINT.name)
                    .key_condition_expression("#pk = :pk AND #sk >= :since")
                    .expression_attribute_names("#pk", keys::BY_ENDPOINT.pk)
                    .expression_attribute_names("#sk", keys::BY_ENDPOINT.sk)
                    .expression_attribute_values(":pk", s(pk.clone()))
                    .expression_attribute_values(":since", s(format_timestamp(since)))
                    .scan_index_forward(false)
                    .limit((limit - taken).min(500) as i32)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(backend)?;
                taken += out.items().len();
                entries.extend(out.items().iter().cloned());
                match out.last_evaluated_key() {
                    Some(k) => start = Some(k.clone()),
                    None => break,
                }
            }
        }
        let sort_key = |e: &Item| {
            get_s(e, keys::BY_ENDPOINT.sk)
                .unwrap_or_default()
                .to_owned()
        };
        entries.sort_by_key(|e| std::cmp::Reverse(sort_key(e)));
        entries.truncate(limit);
        self.fetch_items(&entries)
            .await?
            .iter()
            .map(from_json)
            .collect()
    }

    async fn prepare_sweep(&self, before: DateTime<Utc>) -> StoreResult<()> {
        // Deliveries written while young wait outside the due index: in with the ones
        // still waiting. A failure leaves the index as it was; the next run scans
        // again from the same cursor.
        self.index_left_out(before).await
    }

    async fn overdue_deliveries(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Delivery>> {
        let end = keys::due_slot(before.timestamp_millis());
        let mut entries: Vec<Item> = Vec::new();
        // One page per shard is enough: each is asked for the whole limit (keys only, a
        // few bytes each), and the merge keeps the most overdue of them all. The
        // shards are read side by side: the sweeper runs within a function timeout.
        let reads = (0..keys::DUE_SHARDS).map(|shard| {
            self.client
                .query()
                .table_name(&self.main_table)
                .index_name(keys::BY_DUE.name)
                .key_condition_expression("#pk = :pk AND #sk < :end")
                .expression_attribute_names("#pk", keys::BY_DUE.pk)
                .expression_attribute_names("#sk", keys::BY_DUE.sk)
                .expression_attribute_values(":pk", s(keys::due_shard(shard)))
                .expression_attribute_values(":end", s(end.clone()))
                .limit(limit.clamp(1, 1_000) as i32)
                .send()
        });
        for out in futures_util::future::join_all(reads).await {
            entries.extend(out.map_err(backend)?.items().iter().cloned());
        }
        let sort_key = |e: &Item| get_s(e, keys::BY_DUE.sk).unwrap_or_default().to_owned();
        entries.sort_by_key(sort_key);
        entries.truncate(limit);
        let mut found: Vec<Delivery> = self
            .fetch_items(&entries)
            .await?
            .iter()
            .map(from_json)
            .collect::<StoreResult<_>>()?;
        found.retain(|d| d.due_at().is_some_and(|due| due < before));
        found.sort_by_key(|d| d.due_at());
        Ok(found)
    }

    async fn postpone_sweep(&self, postponed: &[(Delivery, DateTime<Utc>)]) -> StoreResult<()> {
        // Side by side, a bounded number at a time; one that fails (a throttle) does
        // not stop the others, and the next run postpones it.
        let mut first_error = Ok(());
        for chunk in postponed.chunks(POSTPONE_AT_ONCE) {
            let moves = chunk
                .iter()
                .map(|(delivery, until)| self.postpone_one(delivery, *until));
            for outcome in futures_util::future::join_all(moves).await {
                if first_error.is_ok() {
                    first_error = outcome;
                }
            }
        }
        first_error
    }

    async fn paused_deliveries(
        &self,
        endpoint: &EndpointId,
        cursor: Option<&str>,
        limit: usize,
    ) -> StoreResult<Page<Delivery>> {
        // The endpoint's paused deliveries (a sparse index of them alone), newest
        // first from the cursor; the filter drops any the index shows a moment late.
        let part = Partition::sharded(
            keys::BY_DUE,
            keys::endpoint_paused(endpoint),
            keys::OWNER_SHARDS,
        );
        let paused = |item: &Item| {
            from_json::<Delivery>(item).is_ok_and(|d| d.state == DeliveryState::Paused)
        };
        self.page_of(&part, cursor, limit, &paused, from_json, |d: &Delivery| {
            d.id.to_string()
        })
        .await
    }
}
