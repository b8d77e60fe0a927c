//! Endpoints in SQLite.

use async_trait::async_trait;
use entrega_core::endpoint::Endpoint;
use entrega_core::ids::{EndpointId, TenantId};
use entrega_core::ports::{EndpointStore, Page, StoreResult};
use rusqlite::params;

use super::{json_row, json_rows, DbError, SqliteStore};

fn to_json(e: &Endpoint) -> String {
    serde_json::to_string(e).expect("an endpoint serialises")
}

#[async_trait]
impl EndpointStore for SqliteStore {
    async fn create_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()> {
        let (id, tenant, json) = (
            endpoint.id.to_string(),
            endpoint.tenant_id.to_string(),
            to_json(endpoint),
        );
        self.db
            .call(move |conn| {
                conn.execute(
                    "INSERT INTO endpoints (id, tenant_id, json) VALUES (?1, ?2, ?3)",
                    params![id, tenant, json],
                )?;
                Ok(())
            })
            .await
    }

    async fn get_endpoint(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>> {
        let id = id.to_string();
        self.db
            .call(move |conn| json_row(conn, "SELECT json FROM endpoints WHERE id = ?1", [id]))
            .await
    }

    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()> {
        let (id, json) = (endpoint.id.to_string(), to_json(endpoint));
        self.db
            .call(move |conn| {
                let n = conn.execute(
                    "UPDATE endpoints SET json = ?2 WHERE id = ?1",
                    params![id, json],
                )?;
                if n == 0 {
                    return Err(DbError::Conflict(format!("endpoint {id} no longer exists")));
                }
                Ok(())
            })
            .await
    }

    async fn delete_endpoint(&self, id: &EndpointId) -> StoreResult<()> {
        let id = id.to_string();
        self.db
            .call(move |conn| {
                conn.execute("DELETE FROM endpoints WHERE id = ?1", [id])?;
                Ok(())
            })
            .await
    }

    async fn list_endpoints(
        &self,
        tenant: Option<&TenantId>,
        limit: usize,
        cursor: Option<&str>,
    ) -> StoreResult<Page<Endpoint>> {
        let tenant = tenant.map(ToString::to_string);
        let cursor = cursor.map(str::to_owned);
        self.db
            .call(move |conn| {
                let mut stmt = conn.prepare(
                    "SELECT json FROM endpoints
                     WHERE (?1 IS NULL OR tenant_id = ?1) AND (?2 IS NULL OR id < ?2)
                     ORDER BY id DESC LIMIT ?3",
                )?;
                let rows = stmt
                    .query_map(params![tenant, cursor, (limit + 1) as i64], |r| {
                        r.get::<_, String>(0)
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                let data = rows
                    .iter()
                    .map(|j| serde_json::from_str::<Endpoint>(j))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Page::from_rows(data, limit, |e| e.id.to_string(), None))
            })
            .await
    }

    async fn tenant_endpoints(&self, tenant: &TenantId) -> StoreResult<Vec<Endpoint>> {
        let tenant = tenant.to_string();
        self.db
            .call(move |conn| {
                json_rows(
                    conn,
                    "SELECT json FROM endpoints WHERE tenant_id = ?1",
                    [tenant],
                )
            })
            .await
    }
}
