//! Failure records and counters in SQLite.

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::failure::Failure;
use entrega_core::ids::FailureId;
use entrega_core::ports::{CounterStore, FailureStore, StoreResult};
use rusqlite::{params, OptionalExtension};

use super::SqliteStore;

#[async_trait]
impl FailureStore for SqliteStore {
    async fn put_failure_if_absent(&self, failure: &Failure) -> StoreResult<bool> {
        let json = serde_json::to_string(failure).expect("a failure serialises");
        let (id, tenant) = (failure.id.to_string(), failure.tenant_id.to_string());
        self.db
            .call(move |conn| {
                let n = conn.execute(
                    "INSERT INTO failures (id, tenant_id, json) VALUES (?1, ?2, ?3)
                     ON CONFLICT (id) DO NOTHING",
                    params![id, tenant, json],
                )?;
                Ok(n == 1)
            })
            .await
    }

    async fn get_failure(&self, id: &FailureId) -> StoreResult<Option<Failure>> {
        let id = id.to_string();
        self.db
            .call(move |conn| {
                let json: Option<String> = conn
                    .query_row("SELECT json FROM failures WHERE id = ?1", [id], |r| {
                        r.get(0)
                    })
                    .optional()?;
                Ok(json.map(|j| serde_json::from_str(&j)).transpose()?)
            })
            .await
    }
}

#[async_trait]
impl CounterStore for SqliteStore {
    async fn increment(&self, key: &str, ttl: Duration) -> StoreResult<u64> {
        let key = key.to_owned();
        let now = self.clock.now().timestamp();
        let expires_at = now + ttl.as_secs() as i64;
        self.db
            .call(move |conn| {
                // Expired windows are dropped as new ones are counted: no sweeper needed.
                conn.execute("DELETE FROM counters WHERE expires_at < ?1", [now])?;
                let value: i64 = conn.query_row(
                    "INSERT INTO counters (key, value, expires_at) VALUES (?1, 1, ?2)
                     ON CONFLICT (key) DO UPDATE SET value = value + 1
                     RETURNING value",
                    params![key, expires_at],
                    |r| r.get(0),
                )?;
                Ok(value as u64)
            })
            .await
    }
}
