//! Endpoints in DynamoDB: by id, by tenant (gsi1), and all of them (gsi3, admin).

use async_trait::async_trait;
use entrega_core::endpoint::{Endpoint, EndpointHealth};
use entrega_core::ids::{EndpointId, TenantId};
use entrega_core::ports::{EndpointStore, Page, StoreError, StoreResult};

use super::*;

/// Configuration and health live in one item under separate versions: a health write
/// (`SET health`) never touches the configuration a client changed, and vice versa.
const HEALTH: &str = "health";
const HEALTH_VERSION: &str = "health_version";
const VERSION: &str = "version";

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
}

#[async_trait]
impl EndpointStore for DynamoStore {
    async fn create_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()> {
        self.client
            .put_item()
            .table_name(&self.main_table)
            .set_item(Some(item(endpoint)))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await
            .map_err(|e| {
                if is_condition_failure(&e) {
                    StoreError::Conflict(format!("endpoint {} exists", endpoint.id))
                } else {
                    backend(e)
                }
            })?;
        Ok(())
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
        self.client
            .delete_item()
            .table_name(&self.main_table)
            .set_key(Some(key(keys::endpoint(id))))
            .send()
            .await
            .map_err(backend)?;
        Ok(())
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
