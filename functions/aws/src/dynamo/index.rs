//! Reading through the KEYS_ONLY indexes: a query finds the entries, newest first, and
//! [`DynamoStore::fetch_items`] reads the items from the table. The busiest index
//! partitions are written in shards ([`keys::sharded`]); a listing reads every shard
//! of its partition and merges them by sort key, so one cursor still pages through
//! the whole set in order.

use std::collections::HashMap;

use entrega_core::ports::{Page, StoreError};

use super::*;

/// Keys per BatchGetItem call (DynamoDB's limit).
const BATCH_GET_KEYS: usize = 100;
/// Rounds of retrying a batch read's unprocessed keys before giving up.
const BATCH_GET_ROUNDS: usize = 8;
/// Query pages one list request reads at most (each shard's query counts): bounded
/// work; the rest is a cursor.
pub(crate) const MAX_PAGES_PER_LIST: usize = 64;

/// One partition of one index (or of the table itself, `index` `None`), read newest
/// first; written in `shards` shards.
pub(crate) struct Partition {
    pub index: Option<keys::Gsi>,
    pub pk: String,
    pub shards: u8,
}

impl Partition {
    pub fn new(index: keys::Gsi, pk: impl Into<String>) -> Self {
        Self::sharded(index, pk, 1)
    }

    pub fn sharded(index: keys::Gsi, pk: impl Into<String>, shards: u8) -> Self {
        Self {
            index: Some(index),
            pk: pk.into(),
            shards,
        }
    }

    /// A partition of the table, its items read whole (no index in between).
    pub fn table(pk: impl Into<String>, shards: u8) -> Self {
        Self {
            index: None,
            pk: pk.into(),
            shards,
        }
    }

    /// The partition keys actually written.
    pub fn keys(&self) -> Vec<String> {
        if self.shards <= 1 {
            vec![self.pk.clone()]
        } else {
            (0..self.shards)
                .map(|shard| keys::sharded(&self.pk, shard))
                .collect()
        }
    }
}

/// What a bounded read of a partition found.
pub(crate) struct Collected {
    /// Items that passed the filter, newest first, with their index sort keys.
    pub items: Vec<(String, Item)>,
    /// The sort key below which nothing was read yet (kept or not), to resume after.
    pub last_seen: Option<String>,
    /// Whether the partition has more items below `last_seen`.
    pub more: bool,
}

impl DynamoStore {
    /// Read `part` below `below` (sort key, exclusive), newest first, keeping items that
    /// pass `keep`, until `want` are kept, the partition ends, or the page budget is
    /// spent. Filtering here rather than in a FilterExpression costs the same reads
    /// and keeps the filter rules identical to the SQLite store's.
    pub(crate) async fn collect_desc(
        &self,
        part: &Partition,
        below: Option<&str>,
        want: usize,
        keep: &(dyn Fn(&Item) -> bool + Sync),
        pages: &mut usize,
    ) -> Result<Collected, StoreError> {
        // The shards are read side by side, each within an even share of what is left
        // of the page budget (at least one page: a shard not read at all would hold
        // the merged cursor where it was, and paging would never move on).
        let keys = part.keys();
        let share = (MAX_PAGES_PER_LIST.saturating_sub(*pages) / keys.len()).max(1);
        let reads = keys
            .into_iter()
            .map(|pk| self.collect_shard(part.index, pk, below, want, keep, share));
        let mut shards = Vec::new();
        for read in futures_util::future::join_all(reads).await {
            let (collected, used) = read?;
            *pages += used;
            shards.push(collected);
        }
        if shards.len() == 1 {
            return Ok(shards.pop().expect("one shard"));
        }
        // Merge: everything from the highest point some shard stopped at upwards is
        // complete (every shard was read that far; the item at that point was read by
        // its shard); below it, a later page goes on.
        let bound = shards
            .iter()
            .filter(|c| c.more)
            .filter_map(|c| c.last_seen.clone())
            .max();
        let mut items: Vec<(String, Item)> = shards
            .into_iter()
            .flat_map(|c| c.items)
            .filter(|(sk, _)| bound.as_ref().is_none_or(|b| sk >= b))
            .collect();
        items.sort_by(|a, b| b.0.cmp(&a.0));
        let overflow = items.len() > want;
        items.truncate(want);
        Ok(Collected {
            last_seen: if overflow {
                items.last().map(|(sk, _)| sk.clone())
            } else {
                bound.clone()
            },
            more: overflow || bound.is_some(),
            items,
        })
    }

    /// One page of a listing: up to `limit` items of `part` below `cursor` that pass
    /// `keep`, decoded, with the cursor to go on from.
    pub(crate) async fn page_of<T>(
        &self,
        part: &Partition,
        cursor: Option<&str>,
        limit: usize,
        keep: &(dyn Fn(&Item) -> bool + Sync),
        decode: impl Fn(&Item) -> Result<T, StoreError>,
        id: impl Fn(&T) -> String,
    ) -> Result<Page<T>, StoreError> {
        let mut pages = 0;
        let found = self
            .collect_desc(part, cursor, limit + 1, keep, &mut pages)
            .await?;
        let data = found
            .items
            .iter()
            .map(|(_, item)| decode(item))
            .collect::<Result<Vec<T>, _>>()?;
        Ok(Page::from_rows(
            data,
            limit,
            id,
            found.more.then_some(found.last_seen).flatten(),
        ))
    }

    async fn collect_shard(
        &self,
        index: Option<keys::Gsi>,
        pk: String,
        below: Option<&str>,
        want: usize,
        keep: &(dyn Fn(&Item) -> bool + Sync),
        budget: usize,
    ) -> Result<(Collected, usize), StoreError> {
        let mut pages = 0;
        let mut found = Collected {
            items: Vec::new(),
            last_seen: below.map(str::to_owned),
            more: true,
        };
        let mut start: Option<Item> = None;
        let condition = if below.is_some() {
            "#pk = :pk AND #sk < :below"
        } else {
            "#pk = :pk"
        };
        let (pk_attr, sk_attr) = index.map_or((PK, SK), |g| (g.pk, g.sk));
        while found.items.len() < want && pages < budget {
            pages += 1;
            let mut query = self
                .client
                .query()
                .table_name(&self.main_table)
                .set_index_name(index.map(|g| g.name.to_owned()))
                .key_condition_expression(condition)
                .expression_attribute_names("#pk", pk_attr)
                .expression_attribute_values(":pk", s(pk.clone()))
                .scan_index_forward(false)
                .limit(((want - found.items.len()) * 2).clamp(10, 500) as i32)
                .set_exclusive_start_key(start.take());
            if let Some(b) = below {
                query = query
                    .expression_attribute_names("#sk", sk_attr)
                    .expression_attribute_values(":below", s(b));
            }
            let out = query.send().await.map_err(backend)?;
            let items = match index {
                Some(_) => self.fetch_items(out.items()).await?,
                None => out.items().to_vec(),
            };
            let mut items = items.iter().peekable();
            for entry in out.items() {
                if found.items.len() >= want {
                    return Ok((found, pages));
                }
                let sk = get_s(entry, sk_attr).unwrap_or_default().to_owned();
                found.last_seen = Some(sk.clone());
                // The fetched items are in the entries' order, minus deleted ones.
                let same = |item: &&Item| {
                    get_s(item, PK) == get_s(entry, PK) && get_s(item, SK) == get_s(entry, SK)
                };
                if let Some(item) = items.next_if(same) {
                    if keep(item) {
                        found.items.push((sk, item.clone()));
                    }
                }
            }
            match out.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => {
                    found.more = false;
                    return Ok((found, pages));
                }
            }
        }
        Ok((found, pages))
    }

    /// Every item of one partition of `index` (the table itself for `None`), all
    /// pages, in key order; `sk_prefix` narrows to sort keys starting with it. Items
    /// found through an index are read from the table.
    pub(crate) async fn query_partition(
        &self,
        index: Option<keys::Gsi>,
        pk: String,
        sk_prefix: Option<&str>,
    ) -> Result<Vec<Item>, StoreError> {
        let (pk_attr, sk_attr) = index.map_or((PK, SK), |g| (g.pk, g.sk));
        let condition = if sk_prefix.is_some() {
            "#pk = :pk AND begins_with(#sk, :prefix)"
        } else {
            "#pk = :pk"
        };
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let mut query = self
                .client
                .query()
                .table_name(&self.main_table)
                .set_index_name(index.map(|g| g.name.to_owned()))
                .key_condition_expression(condition)
                .expression_attribute_names("#pk", pk_attr)
                .expression_attribute_values(":pk", s(pk.clone()))
                .consistent_read(index.is_none())
                .set_exclusive_start_key(start);
            if let Some(prefix) = sk_prefix {
                query = query
                    .expression_attribute_names("#sk", sk_attr)
                    .expression_attribute_values(":prefix", s(prefix));
            }
            let out = query.send().await.map_err(backend)?;
            items.extend(out.items().iter().cloned());
            match out.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => break,
            }
        }
        if index.is_some() {
            items = self.fetch_items(&items).await?;
        }
        Ok(items)
    }

    /// The table's items for index entries (KEYS_ONLY), in the entries' order; an item
    /// deleted since the index saw it is left out.
    pub(crate) async fn fetch_items(&self, entries: &[Item]) -> Result<Vec<Item>, StoreError> {
        let key_of = |i: &Item| -> Option<(String, String)> {
            Some((get_s(i, PK)?.to_owned(), get_s(i, SK)?.to_owned()))
        };
        let mut found: HashMap<(String, String), Item> = HashMap::new();
        for chunk in entries.chunks(BATCH_GET_KEYS) {
            let mut unique: Vec<(String, String)> = chunk.iter().filter_map(key_of).collect();
            unique.sort();
            unique.dedup();
            let mut pending: Vec<Item> = unique
                .into_iter()
                .map(|(pk, sk)| HashMap::from([(PK.to_owned(), s(pk)), (SK.to_owned(), s(sk))]))
                .collect();
            for _ in 0..BATCH_GET_ROUNDS {
                if pending.is_empty() {
                    break;
                }
                let request = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .build()
                    .expect("keys are set");
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.main_table, request)
                    .send()
                    .await
                    .map_err(backend)?;
                for item in out
                    .responses()
                    .and_then(|r| r.get(&self.main_table))
                    .into_iter()
                    .flatten()
                {
                    if let Some(k) = key_of(item) {
                        found.insert(k, item.clone());
                    }
                }
                // Throttled keys come back unprocessed: ask again, after a pause.
                if let Some(rest) = out.unprocessed_keys().and_then(|u| u.get(&self.main_table)) {
                    pending = rest.keys().to_vec();
                    if !pending.is_empty() {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
            if !pending.is_empty() {
                return Err(StoreError::Backend(
                    "dynamodb kept throttling a batch read; try again".into(),
                ));
            }
        }
        Ok(entries
            .iter()
            .filter_map(|e| key_of(e).and_then(|k| found.get(&k).cloned()))
            .collect())
    }
}
