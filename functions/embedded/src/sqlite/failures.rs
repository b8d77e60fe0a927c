//! Failure records and counters in SQLite.

use std::time::Duration;

use super::{json_row, json_rows, SqliteStore};
use async_trait::async_trait;
use entrega_core::failure::{Acknowledgement, Failure, FailureQuery, Reacknowledge};
use entrega_core::ids::{DeliveryId, FailureId};
use entrega_core::ports::{CounterStore, FailureStore, Page, StoreResult};
use entrega_core::remembered::CLAIM_SUFFIX;
use rusqlite::{params, OptionalExtension};

/// Failure records one delivery can have read back at once: one per failed generation,
/// and a delivery resent this often is a loop, not a history.
const MAX_FAILURES_PER_DELIVERY: i64 = 1000;

#[async_trait]
impl FailureStore for SqliteStore {
    async fn put_failure_if_absent(&self, failure: &Failure) -> StoreResult<bool> {
        let json = serde_json::to_string(failure).expect("a failure serialises");
        let (id, tenant) = (failure.id.to_string(), failure.tenant_id.to_string());
        self.db
            .call(move |conn| {
                let n = conn
                    .prepare_cached(
                        "INSERT INTO failures (id, tenant_id, json) VALUES (?1, ?2, ?3)
                     ON CONFLICT (id) DO NOTHING",
                    )?
                    .execute(params![id, tenant, json])?;
                Ok(n == 1)
            })
            .await
    }

    async fn list_failures(&self, q: &FailureQuery) -> StoreResult<Page<Failure>> {
        let q = q.clone();
        self.db
            .read(move |conn| {
                let data: Vec<Failure> = json_rows(
                    conn,
                    "SELECT json FROM failures
                     WHERE (?1 IS NULL OR tenant_id = ?1) AND (?2 IS NULL OR id < ?2)
                       AND (?3 IS NULL OR (json_extract(json, '$.acknowledged_at') IS NOT NULL) = ?3)
                     ORDER BY id DESC LIMIT ?4",
                    params![
                        q.tenant.as_ref().map(|t| t.to_string()),
                        q.cursor,
                        q.acknowledged,
                        (q.limit + 1) as i64
                    ],
                )?;
                Ok(Page::from_rows(data, q.limit, |f| f.id.to_string(), None))
            })
            .await
    }

    async fn oldest_unacknowledged(
        &self,
        limit: usize,
        after: Option<&str>,
    ) -> StoreResult<Page<Failure>> {
        let after = after.map(str::to_owned);
        self.db
            .read(move |conn| {
                // The same condition as the partial index `failures_unacknowledged`.
                let data: Vec<Failure> = json_rows(
                    conn,
                    "SELECT json FROM failures
                     WHERE json_extract(json, '$.acknowledged_at') IS NULL
                       AND (?1 IS NULL OR id > ?1)
                     ORDER BY id LIMIT ?2",
                    params![after, (limit + 1) as i64],
                )?;
                Ok(Page::from_rows(data, limit, |f| f.id.to_string(), None))
            })
            .await
    }

    async fn failures_of_delivery(&self, delivery: &DeliveryId) -> StoreResult<Vec<Failure>> {
        let delivery = delivery.to_string();
        self.db
            .get(move |conn| {
                // The same expression as the `failures_by_delivery` index, so it is used.
                json_rows(
                    conn,
                    "SELECT json FROM failures WHERE json_extract(json, '$.delivery_id') = ?1
                     ORDER BY id LIMIT ?2",
                    params![delivery, MAX_FAILURES_PER_DELIVERY],
                )
            })
            .await
    }

    async fn acknowledge_failure(
        &self,
        id: &FailureId,
        ack: &Acknowledgement,
        again: Reacknowledge,
    ) -> StoreResult<Option<Failure>> {
        let (id, ack) = (id.to_string(), ack.clone());
        self.db
            .call(move |conn| {
                // Read and write in one transaction: the write is conditional on what
                // was read, as no other writer can come between.
                let json: Option<String> = conn
                    .prepare_cached("SELECT json FROM failures WHERE id = ?1")?
                    .query_row([&id], |r| r.get(0))
                    .optional()?;
                let Some(json) = json else { return Ok(None) };
                let failure: Failure = serde_json::from_str(&json)?;
                if failure.acknowledged_at.is_some() && again == Reacknowledge::KeepFirst {
                    return Ok(Some(failure));
                }
                let failure = failure.acknowledged(&ack);
                conn.prepare_cached("UPDATE failures SET json = ?2 WHERE id = ?1")?
                    .execute(params![id, serde_json::to_string(&failure)?])?;
                Ok(Some(failure))
            })
            .await
    }

    async fn get_failure(&self, id: &FailureId) -> StoreResult<Option<Failure>> {
        let id = id.to_string();
        self.db
            .get(move |conn| json_row(conn, "SELECT json FROM failures WHERE id = ?1", [id]))
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
                conn.prepare_cached("DELETE FROM counters WHERE expires_at < ?1")?
                    .execute([now])?;
                let value: i64 = conn
                    .prepare_cached(
                        "INSERT INTO counters (key, value, expires_at) VALUES (?1, 1, ?2)
                     ON CONFLICT (key) DO UPDATE SET value = value + 1
                     RETURNING value",
                    )?
                    .query_row(params![key, expires_at], |r| r.get(0))?;
                Ok(value as u64)
            })
            .await
    }

    async fn recall(&self, key: &str) -> StoreResult<Option<String>> {
        let key = key.to_owned();
        let now = self.clock.now().timestamp();
        let value = self
            .db
            .get(move |conn| {
                Ok(conn
                    .prepare_cached(
                        "SELECT value FROM remembered WHERE key = ?1 AND expires_at >= ?2",
                    )?
                    .query_row(params![key, now], |r| r.get(0))
                    .optional()?)
            })
            .await?;
        if value.is_some() {
            // What is remembered is an answer given again (a repeated request's): a
            // reader sees it once committed, before its log is synced, and it must not
            // be given before a power loss could no longer take it back.
            self.db.synced().await?;
        }
        Ok(value)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        let key = key.to_owned();
        self.db
            .call(move |conn| {
                conn.prepare_cached("DELETE FROM remembered WHERE key = ?1")?
                    .execute([&key])?;
                Ok(())
            })
            .await
    }

    async fn increment_once(&self, key: &str, token: &str, ttl: Duration) -> StoreResult<u64> {
        let (key, token) = (key.to_owned(), token.to_owned());
        let now = self.clock.now().timestamp();
        let expires_at = now + ttl.as_secs() as i64;
        self.db
            .call(move |conn| {
                conn.prepare_cached("DELETE FROM remembered WHERE expires_at < ?1")?
                    .execute([now])?;
                let fresh = conn
                    .prepare_cached(
                        "INSERT INTO remembered (key, value, expires_at) VALUES (?1, 'counted', ?2)
                     ON CONFLICT (key) DO NOTHING",
                    )?
                    .execute(params![token, expires_at])?
                    == 1;
                let value: i64 = if fresh {
                    conn.prepare_cached(
                        "INSERT INTO counters (key, value, expires_at) VALUES (?1, 1, ?2)
                         ON CONFLICT (key) DO UPDATE SET value = value + 1
                         RETURNING value",
                    )?
                    .query_row(params![key, expires_at], |r| r.get(0))?
                } else {
                    conn.prepare_cached("SELECT value FROM counters WHERE key = ?1")?
                        .query_row([&key], |r| r.get(0))
                        .optional()?
                        .unwrap_or(0)
                };
                Ok(value as u64)
            })
            .await
    }

    async fn remember_once(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> StoreResult<Option<String>> {
        let (key, value) = (key.to_owned(), value.to_owned());
        let now = self.clock.now().timestamp();
        let expires_at = now + ttl.as_secs() as i64;
        self.db
            .call(move |conn| {
                conn.prepare_cached("DELETE FROM remembered WHERE expires_at < ?1")?
                    .execute([now])?;
                let existing: Option<String> = conn
                    .prepare_cached("SELECT value FROM remembered WHERE key = ?1")?
                    .query_row([&key], |r| r.get(0))
                    .optional()?;
                if existing.is_none() {
                    conn.prepare_cached(
                        "INSERT INTO remembered (key, value, expires_at) VALUES (?1, ?2, ?3)",
                    )?
                    .execute(params![key, value, expires_at])?;
                }
                Ok(existing)
            })
            .await
    }
}

impl SqliteStore {
    /// Forget every claim of a request under an `Idempotency-Key` that was running
    /// (see `entrega_http`'s idempotency); how many. Called at start, before the API
    /// listens: each belongs to a request of the process before, which a crash ended.
    /// Kept, it answered a repeat of that request "still running" for five minutes.
    pub async fn release_request_claims(&self) -> StoreResult<usize> {
        self.db
            .call(|conn| {
                Ok(conn
                    .prepare_cached("DELETE FROM remembered WHERE substr(key, -length(?1)) = ?1")?
                    .execute([CLAIM_SUFFIX])?)
            })
            .await
    }
}
