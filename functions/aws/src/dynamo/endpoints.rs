//! Endpoints in DynamoDB: by id, by tenant (gsi1), and all of them (gsi3, admin).

use async_trait::async_trait;
use entrega_core::endpoint::Endpoint;
use entrega_core::ids::{EndpointId, TenantId};
use entrega_core::ports::{EndpointStore, Page, StoreError, StoreResult};

use super::*;

fn endpoint_pk(id: &EndpointId) -> String {
    format!("EP#{id}")
}

/// The gsi3 partition of all endpoints: endpoints are few (one per customer URL), so
/// one partition is enough for the admin's listing.
const ALL_ENDPOINTS: &str = "ALL_EP";

fn item(endpoint: &Endpoint) -> Item {
    let mut item = key(endpoint_pk(&endpoint.id));
    item.insert("json".into(), to_json(endpoint));
    item.insert("tenant_id".into(), s(endpoint.tenant_id.as_str()));
    item.insert(
        "gsi1pk".into(),
        s(format!("TENANT_EP#{}", endpoint.tenant_id)),
    );
    item.insert("gsi1sk".into(), s(endpoint.id.as_str()));
    item.insert("gsi3pk".into(), s(ALL_ENDPOINTS));
    item.insert("gsi3sk".into(), s(endpoint.id.as_str()));
    item
}

impl DynamoStore {
    fn tenant_endpoints_partition(tenant: &TenantId) -> Partition {
        Partition {
            index: Some("gsi1"),
            pk_attr: "gsi1pk",
            pk: format!("TENANT_EP#{tenant}"),
            sk_attr: "gsi1sk",
        }
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
        self.get_main(endpoint_pk(id))
            .await?
            .as_ref()
            .map(from_json)
            .transpose()
    }

    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()> {
        self.client
            .put_item()
            .table_name(&self.main_table)
            .set_item(Some(item(endpoint)))
            .condition_expression("attribute_exists(pk)")
            .send()
            .await
            .map_err(|e| {
                if is_condition_failure(&e) {
                    StoreError::Conflict(format!("endpoint {} no longer exists", endpoint.id))
                } else {
                    backend(e)
                }
            })?;
        Ok(())
    }

    async fn delete_endpoint(&self, id: &EndpointId) -> StoreResult<()> {
        self.client
            .delete_item()
            .table_name(&self.main_table)
            .set_key(Some(key(endpoint_pk(id))))
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
            None => Partition {
                index: Some("gsi3"),
                pk_attr: "gsi3pk",
                pk: ALL_ENDPOINTS.into(),
                sk_attr: "gsi3sk",
            },
        };
        let mut pages = 0;
        let found = self
            .collect_desc(&part, cursor, limit + 1, &|_| true, &mut pages)
            .await?;
        let data = found
            .items
            .iter()
            .map(from_json)
            .collect::<Result<Vec<Endpoint>, _>>()?;
        Ok(Page::from_rows(
            data,
            limit,
            |e| e.id.to_string(),
            found.more.then_some(found.last_seen).flatten(),
        ))
    }

    async fn tenant_endpoints(&self, tenant: &TenantId) -> StoreResult<Vec<Endpoint>> {
        let items = self
            .query_partition(Some("gsi1"), "gsi1pk", format!("TENANT_EP#{tenant}"), None)
            .await?;
        items.iter().map(from_json).collect()
    }
}
