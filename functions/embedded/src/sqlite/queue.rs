//! The embedded queues, with SQS's semantics where they matter for not losing work:
//! a received message is hidden for a visibility timeout and comes back unless
//! deleted, every receive counts, and a stale receipt cannot delete a message that
//! another consumer has received since.
//!
//! Two things SQS does not do, done here because one process serves every tenant:
//! receiving is round-robin over groups (tenants) with ready messages, and messages
//! sharing a concurrency key (an endpoint) have at most their limit in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use entrega_core::ports::{
    Clock, LongDelayScheduler, MessageQueue, OutgoingMessage, ReceivedMessage, StoreResult,
};
use rand::Rng;
use rusqlite::{params, Connection};

use super::{DbError, SqliteDb};

/// The queue of delivery tasks.
pub const DELIVERY_QUEUE: &str = "deliveries";
/// The queue of failure notices (the embedded dead-letter queue).
pub const FAILURE_QUEUE: &str = "failures";

/// One named queue in the database.
#[derive(Clone)]
pub struct SqliteQueue {
    db: SqliteDb,
    name: &'static str,
    clock: Arc<dyn Clock>,
    /// The group served last, so the next receive starts with the one after it.
    last_group: Arc<Mutex<Option<String>>>,
}

fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn parse_receipt(receipt: &str) -> Option<(i64, &str)> {
    let (id, _) = receipt.split_once(':')?;
    Some((id.parse().ok()?, receipt))
}

impl SqliteQueue {
    pub fn new(db: SqliteDb, name: &'static str, clock: Arc<dyn Clock>) -> Self {
        Self {
            db,
            name,
            clock,
            last_group: Arc::new(Mutex::new(None)),
        }
    }

    /// Make every in-flight message visible now. Only sound when no consumer of the
    /// previous process can still be running, which the database lock guarantees.
    pub async fn release_in_flight(&self) -> StoreResult<usize> {
        let (name, now) = (self.name, millis(self.clock.now()));
        self.db
            .call(move |conn| {
                Ok(conn.execute(
                    "UPDATE queue SET in_flight = 0, visible_at = MIN(visible_at, ?2)
                     WHERE queue = ?1 AND in_flight = 1",
                    params![name, now],
                )?)
            })
            .await
    }

    /// Messages in the queue, visible or not (for operators and tests).
    pub async fn depth(&self) -> StoreResult<u64> {
        let name = self.name;
        self.db
            .call(move |conn| {
                Ok(
                    conn.query_row("SELECT COUNT(*) FROM queue WHERE queue = ?1", [name], |r| {
                        r.get::<_, i64>(0)
                    })? as u64,
                )
            })
            .await
    }
}

/// A candidate message: (row id, group, concurrency key, limit).
type Candidate = (i64, String, Option<String>, u32);

fn receive_in(
    conn: &mut Connection,
    name: &str,
    max: usize,
    visible_until: i64,
    now: i64,
    start_after: Option<String>,
) -> Result<(Vec<ReceivedMessage>, Option<String>), DbError> {
    let tx = conn.transaction()?;
    // In-flight counts per concurrency key: keys at their limit are skipped.
    let mut in_flight: HashMap<String, u32> = HashMap::new();
    {
        let mut stmt = tx.prepare(
            "SELECT ckey, COUNT(*) FROM queue
             WHERE queue = ?1 AND in_flight = 1 AND visible_at > ?2 AND ckey IS NOT NULL
             GROUP BY ckey",
        )?;
        for row in stmt.query_map(params![name, now], |r| Ok((r.get(0)?, r.get(1)?)))? {
            let (key, count): (String, u32) = row?;
            in_flight.insert(key, count);
        }
    }
    let mut groups: Vec<String> = {
        let mut stmt = tx.prepare(
            "SELECT DISTINCT grp FROM queue WHERE queue = ?1 AND visible_at <= ?2 ORDER BY grp",
        )?;
        let rows = stmt.query_map(params![name, now], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    // Round robin: start with the group after the one served last time.
    if let Some(last) = start_after {
        let split = groups.partition_point(|g| *g <= last);
        groups.rotate_left(split);
    }
    let mut per_group: Vec<std::collections::VecDeque<Candidate>> = Vec::new();
    {
        let mut stmt = tx.prepare(
            "SELECT id, grp, ckey, climit FROM queue
             WHERE queue = ?1 AND grp = ?2 AND visible_at <= ?3
             ORDER BY visible_at, id LIMIT ?4",
        )?;
        for group in &groups {
            // Saturated keys can hide many ready rows; look further than `max` so one
            // blocked endpoint does not hide its tenant's other endpoints.
            let rows = stmt.query_map(params![name, group, now, (max * 4 + 16) as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?;
            per_group.push(rows.collect::<Result<_, _>>()?);
        }
    }
    let mut taken: Vec<Candidate> = Vec::new();
    let mut last_served = None;
    'rounds: loop {
        let mut progressed = false;
        for queue in per_group.iter_mut() {
            while let Some(candidate) = queue.pop_front() {
                if let Some(key) = &candidate.2 {
                    let count = in_flight.entry(key.clone()).or_default();
                    if *count >= candidate.3.max(1) {
                        continue;
                    }
                    *count += 1;
                }
                last_served = Some(candidate.1.clone());
                taken.push(candidate);
                progressed = true;
                if taken.len() == max {
                    break 'rounds;
                }
                break;
            }
        }
        if !progressed {
            break;
        }
    }
    let mut received = Vec::with_capacity(taken.len());
    {
        let mut stmt = tx.prepare(
            "UPDATE queue SET in_flight = 1, visible_at = ?2, receive_count = receive_count + 1,
                              receipt = ?3
             WHERE id = ?1 RETURNING body, receive_count",
        )?;
        let mut rng = rand::thread_rng();
        for (id, ..) in &taken {
            let receipt = format!("{id}:{:016x}", rng.gen::<u64>());
            let (body, receive_count) = stmt
                .query_row(params![id, visible_until, receipt], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?;
            received.push(ReceivedMessage {
                receipt,
                body,
                receive_count,
            });
        }
    }
    tx.commit()?;
    Ok((received, last_served))
}

#[async_trait]
impl MessageQueue for SqliteQueue {
    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        let (name, now) = (self.name, millis(self.clock.now()));
        self.db
            .call(move |conn| {
                let tx = conn.transaction()?;
                {
                    let mut stmt = tx.prepare(
                        "INSERT INTO queue (queue, body, grp, ckey, climit, visible_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    )?;
                    for m in &messages {
                        let visible_at = now + m.delay.as_millis() as i64;
                        stmt.execute(params![
                            name,
                            m.body,
                            m.group,
                            m.concurrency_key,
                            m.concurrency_limit,
                            visible_at
                        ])?;
                    }
                }
                tx.commit()?;
                Ok(())
            })
            .await
    }

    async fn receive(&self, max: usize, visibility: Duration) -> StoreResult<Vec<ReceivedMessage>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let name = self.name;
        let now = millis(self.clock.now());
        let visible_until = now + visibility.as_millis() as i64;
        let start_after = self.last_group.lock().expect("not poisoned").clone();
        let (received, last) = self
            .db
            .call(move |conn| receive_in(conn, name, max, visible_until, now, start_after))
            .await?;
        if last.is_some() {
            *self.last_group.lock().expect("not poisoned") = last;
        }
        Ok(received)
    }

    async fn change_visibility(&self, receipt: &str, delay: Duration) -> StoreResult<()> {
        let Some((id, receipt)) = parse_receipt(receipt) else {
            return Ok(());
        };
        let receipt = receipt.to_owned();
        let visible_at = millis(self.clock.now()) + delay.as_millis() as i64;
        self.db
            .call(move |conn| {
                // Waiting out a delay is not being in flight: it frees the endpoint's slot.
                conn.execute(
                    "UPDATE queue SET visible_at = ?2, in_flight = 0 WHERE id = ?1 AND receipt = ?3",
                    params![id, visible_at, receipt],
                )?;
                Ok(())
            })
            .await
    }

    async fn delete(&self, receipt: &str) -> StoreResult<()> {
        let Some((id, receipt)) = parse_receipt(receipt) else {
            return Ok(());
        };
        let receipt = receipt.to_owned();
        self.db
            .call(move |conn| {
                conn.execute(
                    "DELETE FROM queue WHERE id = ?1 AND receipt = ?2",
                    params![id, receipt],
                )?;
                Ok(())
            })
            .await
    }

    fn max_delay(&self) -> Option<Duration> {
        // No 12-hour limit here: a long retry is just a message visible later.
        None
    }
}

/// The embedded long-delay scheduler: a message that becomes visible later.
#[async_trait]
impl LongDelayScheduler for SqliteQueue {
    async fn schedule(&self, mut message: OutgoingMessage, at: DateTime<Utc>) -> StoreResult<()> {
        message.delay = (at - self.clock.now()).to_std().unwrap_or(Duration::ZERO);
        self.send(vec![message]).await
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
