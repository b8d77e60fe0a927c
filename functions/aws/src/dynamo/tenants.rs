//! Tenants and API keys in DynamoDB.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use entrega_core::ids::TenantId;
use entrega_core::ports::{Page, StoreError, StoreResult, TenantStore};
use entrega_core::tenant::{Principal, Tenant};

use super::*;

use keys::ADMIN_MARKER;

fn key_item(hash: &str, principal: &Principal) -> Item {
    let mut item = key(keys::api_key(hash));
    item.insert("principal".into(), to_json(principal));
    item
}

#[async_trait]
impl TenantStore for DynamoStore {
    async fn create_tenant(&self, tenant: &Tenant, api_key_hash: &str) -> StoreResult<()> {
        let mut item = key(keys::tenant(&tenant.id));
        item.insert("json".into(), to_json(tenant));
        // Tenants are few and made by hand: one partition of the admin's index holds
        // them all.
        item.insert(keys::BY_KIND.pk.into(), s(keys::ALL_TENANTS));
        item.insert(keys::BY_KIND.sk.into(), s(tenant.id.as_str()));
        let put_tenant = Put::builder()
            .table_name(&self.main_table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .expect("table and item are set");
        let put_key = Put::builder()
            .table_name(&self.main_table)
            .set_item(Some(key_item(
                api_key_hash,
                &Principal::Tenant(tenant.id.clone()),
            )))
            .build()
            .expect("table and item are set");
        // The tenant and its key commit together: no tenant without a way in.
        self.client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(put_tenant).build())
            .transact_items(TransactWriteItem::builder().put(put_key).build())
            .send()
            .await
            .map_err(|e| {
                if is_condition_failure(&e) {
                    StoreError::Conflict(format!("tenant {} exists", tenant.id))
                } else {
                    backend(e)
                }
            })?;
        Ok(())
    }

    async fn get_tenant(&self, id: &TenantId) -> StoreResult<Option<Tenant>> {
        self.get_main(keys::tenant(id))
            .await?
            .as_ref()
            .map(from_json)
            .transpose()
    }

    async fn list_tenants(&self, limit: usize, cursor: Option<&str>) -> StoreResult<Page<Tenant>> {
        let part = Partition::new(keys::BY_KIND, keys::ALL_TENANTS);
        self.page_of(&part, cursor, limit, &|_| true, from_json, |t: &Tenant| {
            t.id.to_string()
        })
        .await
    }

    async fn put_api_key(&self, api_key_hash: &str, principal: &Principal) -> StoreResult<()> {
        self.client
            .put_item()
            .table_name(&self.main_table)
            .set_item(Some(key_item(api_key_hash, principal)))
            .send()
            .await
            .map_err(backend)?;
        if *principal == Principal::Admin {
            // A marker, because key items are found by hash only.
            self.client
                .put_item()
                .table_name(&self.main_table)
                .set_item(Some(key(ADMIN_MARKER.to_owned())))
                .send()
                .await
                .map_err(backend)?;
        }
        Ok(())
    }

    async fn has_admin_key(&self) -> StoreResult<bool> {
        Ok(self.get_main(ADMIN_MARKER.to_owned()).await?.is_some())
    }

    async fn principal_for_key(&self, api_key_hash: &str) -> StoreResult<Option<Principal>> {
        let item = self.get_main(keys::api_key(api_key_hash)).await?;
        let Some(item) = item.as_ref() else {
            return Ok(None);
        };
        let json = get_s(item, "principal")
            .ok_or_else(|| StoreError::Backend("a key item has no principal".into()))?;
        serde_json::from_str(json)
            .map(Some)
            .map_err(|e| StoreError::Backend(format!("stored principal unreadable: {e}")))
    }
}
