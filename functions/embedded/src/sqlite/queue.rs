//! The embedded queues, with SQS's semantics where they matter for not losing work:
//! a received message is hidden for a visibility timeout and comes back unless
//! deleted, every receive counts, and a stale receipt cannot delete a message that
//! another consumer has received since.
//!
//! Every message is a row in SQLite (a send commits before it returns); which message
//! a receive hands out is decided in memory by the [`Scheduler`]: round-robin over
//! groups (tenants), then over concurrency keys (endpoints) within a group, each key
//! capped at its limit in flight. Receiving is a memory operation plus one read of the
//! bodies it hands out, whatever the backlog. What is *not* persisted — that a message
//! is in flight, and its receive count — is exactly what a restart must forget anyway:
//! the database is locked to one process, so nothing of a previous process is running.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use entrega_core::ports::{
    Clock, DelayLimits, LongDelayScheduler, MessageQueue, OutgoingMessage, ReceivedMessage,
    StoreResult,
};
use rusqlite::{params, Connection};
use tokio::sync::Notify;

use super::lanes::{Handout, KeptSlots, Scheduler};
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
    scheduler: Arc<Mutex<Scheduler>>,
    /// Signalled when a message may have become receivable (sent, or a slot freed),
    /// so a consumer waits on work instead of polling on a timer.
    work: Arc<Notify>,
}

fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// `delay` after `now` (both as rows store times, unix ms).
fn after(now: i64, delay: Duration) -> i64 {
    now + delay.as_millis() as i64
}

/// Messages to store in a queue, as a write's step.
#[derive(Clone)]
pub(super) struct QueueRows(Arc<Vec<OutgoingMessage>>);

impl QueueRows {
    pub(super) fn of(messages: Vec<OutgoingMessage>) -> Self {
        Self(Arc::new(messages))
    }

    /// Store them in the queue `name`, sent at `now` (unix ms); their row ids, in order.
    /// Not receivable until [`SqliteQueue::schedule`] hands them out after the commit.
    pub(super) fn insert(
        &self,
        conn: &Connection,
        name: &str,
        now: i64,
    ) -> Result<Vec<i64>, DbError> {
        let mut ids = Vec::with_capacity(self.0.len());
        let mut stmt = conn.prepare_cached(
            "INSERT INTO queue (queue, body, grp, ckey, climit, visible_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for m in self.0.iter() {
            let visible_at = after(now, m.delay);
            stmt.execute(params![
                name,
                m.body,
                m.group,
                m.concurrency_key,
                m.concurrency_limit,
                visible_at
            ])?;
            ids.push(conn.last_insert_rowid());
        }
        Ok(ids)
    }
}

/// A receipt is `<row id>:<receipt number>` (hex), opaque to consumers.
fn parse_receipt(receipt: &str) -> Option<(i64, u64)> {
    let (id, number) = receipt.split_once(':')?;
    Some((id.parse().ok()?, u64::from_str_radix(number, 16).ok()?))
}

impl SqliteQueue {
    /// Store `messages` and hand them to the scheduler (see [`MessageQueue::send`],
    /// which runs this to completion: a row stored but not scheduled would wait unseen
    /// until a restart).
    async fn send_now(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        let (name, now) = (self.name, millis(self.clock.now()));
        let rows = QueueRows::of(messages);
        let written = rows.clone();
        let ids = self
            .db
            .call(move |conn| written.insert(conn, name, now))
            .await?;
        self.schedule(&rows, ids, now);
        Ok(())
    }

    /// Hand the rows of `rows`, just committed as `ids` at `now`, to the scheduler, and
    /// wake a consumer.
    pub(super) fn schedule(&self, rows: &QueueRows, ids: Vec<i64>, now: i64) {
        {
            let mut scheduler = self.scheduler();
            for (id, m) in ids.into_iter().zip(rows.0.iter()) {
                let visible_at = after(now, m.delay);
                scheduler.insert(
                    id,
                    &m.group,
                    m.concurrency_key.as_deref(),
                    m.concurrency_limit,
                    visible_at,
                    now,
                );
            }
        }
        self.work.notify_one();
    }

    /// This queue's name in the `queue` column.
    pub(super) fn name(&self) -> &'static str {
        self.name
    }

    /// Now by this queue's clock, as its rows store times (unix ms).
    pub(super) fn now_ms(&self) -> i64 {
        millis(self.clock.now())
    }

    /// The queue `name` in `db`, with its messages loaded. Every message is visible
    /// again at once unless it was delayed: no consumer of a previous process can
    /// still be running (the database lock sees to that).
    pub async fn open(
        db: SqliteDb,
        name: &'static str,
        clock: Arc<dyn Clock>,
    ) -> StoreResult<Self> {
        let now = millis(clock.now());
        let rows = db
            .call(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT id, grp, ckey, climit,
                            CASE WHEN in_flight = 1 THEN MIN(visible_at, ?2) ELSE visible_at END
                     FROM queue WHERE queue = ?1 ORDER BY id",
                )?;
                let rows = stmt
                    .query_map(params![name, now], |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, Option<String>>(2)?,
                            r.get::<_, u32>(3)?,
                            r.get::<_, i64>(4)?,
                        ))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await?;
        let mut scheduler = Scheduler::new(rand::random());
        for (id, group, key, limit, visible_at) in rows {
            scheduler.insert(id, &group, key.as_deref(), limit, visible_at, now);
        }
        Ok(Self {
            db,
            name,
            clock,
            scheduler: Arc::new(Mutex::new(scheduler)),
            work: Arc::new(Notify::new()),
        })
    }

    fn scheduler(&self) -> std::sync::MutexGuard<'_, Scheduler> {
        self.scheduler.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep the last of the worker's slots for light groups (tenants).
    pub fn keep_last_slots(&self, slots: KeptSlots) {
        self.scheduler().keep_last_slots(slots);
    }

    /// The attempt for the message of `receipt` has run long (see
    /// [`Scheduler::note_slow`]); whether it was demoted out of its tenant's share of
    /// the worker's slots (it then counts against its endpoint's cap only). In memory
    /// only: a restart makes every message visible again anyway.
    pub fn note_slow(&self, receipt: &str, may_demote: bool) -> bool {
        let Some((id, number)) = parse_receipt(receipt) else {
            return false;
        };
        let now = millis(self.clock.now());
        self.scheduler().note_slow(id, number, now, may_demote)
    }

    /// The attempt for the message of `receipt` was noted slow and kept its worker
    /// slot, but it took one of the kept ones: demoted if `may_move()` (see
    /// [`Scheduler::demote_from_kept_place`]). In memory only, as [`Self::note_slow`].
    pub fn demote_from_kept_place(&self, receipt: &str, may_move: impl FnOnce() -> bool) -> bool {
        let Some((id, number)) = parse_receipt(receipt) else {
            return false;
        };
        self.scheduler()
            .demote_from_kept_place(id, number, may_move)
    }

    /// The message of `receipt` was just received: demoted at once if its endpoint's
    /// attempts ran long lately and `may_demote()` (see
    /// [`Scheduler::demote_if_lane_slow`]); whether it was, so that its attempt starts
    /// in a slow slot. In memory only, as [`Self::note_slow`].
    pub fn demote_if_lane_slow(&self, receipt: &str, may_demote: impl FnOnce() -> bool) -> bool {
        let Some((id, number)) = parse_receipt(receipt) else {
            return false;
        };
        let now = millis(self.clock.now());
        self.scheduler()
            .demote_if_lane_slow(id, number, now, may_demote)
    }

    /// The request of the attempt for the message of `receipt` is over: its lane may
    /// hand out its next message while this one's outcome is written (see
    /// [`Scheduler::request_over`]). In memory only, as [`Self::note_slow`].
    pub fn request_over(&self, receipt: &str) {
        let Some((id, number)) = parse_receipt(receipt) else {
            return;
        };
        let now = millis(self.clock.now());
        if self.scheduler().request_over(id, number, now) {
            self.wake_consumer();
        }
    }

    /// Wake a consumer waiting for work (a worker slot was given up).
    pub fn wake_consumer(&self) {
        self.work.notify_one();
    }

    /// Messages in the queue, visible or not (for operators and tests).
    pub async fn depth(&self) -> StoreResult<u64> {
        Ok(self.scheduler().len() as u64)
    }

    /// Messages of one group (a tenant's waiting work), visible or not.
    pub fn group_len(&self, group: &str) -> u64 {
        self.scheduler().group_len(group)
    }

    /// Every group with messages, and how many.
    pub fn group_lens(&self) -> Vec<(String, u64)> {
        self.scheduler().group_lens()
    }

    /// Resolves when work may have arrived; consumers also poll, so a missed signal
    /// costs a poll interval, never a message.
    pub async fn work_arrived(&self) {
        self.work.notified().await
    }
}

#[async_trait]
impl MessageQueue for SqliteQueue {
    async fn send(&self, messages: Vec<OutgoingMessage>) -> StoreResult<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let queue = self.clone();
        super::db::to_completion(async move { queue.send_now(messages).await }).await
    }

    async fn receive(&self, max: usize, visibility: Duration) -> StoreResult<Vec<ReceivedMessage>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let now = millis(self.clock.now());
        let handouts: Vec<Handout> = self.scheduler().receive(max, now, after(now, visibility));
        if handouts.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Vec<i64> = handouts.iter().map(|h| h.id).collect();
        let bodies = self
            .db
            .get(move |conn| {
                let mut stmt = conn.prepare_cached("SELECT body FROM queue WHERE id = ?1")?;
                let mut bodies = Vec::with_capacity(wanted.len());
                for id in wanted {
                    bodies.push(stmt.query_row([id], |r| r.get::<_, String>(0))?);
                }
                Ok::<_, DbError>(bodies)
            })
            .await?;
        Ok(handouts
            .into_iter()
            .zip(bodies)
            .map(|(h, body)| ReceivedMessage {
                receipt: format!("{}:{:x}", h.id, h.receipt),
                body,
                receive_count: h.receive_count,
            })
            .collect())
    }

    async fn change_visibility(&self, receipt: &str, delay: Duration) -> StoreResult<()> {
        let Some((id, number)) = parse_receipt(receipt) else {
            return Ok(());
        };
        let now = millis(self.clock.now());
        let visible_at = after(now, delay);
        if !self
            .scheduler()
            .change_visibility(id, number, visible_at, now)
        {
            return Ok(());
        }
        self.work.notify_one();
        // Persisted so a retry delay outlives a restart (a lost one only brings the
        // message back early, which the worker checks against the delivery anyway), so
        // nobody waits for it.
        self.db.call_detached(
            "persist a visibility change",
            move |conn| {
                conn.prepare_cached("UPDATE queue SET visible_at = ?2 WHERE id = ?1")?
                    .execute(params![id, visible_at])?;
                Ok(())
            },
            drop,
        );
        Ok(())
    }

    async fn delete(&self, receipt: &str) -> StoreResult<()> {
        let Some((id, number)) = parse_receipt(receipt) else {
            return Ok(());
        };
        let now = millis(self.clock.now());
        if !self.scheduler().remove(id, number, now) {
            return Ok(());
        }
        self.work.notify_one();
        // The outcome the message led to is already recorded, so a delete lost in a
        // crash only brings the message back to a delivery that is settled (the
        // worker finds it so and drops it): nobody waits for it.
        self.db.call_detached(
            "delete a settled message",
            move |conn| {
                conn.prepare_cached("DELETE FROM queue WHERE id = ?1")?
                    .execute([id])?;
                Ok(())
            },
            drop,
        );
        Ok(())
    }

    fn delay_limits(&self) -> DelayLimits {
        // No in-flight limit here: a long retry is just a message visible later.
        DelayLimits::UNLIMITED
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
