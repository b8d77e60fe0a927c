//! Endpoints in DynamoDB: by id, by tenant (gsi1), and all of them (gsi3, admin).

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem, Update};
use entrega_core::endpoint::{Endpoint, EndpointHealth};
use entrega_core::ids::{EndpointId, TenantId};
use entrega_core::ports::{EndpointCreated, EndpointStore, Page, StoreError, StoreResult};

use super::*;

/// Configuration and health live in one item under separate versions: a health write
/// (`SET health`) never touches the configuration a client changed, and vice versa.
const HEALTH: &str = "health";
const HEALTH_VERSION: &str = "health_version";
const VERSION: &str = "version";
/// The attribute of a tenant's endpoint count item ([`keys::tenant_endpoint_count`]).
const COUNT: &str = "count";
/// How many times a create or delete writes again when its transaction was cancelled
/// (the count moved on, or another transaction held the item): each try reads the
/// count afresh, so a racer that reached the limit hears so on its next try.
const COUNT_TRIES: u32 = 8;
/// The pause before a try after a cancelled one, times the try's number (plus up to
/// as much again at random), so racers on one count spread out instead of colliding
/// again.
const COUNT_RETRY_PAUSE: Duration = Duration::from_millis(10);

fn item(endpoint: &Endpoint) -> Item {
    let mut item = key(keys::endpoint(&endpoint.id));
    item.insert("json".into(), to_json(endpoint));
    item.insert(VERSION.into(), n(endpoint.version));
    item.insert(HEALTH.into(), to_json(&endpoint.health));
    item.insert(HEALTH_VERSION.into(), n(endpoint.health.version));
    item.insert("tenant_id".into(), s(endpoint.tenant_id.as_str()));
    item.insert(
        keys::BY_TENANT.pk.into(),
        s(keys::tenant_endpoints(&endpoint.tenant_id)),
    );
    item.insert(keys::BY_TENANT.sk.into(), s(endpoint.id.as_str()));
    // Endpoints are few (one per customer URL): one partition holds them all for the
    // admin's listing.
    item.insert(keys::BY_KIND.pk.into(), s(keys::ALL_ENDPOINTS));
    item.insert(keys::BY_KIND.sk.into(), s(endpoint.id.as_str()));
    item
}

fn number(item: &Item, name: &str) -> u64 {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// An endpoint item: configuration, version and health.
fn decode(item: &Item) -> Result<Endpoint, StoreError> {
    let mut endpoint: Endpoint = from_json(item)?;
    endpoint.version = number(item, VERSION);
    endpoint.health = match get_s(item, HEALTH) {
        Some(h) => serde_json::from_str(h)
            .map_err(|e| StoreError::Backend(format!("stored health unreadable: {e}")))?,
        None => EndpointHealth::default(),
    };
    endpoint.health.version = number(item, HEALTH_VERSION);
    Ok(endpoint)
}

/// The condition that the stored version (attribute name `#ver`) is still `version`
/// (an item written before versions existed counts as version 0).
fn version_condition(version: u64) -> &'static str {
    if version == 0 {
        "attribute_exists(pk) AND (attribute_not_exists(#ver) OR #ver = :expected)"
    } else {
        "#ver = :expected"
    }
}

impl DynamoStore {
    fn tenant_endpoints_partition(tenant: &TenantId) -> Partition {
        Partition::new(keys::BY_TENANT, keys::tenant_endpoints(tenant))
    }

    /// The tenant's endpoint count, `None` if it was never counted.
    async fn endpoint_count(&self, tenant: &TenantId) -> StoreResult<Option<u64>> {
        Ok(self
            .get_main(keys::tenant_endpoint_count(tenant))
            .await?
            .map(|item| number(&item, COUNT)))
    }

    /// One try at storing `endpoint` with its tenant's count: `Some` with the answer,
    /// or `None` if the transaction was cancelled and a fresh read should decide.
    async fn try_create(
        &self,
        endpoint: &Endpoint,
        per_tenant: u64,
    ) -> StoreResult<Option<EndpointCreated>> {
        let tenant = &endpoint.tenant_id;
        let counted = self.endpoint_count(tenant).await?;
        // A tenant never counted (a new one, or one whose endpoints predate the count)
        // starts from what it has. The listing reads an index, which can lag by a
        // moment: only endpoints created by an older release in that moment are missed.
        let held = match counted {
            Some(held) => held,
            None => self.tenant_endpoints(tenant).await?.len() as u64,
        };
        if held >= per_tenant {
            return Ok(Some(EndpointCreated::TenantFull));
        }
        let count_key = key(keys::tenant_endpoint_count(tenant));
        let count = match counted {
            // Racing creates each add one without conflicting on a version; the
            // condition stops them at the limit.
            Some(_) => TransactWriteItem::builder().update(
                Update::builder()
                    .table_name(&self.main_table)
                    .set_key(Some(count_key))
                    .update_expression("ADD #count :one")
                    .condition_expression("#count < :limit")
                    .expression_attribute_names("#count", COUNT)
                    .expression_attribute_values(":one", n(1))
                    .expression_attribute_values(":limit", n(per_tenant))
                    .build()
                    .expect("table, key and expression are set"),
            ),
            // The first count is written once: a racing first count fails here and
            // its next try adds to this one.
            None => {
                let mut item = count_key;
                item.insert(COUNT.into(), n(held + 1));
                TransactWriteItem::builder().put(
                    Put::builder()
                        .table_name(&self.main_table)
                        .set_item(Some(item))
                        .condition_expression("attribute_not_exists(pk)")
                        .build()
                        .expect("table and item are set"),
                )
            }
        };
        let put = Put::builder()
            .table_name(&self.main_table)
            .set_item(Some(item(endpoint)))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .expect("table and item are set");
        match self
            .client
            .transact_write_items()
            .transact_items(count.build())
            .transact_items(TransactWriteItem::builder().put(put).build())
            .send()
            .await
        {
            Ok(_) => Ok(Some(EndpointCreated::Stored)),
            Err(e) if is_condition_failure(&e) => Ok(None),
            Err(e) => Err(backend(e)),
        }
    }

    /// One try at deleting the endpoint `id` of `tenant` and taking it off the count:
    /// whether it is done.
    async fn try_delete(&self, id: &EndpointId, tenant: &TenantId) -> StoreResult<bool> {
        let delete = Delete::builder()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::endpoint(id))))
            .condition_expression("attribute_exists(pk)")
            .build()
            .expect("table and key are set");
        let uncount = Update::builder()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::tenant_endpoint_count(tenant))))
            .update_expression("ADD #count :minus_one")
            .condition_expression("#count > :zero")
            .expression_attribute_names("#count", COUNT)
            .expression_attribute_values(":minus_one", n(-1))
            .expression_attribute_values(":zero", n(0))
            .build()
            .expect("table, key and expression are set");
        match self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().delete(delete).build())
            .transact_items(TransactWriteItem::builder().update(uncount).build())
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failure(&e) => Ok(false),
            Err(e) => Err(backend(e)),
        }
    }
}

/// The pause before try `n` (from 1) after a cancelled one.
fn count_retry_pause(n: u32) -> Duration {
    let base = COUNT_RETRY_PAUSE * n;
    base + base.mul_f64(rand::random::<f64>())
}

#[async_trait]
impl EndpointStore for DynamoStore {
    async fn create_endpoint(
        &self,
        endpoint: &Endpoint,
        per_tenant: usize,
    ) -> StoreResult<EndpointCreated> {
        for n in 0..COUNT_TRIES {
            if n > 0 {
                tokio::time::sleep(count_retry_pause(n)).await;
            }
            if let Some(created) = self.try_create(endpoint, per_tenant as u64).await? {
                return Ok(created);
            }
        }
        Err(StoreError::Conflict(format!(
            "endpoint {}: the tenant's endpoints kept changing meanwhile; try again",
            endpoint.id
        )))
    }

    async fn get_endpoint(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>> {
        self.get_main(keys::endpoint(id))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<Endpoint> {
        let mut next = endpoint.clone();
        next.version += 1;
        self.client
            .update_item()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::endpoint(&endpoint.id))))
            .update_expression("SET #json = :json, #ver = :next")
            .condition_expression(version_condition(endpoint.version))
            .expression_attribute_names("#json", "json")
            .expression_attribute_names("#ver", VERSION)
            .expression_attribute_values(":json", to_json(&next))
            .expression_attribute_values(":next", n(next.version))
            .expression_attribute_values(":expected", n(endpoint.version))
            .send()
            .await
            .map_err(|e| {
                if is_condition_failure(&e) {
                    StoreError::Conflict(format!(
                        "endpoint {} changed meanwhile or no longer exists",
                        endpoint.id
                    ))
                } else {
                    backend(e)
                }
            })?;
        Ok(next)
    }

    async fn update_endpoint_health(
        &self,
        id: &EndpointId,
        health: &EndpointHealth,
    ) -> StoreResult<EndpointHealth> {
        let mut next = health.clone();
        next.version += 1;
        self.client
            .update_item()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::endpoint(id))))
            .update_expression("SET #health = :health, #ver = :next")
            .condition_expression(version_condition(health.version))
            .expression_attribute_names("#health", HEALTH)
            .expression_attribute_names("#ver", HEALTH_VERSION)
            .expression_attribute_values(":health", to_json(&next))
            .expression_attribute_values(":next", n(next.version))
            .expression_attribute_values(":expected", n(health.version))
            .send()
            .await
            .map_err(|e| {
                if is_condition_failure(&e) {
                    StoreError::Conflict(format!("the health of endpoint {id} changed meanwhile"))
                } else {
                    backend(e)
                }
            })?;
        Ok(next)
    }

    async fn delete_endpoint(&self, id: &EndpointId) -> StoreResult<()> {
        for n in 0..COUNT_TRIES {
            if n > 0 {
                tokio::time::sleep(count_retry_pause(n)).await;
            }
            let Some(stored) = self.get_main(keys::endpoint(id)).await? else {
                return Ok(());
            };
            let tenant = decode(&stored)?.tenant_id;
            if self.try_delete(id, &tenant).await? {
                return Ok(());
            }
            // Cancelled: the endpoint went meanwhile (the next read ends it), another
            // transaction held an item (try again), or the tenant was never counted,
            // when the endpoint goes on its own and the first create counts what is
            // left.
            if self.endpoint_count(&tenant).await?.unwrap_or(0) == 0 {
                self.client
                    .delete_item()
                    .table_name(&self.main_table)
                    .set_key(Some(key(keys::endpoint(id))))
                    .send()
                    .await
                    .map_err(backend)?;
                return Ok(());
            }
        }
        Err(StoreError::Backend(format!(
            "endpoint {id}: its tenant's endpoints kept changing meanwhile; try again"
        )))
    }

    async fn list_endpoints(
        &self,
        tenant: Option<&TenantId>,
        limit: usize,
        cursor: Option<&str>,
    ) -> StoreResult<Page<Endpoint>> {
        let part = match tenant {
            Some(t) => Self::tenant_endpoints_partition(t),
            None => Partition::new(keys::BY_KIND, keys::ALL_ENDPOINTS),
        };
        self.page_of(&part, cursor, limit, &|_| true, decode, |e: &Endpoint| {
            e.id.to_string()
        })
        .await
    }

    async fn tenant_endpoints(&self, tenant: &TenantId) -> StoreResult<Vec<Endpoint>> {
        let items = self
            .query_partition(Some(keys::BY_TENANT), keys::tenant_endpoints(tenant), None)
            .await?;
        items.iter().map(decode).collect()
    }
}
