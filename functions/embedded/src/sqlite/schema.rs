//! The embedded database schema. Records are stored whole as JSON (the domain types'
//! serde form) beside the columns that queries filter and sort on.

pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS tenants (
    id TEXT PRIMARY KEY,
    json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    hash TEXT PRIMARY KEY,
    principal TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS endpoints (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS endpoints_by_tenant ON endpoints (tenant_id, id);

-- The outbox: an event exists once its row commits. `fanned_out` is the embedded
-- runtime's stand-in for a DynamoDB stream's position.
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    tenant_id TEXT NOT NULL,
    json TEXT NOT NULL,
    fanned_out INTEGER NOT NULL DEFAULT 0
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
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_by_tenant ON deliveries (tenant_id, id);
CREATE INDEX IF NOT EXISTS deliveries_by_endpoint ON deliveries (endpoint_id, state, id);
CREATE INDEX IF NOT EXISTS deliveries_by_event ON deliveries (event_id);

CREATE TABLE IF NOT EXISTS attempts (
    id TEXT PRIMARY KEY,
    delivery_id TEXT NOT NULL,
    endpoint_id TEXT NOT NULL,
    started_at TEXT NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS attempts_by_delivery ON attempts (delivery_id);
CREATE INDEX IF NOT EXISTS attempts_by_endpoint ON attempts (endpoint_id, started_at);

CREATE TABLE IF NOT EXISTS failures (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS failures_by_tenant ON failures (tenant_id, id);

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
CREATE INDEX IF NOT EXISTS queue_ready ON queue (queue, grp, visible_at);
CREATE INDEX IF NOT EXISTS queue_in_flight ON queue (queue, in_flight, ckey);
"#;
