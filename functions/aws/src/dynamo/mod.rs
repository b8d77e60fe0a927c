//! The DynamoDB store: every store port over two tables.
//!
//! - the **outbox** table (DESIGN.md's producer contract: `pk` = event id, stream with
//!   NEW_IMAGE) holds events;
//! - the **main** table, single-table design, holds everything else under `pk`/`sk`,
//!   with four generic GSIs for the listings (by tenant, by endpoint, by day, by event).
//!
//! Records are stored whole as JSON (the domain types' serde form) beside the key and
//! filter attributes, so the embedded and AWS stores cannot drift in what they keep.

mod backlog;
mod deliveries;
mod endpoints;
mod events;
mod failures;
mod tenants;

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use entrega_core::ports::{Clock, StoreError};

pub type Item = HashMap<String, AttributeValue>;

/// Partition key, sort key and the GSI attribute names (shared with provisioning and
/// the template).
pub const PK: &str = "pk";
pub const SK: &str = "sk";
/// The sort key of single-record items.
pub const ONLY: &str = "#";
/// The GSIs: name, partition attribute, sort attribute.
pub const GSIS: [(&str, &str, &str); 4] = [
    ("gsi1", "gsi1pk", "gsi1sk"),
    ("gsi2", "gsi2pk", "gsi2sk"),
    ("gsi3", "gsi3pk", "gsi3sk"),
    ("gsi4", "gsi4pk", "gsi4sk"),
];
/// The TTL attribute of both tables (epoch seconds).
pub const TTL_ATTRIBUTE: &str = "expires_at";
/// Query pages read per list request at most: bounded work, the rest is a cursor.
const MAX_PAGES_PER_LIST: usize = 20;

/// The store over a DynamoDB client.
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    main_table: String,
    outbox_table: String,
    clock: Arc<dyn Clock>,
    /// How long deliveries, attempts and failures are kept (TTL), in days.
    retention_days: i64,
}

impl DynamoStore {
    pub fn new(
        client: Client,
        main_table: impl Into<String>,
        outbox_table: impl Into<String>,
        clock: Arc<dyn Clock>,
        retention_days: i64,
    ) -> Self {
        Self {
            client,
            main_table: main_table.into(),
            outbox_table: outbox_table.into(),
            clock,
            retention_days,
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The TTL value for a record written now.
    fn expires_at(&self) -> AttributeValue {
        let at = self.clock.now() + chrono::Duration::days(self.retention_days);
        n(at.timestamp())
    }
}

pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A string attribute of an item.
pub fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}

/// Decode the `json` attribute of an item.
fn from_json<T: serde::de::DeserializeOwned>(item: &Item) -> Result<T, StoreError> {
    let json = get_s(item, "json")
        .ok_or_else(|| StoreError::Backend("an item has no json attribute".into()))?;
    serde_json::from_str(json)
        .map_err(|e| StoreError::Backend(format!("stored record unreadable: {e}")))
}

fn to_json<T: serde::Serialize>(value: &T) -> AttributeValue {
    s(serde_json::to_string(value).expect("domain types serialise"))
}

/// Any SDK error as a backend error, with the service's code when there is one.
pub fn backend<E: ProvideErrorMetadata + std::fmt::Debug, R: std::fmt::Debug>(
    e: SdkError<E, R>,
) -> StoreError {
    let code = e.code().unwrap_or("unknown").to_owned();
    let message = e.message().unwrap_or_default().to_owned();
    StoreError::Backend(format!("dynamodb {code}: {message}"))
}

/// Whether an SDK error is a failed condition (of a single write or a transaction).
fn is_condition_failure<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> bool {
    matches!(
        e.code(),
        Some("ConditionalCheckFailedException") | Some("TransactionCanceledException")
    )
}

/// Keys of the single-record items.
fn key(pk: String) -> Item {
    HashMap::from([(PK.to_owned(), s(pk)), (SK.to_owned(), s(ONLY))])
}

impl DynamoStore {
    /// A consistent read of the single-record item `pk` of the main table.
    pub(crate) async fn get_main(&self, pk: String) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.main_table)
            .set_key(Some(key(pk)))
            .consistent_read(true)
            .send()
            .await
            .map_err(backend)?;
        Ok(out.item().cloned())
    }

    /// Every item of one partition of `index` (the table itself for `None`), all
    /// pages, in key order; `sk_prefix` narrows to sort keys starting with it.
    pub(crate) async fn query_partition(
        &self,
        index: Option<&str>,
        pk_attr: &str,
        pk: String,
        sk: Option<(&str, &str)>,
    ) -> Result<Vec<Item>, StoreError> {
        let condition = if sk.is_some() {
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
                .set_index_name(index.map(str::to_owned))
                .key_condition_expression(condition)
                .expression_attribute_names("#pk", pk_attr)
                .expression_attribute_values(":pk", s(pk.clone()))
                .consistent_read(index.is_none())
                .set_exclusive_start_key(start);
            if let Some((sk_attr, prefix)) = sk {
                query = query
                    .expression_attribute_names("#sk", sk_attr)
                    .expression_attribute_values(":prefix", s(prefix));
            }
            let out = query.send().await.map_err(backend)?;
            items.extend(out.items().iter().cloned());
            match out.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => return Ok(items),
            }
        }
    }
}

/// One partition of one index, read newest first.
pub(crate) struct Partition {
    pub index: Option<&'static str>,
    pub pk_attr: &'static str,
    pub pk: String,
    pub sk_attr: &'static str,
}

/// What a bounded read of a partition found.
pub(crate) struct Collected {
    /// Items that passed the filter, newest first.
    pub items: Vec<Item>,
    /// The sort key of the last item read (kept or not), to resume after.
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
        let mut found = Collected {
            items: Vec::new(),
            last_seen: None,
            more: true,
        };
        let mut start: Option<Item> = None;
        let condition = if below.is_some() {
            "#pk = :pk AND #sk < :below"
        } else {
            "#pk = :pk"
        };
        while found.items.len() < want && *pages < MAX_PAGES_PER_LIST {
            *pages += 1;
            let mut query = self
                .client
                .query()
                .table_name(&self.main_table)
                .set_index_name(part.index.map(str::to_owned))
                .key_condition_expression(condition)
                .expression_attribute_names("#pk", part.pk_attr)
                .expression_attribute_values(":pk", s(part.pk.clone()))
                .scan_index_forward(false)
                .limit(((want - found.items.len()) * 2).clamp(10, 500) as i32)
                .set_exclusive_start_key(start.take());
            if let Some(b) = below {
                query = query
                    .expression_attribute_names("#sk", part.sk_attr)
                    .expression_attribute_values(":below", s(b));
            }
            let out = query.send().await.map_err(backend)?;
            for item in out.items() {
                if found.items.len() >= want {
                    return Ok(found);
                }
                found.last_seen = get_s(item, part.sk_attr).map(str::to_owned);
                if keep(item) {
                    found.items.push(item.clone());
                }
            }
            match out.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => {
                    found.more = false;
                    return Ok(found);
                }
            }
        }
        Ok(found)
    }
}
