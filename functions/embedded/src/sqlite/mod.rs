//! The SQLite adapters: one database file holds the store (tenants, keys, endpoints,
//! the outbox, deliveries, attempts, failures, counters) and the two queues.
//!
//! Writes go to one writer thread that commits them in groups; reads go to read-only
//! connections (see [`db`]).

pub mod backlog;
mod db;
mod deliveries;
mod endpoints;
mod events;
mod failures;
mod lanes;
pub mod prefetch;
pub mod publish_fan_out;
pub mod queue;
mod read_cache;
mod readers;
pub mod retention;
mod schema;
mod sync;
mod tenants;
mod writer;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use entrega_core::ports::{Clock, StoreError, StoreResult};
use rusqlite::{Connection, OptionalExtension};

pub use db::{replayable, Durability, SqliteDb};
pub use lanes::KeptSlots;

/// The share of `--max-db-size-mb` new events may fill; the rest is headroom for the
/// deliveries, attempts and queue rows of what was already accepted.
const PUBLISH_SHARE: f64 = 0.75;

/// Errors inside a database call: SQLite's, or a domain conflict.
#[derive(Debug)]
pub enum DbError {
    Sql(rusqlite::Error),
    Json(serde_json::Error),
    Conflict(String),
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<serde_json::Error> for DbError {
    fn from(e: serde_json::Error) -> Self {
        Self::Json(e)
    }
}

impl From<DbError> for StoreError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Sql(e) => StoreError::Backend(format!("sqlite: {e}")),
            DbError::Json(e) => StoreError::Backend(format!("stored record unreadable: {e}")),
            DbError::Conflict(what) => StoreError::Conflict(what),
        }
    }
}

/// The JSON record in the first column of the one row `sql` selects, decoded.
fn json_row<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Option<T>, DbError> {
    let json: Option<String> = conn
        .prepare_cached(sql)?
        .query_row(params, |r| r.get(0))
        .optional()?;
    Ok(json.map(|j| serde_json::from_str(&j)).transpose()?)
}

/// The JSON records in the first column of the rows `sql` selects, decoded.
fn json_rows<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<T>, DbError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt
        .query_map(params, |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows
        .iter()
        .map(|j| serde_json::from_str(j))
        .collect::<Result<Vec<_>, _>>()?)
}

/// Timestamps are stored in the API's format: fixed width, so they sort as text.
fn ts(t: DateTime<Utc>) -> String {
    entrega_core::event::format_timestamp(t)
}

/// The store: every store port over one database.
#[derive(Clone)]
pub struct SqliteStore {
    db: SqliteDb,
    clock: Arc<dyn Clock>,
    /// Events committed but not fanned out, per tenant (for the backlog).
    outbox_pending: backlog::TenantCounts,
    /// Which tenant the next outbox poll starts with (round-robin).
    outbox_turn: Arc<std::sync::atomic::AtomicUsize>,
    /// The principal each API key hash names (keys are never changed or removed).
    principals: Arc<read_cache::ReadCache<String, entrega_core::tenant::Principal>>,
    /// Each tenant's endpoints, as the fan-out reads them.
    endpoint_lists: Arc<read_cache::ReadCache<String, Arc<Vec<entrega_core::endpoint::Endpoint>>>>,
}

impl SqliteStore {
    pub fn new(db: SqliteDb, clock: Arc<dyn Clock>) -> Self {
        Self {
            db,
            clock,
            outbox_pending: backlog::TenantCounts::default(),
            outbox_turn: Arc::default(),
            principals: Arc::default(),
            endpoint_lists: Arc::default(),
        }
    }

    /// Count the outbox rows not yet fanned out, per tenant (at start-up).
    pub async fn load_outbox_pending(&self) -> StoreResult<()> {
        let rows = self
            .db
            .call(|conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT tenant_id, COUNT(*) FROM outbox WHERE fanned_out = 0 GROUP BY tenant_id",
                )?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await?;
        for (tenant, count) in rows {
            self.outbox_pending.set(tenant, count as u64);
        }
        Ok(())
    }

    pub fn db(&self) -> &SqliteDb {
        &self.db
    }

    pub fn outbox_pending(&self) -> &backlog::TenantCounts {
        &self.outbox_pending
    }

    /// After a crash (or `kill -9`) no attempt of the previous process is running: the
    /// database is locked to one process, so every lease it held is void (also one a
    /// resend kept from the attempt it superseded). Clearing them lets the restarted
    /// worker resume at once instead of waiting them out.
    ///
    /// An attempt's delivery has no next attempt set, only its lease: with the lease
    /// gone it would be due at no time, out of the sweeper's view (and of the start's
    /// repair, [`crate::restart`]) until its message came back. It is due now.
    pub async fn release_dead_leases(&self) -> StoreResult<usize> {
        let now = deliveries::json_time(self.clock.now());
        self.db
            .call(move |conn| {
                Ok(conn
                    .prepare_cached(
                        "UPDATE deliveries
                         SET json = json_set(json,
                                '$.lease_until', json('null'),
                                '$.next_attempt_at',
                                    COALESCE(json_extract(json, '$.next_attempt_at'), ?1)),
                             due_at = COALESCE(json_extract(json, '$.next_attempt_at'), ?1)
                         WHERE state = 'delivering'
                            OR (state = 'pending' AND json_extract(json, '$.lease_until') IS NOT NULL)",
                    )?
                    .execute([&now])?)
            })
            .await
    }

    /// Waiting deliveries that no message of the delivery queue names, most overdue
    /// first, at most `limit`: at start, those whose message the previous process had
    /// not yet written when it stopped (see [`crate::restart`]).
    pub async fn waiting_without_message(
        &self,
        limit: usize,
    ) -> StoreResult<Vec<entrega_core::delivery::Delivery>> {
        self.db
            .read(move |conn| {
                // `IS NOT NULL`: a resume task names no delivery, and one NULL in a
                // `NOT IN` list makes the test unknown for every row.
                json_rows(
                    conn,
                    "SELECT json FROM deliveries
                     WHERE due_at IS NOT NULL
                       AND id NOT IN (SELECT json_extract(body, '$.delivery_id') FROM queue
                                      WHERE queue = ?1
                                        AND json_extract(body, '$.delivery_id') IS NOT NULL)
                     ORDER BY due_at
                     LIMIT ?2",
                    rusqlite::params![queue::DELIVERY_QUEUE, limit as i64],
                )
            })
            .await
    }
}
