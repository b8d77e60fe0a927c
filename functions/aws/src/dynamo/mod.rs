//! The DynamoDB store: every store port over two tables.
//!
//! - the **outbox** table (DESIGN.md's producer contract: `pk` = event id, stream with
//!   NEW_IMAGE) holds events, payload included (stored once: nothing else copies it);
//! - the **main** table, single-table design, holds everything else under `pk`/`sk`,
//!   with five generic KEYS_ONLY GSIs for the listings and the sweeper ([`keys`]).
//!
//! Records are stored whole as JSON (the domain types' serde form) beside their keys
//! and version, so the embedded and AWS stores cannot drift in what they keep.
//!
//! # Access patterns
//!
//! Every read and write the API and the handlers make, and where it lands. "Shards"
//! are write shards of one logical partition ([`keys::sharded`]): a listing reads
//! them all and merges by sort key.
//!
//! | access (port method) | where | how |
//! |---|---|---|
//! | publish an event (`publish`) | outbox `pk` = `<tenant>:<event>` | conditional Put |
//! | read an event (`get_event`) | outbox `pk` | GetItem |
//! | tenant, API key, admin marker | main `TENANT#`, `KEY#`, `ADMIN_KEY_EXISTS` | Get / Put |
//! | list tenants (admin) | gsi3 `ALL_TEN` | Query + BatchGet |
//! | endpoint by id, config / health writes | main `EP#<id>` | Get; UpdateItem conditional on `version` / `health_version` |
//! | a tenant's endpoints (fan-out, list) | gsi1 `TENANT_EP#<tenant>` | Query + BatchGet |
//! | create / delete an endpoint within the tenant's limit | main `EP_COUNT#<tenant>` with `EP#<id>` | transaction: ADD to the count if under the limit (the first count: Put if absent, from the tenant's listing) with a Put if absent; Delete if present with ADD −1 |
//! | all endpoints (admin) | gsi3 `ALL_EP` | Query + BatchGet |
//! | the local emulation's place in each outbox stream shard (never on AWS, where Lambda keeps it) | main `STREAM_CHECKPOINT#<shard>` | consistent Get at start; Put after each batch |
//! | create a delivery (fan-out) | main `D#<day>#<0..3f>`, `sk` = its id (both from the id) | Put if absent |
//! | read / save a delivery (worker, resend) | the same | consistent Get; Put conditional on `version` |
//! | append attempts, list a delivery's attempts | main `DLV#<id>`, `sk` = `ATT#<gen>#<n>#<id>` | Put; Query |
//! | a tenant's delivery log | gsi1 `T#<tenant>#<0..3>` | Query each shard + BatchGet, merge |
//! | an endpoint's delivery log | gsi2 `E#<endpoint>#<0..3>` | same |
//! | an endpoint's paused deliveries (background resume) | gsi5 `PAUSED#<endpoint>#<0..3>`, sparse: only while paused | same, from the resume's cursor |
//! | an endpoint's attempts since (stats) | gsi2 `EA#<endpoint>#<0..3>`, `sk` = time | same |
//! | every tenant's log (admin) | main `D#<day>#<0..3f>`: the delivery items themselves | Query each shard side by side, merge; day by day, at most 4 a request |
//! | an event's deliveries | gsi1 `T#<tenant>#<0..3>`, `sk` starting with the event's creation time and id hash (`DeliveryId::prefix_of_event`) | Query each shard + BatchGet, keep the event's |
//! | failure by id, acknowledge | main `FAIL#<id>` | Get; Update conditional on the record read |
//! | a tenant's / all failures | gsi1 `TF#<tenant>` / gsi3 `ALL_FAIL` | Query + BatchGet |
//! | a delivery's failures (resend acknowledges them) | gsi4 `FD#<delivery>` | Query + BatchGet |
//! | the oldest unacknowledged failures (24-hour rule) | gsi2 `UNACK`, sparse: removed on acknowledgement | Query ascending + BatchGet |
//! | hourly counters, claims, idempotency keys | main `CNT#`, `REMEMBER#` | atomic ADD; conditional Put |
//! | waiting deliveries due before a time (sweeper) | gsi5 `DUE#<0..3f>`, `sk` = 10-minute slot; sparse, and not entered while young | Query each shard below the cutoff slot + BatchGet |
//! | deliveries left out of the due index while young, still waiting (`prepare_sweep`, before each sweep) | main `D#<day>#<0..3f>` from `DUE_SCAN_CURSOR` to the cutoff | Query each shard with a filter; UpdateItem of the due keys, conditional on `version`; Update of the cursor, forward only |
//! | leave a swept delivery out of the sweeper's question (`postpone_sweep`) | gsi5 `sk` of its item, main `D#<day>#<0..3f>` | UpdateItem of the sort key only, conditional on `version` |
//! | a tenant's backlog | main `BACKLOG#<tenant>#<0..3>` | ADD on a random shard; BatchGet of all |
//! | an endpoint's concurrency slots (worker) | main `SLOT#<endpoint>#<n>`, one partition each | Update if free or expired; Update if ours |
//! | the slow endpoints' share (worker, for an endpoint slow lately) | main `SLOT#SLOW_ENDPOINTS#<n>`, one partition each | the same |
//!
//! On the delivery path (fan-out, one attempt) every write is a single-item write of an
//! item under 1 KiB: no transaction (they cost double), no index copy rewritten by a
//! state change (KEYS_ONLY), and no partition taking more than half of the ~1 000
//! writes a second one partition accepts at 1 000 deliveries/s to one endpoint, or
//! 10 000/s across 1 000 tenants (README, "The DynamoDB data model").
//!
//! What no longer costs a write: an event's deliveries are found among its tenant's
//! log entries whose ids start as its deliveries' do (an index entry per delivery
//! before), and the admin's all-tenant log is the table itself, the delivery items
//! kept in their day's partition (an index entry per delivery before).

mod backlog;
mod deliveries;
mod delivery_log;
mod due_scan;
mod endpoints;
mod events;
mod failures;
mod index;
pub mod keys;
mod slots;
mod tenants;

use index::Partition;

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
pub const GSIS: [(&str, &str, &str); 5] = [
    (keys::BY_TENANT.name, keys::BY_TENANT.pk, keys::BY_TENANT.sk),
    (
        keys::BY_ENDPOINT.name,
        keys::BY_ENDPOINT.pk,
        keys::BY_ENDPOINT.sk,
    ),
    (keys::BY_KIND.name, keys::BY_KIND.pk, keys::BY_KIND.sk),
    (keys::BY_PARENT.name, keys::BY_PARENT.pk, keys::BY_PARENT.sk),
    (keys::BY_DUE.name, keys::BY_DUE.pk, keys::BY_DUE.sk),
];
/// What every GSI holds of an item: its keys only. An index write then happens when
/// an item enters or leaves an index, never when its state changes (with ALL, every
/// state change of a delivery was four more writes); listings read the items from the
/// table, which costs reads, five times cheaper than writes and far rarer.
pub const GSI_PROJECTION: aws_sdk_dynamodb::types::ProjectionType =
    aws_sdk_dynamodb::types::ProjectionType::KeysOnly;
/// The TTL attribute of both tables (epoch seconds).
pub const TTL_ATTRIBUTE: &str = "expires_at";

/// The store over a DynamoDB client.
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    main_table: String,
    outbox_table: String,
    clock: Arc<dyn Clock>,
    /// How long deliveries, attempts and failures are kept (TTL), in days.
    retention_days: i64,
    /// The sweeper's scan: waiting deliveries it enters a run, per shard.
    left_out_per_shard: usize,
    /// When this process last saw the sweeper's scan cursor exist, in epoch ms (0:
    /// never; [`due_scan`]'s `before_unindexed_write`).
    scan_cursor_checked_ms: Arc<std::sync::atomic::AtomicI64>,
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
            left_out_per_shard: due_scan::LEFT_OUT_PER_SHARD,
            scan_cursor_checked_ms: Arc::default(),
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
    key_of(pk, ONLY.to_owned())
}

/// Keys of an item.
fn key_of(pk: String, sk: String) -> Item {
    HashMap::from([(PK.to_owned(), s(pk)), (SK.to_owned(), s(sk))])
}

impl DynamoStore {
    /// A consistent read of the single-record item `pk` of the main table.
    pub(crate) async fn get_main(&self, pk: String) -> Result<Option<Item>, StoreError> {
        self.get_keyed(key(pk)).await
    }

    /// A consistent read of the item with keys `keys` of the main table.
    pub(crate) async fn get_keyed(&self, keys: Item) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.main_table)
            .set_key(Some(keys))
            .consistent_read(true)
            .send()
            .await
            .map_err(backend)?;
        Ok(out.item().cloned())
    }
}
