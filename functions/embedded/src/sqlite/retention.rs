//! Retention: the embedded store forgets what has outlived the retention period, as
//! the AWS store does with DynamoDB's TTL, so the database file stops growing once its
//! oldest records are that old (before, it grew until `--max-db-size-mb` refused new
//! events, or the disk filled).
//!
//! What goes, and what never does:
//! - a delivery that is settled (delivered, failed, exhausted) and was last changed
//!   before the cutoff, with its attempts; never one still waiting or paused, however
//!   old, since it will still be attempted;
//! - an event created before the cutoff once none of its deliveries is left (and it
//!   has been fanned out), so a waiting delivery always finds its payload;
//! - a failure record created before the cutoff (acknowledged or not, as on AWS).
//!
//! The work is done a bounded window at a time ([`PURGE_WINDOW`] rows of each kind),
//! each window in one write, so the writer, which serves everybody, is never held
//! long; a [`PurgeCursor`] carries a pass from one window to the next.

use chrono::{DateTime, Utc};
use entrega_core::ids::DeliveryId;
use entrega_core::ports::StoreResult;
use rusqlite::{params, Connection};

use super::{ts, DbError, SqliteStore};

/// Rows of each kind looked at per step.
pub const PURGE_WINDOW: usize = 500;

/// Where a purge pass has got to; the default starts one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PurgeCursor {
    /// The last delivery id looked at.
    after_delivery: String,
    /// The last outbox sequence number looked at.
    after_event: i64,
}

/// What one step deleted, and where the pass goes on from (`None`: the pass is done).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PurgeStep {
    pub deliveries: usize,
    pub events: usize,
    pub failures: usize,
    pub next: Option<PurgeCursor>,
}

/// The smallest delivery id made for an event created at or after `cutoff`: ids start
/// with that time (UUIDv7), so every id below it is older.
fn id_bound(prefix: &str, cutoff: DateTime<Utc>) -> String {
    format!("{prefix}{:012x}", cutoff.timestamp_millis().max(0))
}

/// The settled deliveries last changed before the cutoff, in `(after, last]`, as SQL
/// over `deliveries` with parameters ?1 after, ?2 last, ?3 cutoff.
const EXPIRED_DELIVERIES: &str = "SELECT id FROM deliveries
     WHERE id > ?1 AND id <= ?2
       AND (state = 'delivered' OR state = 'failed' OR state = 'exhausted')
       AND json_extract(json, '$.updated_at') < ?3";

/// Delete the expired deliveries among the next window; (deleted, window full).
fn purge_deliveries(
    conn: &Connection,
    cursor: &mut PurgeCursor,
    cutoff: &str,
    bound: &str,
) -> Result<(usize, bool), DbError> {
    let window: Vec<String> = conn
        .prepare_cached("SELECT id FROM deliveries WHERE id > ?1 AND id < ?2 ORDER BY id LIMIT ?3")?
        .query_map(
            params![cursor.after_delivery, bound, PURGE_WINDOW as i64],
            |r| r.get(0),
        )?
        .collect::<Result<_, _>>()?;
    let Some(last) = window.last() else {
        return Ok((0, false));
    };
    let args = params![cursor.after_delivery, last, cutoff];
    // Attempts first: they are found through the deliveries they belong to. Whether a
    // delivery qualifies is decided inside this one write, so a resend that lands
    // first makes it waiting again and it stays; one that lands after finds it gone.
    conn.prepare_cached(&format!(
        "DELETE FROM attempts WHERE delivery_id IN ({EXPIRED_DELIVERIES})"
    ))?
    .execute(args)?;
    conn.prepare_cached(&format!(
        "DELETE FROM sweep_postponed WHERE delivery_id IN ({EXPIRED_DELIVERIES})"
    ))?
    .execute(args)?;
    let deleted = conn
        .prepare_cached(&format!(
            "DELETE FROM deliveries WHERE id IN ({EXPIRED_DELIVERIES})"
        ))?
        .execute(args)?;
    cursor.after_delivery = last.clone();
    Ok((deleted, window.len() == PURGE_WINDOW))
}

/// Of `window` (keys with their creation times, oldest first), the last key of the
/// rows created before `cutoff`, and how many those are; `None` if the first is not.
fn created_before<K: Clone>(window: &[(K, String)], cutoff: &str) -> Option<(K, usize)> {
    let old = window
        .iter()
        .take_while(|(_, created)| created.as_str() < cutoff)
        .count();
    old.checked_sub(1).map(|i| (window[i].0.clone(), old))
}

/// Delete the expired events among the next window of those created before the
/// cutoff; (deleted, window full).
fn purge_events(
    conn: &Connection,
    cursor: &mut PurgeCursor,
    cutoff: &str,
) -> Result<(usize, bool), DbError> {
    let window: Vec<(i64, String)> = conn
        .prepare_cached(
            "SELECT seq, json_extract(json, '$.created_at') FROM outbox
             WHERE seq > ?1 ORDER BY seq LIMIT ?2",
        )?
        .query_map(params![cursor.after_event, PURGE_WINDOW as i64], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    // In storage order, so once one was created after the cutoff, so were the rest.
    let Some((last, old)) = created_before(&window, cutoff) else {
        return Ok((0, false));
    };
    let deleted = conn
        .prepare_cached(
            "DELETE FROM outbox WHERE seq > ?1 AND seq <= ?2 AND fanned_out = 1
               AND NOT EXISTS (SELECT 1 FROM deliveries d
                               WHERE d.tenant_id = outbox.tenant_id AND d.event_id = outbox.id)",
        )?
        .execute(params![cursor.after_event, last])?;
    cursor.after_event = last;
    Ok((deleted, old == PURGE_WINDOW))
}

/// Delete the oldest failures, up to a window, created before the cutoff; (deleted,
/// window full). No cursor: whatever is left at the front was created after it.
fn purge_failures(conn: &Connection, cutoff: &str) -> Result<(usize, bool), DbError> {
    // Ids start with their creation time, so the front of the table is the oldest.
    let window: Vec<(String, String)> = conn
        .prepare_cached(
            "SELECT id, json_extract(json, '$.created_at') FROM failures ORDER BY id LIMIT ?1",
        )?
        .query_map(params![PURGE_WINDOW as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let Some((last, old)) = created_before(&window, cutoff) else {
        return Ok((0, false));
    };
    let deleted = conn
        .prepare_cached(
            "DELETE FROM failures WHERE id <= ?1 AND json_extract(json, '$.created_at') < ?2",
        )?
        .execute(params![last, cutoff])?;
    Ok((deleted, old == PURGE_WINDOW))
}

impl SqliteStore {
    /// One step of a purge pass from `from`: forget what has outlived `cutoff` in the
    /// next window of each kind (see the module's docs for what that is).
    pub async fn purge_step(
        &self,
        cutoff: DateTime<Utc>,
        from: PurgeCursor,
    ) -> StoreResult<PurgeStep> {
        let cutoff_ts = ts(cutoff);
        let delivery_bound = id_bound(DeliveryId::PREFIX, cutoff);
        // Nothing here needs to survive a power loss: a purge lost with the log's last
        // commits is done again by the next pass.
        super::replayable(self.db.call(move |conn| {
            let mut cursor = from.clone();
            let (deliveries, more_deliveries) =
                purge_deliveries(conn, &mut cursor, &cutoff_ts, &delivery_bound)?;
            // Events after deliveries: an event goes once its last delivery has.
            let (events, more_events) = purge_events(conn, &mut cursor, &cutoff_ts)?;
            let (failures, more_failures) = purge_failures(conn, &cutoff_ts)?;
            let more = more_deliveries || more_events || more_failures;
            Ok(PurgeStep {
                deliveries,
                events,
                failures,
                next: more.then_some(cursor),
            })
        }))
        .await
    }
}

#[cfg(test)]
#[path = "retention_tests.rs"]
mod tests;
