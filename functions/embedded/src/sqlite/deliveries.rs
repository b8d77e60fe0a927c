//! Deliveries and their attempts in SQLite.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use entrega_core::delivery::{Attempt, Delivery};
use entrega_core::event::Event;
use entrega_core::ids::{DeliveryId, EndpointId};
use entrega_core::ports::{
    written, DeliveryQuery, DeliveryStore, Page, PendingWrite, StoreError, StoreResult,
};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection};

use super::{json_row, json_rows, ts, DbError, SqliteStore};

/// A time as serde stores it in a record's JSON (RFC 3339, UTC, `Z`), to compare as
/// text with the times in it: ordered as the times are, to within a second's
/// fraction digits.
pub(super) fn json_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// When a waiting delivery is due (the `due_at` column): its next attempt, or the end
/// of the lease of the attempt under way. None once it waits no more.
fn due_at(d: &Delivery) -> Option<String> {
    d.state
        .is_waiting()
        .then(|| d.next_attempt_at.or(d.lease_until).map(json_time))
        .flatten()
}

/// An attempt as its row stores it, made before the write: the writer thread runs
/// every caller's writes one after another, so what can be done before is.
struct AttemptRow {
    id: String,
    delivery_id: String,
    endpoint_id: String,
    started_at: String,
    json: String,
}

impl AttemptRow {
    fn of(a: &Attempt) -> Result<Self, serde_json::Error> {
        Ok(Self {
            id: a.id.to_string(),
            delivery_id: a.delivery_id.to_string(),
            endpoint_id: a.endpoint_id.to_string(),
            started_at: ts(a.started_at),
            json: serde_json::to_string(a)?,
        })
    }
}

pub(super) fn read_delivery(conn: &Connection, id: &str) -> Result<Option<Delivery>, DbError> {
    json_row(conn, "SELECT json FROM deliveries WHERE id = ?1", [id])
}

fn insert_attempts(conn: &Connection, attempts: &[AttemptRow]) -> Result<(), DbError> {
    let mut stmt = conn.prepare_cached(
        "INSERT OR IGNORE INTO attempts (id, delivery_id, endpoint_id, started_at, json)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for a in attempts {
        stmt.execute(params![
            a.id,
            a.delivery_id,
            a.endpoint_id,
            a.started_at,
            a.json
        ])?;
    }
    Ok(())
}

fn read_many(conn: &Connection, sql: &str, args: Vec<SqlValue>) -> Result<Vec<Delivery>, DbError> {
    json_rows(conn, sql, params_from_iter(args))
}

/// A delivery's save, made ready before it goes to the writer thread. The attempts are
/// recorded whether or not the state write lands (see the port): a conflict is an
/// answer, not a rollback.
struct DeliveryWrite {
    attempts: Vec<AttemptRow>,
    id: String,
    state: &'static str,
    status: &'static str,
    version: i64,
    json: String,
    due: Option<String>,
}

impl DeliveryWrite {
    /// `delivery` as saving it writes it (version + 1), and the write.
    fn of(delivery: &Delivery, attempts: &[Attempt]) -> Result<(Delivery, Self), DbError> {
        let mut next = delivery.clone();
        next.version += 1;
        let write = Self {
            attempts: attempts
                .iter()
                .map(AttemptRow::of)
                .collect::<Result<_, _>>()?,
            id: next.id.to_string(),
            state: next.state.as_str(),
            status: next.state.status().as_str(),
            version: next.version as i64,
            json: serde_json::to_string(&next)?,
            due: due_at(&next),
        };
        Ok((next, write))
    }

    /// `true` if the state write landed, `false` on a version conflict.
    fn run(&self, conn: &Connection) -> Result<bool, DbError> {
        insert_attempts(conn, &self.attempts)?;
        let n = conn
            .prepare_cached(
                "UPDATE deliveries SET state = ?2, status = ?3, version = ?4, json = ?5,
                                       due_at = ?7
                 WHERE id = ?1 AND version = ?6",
            )?
            .execute(params![
                self.id,
                self.state,
                self.status,
                self.version,
                self.json,
                self.version - 1,
                self.due
            ])?;
        Ok(n == 1)
    }
}

/// A delivery's create, made ready before it goes to the writer thread.
pub(super) struct NewDelivery {
    delivery: Delivery,
    json: String,
    due: Option<String>,
}

impl NewDelivery {
    pub(super) fn of(delivery: Delivery) -> Result<Self, DbError> {
        Ok(Self {
            json: serde_json::to_string(&delivery)?,
            due: due_at(&delivery),
            delivery,
        })
    }

    /// Create it unless the event already has a delivery to its endpoint; the delivery
    /// as stored, and whether this created it.
    pub(super) fn insert_if_absent(&self, conn: &Connection) -> Result<(Delivery, bool), DbError> {
        let d = &self.delivery;
        let created =
            conn.prepare_cached(
                "INSERT INTO deliveries
                   (id, tenant_id, endpoint_id, event_id, event_type, state, status, created_at,
                    version, json, due_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT DO NOTHING",
            )?
            .execute(params![
                d.id.as_str(),
                d.tenant_id.as_str(),
                d.endpoint_id.as_str(),
                d.event_id.as_str(),
                d.event_type,
                d.state.as_str(),
                d.state.status().as_str(),
                ts(d.created_at),
                d.version as i64,
                self.json,
                self.due,
            ])? == 1;
        if created {
            return Ok((d.clone(), true));
        }
        // The one delivery of this event to this endpoint, whatever its id: a database
        // from a build that derived ids otherwise keeps its own.
        let stored = json_row(
            conn,
            "SELECT json FROM deliveries
             WHERE tenant_id = ?1 AND event_id = ?2 AND endpoint_id = ?3",
            [
                d.tenant_id.as_str(),
                d.event_id.as_str(),
                d.endpoint_id.as_str(),
            ],
        )?
        .ok_or_else(|| DbError::Conflict("delivery vanished after insert".into()))?;
        Ok((stored, false))
    }
}

/// `saved` if its write landed; a conflict if the delivery had changed meanwhile.
fn landed_or_conflict(landed: bool, saved: Delivery) -> StoreResult<Delivery> {
    if landed {
        return Ok(saved);
    }
    Err(StoreError::Conflict(format!(
        "delivery {} changed meanwhile",
        saved.id
    )))
}

#[async_trait]
impl DeliveryStore for SqliteStore {
    async fn create_delivery_if_absent(
        &self,
        delivery: &Delivery,
    ) -> StoreResult<(Delivery, bool)> {
        let new = NewDelivery::of(delivery.clone())?;
        self.db.call(move |conn| new.insert_if_absent(conn)).await
    }

    async fn get_delivery(&self, id: &DeliveryId) -> StoreResult<Option<Delivery>> {
        if let Some(delivery) = super::prefetch::take_delivery(id) {
            return Ok(Some(delivery));
        }
        let id = id.to_string();
        self.db.get(move |conn| read_delivery(conn, &id)).await
    }

    async fn save_delivery(
        &self,
        delivery: &Delivery,
        attempts: &[Attempt],
    ) -> StoreResult<Delivery> {
        let (next, write) = DeliveryWrite::of(delivery, attempts)?;
        let landed = self.db.call(move |conn| write.run(conn)).await?;
        landed_or_conflict(landed, next)
    }

    /// One writer commits in order: the caller's outcome write lands after this one.
    async fn save_delivery_ahead(
        &self,
        delivery: &Delivery,
        attempts: &[Attempt],
    ) -> StoreResult<PendingWrite<Delivery>> {
        if self.db.writes_failing() {
            let saved = self.save_delivery(delivery, attempts).await?;
            return Ok(written(saved));
        }
        let (next, write) = DeliveryWrite::of(delivery, attempts)?;
        let landed = self.db.call_ahead(move |conn| write.run(conn)).await?;
        Ok(Box::pin(
            async move { landed_or_conflict(landed.await?, next) },
        ))
    }

    async fn list_attempts(&self, id: &DeliveryId) -> StoreResult<Vec<Attempt>> {
        let id = id.to_string();
        self.db
            .get(move |conn| {
                let mut attempts: Vec<Attempt> = json_rows(
                    conn,
                    "SELECT json FROM attempts WHERE delivery_id = ?1",
                    [id],
                )?;
                attempts.sort_by_key(|a| (a.generation, a.number, a.started_at));
                Ok(attempts)
            })
            .await
    }

    async fn list_deliveries(&self, query: &DeliveryQuery) -> StoreResult<Page<Delivery>> {
        let q = query.clone();
        self.db
            .read(move |conn| {
                let mut sql = String::from("SELECT json FROM deliveries WHERE 1 = 1");
                let mut args: Vec<SqlValue> = Vec::new();
                let mut filter = |clause: &str, value: SqlValue| {
                    args.push(value);
                    sql.push_str(&format!(" AND {clause} ?{}", args.len()));
                };
                if let Some(t) = &q.tenant {
                    filter("tenant_id =", SqlValue::Text(t.to_string()));
                }
                if let Some(e) = &q.endpoint_id {
                    filter("endpoint_id =", SqlValue::Text(e.to_string()));
                }
                if let Some(t) = &q.event_type {
                    filter("event_type =", SqlValue::Text(t.clone()));
                }
                if let Some(s) = q.status {
                    filter("status =", SqlValue::Text(s.as_str().into()));
                }
                if let Some(s) = q.since {
                    filter("created_at >=", SqlValue::Text(ts(s)));
                }
                if let Some(u) = q.until {
                    filter("created_at <", SqlValue::Text(ts(u)));
                }
                if let Some(c) = &q.cursor {
                    filter("id <", SqlValue::Text(c.clone()));
                }
                args.push(SqlValue::Integer(q.limit as i64 + 1));
                sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", args.len()));
                let data = read_many(conn, &sql, args)?;
                Ok(Page::from_rows(data, q.limit, |d| d.id.to_string(), None))
            })
            .await
    }

    async fn deliveries_of_event(&self, event: &Event) -> StoreResult<Vec<Delivery>> {
        let (tenant, id) = (event.tenant_id.to_string(), event.id.to_string());
        self.db
            .read(move |conn| {
                read_many(
                    conn,
                    "SELECT json FROM deliveries WHERE tenant_id = ?1 AND event_id = ?2 ORDER BY id",
                    vec![SqlValue::Text(tenant), SqlValue::Text(id)],
                )
            })
            .await
    }

    async fn endpoint_attempts_since(
        &self,
        endpoint: &EndpointId,
        since: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Attempt>> {
        let (endpoint, since) = (endpoint.to_string(), ts(since));
        self.db
            .read(move |conn| {
                json_rows(
                    conn,
                    "SELECT json FROM attempts WHERE endpoint_id = ?1 AND started_at >= ?2
                     ORDER BY started_at DESC LIMIT ?3",
                    params![endpoint, since, limit as i64],
                )
            })
            .await
    }

    async fn paused_deliveries(
        &self,
        endpoint: &EndpointId,
        cursor: Option<&str>,
        limit: usize,
    ) -> StoreResult<Page<Delivery>> {
        let endpoint = endpoint.to_string();
        let after = cursor.unwrap_or_default().to_owned();
        let data = self
            .db
            .read(move |conn| {
                read_many(
                    conn,
                    "SELECT json FROM deliveries
                     WHERE endpoint_id = ?1 AND state = 'paused' AND id > ?2
                     ORDER BY id LIMIT ?3",
                    vec![
                        SqlValue::Text(endpoint),
                        SqlValue::Text(after),
                        SqlValue::Integer(limit as i64 + 1),
                    ],
                )
            })
            .await?;
        Ok(Page::from_rows(data, limit, |d| d.id.to_string(), None))
    }

    async fn overdue_deliveries(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Delivery>> {
        let before = json_time(before);
        self.db
            .read(move |conn| {
                read_many(
                    conn,
                    "SELECT json FROM deliveries
                     WHERE due_at < ?1
                       AND NOT EXISTS (SELECT 1 FROM sweep_postponed p
                                       WHERE p.delivery_id = deliveries.id
                                         AND p.version = deliveries.version
                                         AND p.until >= ?1)
                     ORDER BY due_at
                     LIMIT ?2",
                    vec![SqlValue::Text(before), SqlValue::Integer(limit as i64)],
                )
            })
            .await
    }

    async fn postpone_sweep(&self, postponed: &[(Delivery, DateTime<Utc>)]) -> StoreResult<()> {
        let rows: Vec<(String, i64, String)> = postponed
            .iter()
            .map(|(d, until)| (d.id.to_string(), d.version as i64, json_time(*until)))
            .collect();
        let now = json_time(self.clock.now());
        self.db
            .call(move |conn| {
                // Spent postponements go as new ones come (by the `until` index): the
                // table holds at most what the sweeps of one claim period queued.
                conn.prepare_cached("DELETE FROM sweep_postponed WHERE until < ?1")?
                    .execute([&now])?;
                let mut insert = conn.prepare_cached(
                    "INSERT OR REPLACE INTO sweep_postponed (delivery_id, version, until)
                     VALUES (?1, ?2, ?3)",
                )?;
                for (id, version, until) in &rows {
                    insert.execute(params![id, version, until])?;
                }
                Ok(())
            })
            .await
    }
}

#[cfg(test)]
#[path = "deliveries_tests.rs"]
mod tests;
