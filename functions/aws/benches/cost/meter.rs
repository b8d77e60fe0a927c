//! An SDK interceptor that counts every AWS call by service and operation, and the
//! DynamoDB capacity units each one consumes.
//!
//! The emulator does not report consumed capacity, so units are computed the way
//! DynamoDB bills them, from the items themselves: a write is one unit per started
//! KiB of the larger of the old and new item (twice that inside a transaction), a read
//! one unit per started 4 KiB (half for an eventually consistent read), and every
//! global secondary index an item is in takes its own write when the item enters,
//! leaves, or changes a projected attribute (DescribeTable tells which are projected).
//! The meter keeps each item's size and index keys as last written, so it knows
//! whether a write is an insert, an update, or moves the item between index partitions.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::types::{AttributeValue, ProjectionType};
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeSerializationInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_types::config_bag::{Storable, StoreReplace};

type Item = HashMap<String, AttributeValue>;

/// Bytes per write unit and per read unit.
const WRITE_UNIT: usize = 1024;
const READ_UNIT: usize = 4096;
/// What DynamoDB adds to every item it stores, per index (for storage).
const ITEM_OVERHEAD: usize = 100;

/// One global secondary index as DescribeTable shows it.
#[derive(Debug, Clone)]
pub struct Index {
    pub pk: String,
    pub sk: String,
    pub projection: ProjectionType,
    /// For INCLUDE: the projected non-key attributes.
    pub included: Vec<String>,
}

/// A table's key attributes and indexes.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub key: Vec<String>,
    pub indexes: Vec<Index>,
}

/// An item as last written: its size, and its key and projected value in each index.
#[derive(Debug, Clone)]
struct Shadow {
    size: usize,
    in_index: Vec<Option<(String, u64)>>,
}

/// Calls and units so far.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// `service operation` → calls.
    pub calls: BTreeMap<String, u64>,
    /// Non-empty receives (an event source mapping invokes its function for each).
    pub batches: BTreeMap<String, u64>,
    pub write_units: f64,
    pub index_write_units: f64,
    pub read_units: f64,
    /// Bytes stored, base table and indexes, by the writes counted.
    pub stored_bytes: i64,
}

#[derive(Debug, Default)]
pub struct Meter {
    tables: Mutex<HashMap<String, Table>>,
    shadows: Mutex<HashMap<(String, String), Shadow>>,
    tally: Mutex<Tally>,
}

/// What a write will do if it succeeds, computed before the input is serialised.
#[derive(Debug, Clone)]
struct Planned(Vec<(String, Item, Kind)>);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Put,
    /// An update: the new item is the old one plus the attributes the expression names
    /// (approximated: those set with a value are merged in).
    Update,
    Delete,
}

impl Storable for Planned {
    type Storer = StoreReplace<Self>;
}

impl Meter {
    pub fn learn(&self, name: &str, table: Table) {
        self.tables.lock().unwrap().insert(name.to_owned(), table);
    }

    pub fn take(&self) -> Tally {
        std::mem::take(&mut *self.tally.lock().unwrap())
    }

    fn key_of(&self, table: &str, item: &Item) -> String {
        let tables = self.tables.lock().unwrap();
        let key = tables.get(table).map(|t| t.key.clone()).unwrap_or_default();
        key.iter()
            .map(|k| item.get(k).map(show).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("|")
    }

    /// Units of one write of `item` (or of the stored item, for a delete), with index
    /// upkeep, and the shadow updated when `applied`.
    fn write(&self, table: &str, item: &Item, kind: Kind, transactional: bool, applied: bool) {
        let key = (table.to_owned(), self.key_of(table, item));
        let indexes = self
            .tables
            .lock()
            .unwrap()
            .get(table)
            .map(|t| t.indexes.clone())
            .unwrap_or_default();
        let mut shadows = self.shadows.lock().unwrap();
        let old = shadows.get(&key).cloned();
        let new_item: Option<&Item> = (kind != Kind::Delete).then_some(item);
        let new_size = match (kind, &old) {
            (Kind::Delete, _) => 0,
            (Kind::Update, Some(o)) => o.size.max(item_size(item)),
            _ => item_size(item),
        };
        let billed = new_size.max(old.as_ref().map_or(0, |o| o.size)).max(1);
        let mut tally = self.tally.lock().unwrap();
        tally.write_units += units(billed, WRITE_UNIT) * if transactional { 2.0 } else { 1.0 };
        if !applied {
            return;
        }
        let mut in_index = Vec::new();
        for (i, index) in indexes.iter().enumerate() {
            let before = old
                .as_ref()
                .and_then(|o| o.in_index.get(i).cloned().flatten());
            let after = new_item.as_ref().and_then(|item| {
                let (pk, sk) = (item.get(&index.pk), item.get(&index.sk));
                match (kind, pk, sk, &before) {
                    (_, Some(pk), Some(sk), _) => {
                        Some((format!("{}|{}", show(pk), show(sk)), projected(index, item)))
                    }
                    // An update that does not touch the index keys keeps the item where
                    // it was; its projected attributes may change.
                    (Kind::Update, None, None, Some((k, _))) => {
                        Some((k.clone(), projected(index, item)))
                    }
                    _ => None,
                }
            });
            let size = projected_size(index, new_size, &key.1);
            let upkeep = match (&before, &after) {
                (None, None) => 0.0,
                (None, Some(_)) => units(size, WRITE_UNIT),
                (Some(_), None) => 1.0,
                (Some((bk, _)), Some((ak, _))) if bk != ak => 1.0 + units(size, WRITE_UNIT),
                (Some((_, bv)), Some((_, av))) if bv != av => units(size, WRITE_UNIT),
                _ => 0.0,
            };
            tally.index_write_units += upkeep;
            let stored = |x: &Option<(String, u64)>| {
                if x.is_some() {
                    (size + ITEM_OVERHEAD) as i64
                } else {
                    0
                }
            };
            tally.stored_bytes += stored(&after) - stored(&before);
            in_index.push(after);
        }
        let base = |s: usize| if s > 0 { (s + ITEM_OVERHEAD) as i64 } else { 0 };
        tally.stored_bytes += base(new_size) - old.as_ref().map_or(0, |o| base(o.size));
        match kind {
            Kind::Delete => {
                shadows.remove(&key);
            }
            _ => {
                shadows.insert(
                    key,
                    Shadow {
                        size: new_size,
                        in_index,
                    },
                );
            }
        }
    }

    fn read(&self, items: &[&Item], consistent: bool, transactional: bool) {
        let bytes: usize = items.iter().map(|i| item_size(i)).sum();
        let mut u = units(bytes.max(1), READ_UNIT);
        if !consistent {
            u /= 2.0;
        }
        if transactional {
            u *= 2.0;
        }
        self.tally.lock().unwrap().read_units += u;
    }
}

fn units(bytes: usize, unit: usize) -> f64 {
    bytes.div_ceil(unit) as f64
}

/// What an index holds of an item beyond its keys, as a fingerprint: a change to it
/// is an index write.
fn projected(index: &Index, item: &Item) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let names: Vec<&String> = match index.projection {
        ProjectionType::All => {
            let mut all: Vec<&String> = item.keys().collect();
            all.sort();
            all
        }
        ProjectionType::Include => index.included.iter().collect(),
        _ => Vec::new(),
    };
    for n in names {
        n.hash(&mut h);
        item.get(n).map(show).hash(&mut h);
    }
    h.finish()
}

fn projected_size(index: &Index, item_size: usize, key: &str) -> usize {
    match index.projection {
        ProjectionType::All => item_size,
        // Keys (table and index) and the included attributes: small.
        _ => key.len() + 2 * 48 + index.included.len() * 40,
    }
}

/// A value as text, for keys and fingerprints.
fn show(v: &AttributeValue) -> String {
    format!("{v:?}")
}

/// DynamoDB's item size: attribute names plus values.
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::L(l) => 3 + l.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| 1 + k.len() + value_size(v))
                .sum::<usize>()
        }
        AttributeValue::Ss(s) => s.iter().map(String::len).sum(),
        AttributeValue::Ns(n) => n.iter().map(|x| x.len()).sum(),
        _ => 8,
    }
}

/// The interceptor: every client of a metered run carries one over a shared meter.
#[derive(Debug, Clone)]
pub struct Metered(pub std::sync::Arc<Meter>);

fn operation(cfg: &ConfigBag) -> (String, String) {
    cfg.load::<Metadata>()
        .map(|m| (m.service().to_owned(), m.name().to_owned()))
        .unwrap_or_default()
}

/// The item an update leaves behind, approximately: the key plus every value the
/// update names (enough for sizes and fingerprints).
fn update_image(key: &Item, values: Option<&Item>) -> Item {
    let mut item = key.clone();
    if let Some(values) = values {
        for (k, v) in values {
            item.insert(format!("upd{k}"), v.clone());
        }
    }
    item
}

impl Intercept for Metered {
    fn name(&self) -> &'static str {
        "cost meter"
    }

    // Not `read_before_execution`: a client's interceptors run that before the
    // operation's configuration (its name) is in the bag.
    fn read_before_serialization(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        use aws_sdk_dynamodb::operation::*;
        let (service, op) = operation(cfg);
        *self
            .0
            .tally
            .lock()
            .unwrap()
            .calls
            .entry(format!("{service} {op}"))
            .or_default() += 1;
        let input = context.input();
        let mut planned: Vec<(String, Item, Kind)> = Vec::new();
        if let Some(i) = input.downcast_ref::<put_item::PutItemInput>() {
            if let (Some(t), Some(item)) = (i.table_name(), i.item()) {
                planned.push((t.to_owned(), item.clone(), Kind::Put));
            }
        } else if let Some(i) = input.downcast_ref::<update_item::UpdateItemInput>() {
            if let (Some(t), Some(key)) = (i.table_name(), i.key()) {
                let image = update_image(key, i.expression_attribute_values());
                planned.push((t.to_owned(), image, Kind::Update));
            }
        } else if let Some(i) = input.downcast_ref::<delete_item::DeleteItemInput>() {
            if let (Some(t), Some(key)) = (i.table_name(), i.key()) {
                planned.push((t.to_owned(), key.clone(), Kind::Delete));
            }
        } else if let Some(i) = input.downcast_ref::<batch_write_item::BatchWriteItemInput>() {
            for (t, requests) in i.request_items().into_iter().flatten() {
                for r in requests {
                    if let Some(p) = r.put_request() {
                        planned.push((t.clone(), p.item().clone(), Kind::Put));
                    }
                    if let Some(d) = r.delete_request() {
                        planned.push((t.clone(), d.key().clone(), Kind::Delete));
                    }
                }
            }
        } else if let Some(i) =
            input.downcast_ref::<transact_write_items::TransactWriteItemsInput>()
        {
            for w in i.transact_items() {
                if let Some(p) = w.put() {
                    planned.push((p.table_name().to_owned(), p.item().clone(), Kind::Put));
                }
                if let Some(u) = w.update() {
                    let image = update_image(u.key(), u.expression_attribute_values());
                    planned.push((u.table_name().to_owned(), image, Kind::Update));
                }
                if let Some(d) = w.delete() {
                    planned.push((d.table_name().to_owned(), d.key().clone(), Kind::Delete));
                }
                if let Some(c) = w.condition_check() {
                    // Billed as a write of the item, changes nothing.
                    self.0
                        .write(c.table_name(), c.key(), Kind::Update, true, false);
                }
            }
            cfg.interceptor_state().store_put(Transactional);
        }
        if !planned.is_empty() {
            cfg.interceptor_state().store_put(Planned(planned));
        }
        Ok(())
    }

    fn read_after_execution(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        use aws_sdk_dynamodb::operation::*;
        let (service, op) = operation(cfg);
        let ok = matches!(context.output_or_error(), Some(Ok(_)));
        if let Some(Planned(writes)) = cfg.load::<Planned>().cloned() {
            let transactional = cfg.load::<Transactional>().is_some();
            for (table, item, kind) in &writes {
                self.0.write(table, item, *kind, transactional, ok);
            }
        }
        let Some(Ok(output)) = context.output_or_error() else {
            return Ok(());
        };
        let mut batch = false;
        if let Some(o) = output.downcast_ref::<get_item::GetItemOutput>() {
            let items: Vec<&Item> = o.item().into_iter().collect();
            // GetItem is always consistent here (the store reads its own writes).
            self.0.read(&items, true, false);
        } else if let Some(o) = output.downcast_ref::<query::QueryOutput>() {
            let items: Vec<&Item> = o.items().iter().collect();
            self.0.read(&items, false, false);
        } else if let Some(o) = output.downcast_ref::<scan::ScanOutput>() {
            let items: Vec<&Item> = o.items().iter().collect();
            self.0.read(&items, false, false);
        } else if let Some(o) = output.downcast_ref::<batch_get_item::BatchGetItemOutput>() {
            let items: Vec<&Item> = o
                .responses()
                .into_iter()
                .flat_map(|r| r.values().flatten())
                .collect();
            self.0.read(&items, false, false);
        } else if let Some(o) =
            output.downcast_ref::<aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput>()
        {
            batch = !o.messages().is_empty();
        } else if let Some(o) = output
            .downcast_ref::<aws_sdk_dynamodbstreams::operation::get_records::GetRecordsOutput>(
        ) {
            batch = !o.records().is_empty();
        }
        if batch {
            *self
                .0
                .tally
                .lock()
                .unwrap()
                .batches
                .entry(format!("{service} {op}"))
                .or_default() += 1;
        }
        Ok(())
    }
}

/// Marks a TransactWriteItems call: its writes cost double.
#[derive(Debug, Clone)]
struct Transactional;

impl Storable for Transactional {
    type Storer = StoreReplace<Self>;
}

/// The tables' keys and indexes, from DescribeTable.
pub async fn describe(client: &aws_sdk_dynamodb::Client, name: &str) -> Table {
    let out = client
        .describe_table()
        .table_name(name)
        .send()
        .await
        .unwrap();
    let t = out.table().unwrap();
    Table {
        key: t
            .key_schema()
            .iter()
            .map(|k| k.attribute_name().to_owned())
            .collect(),
        indexes: t
            .global_secondary_indexes()
            .iter()
            .map(|g| {
                let keys: Vec<String> = g
                    .key_schema()
                    .iter()
                    .map(|k| k.attribute_name().to_owned())
                    .collect();
                let projection = g.projection();
                Index {
                    pk: keys.first().cloned().unwrap_or_default(),
                    sk: keys.get(1).cloned().unwrap_or_default(),
                    projection: projection
                        .and_then(|p| p.projection_type().cloned())
                        .unwrap_or(ProjectionType::All),
                    included: projection
                        .map(|p| p.non_key_attributes().to_vec())
                        .unwrap_or_default(),
                }
            })
            .collect(),
    }
}
