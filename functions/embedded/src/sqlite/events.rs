//! The outbox in SQLite, and the embedded trigger's reading position in it.

use super::{json_row, DbError, SqliteStore};
use async_trait::async_trait;
use entrega_core::event::Event;
use entrega_core::ids::{EventId, TenantId};
use entrega_core::ports::{EventStore, OutboxPage, Published, StoreError, StoreResult};
use rusqlite::{params, Connection};

/// The event `id` of `tenant`, if there is one.
pub(super) fn read_event(
    conn: &Connection,
    tenant: &str,
    id: &str,
) -> Result<Option<Event>, DbError> {
    json_row(
        conn,
        "SELECT json FROM outbox WHERE tenant_id = ?1 AND id = ?2",
        [tenant, id],
    )
}

/// A step of a publish's write: the event's outbox row, unless its tenant already has
/// an event with its id (then that one), or the database is near its size limit
/// (`None`: a refusal is an answer, not a failed write, which would make the writer
/// run its whole group again; see `writer.rs`). `fanned_out` when its deliveries are
/// queued in the same transaction.
pub(super) fn insert_event(
    conn: &Connection,
    soft_limit: Option<i64>,
    id: &str,
    tenant: &str,
    json: &str,
    fanned_out: bool,
) -> Result<Option<Published>, DbError> {
    if let Some(limit) = soft_limit {
        let used: i64 = conn
            .prepare_cached(
                "SELECT (SELECT page_count FROM pragma_page_count())
                      - (SELECT freelist_count FROM pragma_freelist_count())",
            )?
            .query_row([], |r| r.get(0))?;
        if used >= limit {
            return Ok(None);
        }
    }
    let inserted = conn
        .prepare_cached(
            "INSERT INTO outbox (id, tenant_id, json, fanned_out) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (tenant_id, id) DO NOTHING",
        )?
        .execute(params![id, tenant, json, fanned_out])?;
    if inserted == 1 {
        return Ok(Some(Published::Created));
    }
    let existing = read_event(conn, tenant, id)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
    Ok(Some(Published::Existing(existing)))
}

/// Why a publish was refused near the size limit.
pub(super) fn size_limit_refusal() -> StoreError {
    StoreError::Backend(
        "the database is near its size limit (--max-db-size-mb): new events are refused \
         while three quarters of it are in use, the rest kept for delivering what was \
         accepted; settled records are deleted after --retention-days, so raise the limit \
         or shorten the retention"
            .into(),
    )
}

/// Outbox rows taken per tenant per poll, so one tenant's burst is fanned out
/// interleaved with everyone else's instead of ahead of it.
const OUTBOX_ROWS_PER_TENANT: i64 = 20;

#[async_trait]
impl EventStore for SqliteStore {
    async fn publish(&self, event: &Event) -> StoreResult<Published> {
        let (store, event) = (self.clone(), event.clone());
        super::db::to_completion(async move { store.publish_now(&event).await }).await
    }

    async fn get_event(&self, tenant: &TenantId, id: &EventId) -> StoreResult<Option<Event>> {
        if let Some(event) = super::prefetch::take_event(tenant, id) {
            return Ok(Some(event));
        }
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.db
            .get(move |conn| read_event(conn, &tenant, &id))
            .await
    }

    async fn outbox_page(
        &self,
        since: chrono::DateTime<chrono::Utc>,
        cursor: Option<&str>,
        limit: usize,
    ) -> StoreResult<OutboxPage> {
        // The cursor is the outbox sequence number: storage order, never reused.
        let after: i64 = cursor.and_then(|c| c.parse().ok()).unwrap_or(0);
        let limit = limit.clamp(1, 1000);
        self.db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT seq, json FROM outbox WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                )?;
                let rows = stmt
                    .query_map(params![after, limit as i64], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                let next_cursor = (rows.len() == limit)
                    .then(|| rows.last().map(|(seq, _)| seq.to_string()))
                    .flatten();
                // Rows are events the API validated: nothing here is malformed.
                let mut events = Vec::new();
                for (_, json) in rows {
                    let event: Event = serde_json::from_str(&json)?;
                    if event.created_at >= since {
                        events.push(event);
                    }
                }
                Ok(OutboxPage {
                    events,
                    malformed: 0,
                    next_cursor,
                })
            })
            .await
    }
}

impl SqliteStore {
    /// Store `event` in the outbox and count it for the outbox poller (see
    /// [`EventStore::publish`], which runs this to completion).
    async fn publish_now(&self, event: &Event) -> StoreResult<Published> {
        let json = serde_json::to_string(event).expect("an event serialises");
        let (id, tenant) = (event.id.to_string(), event.tenant_id.to_string());
        let soft_limit = self.db.publish_page_limit();
        // A refusal is an answer (`None`), not a failed write: a failed write makes the
        // writer run its whole group again (see `writer.rs`).
        let published = self
            .db
            .call(move |conn| insert_event(conn, soft_limit, &id, &tenant, &json, false))
            .await?
            .ok_or_else(size_limit_refusal)?;
        if published == Published::Created {
            self.outbox_pending.add(&event.tenant_id, 1);
        }
        Ok(published)
    }

    /// Events committed but not yet fanned out, up to `limit`, fair across tenants.
    ///
    /// The tenants with waiting events are known in memory, and each one's oldest rows
    /// are one index seek away (`outbox_waiting`: fanned_out, tenant_id, seq), so a poll
    /// costs what it returns, not the size of the outbox.
    ///
    /// Rows younger than `grace` are left to the publish that is fanning them out.
    pub async fn outbox_waiting(
        &self,
        limit: usize,
        grace: std::time::Duration,
    ) -> StoreResult<Vec<Event>> {
        let young = self.clock.now() - chrono::Duration::from_std(grace).unwrap_or_default();
        let mut tenants: Vec<String> = self
            .outbox_pending
            .snapshot()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(t, _)| t)
            .collect();
        if tenants.is_empty() {
            return Ok(Vec::new());
        }
        tenants.sort_unstable();
        // Start after the tenant served first last time, so no tenant waits behind
        // the others' bursts when more tenants wait than one poll takes.
        let start = self
            .outbox_turn
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % tenants.len();
        tenants.rotate_left(start);
        let per_tenant = OUTBOX_ROWS_PER_TENANT.min(limit.max(1) as i64);
        let events = self
            .db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT json FROM outbox WHERE fanned_out = 0 AND tenant_id = ?1
                     ORDER BY seq LIMIT ?2",
                )?;
                let mut events = Vec::new();
                for tenant in tenants {
                    if events.len() >= limit {
                        break;
                    }
                    let rows = stmt
                        .query_map(params![tenant, per_tenant], |r| r.get::<_, String>(0))?
                        .collect::<Result<Vec<_>, _>>()?;
                    for row in rows {
                        let event: Event = serde_json::from_str(&row)?;
                        // Rows are in commit order: once one is young, so is the rest.
                        if event.created_at > young {
                            break;
                        }
                        events.push(event);
                    }
                }
                Ok(events)
            })
            .await?;
        if !events.is_empty() {
            // A row is committed, and readers see it, before the log is synced and
            // its publisher answered; only then does the publish mark its fan-out under
            // way. Taking a row before that (a sync held past the grace by a busy disk)
            // fanned the event out twice at once: two messages a delivery, both sent.
            // Past this wait, every row read has been synced and its publisher told.
            self.db.synced().await?;
        }
        Ok(events)
    }

    /// Record that `event` has been fanned out (after its deliveries are queued), and
    /// drop `until_marked` once that is committed (or has failed). Nobody waits for
    /// it: if a crash loses it, the outbox poller fans the event out again, which finds
    /// its deliveries made, and queues a message again for each one not yet tried
    /// (at least once).
    pub async fn mark_fanned_out(
        &self,
        event: &Event,
        until_marked: impl Send + 'static,
    ) -> StoreResult<()> {
        let tenant = event.tenant_id.clone();
        let id = event.id.to_string();
        let pending = self.outbox_pending.clone();
        self.db.call_detached(
            "mark an event fanned out",
            {
                let tenant = tenant.to_string();
                move |conn| {
                    Ok(conn
                        .prepare_cached(
                            "UPDATE outbox SET fanned_out = 1
                                 WHERE tenant_id = ?1 AND id = ?2 AND fanned_out = 0",
                        )?
                        .execute([&tenant, &id])?)
                }
            },
            // Counted once it is committed: the work may run twice, and may fail.
            move |marked| {
                if marked == 1 {
                    pending.add(&tenant, -1);
                }
                drop(until_marked);
            },
        );
        Ok(())
    }
}
