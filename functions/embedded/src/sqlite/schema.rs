//! The embedded database schema. Records are stored whole as JSON (the domain types'
//! serde form) beside the columns that queries filter and sort on.

/// The schema version this code writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 4;

/// Refuse another program's database, before anything is changed in it (its journal
/// mode included): it failed half-way through [`migrate`] with an SQL error naming a
/// column (a hostile test). An unversioned Entrega database (schema 1) has an outbox;
/// later ones carry their version; a new file has no table at all.
pub fn refuse_foreign(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    let (tables, outbox): (i64, bool) = conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(name = 'outbox'), 0) > 0
         FROM sqlite_master WHERE type = 'table'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if tables == 0 || outbox || version > 0 {
        return Ok(());
    }
    Err(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
        Some(
            "this is not an Entrega database (it has tables Entrega did not make); give --db \
             a new file, or one Entrega wrote"
                .to_owned(),
        ),
    ))
}

/// Bring a database written by an earlier version up to [`SCHEMA_VERSION`], in one
/// transaction, before [`SCHEMA`] runs. Version 1 (unversioned, `user_version` 0) had
/// one global event-id namespace and endpoints without versions; version 2 found a
/// delivery's due time in its JSON (an expression index that parsed the record on
/// every write), kept attempts in a table with three indexes, and two indexes on the
/// queue that nothing reads any more. Version 3 indexed an endpoint's deliveries by
/// state, an entry that moved with every change of state (twice an attempt); [`SCHEMA`]
/// drops that index itself.
pub fn migrate(conn: &mut rusqlite::Connection) -> rusqlite::Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let has_table = |name: &str| -> rusqlite::Result<bool> {
        conn.query_row(
            "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [name],
            |r| r.get(0),
        )
    };
    let (has_endpoints, has_deliveries, has_attempts) = (
        has_table("endpoints")?,
        has_table("deliveries")?,
        has_table("attempts")?,
    );
    if version > SCHEMA_VERSION {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(format!(
                "the database was written by a newer Entrega (schema {version}, this one knows {SCHEMA_VERSION})"
            )),
        ));
    }
    let tx = conn.transaction()?;
    if version < 2 && has_endpoints {
        tx.execute_batch(
            "ALTER TABLE endpoints ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE endpoints ADD COLUMN health TEXT NOT NULL DEFAULT '{}';
             ALTER TABLE endpoints ADD COLUMN health_version INTEGER NOT NULL DEFAULT 0;
             CREATE TABLE outbox_v2 (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 id TEXT NOT NULL,
                 tenant_id TEXT NOT NULL,
                 json TEXT NOT NULL,
                 fanned_out INTEGER NOT NULL DEFAULT 0,
                 UNIQUE (tenant_id, id)
             );
             INSERT INTO outbox_v2 (seq, id, tenant_id, json, fanned_out)
                 SELECT seq, id, tenant_id, json, fanned_out FROM outbox;
             DROP TABLE outbox;
             ALTER TABLE outbox_v2 RENAME TO outbox;
             DROP INDEX IF EXISTS deliveries_by_event;",
        )?;
    }
    if version < 3 && has_deliveries {
        tx.execute_batch(
            "ALTER TABLE deliveries ADD COLUMN due_at TEXT;
             UPDATE deliveries SET due_at = coalesce(json_extract(json, '$.next_attempt_at'),
                                                    json_extract(json, '$.lease_until'))
                 WHERE state IN ('pending', 'delivering', 'retrying');
             DROP INDEX IF EXISTS deliveries_due;",
        )?;
    }
    // The attempts move to the table as SCHEMA now makes it.
    let move_attempts = version < 3 && has_attempts;
    if move_attempts {
        tx.execute_batch(
            "ALTER TABLE attempts RENAME TO attempts_v2;
             DROP INDEX IF EXISTS attempts_by_delivery;
             DROP INDEX IF EXISTS attempts_by_endpoint;",
        )?;
    }
    tx.execute_batch(SCHEMA)?;
    if move_attempts {
        tx.execute_batch(
            "INSERT OR IGNORE INTO attempts (delivery_id, id, endpoint_id, started_at, json)
                 SELECT delivery_id, id, endpoint_id, started_at, json FROM attempts_v2;
             DROP TABLE attempts_v2;",
        )?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()
}

pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tenants (
    id TEXT PRIMARY KEY,
    json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    hash TEXT PRIMARY KEY,
    principal TEXT NOT NULL
);
-- The configuration (`json`, `version`) and the health bookkeeping (`health`,
-- `health_version`) are versioned apart: the worker writes only the latter, so it can
-- never undo a client's change to the former.
CREATE TABLE IF NOT EXISTS endpoints (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    json TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 0,
    health TEXT NOT NULL DEFAULT '{}',
    health_version INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS endpoints_by_tenant ON endpoints (tenant_id, id);

-- The outbox: an event exists once its row commits. `fanned_out` is the embedded
-- runtime's stand-in for a DynamoDB stream's position. Event ids are scoped to their
-- tenant: two tenants may publish the same id.
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    json TEXT NOT NULL,
    fanned_out INTEGER NOT NULL DEFAULT 0,
    UNIQUE (tenant_id, id)
);
CREATE INDEX IF NOT EXISTS outbox_waiting ON outbox (fanned_out, tenant_id, seq);

CREATE TABLE IF NOT EXISTS deliveries (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    endpoint_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    state TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    version INTEGER NOT NULL,
    json TEXT NOT NULL,
    -- When a waiting delivery is due: its next attempt, or the end of the lease of the
    -- attempt under way (as the record's JSON writes times, so they compare as text).
    -- NULL once it waits no more (delivered, failed, paused).
    due_at TEXT
);
CREATE INDEX IF NOT EXISTS deliveries_by_tenant ON deliveries (tenant_id, id);
-- An endpoint's deliveries, newest first (the log filtered by endpoint, and by status
-- as it is read). Not keyed by state: that entry moved with every change of a
-- delivery's state, twice an attempt.
DROP INDEX IF EXISTS deliveries_by_endpoint;
CREATE INDEX IF NOT EXISTS deliveries_of_endpoint ON deliveries (endpoint_id, id);
-- An endpoint's paused deliveries, for the resume after it is enabled again: written
-- only when a delivery enters the paused state (created for a disabled endpoint, or
-- paused) or leaves it (resumed, or failed with its deleted endpoint).
CREATE INDEX IF NOT EXISTS deliveries_paused ON deliveries (endpoint_id, id)
    WHERE state = 'paused';
-- One delivery per event and endpoint, whatever its id (ids were derived otherwise
-- by earlier builds): also an event's deliveries, by its first two columns.
DROP INDEX IF EXISTS deliveries_by_tenant_event;
CREATE UNIQUE INDEX IF NOT EXISTS deliveries_of_event_endpoint
    ON deliveries (tenant_id, event_id, endpoint_id);
-- The sweeper's question: waiting deliveries by when they were due. Partial: only
-- waiting ones. (Not `WHERE state IN (...)`: SQLite evaluates an IN list through a
-- temporary table, opened twice per update of the row, a tenth of the writer's time.)
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (due_at) WHERE due_at IS NOT NULL;
-- Deliveries the sweeper queued again, left out of its question until `until` while
-- their version is the one it read (the deliveries table is never written for it).
CREATE TABLE IF NOT EXISTS sweep_postponed (
    delivery_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    until TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sweep_postponed_until ON sweep_postponed (until);

-- Keyed by delivery, then attempt: a delivery's attempts are one range of the table,
-- which needs no index of its own, so recording an attempt writes two trees, not four
-- (and delivery ids grow with time, so the writes land near each other).
CREATE TABLE IF NOT EXISTS attempts (
    delivery_id TEXT NOT NULL,
    id TEXT NOT NULL,
    endpoint_id TEXT NOT NULL,
    started_at TEXT NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (delivery_id, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS attempts_by_endpoint ON attempts (endpoint_id, started_at);

CREATE TABLE IF NOT EXISTS failures (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS failures_by_tenant ON failures (tenant_id, id);
CREATE INDEX IF NOT EXISTS failures_by_delivery ON failures (json_extract(json, '$.delivery_id'));
-- Only the unacknowledged ones: the 24-hour rule reads the oldest first.
CREATE INDEX IF NOT EXISTS failures_unacknowledged ON failures (id)
    WHERE json_extract(json, '$.acknowledged_at') IS NULL;

-- Answers to requests made with an Idempotency-Key, kept for a day.
CREATE TABLE IF NOT EXISTS remembered (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS counters (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

-- Both queues (delivery, failures). Times are unix milliseconds from the clock port.
CREATE TABLE IF NOT EXISTS queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    body TEXT NOT NULL,
    grp TEXT NOT NULL,
    ckey TEXT,
    climit INTEGER NOT NULL,
    visible_at INTEGER NOT NULL,
    in_flight INTEGER NOT NULL DEFAULT 0,
    receive_count INTEGER NOT NULL DEFAULT 0,
    receipt TEXT
);
-- Which message goes next is decided in memory (see `queue.rs`): the table is read
-- by row id only, and an index on it would be written with every send and delete.
DROP INDEX IF EXISTS queue_ready;
DROP INDEX IF EXISTS queue_in_flight;
"#;

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
