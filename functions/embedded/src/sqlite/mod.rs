//! The SQLite adapters: one database file holds the store (tenants, keys, endpoints,
//! the outbox, deliveries, attempts, failures, counters) and the two queues.
//!
//! One connection behind a mutex, used from tokio's blocking pool: SQLite serialises
//! writers anyway, and a single connection makes every transaction's view simple.
//! WAL mode keeps readers (`sqlite3` in another shell) from blocking the runtime.

pub mod backlog;
mod deliveries;
mod endpoints;
mod events;
mod failures;
mod lanes;
pub mod queue;
mod schema;
mod tenants;

use std::path::Path;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use entrega_core::ports::{Clock, StoreError, StoreResult};
use rusqlite::{Connection, OptionalExtension};

/// How long a statement waits for a lock held by another connection (an operator's
/// `sqlite3` shell) before failing.
const BUSY_TIMEOUT_MS: u32 = 5_000;

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct SqliteDb {
    conn: Arc<Mutex<Connection>>,
    /// Pages in use past which new events are refused (0: no limit): a share of the
    /// hard size limit kept free, so what was accepted can still be delivered.
    publish_pages: Arc<std::sync::atomic::AtomicI64>,
}

/// The share of `--max-db-size-mb` new events may fill; the rest is headroom for the
/// deliveries, attempts and queue rows of what was already accepted.
const PUBLISH_SHARE: f64 = 0.75;

impl SqliteDb {
    /// Open (creating if needed) the database at `path` and bring its schema up to date.
    pub fn open(path: &Path) -> Result<Self, rusqlite::Error> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // NORMAL in WAL mode: a commit survives a process crash (kill -9); only an OS
        // crash or power loss may lose the last transactions.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "busy_timeout", BUSY_TIMEOUT_MS)?;
        schema::migrate(&mut conn)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            publish_pages: Arc::default(),
        })
    }

    /// Bound the database file to `bytes` (SQLite's `max_page_count`): past it, writes
    /// fail with "database or disk is full" and the API answers 503, before the disk
    /// itself fills.
    pub async fn limit_size(&self, bytes: u64) -> StoreResult<()> {
        let pages = self
            .call(move |conn| {
                let page_size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
                let pages = (bytes as i64 / page_size.max(512)).max(1);
                conn.pragma_update(None, "max_page_count", pages)?;
                Ok(pages)
            })
            .await?;
        self.publish_pages.store(
            ((pages as f64 * PUBLISH_SHARE) as i64).max(1),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    }

    /// Pages in use past which new events are refused, if the size is limited.
    pub fn publish_page_limit(&self) -> Option<i64> {
        match self
            .publish_pages
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            n => Some(n),
        }
    }

    /// Run `f` on the connection in the blocking pool.
    pub async fn call<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, DbError> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Backend(format!("database task failed: {e}")))?
        .map_err(StoreError::from)
    }
}

/// Errors inside a database call: SQLite's, or a domain conflict.
#[derive(Debug)]
pub enum DbError {
    Sql(rusqlite::Error),
    Json(serde_json::Error),
    Conflict(String),
    /// The store refuses to grow (a size limit): retry later.
    Full(String),
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
            DbError::Full(why) => StoreError::Backend(why),
        }
    }
}

/// The JSON record in the first column of the one row `sql` selects, decoded.
fn json_row<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Option<T>, DbError> {
    let json: Option<String> = conn.query_row(sql, params, |r| r.get(0)).optional()?;
    Ok(json.map(|j| serde_json::from_str(&j)).transpose()?)
}

/// The JSON records in the first column of the rows `sql` selects, decoded.
fn json_rows<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<T>, DbError> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt
        .query_map(params, |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows
        .iter()
        .map(|j| serde_json::from_str(j))
        .collect::<Result<Vec<_>, _>>()?)
}

/// Whether an insert failed on a uniqueness constraint.
fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(err, _)
            if err.code == rusqlite::ErrorCode::ConstraintViolation
    )
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
}

impl SqliteStore {
    pub fn new(db: SqliteDb, clock: Arc<dyn Clock>) -> Self {
        Self {
            db,
            clock,
            outbox_pending: backlog::TenantCounts::default(),
            outbox_turn: Arc::default(),
        }
    }

    /// Count the outbox rows not yet fanned out, per tenant (at start-up).
    pub async fn load_outbox_pending(&self) -> StoreResult<()> {
        let rows = self
            .db
            .call(|conn| {
                let mut stmt = conn.prepare(
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
    /// database is locked to one process, so every lease it held is void. Clearing them
    /// lets the restarted worker resume at once instead of waiting them out.
    pub async fn release_dead_leases(&self) -> StoreResult<usize> {
        self.db
            .call(|conn| {
                Ok(conn.execute(
                    "UPDATE deliveries SET json = json_set(json, '$.lease_until', json('null'))
                     WHERE state = 'delivering'",
                    [],
                )?)
            })
            .await
    }
}
