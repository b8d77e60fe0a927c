//! Tenants and API keys in SQLite.

use super::{json_row, json_rows, SqliteStore};
use async_trait::async_trait;
use entrega_core::ids::TenantId;
use entrega_core::ports::{Page, StoreError, StoreResult, TenantStore};
use entrega_core::tenant::{Principal, Tenant};
use rusqlite::params;

#[async_trait]
impl TenantStore for SqliteStore {
    async fn create_tenant(&self, tenant: &Tenant, api_key_hash: &str) -> StoreResult<()> {
        let json = serde_json::to_string(tenant).expect("a tenant serialises");
        let principal = serde_json::to_string(&Principal::Tenant(tenant.id.clone()))
            .expect("a principal serialises");
        let (id, hash) = (tenant.id.to_string(), api_key_hash.to_owned());
        // "It exists" is an answer (`Ok(false)`), not a failed write (see `writer.rs`).
        let created = self
            .db
            .call(move |conn| {
                // The tenant and its key commit together: no tenant without a way in.
                let created = conn
                    .prepare_cached(
                        "INSERT INTO tenants (id, json) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                    )?
                    .execute(params![id, json])?
                    == 1;
                if created {
                    conn.prepare_cached("INSERT INTO api_keys (hash, principal) VALUES (?1, ?2)")?
                        .execute(params![hash, principal])?;
                }
                Ok(created)
            })
            .await?;
        if created {
            Ok(())
        } else {
            Err(StoreError::Conflict(format!("tenant {} exists", tenant.id)))
        }
    }

    async fn get_tenant(&self, id: &TenantId) -> StoreResult<Option<Tenant>> {
        let id = id.to_string();
        self.db
            .get(move |conn| json_row(conn, "SELECT json FROM tenants WHERE id = ?1", [id]))
            .await
    }

    async fn list_tenants(&self, limit: usize, cursor: Option<&str>) -> StoreResult<Page<Tenant>> {
        let cursor = cursor.map(str::to_owned);
        self.db
            .read(move |conn| {
                let data: Vec<Tenant> = json_rows(
                    conn,
                    "SELECT json FROM tenants WHERE (?1 IS NULL OR id < ?1)
                     ORDER BY id DESC LIMIT ?2",
                    params![cursor, (limit + 1) as i64],
                )?;
                Ok(Page::from_rows(data, limit, |t| t.id.to_string(), None))
            })
            .await
    }

    async fn put_api_key(&self, api_key_hash: &str, principal: &Principal) -> StoreResult<()> {
        let principal = serde_json::to_string(principal).expect("a principal serialises");
        let hash = api_key_hash.to_owned();
        self.db
            .call(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO api_keys (hash, principal) VALUES (?1, ?2)
                     ON CONFLICT (hash) DO UPDATE SET principal = excluded.principal",
                )?
                .execute(params![hash, principal])?;
                Ok(())
            })
            .await
    }

    async fn principal_for_key(&self, api_key_hash: &str) -> StoreResult<Option<Principal>> {
        let now = self.clock.now();
        if let Some(principal) = self.principals.get(api_key_hash, now) {
            return Ok(Some(principal));
        }
        let read_at = self.principals.generation();
        let hash = api_key_hash.to_owned();
        let found: Option<Principal> = self
            .db
            .get(move |conn| {
                json_row(
                    conn,
                    "SELECT principal FROM api_keys WHERE hash = ?1",
                    [hash],
                )
            })
            .await?;
        // Only keys that exist are kept: a wrong key is read again each time, so a
        // flood of them cannot push the real ones out.
        if let Some(principal) = &found {
            self.principals
                .put(api_key_hash.to_owned(), principal.clone(), read_at, now);
        }
        Ok(found)
    }

    async fn has_admin_key(&self) -> StoreResult<bool> {
        let admin = serde_json::to_string(&Principal::Admin).expect("a principal serialises");
        self.db
            .get(move |conn| {
                Ok(conn
                    .prepare_cached("SELECT EXISTS(SELECT 1 FROM api_keys WHERE principal = ?1)")?
                    .query_row([admin], |r| r.get(0))?)
            })
            .await
    }
}
