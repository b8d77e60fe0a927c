//! The writer thread: the callers' writes, run in groups, each group in one
//! transaction with one commit (see [`super::db`] for why one writer).

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::sync::Answers;
use super::DbError;

/// Writes committed together at most: bounds how long the first caller of a group
/// waits for the others' work, and the size of one transaction.
const MAX_GROUP: usize = 256;
/// A group this large means the writer is busy: it lingers [`LINGER`] to fill it.
/// A lone write (low load) never waits.
const BUSY_GROUP: usize = 8;
const LINGER: std::time::Duration = std::time::Duration::from_micros(300);

/// One caller's write, run by the writer thread inside the group's transaction.
pub(super) trait WriteJob: Send {
    /// Run the work; its result waits for the commit. `Isolation::Savepoint` runs it in
    /// a savepoint of its own, rolled back if it fails. Run again if the group is re-run
    /// (see [`commit_group`]). Whether it succeeded.
    fn run(&mut self, conn: &mut Connection, isolation: Isolation) -> bool;
    /// The group's transaction ended: tell the caller (`Err` if it did not commit).
    fn finish(self: Box<Self>, committed: Result<(), String>);
    /// Whether the caller must not hear "done" before the work is on disk.
    fn durable(&self) -> bool;
}

/// How a job's work is kept apart from the rest of its group.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Isolation {
    /// Straight into the group's transaction: a failure means re-running the group.
    None,
    /// In a savepoint of its own: a failure is rolled back alone.
    Savepoint,
}

impl Isolation {
    /// Run `work` kept apart as this says.
    fn run<T>(
        self,
        conn: &mut Connection,
        work: &mut impl FnMut(&mut Connection) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        if self == Self::None {
            return work(conn);
        }
        conn.execute_batch("SAVEPOINT job")?;
        let result = work(conn);
        let end = if result.is_ok() {
            "RELEASE job"
        } else {
            "ROLLBACK TO job; RELEASE job"
        };
        conn.execute_batch(end)?;
        result
    }
}

/// A caller's work and what its last run gave (it may run twice; see
/// [`commit_group`]).
pub(super) struct Work<T, F> {
    work: F,
    result: Option<Result<T, DbError>>,
}

impl<T, F> Work<T, F>
where
    F: FnMut(&mut Connection) -> Result<T, DbError>,
{
    pub fn new(work: F) -> Self {
        Self { work, result: None }
    }

    /// Run it, kept apart as `isolation` says; whether it succeeded.
    fn run(&mut self, conn: &mut Connection, isolation: Isolation) -> bool {
        let result = isolation.run(conn, &mut self.work);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }
}

pub(super) struct Job<T, F> {
    pub work: Work<T, F>,
    pub reply: oneshot::Sender<Result<T, DbError>>,
    pub durable: bool,
}

impl<T, F> WriteJob for Job<T, F>
where
    T: Send,
    F: FnMut(&mut Connection) -> Result<T, DbError> + Send,
{
    fn run(&mut self, conn: &mut Connection, isolation: Isolation) -> bool {
        self.work.run(conn, isolation)
    }

    fn finish(self: Box<Self>, committed: Result<(), String>) {
        let result = match (committed, self.work.result) {
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(DbError::Sql(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_INTERNAL),
                Some("the write was not run".into()),
            ))),
            (Err(why), _) => Err(DbError::Sql(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                Some(format!("commit failed: {why}")),
            ))),
        };
        // A caller that stopped waiting (its request was cancelled) is not an error:
        // its work is committed either way, as with any write.
        let _ = self.reply.send(result);
    }

    fn durable(&self) -> bool {
        self.durable
    }
}

/// A write nobody waits for (see [`SqliteDb::call_detached`]).
pub(super) struct Detached<T, F, G> {
    pub what: &'static str,
    pub work: Work<T, F>,
    pub committed: G,
}

impl<T, F, G> WriteJob for Detached<T, F, G>
where
    T: Send,
    F: FnMut(&mut Connection) -> Result<T, DbError> + Send,
    G: FnOnce(T) + Send,
{
    fn run(&mut self, conn: &mut Connection, isolation: Isolation) -> bool {
        self.work.run(conn, isolation)
    }

    fn finish(self: Box<Self>, committed: Result<(), String>) {
        match (committed, self.work.result) {
            (Ok(()), Some(Ok(value))) => (self.committed)(value),
            (Ok(()), Some(Err(e))) => {
                tracing::debug!(error = ?e, what = self.what, "a detached write failed; it is redone later")
            }
            (Ok(()), None) => {}
            (Err(why), _) => {
                tracing::debug!(error = %why, what = self.what, "a detached write was not committed; it is redone later")
            }
        }
    }

    fn durable(&self) -> bool {
        false
    }
}

/// The writer thread: take what is queued (at most [`MAX_GROUP`]), run it in one
/// transaction, commit once, then answer every caller (see [`Answers`]).
///
/// The writer never waits for the disk itself: it commits with
/// `synchronous=NORMAL`, which writes the log without syncing it, and the callers who
/// need their work on disk hear "done" from [`super::sync::sync_loop`] once the log
/// is synced, where a synchronous commit held the writer idle for every sync (at
/// 5 000 events/s, most of its time). While one sync is under way, what is queued
/// meanwhile waits for it to end and then commits as one group (see
/// [`Answers::wait_for_sync`]): the next sync covers it either way.
pub(super) fn write_loop(
    mut conn: Connection,
    mut queued: mpsc::Receiver<Box<dyn WriteJob>>,
    mut answers: Answers,
    failing: &std::sync::atomic::AtomicI64,
    broken: &std::sync::OnceLock<String>,
) {
    let mut group: Vec<Box<dyn WriteJob>> = Vec::with_capacity(MAX_GROUP);
    answers.on_writer_thread();
    while let Some(first) = queued.blocking_recv() {
        group.push(first);
        take_queued(&mut queued, &mut group);
        if let Some(why) = broken.get() {
            // See `sync_loop`: no write is made once a sync has failed, durable or
            // not (a lease the worker sends on must be one it can record the outcome of).
            for job in group.drain(..) {
                job.finish(Err(why.clone()));
            }
            continue;
        }
        if answers.wait_for_sync() {
            take_queued(&mut queued, &mut group);
        } else if group.len() >= BUSY_GROUP {
            // Under load, a moment's wait lets the callers this commit is about to
            // answer queue their next writes into it: fewer, fuller commits write
            // each shared page once instead of once per small group.
            std::thread::sleep(LINGER);
            take_queued(&mut queued, &mut group);
        }
        while !group.is_empty() {
            commit_group(&mut conn, &mut group, &mut answers, failing);
            answers.hand_over();
        }
    }
}

fn take_queued(queued: &mut mpsc::Receiver<Box<dyn WriteJob>>, group: &mut Vec<Box<dyn WriteJob>>) {
    while group.len() < MAX_GROUP {
        match queued.try_recv() {
            Ok(job) => group.push(job),
            Err(_) => break,
        }
    }
}

/// Run the jobs of `group` in one transaction and answer them all (in more than one
/// transaction if SQLite rolls one back by itself; see [`commit_isolated`]). If a
/// job's work was not committed, sets `failing` to now (unix ms) before any caller
/// hears of it.
///
/// Why not a savepoint per job: SQLite copies every page a savepoint's work touches
/// before changing it (its sub-journal), so the jobs of a group that all write the same
/// index pages each copied them again; with the savepoints' own statements, that was a
/// fifth of the writer's time. Jobs almost never fail (a conflict is an answer, not a
/// failure), so they run straight into the transaction, and if one does fail, the whole
/// transaction is rolled back and the group run again with a savepoint per job, which
/// rolls the failing one back alone. That is why a job may run twice.
fn commit_group(
    conn: &mut Connection,
    group: &mut Vec<Box<dyn WriteJob>>,
    answers: &mut Answers,
    failing: &std::sync::atomic::AtomicI64,
) {
    use std::sync::atomic::Ordering::Relaxed;
    if !conn.is_autocommit() {
        // A transaction left open by a rollback that failed: without this, every
        // group after it would fail to begin until the process restarted.
        if let Err(e) = conn.execute_batch("ROLLBACK") {
            tracing::warn!(error = %e, "could not end a transaction left open");
        }
    }
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let why = e.to_string();
        failing.store(super::db::unix_ms(), Relaxed);
        for job in group.drain(..) {
            answers.give(job, Err(why.clone()));
        }
        return;
    }
    let mut all_ran = true;
    for job in group.iter_mut() {
        if !job.run(conn, Isolation::None) || conn.is_autocommit() {
            all_ran = false;
            break;
        }
    }
    if all_ran {
        let committed = conn.execute_batch("COMMIT").map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            e.to_string()
        });
        if committed.is_err() {
            failing.store(super::db::unix_ms(), Relaxed);
        }
        for job in group.drain(..) {
            answers.give(job, committed.clone());
        }
        return;
    }
    // A write failed: expected answers are results, not failures, so this one could
    // not be written (a full disk, the size limit).
    failing.store(super::db::unix_ms(), Relaxed);
    if !conn.is_autocommit() {
        if let Err(e) = conn.execute_batch("ROLLBACK") {
            tracing::warn!(error = %e, "could not roll back a failed group");
        }
    }
    while !group.is_empty() {
        commit_isolated(conn, group, answers);
    }
}

/// Run jobs from the front of `group` in one transaction, each in its own savepoint,
/// and answer them. Usually that is all of them; but if SQLite rolls the transaction
/// back by itself (a full disk, an I/O error), the jobs run so far are answered with
/// the failure and the rest are left for a transaction of their own, so none is
/// confirmed unless its work was committed and none runs outside a transaction.
fn commit_isolated(
    conn: &mut Connection,
    group: &mut Vec<Box<dyn WriteJob>>,
    answers: &mut Answers,
) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let why = e.to_string();
        for job in group.drain(..) {
            answers.give(job, Err(why.clone()));
        }
        return;
    }
    let mut ran = 0;
    let mut aborted = false;
    for job in group.iter_mut() {
        job.run(conn, Isolation::Savepoint);
        ran += 1;
        if conn.is_autocommit() {
            aborted = true;
            break;
        }
    }
    let committed = if aborted {
        Err("the transaction was rolled back by the database".to_owned())
    } else {
        conn.execute_batch("COMMIT").map_err(|e| {
            // Nothing of the group is kept: every caller hears it failed.
            let _ = conn.execute_batch("ROLLBACK");
            e.to_string()
        })
    };
    for job in group.drain(..ran) {
        answers.give(job, committed.clone());
    }
}
