//! Endpoints in SQLite: the configuration and the health record in one row, each
//! under its own version.

use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::endpoint::{Endpoint, EndpointHealth};
use entrega_core::ids::{EndpointId, TenantId};
use entrega_core::ports::{EndpointCreated, EndpointStore, Page, StoreError, StoreResult};
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{DbError, SqliteStore};

/// The columns [`from_row`] reads, in order.
const COLUMNS: &str = "json, version, health, health_version";

fn config_json(e: &Endpoint) -> String {
    serde_json::to_string(e).expect("an endpoint serialises")
}

fn from_row(row: &Row<'_>) -> rusqlite::Result<(String, i64, String, i64)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

/// The endpoint `id`, if there is one.
pub(super) fn read_endpoint(conn: &Connection, id: &str) -> Result<Option<Endpoint>, DbError> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM endpoints WHERE id = ?1"))?
        .query_row([id], from_row)
        .optional()?
        .map(decode)
        .transpose()
}

fn decode(
    (json, version, health, health_version): (String, i64, String, i64),
) -> Result<Endpoint, DbError> {
    let mut endpoint: Endpoint = serde_json::from_str(&json)?;
    endpoint.version = version as u64;
    endpoint.health = serde_json::from_str(&health)?;
    endpoint.health.version = health_version as u64;
    Ok(endpoint)
}

/// One of the two versioned parts of an endpoint row: its JSON column, its version
/// column, and what a conflict on it means.
struct VersionedColumns {
    json: &'static str,
    version: &'static str,
    conflict: &'static str,
}

impl VersionedColumns {
    const CONFIG: Self = Self {
        json: "json",
        version: "version",
        conflict: "changed meanwhile or no longer exists",
    };
    const HEALTH: Self = Self {
        json: "health",
        version: "health_version",
        conflict: "health changed meanwhile",
    };
}

impl SqliteStore {
    /// Run `work`, a write to the endpoints table, then drop every cached list of
    /// endpoints (whatever came of it: a commit whose answer was lost may have landed),
    /// before the caller hears of it.
    async fn write_endpoints<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Connection) -> Result<T, DbError> + Send + 'static,
    {
        let result = self.db.call(work).await;
        self.endpoint_lists.invalidate();
        result
    }

    /// Write one part of the endpoint if its stored version is still `expected`, and
    /// bump that version; a `Conflict` otherwise.
    async fn versioned_update(
        &self,
        part: VersionedColumns,
        id: &EndpointId,
        json: String,
        expected: u64,
    ) -> StoreResult<()> {
        let key = id.to_string();
        // A conflict is an answer (`Ok(false)`), not a failed write: a failed write
        // makes the writer run its whole group again (see `writer.rs`).
        let updated = self
            .write_endpoints(move |conn| {
                let n = conn
                    .prepare_cached(&format!(
                        "UPDATE endpoints SET {json} = ?2, {version} = {version} + 1
                         WHERE id = ?1 AND {version} = ?3",
                        json = part.json,
                        version = part.version
                    ))?
                    .execute(params![key, json, expected as i64])?;
                Ok(n == 1)
            })
            .await?;
        if updated {
            Ok(())
        } else {
            Err(StoreError::Conflict(format!(
                "endpoint {id}: {}",
                part.conflict
            )))
        }
    }
}

#[async_trait]
impl EndpointStore for SqliteStore {
    async fn create_endpoint(
        &self,
        endpoint: &Endpoint,
        per_tenant: usize,
    ) -> StoreResult<EndpointCreated> {
        let (id, tenant, json) = (
            endpoint.id.to_string(),
            endpoint.tenant_id.to_string(),
            config_json(endpoint),
        );
        // The count and the insert are one statement on the one writer: no other write
        // lands between them, so racing creates cannot pass the limit together.
        let stored = self
            .write_endpoints(move |conn| {
                let n = conn
                    .prepare_cached(
                        "INSERT INTO endpoints (id, tenant_id, json)
                         SELECT ?1, ?2, ?3
                         WHERE (SELECT count(*) FROM endpoints WHERE tenant_id = ?2) < ?4",
                    )?
                    .execute(params![id, tenant, json, per_tenant as i64])?;
                Ok(n == 1)
            })
            .await?;
        Ok(if stored {
            EndpointCreated::Stored
        } else {
            EndpointCreated::TenantFull
        })
    }

    async fn get_endpoint(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>> {
        if let Some(endpoint) = super::prefetch::take_endpoint(id) {
            return Ok(Some(endpoint));
        }
        let id = id.to_string();
        self.db.get(move |conn| read_endpoint(conn, &id)).await
    }

    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<Endpoint> {
        let mut next = endpoint.clone();
        next.version += 1;
        let json = config_json(&next);
        self.versioned_update(
            VersionedColumns::CONFIG,
            &endpoint.id,
            json,
            endpoint.version,
        )
        .await?;
        Ok(next)
    }

    async fn update_endpoint_health(
        &self,
        id: &EndpointId,
        health: &EndpointHealth,
    ) -> StoreResult<EndpointHealth> {
        let mut next = health.clone();
        next.version += 1;
        let json = serde_json::to_string(&next).expect("health serialises");
        self.versioned_update(VersionedColumns::HEALTH, id, json, health.version)
            .await?;
        Ok(next)
    }

    async fn delete_endpoint(&self, id: &EndpointId) -> StoreResult<()> {
        let id = id.to_string();
        self.write_endpoints(move |conn| {
            conn.prepare_cached("DELETE FROM endpoints WHERE id = ?1")?
                .execute([&id])?;
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
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM endpoints
                     WHERE (?1 IS NULL OR tenant_id = ?1) AND (?2 IS NULL OR id < ?2)
                     ORDER BY id DESC LIMIT ?3"
                ))?;
                let rows = stmt
                    .query_map(params![tenant, cursor, (limit + 1) as i64], from_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                let data = rows
                    .into_iter()
                    .map(decode)
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Page::from_rows(data, limit, |e| e.id.to_string(), None))
            })
            .await
    }

    async fn tenant_endpoints(&self, tenant: &TenantId) -> StoreResult<Vec<Endpoint>> {
        Ok(self.shared_tenant_endpoints(tenant).await?.as_ref().clone())
    }
}

impl SqliteStore {
    /// `tenant`'s endpoints as [`EndpointStore::tenant_endpoints`] reads them, without
    /// copying them out of the read cache.
    pub async fn shared_tenant_endpoints(
        &self,
        tenant: &TenantId,
    ) -> StoreResult<Arc<Vec<Endpoint>>> {
        let now = self.clock.now();
        if let Some(endpoints) = self.endpoint_lists.get(tenant.as_str(), now) {
            return Ok(endpoints);
        }
        let tenant = tenant.to_string();
        let read_at = self.endpoint_lists.generation();
        let key = tenant.clone();
        let endpoints: Vec<Endpoint> = self
            .db
            .get(move |conn| {
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM endpoints WHERE tenant_id = ?1"
                ))?;
                let rows = stmt
                    .query_map([key.as_str()], from_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                rows.into_iter().map(decode).collect::<Result<Vec<_>, _>>()
            })
            .await?;
        let endpoints = Arc::new(endpoints);
        self.endpoint_lists
            .put(tenant, endpoints.clone(), read_at, now);
        Ok(endpoints)
    }
}
