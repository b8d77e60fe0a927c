//! The outbox table contract, version 1, and `entrega outbox init`, which creates it
//! (idempotent, safe to run from two places at once) and grants Entrega's role only
//! what the drain needs.
//!
//! ```sql
//! entrega_outbox (
//!     id         text PRIMARY KEY DEFAULT gen_random_uuid()::text, -- the event id
//!     tenant_id  text NOT NULL,                                    -- ten_…
//!     type       text NOT NULL,                                    -- lead.created
//!     payload    jsonb NOT NULL,                                   -- the webhook's data
//!     created_at timestamptz NOT NULL DEFAULT clock_timestamp()
//! )
//! ```
//!
//! The same fields as the DynamoDB outbox item. An id is unique in the table, across
//! tenants (the design's contract, which producers' `ON CONFLICT (id)` relies on); a
//! table keyed by (`tenant_id`, `id`) instead, where two tenants' rows may share an
//! id as their events may in the API, drains as well: a drain names a row by the
//! pair. A drain reads `id`, `tenant_id` and `type` as text, so a `uuid` or `varchar`
//! column serves too; `payload` must be `jsonb`, which refuses what is not JSON.
//!
//! `entrega_outbox_quarantine` holds the rows that can never become events, with the
//! reason; an `AFTER INSERT` trigger notifies channel [`CHANNEL`] so a drain wakes at
//! the producer's commit.

use tokio_postgres::{Client, GenericClient};

/// What `COMMENT ON TABLE entrega_outbox` says; a drain refuses any other table.
pub const CONTRACT_VERSION: &str = "entrega outbox v1";
/// The channel the insert trigger notifies (on commit only: a rolled-back insert
/// wakes nobody).
pub const CHANNEL: &str = "entrega_outbox";
/// Serialises concurrent `init` runs (`CREATE … IF NOT EXISTS` alone can race).
const INIT_LOCK: i64 = 0x0065_6e74_7265_6761; // "entrega"

const CREATE: &str = r#"
CREATE TABLE IF NOT EXISTS entrega_outbox (
    id         text PRIMARY KEY DEFAULT gen_random_uuid()::text,
    tenant_id  text NOT NULL,
    type       text NOT NULL,
    payload    jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS entrega_outbox_by_age ON entrega_outbox (created_at, id);
CREATE TABLE IF NOT EXISTS entrega_outbox_quarantine (
    id             text NOT NULL,
    tenant_id      text NOT NULL,
    type           text NOT NULL,
    payload        jsonb NOT NULL,
    created_at     timestamptz NOT NULL,
    reason         text NOT NULL,
    quarantined_at timestamptz NOT NULL DEFAULT now()
);
CREATE OR REPLACE FUNCTION entrega_outbox_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('entrega_outbox', ''); RETURN NULL; END $$;
CREATE OR REPLACE TRIGGER entrega_outbox_notify AFTER INSERT ON entrega_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION entrega_outbox_notify();
COMMENT ON TABLE entrega_outbox IS 'entrega outbox v1';
"#;

/// Create the tables and the trigger (idempotent). With `grant_to`, give that role
/// what a drain needs and nothing more: read, lock and delete outbox rows, add
/// quarantined ones. Locking (`FOR UPDATE`) needs the UPDATE privilege on one column;
/// it is granted on `created_at` alone, which the drain never writes. A table already
/// there that a drain could not read (see [`check`]) is refused, and nothing changed.
pub async fn init(client: &mut Client, grant_to: Option<&str>) -> Result<(), String> {
    let failed = |e: tokio_postgres::Error| super::error_text(&e);
    let tx = client.transaction().await.map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&INIT_LOCK])
        .await
        .map_err(failed)?;
    tx.batch_execute(CREATE).await.map_err(failed)?;
    check(&tx).await?;
    if let Some(role) = grant_to {
        let quoted: String = tx
            .query_one("SELECT quote_ident($1)", &[&role])
            .await
            .map_err(failed)?
            .get(0);
        tx.batch_execute(&format!(
            "GRANT SELECT, DELETE, UPDATE (created_at) ON entrega_outbox TO {quoted};
             GRANT INSERT ON entrega_outbox_quarantine TO {quoted};"
        ))
        .await
        .map_err(failed)?;
    }
    tx.commit().await.map_err(failed)
}

/// Any type: the drain reads the column as text.
const ANY: &[&str] = &[];
const JSONB: &[&str] = &["jsonb"];
const TEXT: &[&str] = &["text"];
/// Both kinds of timestamp: a row's `created_at` is copied into quarantine's
/// `timestamptz` (a `text` or `bigint` one failed that copy, and with it every batch
/// holding a bad row, for good).
const TIMESTAMP: &[&str] = &["timestamp with time zone", "timestamp without time zone"];

/// The columns a drain reads, with the types it can take.
const OUTBOX_COLUMNS: [(&str, &[&str]); 5] = [
    ("id", ANY),
    ("tenant_id", ANY),
    ("type", ANY),
    ("payload", JSONB),
    ("created_at", TIMESTAMP),
];

/// The columns a drain writes in quarantine, as `init` makes them.
const QUARANTINE_COLUMNS: [(&str, &[&str]); 6] = [
    ("id", TEXT),
    ("tenant_id", TEXT),
    ("type", TEXT),
    ("payload", JSONB),
    ("created_at", &["timestamp with time zone"]),
    ("reason", TEXT),
];

/// Whether `table` has `columns` of types a drain can read and write: a drain that met
/// a column it could not read stopped (a `uuid` id), sent what the API refuses (a
/// `text` or `json` payload: not JSON, or duplicate keys), or failed every batch
/// with a bad row (a quarantine it could not write).
async fn check_columns(
    client: &impl GenericClient,
    table: &str,
    columns: &[(&str, &[&str])],
) -> Result<(), String> {
    let rows = client
        .query(
            "SELECT attname::text, format_type(atttypid, atttypmod)
               FROM pg_attribute
              WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
            &[&table],
        )
        .await
        .map_err(|e| super::error_text(&e))?;
    let types: std::collections::HashMap<String, String> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    if types.is_empty() {
        return Err(format!(
            "no {table} table; create it with `entrega outbox init --postgres URL`"
        ));
    }
    for (column, allowed) in columns {
        match types.get(*column) {
            None => return Err(format!("{table} has no column `{column}`")),
            Some(found) if !allowed.is_empty() && !allowed.contains(&found.as_str()) => {
                return Err(format!(
                    "{table}.{column} is `{found}`, the contract says `{}`",
                    allowed.join("` or `")
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Whether the outbox table is there, of this contract version, and has the columns a
/// drain reads.
pub async fn check(client: &impl GenericClient) -> Result<(), String> {
    let row = client
        .query_one(
            "SELECT obj_description(to_regclass('entrega_outbox'), 'pg_class')",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    match row.get::<_, Option<String>>(0) {
        Some(v) if v == CONTRACT_VERSION => {
            check_columns(client, "entrega_outbox", &OUTBOX_COLUMNS).await?;
            check_columns(client, "entrega_outbox_quarantine", &QUARANTINE_COLUMNS).await
        }
        Some(v) => Err(format!(
            "entrega_outbox is `{v}`, this entrega drains `{CONTRACT_VERSION}`"
        )),
        None => Err(
            "no entrega_outbox table (of this contract); create it with `entrega outbox init --postgres URL`"
                .into(),
        ),
    }
}
