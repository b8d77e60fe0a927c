//! The connection strategy: one writer thread that commits many callers' writes in
//! one transaction (group commit), and a small pool of read-only connections that
//! never queue behind it (WAL lets readers see the last commit while a write runs).
//!
//! Why one writer: SQLite serialises writers anyway, and a transaction per caller
//! pays a commit (an fsync, with full durability) per caller. Callers that arrive
//! while a commit runs are queued and go into the next transaction together, so under
//! load one fsync covers a whole group, and at low load a lone write commits at once
//! (nothing waits for a group to fill). A caller whose work fails is rolled back
//! alone (see `writer.rs` for how, without a savepoint per caller), and nobody is
//! told "done" before the transaction holding their work has committed.

use std::path::Path;
use std::sync::Arc;

use entrega_core::ports::{StoreError, StoreResult};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};

use super::readers::Readers;
use super::sync::{open_log, sync_loop, Answers, SyncGate, SYNC_QUEUE};
use super::writer::{write_loop, Detached, Job, Work, WriteJob};
use super::{schema, DbError};

/// How long a statement waits for a lock held by another connection (an operator's
/// `sqlite3` shell) before failing.
const BUSY_TIMEOUT_MS: u32 = 5_000;
/// Writes queued for the writer at most; past it callers wait (backpressure) rather
/// than grow memory without bound.
const WRITE_QUEUE: usize = 4_096;
/// Read-only connections: enough that the API's reads and the workers' reads run
/// beside each other on two cores.
const READERS: usize = 4;
/// The writer's page cache (KiB): the pages a group of writes changes, and the hot
/// pages of the indexes it updates (the rest it reads through [`MMAP_BYTES`]). Not
/// larger: whenever an insert splits a b-tree page, SQLite renumbers the new pages
/// through a page number past the end of the file, and the commit then walks the whole
/// cache to drop pages past the end. With 32 MiB that walk was a sixth of the writer's
/// time; at 8 MiB the worker path used 7 % less CPU a delivery (2 MiB used more again:
/// pages read back from the log).
const CACHE_KIB: i64 = 8 * 1024;
/// Page cache of a read-only connection (KiB). Small on purpose: a reader drops its
/// whole cache whenever it finds the database changed since its last read, which under
/// load is every read, and dropping a large cache costs more than it saves.
const READER_CACHE_KIB: i64 = 1024;
/// Memory-mapped I/O for the writer: reads of pages not in its cache are served from
/// the OS page cache without a system call each.
const MMAP_BYTES: i64 = 256 * 1024 * 1024;
/// None for the readers: a connection maps the file anew whenever it has grown, and
/// under load it grows between any reader's two reads, so each read unmapped and mapped
/// it again (an unmap stops every thread of the process to flush its address cache). A
/// reader's few pages a read are cheaper read with `pread`.
const READER_MMAP_BYTES: i64 = 0;
/// How long a failed write marks the database as failing (see
/// [`SqliteDb::writes_failing`]).
pub const WRITES_FAILING_FOR: std::time::Duration = std::time::Duration::from_secs(10);
/// How often the checkpointer copies the log back into the database.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// Log pages past which the writer checkpoints by itself (SQLite's default is 1 000):
/// only if the checkpointer falls behind; bounds the log file at about 40 MiB.
const WRITER_CHECKPOINT_PAGES: i64 = 10_000;
/// The log file's size after a checkpoint that emptied it: SQLite truncates it to
/// this when it starts writing it from the beginning again. Without it, the file kept
/// the largest size a burst ever gave it (25.7 MiB beside a 2 MiB database capped by
/// `--max-db-size-mb`, a hostile test), for good. With a size limit, a quarter of it.
const WAL_SIZE_LIMIT: i64 = 16 * 1024 * 1024;
/// Prepared statements kept per connection (every statement the store uses fits).
const STATEMENT_CACHE: usize = 128;

/// How a commit is made durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// Every commit is on disk before it is confirmed: an accepted event survives a
    /// power loss. The default.
    // The log is synced after the commit, as `synchronous=FULL` does, but off the
    // writer's thread (see `sync::sync_loop`).
    #[default]
    Full,
    /// Commits survive a crash of the process (`kill -9`), but the last ones may be
    /// lost if the machine loses power (`synchronous=NORMAL` in WAL mode).
    Normal,
}

tokio::task_local! {
    /// Set around work whose writes a crash or power loss may lose because it is
    /// replayed from what is already durable (see [`replayable`]).
    static REPLAYABLE: ();
}

/// Run `work` with its writes marked replayable: they are answered once committed,
/// without waiting for the log to be synced, even under full durability.
///
/// Why this is safe: only the fan-out of an event whose outbox row has committed is
/// run this way. If power is lost before those writes reach the disk, the row is not
/// marked fanned out either (the log is written in order), and the outbox poller fans
/// it out again. Nothing is sent on their strength alone that a power loss could not
/// repeat: at most once, the worker commits its "about to send" write durably before
/// the attempt, and that commit's sync makes every earlier commit in the log durable
/// with it; at least once, the fan-out and the attempt are made again, which the
/// promise allows. What it saves: two disk syncs on the way from publish to
/// delivered, at low load.
pub async fn replayable<F: std::future::Future>(work: F) -> F::Output {
    REPLAYABLE.scope((), work).await
}

/// Run `work` to its end even if the caller stops waiting (a request cancelled by its
/// client's disconnect): what a store does once its write has committed (the
/// in-memory bookkeeping that lets a poller find the row) must not be skipped, or the
/// committed row waits unseen until a restart. Keeps [`replayable`] as it was.
pub async fn to_completion<T, F>(work: F) -> StoreResult<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = StoreResult<T>> + Send + 'static,
{
    let replayable_here = REPLAYABLE.try_with(|_| ()).is_ok();
    tokio::spawn(async move {
        if replayable_here {
            REPLAYABLE.scope((), work).await
        } else {
            work.await
        }
    })
    .await
    .unwrap_or_else(|e| match e.try_into_panic() {
        Ok(panic) => std::panic::resume_unwind(panic),
        Err(_) => Err(StoreError::Backend("the database work was stopped".into())),
    })
}

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct SqliteDb {
    writes: mpsc::Sender<Box<dyn WriteJob>>,
    readers: Arc<Readers>,
    /// Held by every handle: the checkpointer thread stops once the last is dropped.
    _alive: Arc<()>,
    /// Pages in use past which new events are refused (0: no limit): a share of the
    /// hard size limit kept free, so what was accepted can still be delivered.
    publish_pages: Arc<std::sync::atomic::AtomicI64>,
    /// When a write last failed (unix ms; 0: never), set by the writer thread.
    last_write_failure_ms: Arc<std::sync::atomic::AtomicI64>,
    /// Why no write is made any more (a failed sync; see `sync::sync_loop`).
    broken: Arc<std::sync::OnceLock<String>>,
}

fn tune(conn: &Connection, cache_kib: i64, mmap_bytes: i64) -> Result<(), rusqlite::Error> {
    conn.pragma_update(None, "busy_timeout", BUSY_TIMEOUT_MS)?;
    conn.pragma_update(None, "cache_size", -cache_kib)?;
    conn.pragma_update(None, "mmap_size", mmap_bytes)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

impl SqliteDb {
    /// Open (creating if needed) the database at `path` with full durability and
    /// bring its schema up to date.
    pub fn open(path: &Path) -> Result<Self, rusqlite::Error> {
        Self::open_with(path, Durability::Full)
    }

    /// Open with the given durability.
    pub fn open_with(path: &Path, durability: Durability) -> Result<Self, rusqlite::Error> {
        Self::open_syncing_with(path, durability, std::fs::File::sync_data)
    }

    /// Open with the given durability, syncing the log with `sync` (given the log
    /// file): tests give one that fails or holds.
    pub(crate) fn open_syncing_with(
        path: &Path,
        durability: Durability,
        sync: impl Fn(&std::fs::File) -> std::io::Result<()> + Send + 'static,
    ) -> Result<Self, rusqlite::Error> {
        let mut conn = Connection::open(path)?;
        schema::refuse_foreign(&conn)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // The writer's commits never wait for the disk; with full durability the
        // sync thread syncs the log before a durable caller is answered.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        tune(&conn, CACHE_KIB, MMAP_BYTES)?;
        // The checkpointer thread copies the log back into the database; the
        // writer's own automatic checkpoint stays only as the bound if it falls behind.
        conn.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)?;
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
        schema::migrate(&mut conn)?;
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let reader = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            tune(&reader, READER_CACHE_KIB, READER_MMAP_BYTES)?;
            readers.push(reader);
        }
        let checkpointer = Connection::open(path)?;
        checkpointer.pragma_update(None, "busy_timeout", BUSY_TIMEOUT_MS)?;
        let (writes, queued) = mpsc::channel(WRITE_QUEUE);
        let last_write_failure_ms = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let broken = Arc::new(std::sync::OnceLock::new());
        let gate = Arc::new(SyncGate::default());
        let to_sync = match durability {
            Durability::Normal => None,
            Durability::Full => {
                let log = open_log(&conn)?;
                let (to_sync, waiting) = std::sync::mpsc::sync_channel(SYNC_QUEUE);
                let (failing, broken) = (last_write_failure_ms.clone(), broken.clone());
                let gate = gate.clone();
                spawn("sync", move || {
                    sync_loop(waiting, || sync(&log), &gate, &failing, &broken)
                })?;
                Some(to_sync)
            }
        };
        let failing = last_write_failure_ms.clone();
        let writer_broken = broken.clone();
        spawn("writer", move || {
            write_loop(
                conn,
                queued,
                Answers::new(to_sync, gate),
                &failing,
                &writer_broken,
            )
        })?;
        let alive = Arc::new(());
        let watch = Arc::downgrade(&alive);
        spawn("checkpointer", move || checkpoint_loop(checkpointer, watch))?;
        Ok(Self {
            writes,
            readers: Arc::new(Readers::new(readers)),
            _alive: alive,
            publish_pages: Arc::default(),
            last_write_failure_ms,
            broken,
        })
    }

    /// Bound the database file to `bytes` (SQLite's `max_page_count`): past it, writes
    /// fail with "database or disk is full" and the API answers 503, before the disk
    /// itself fills. The log file beside it is truncated to a quarter of `bytes` (at
    /// most [`WAL_SIZE_LIMIT`]) whenever a checkpoint has emptied it.
    pub async fn limit_size(&self, bytes: u64) -> StoreResult<()> {
        let pages = self
            .call(move |conn| {
                let page_size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
                let pages = (bytes as i64 / page_size.max(512)).max(1);
                conn.pragma_update(None, "max_page_count", pages)?;
                let log = (bytes as i64 / 4).min(WAL_SIZE_LIMIT);
                conn.pragma_update(None, "journal_size_limit", log)?;
                Ok(pages)
            })
            .await?;
        self.publish_pages.store(
            ((pages as f64 * super::PUBLISH_SHARE) as i64).max(1),
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

    /// Run `f` on the writer's connection, in the next group's transaction; returns
    /// once that transaction has committed. `f` is atomic: if it returns `Err`, none of
    /// its writes are kept (it needs no savepoint of its own for that). It must not
    /// begin or end a transaction itself, and it may be run more than once (if another
    /// caller's work in its group fails): it must do nothing but database work.
    pub async fn call<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Connection) -> Result<T, DbError> + Send + 'static,
    {
        let durable = REPLAYABLE.try_with(|_| ()).is_err();
        self.queue(f, durable).await?.await
    }

    /// Queue `f` as [`Self::call`] does, behind every write queued before it, and
    /// return once it is queued, with what resolves to its result once its group has
    /// committed: a write the caller queues next commits after it. Not durable by
    /// itself (a later durable commit makes it so).
    pub async fn call_ahead<T, F>(
        &self,
        f: F,
    ) -> StoreResult<impl std::future::Future<Output = StoreResult<T>> + Send + 'static>
    where
        T: Send + 'static,
        F: FnMut(&mut Connection) -> Result<T, DbError> + Send + 'static,
    {
        self.queue(f, false).await
    }

    /// A database at `path` whose log syncs wait while the flag returned is set (it
    /// starts as `held`): its commits are readable, its durable callers unanswered.
    #[cfg(test)]
    pub(crate) fn open_with_held_sync(
        path: &Path,
        held: bool,
    ) -> (Self, Arc<std::sync::atomic::AtomicBool>) {
        use std::sync::atomic::{AtomicBool, Ordering};
        let hold = Arc::new(AtomicBool::new(held));
        let holding = hold.clone();
        let db = Self::open_syncing_with(path, Durability::Full, move |_| {
            while holding.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(())
        })
        .expect("a database in a fresh directory opens");
        (db, hold)
    }

    /// Return once everything committed before this call is as durable as
    /// [`Durability`] makes it, and every durable caller of those commits has been
    /// answered (the sync thread answers in commit order).
    pub async fn synced(&self) -> StoreResult<()> {
        self.queue(|_| Ok(()), true).await?.await
    }

    /// Whether a write failed (or a commit) within [`WRITES_FAILING_FOR`]: the
    /// database cannot be written at the moment (a full disk, the size limit). Not
    /// just the last group: writes that need no new page still commit between ones
    /// that fail.
    pub fn writes_failing(&self) -> bool {
        let failed = self
            .last_write_failure_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        self.broken.get().is_some()
            || (failed > 0 && unix_ms() - failed < WRITES_FAILING_FOR.as_millis() as i64)
    }

    async fn queue<T, F>(
        &self,
        f: F,
        durable: bool,
    ) -> StoreResult<impl std::future::Future<Output = StoreResult<T>> + Send + 'static>
    where
        T: Send + 'static,
        F: FnMut(&mut Connection) -> Result<T, DbError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn WriteJob> = Box::new(Job {
            work: Work::new(f),
            reply,
            durable,
        });
        self.writes
            .send(job)
            .await
            .map_err(|_| StoreError::Backend("the database writer has stopped".into()))?;
        Ok(async move {
            answer
                .await
                .map_err(|_| StoreError::Backend("the database writer has stopped".into()))?
                .map_err(StoreError::from)
        })
    }

    /// Queue a write whose loss in a crash costs nothing but some repeated work (a
    /// queue row deleted after its outcome is recorded, a retry delay persisted) and
    /// return without waiting for it: it commits with the next group, and the caller
    /// saves a round trip to the writer thread. A failure is logged, not returned. As
    /// with [`Self::call`], `f` is atomic and may be run more than once; what must
    /// happen once goes in `committed`, which the writer thread runs with `f`'s result
    /// after the commit (briefly: the next group waits for it).
    pub fn call_detached<T, F, G>(&self, what: &'static str, work: F, committed: G)
    where
        T: Send + 'static,
        F: FnMut(&mut Connection) -> Result<T, DbError> + Send + 'static,
        G: FnOnce(T) + Send + 'static,
    {
        let job: Box<dyn WriteJob> = Box::new(Detached {
            what,
            work: Work::new(work),
            committed,
        });
        if let Err(mpsc::error::TrySendError::Full(job)) = self.writes.try_send(job) {
            // The writer is behind: wait for room off this task rather than drop it.
            let writes = self.writes.clone();
            tokio::spawn(async move {
                let _ = writes.send(job).await;
            });
        }
    }

    /// Run a point read (one row by key, a handful of rows) on a read-only connection
    /// right here, on the calling thread: it takes microseconds from the page cache,
    /// less than handing it to another thread and back would cost. When every reader
    /// is busy it goes to the blocking pool like [`Self::read`].
    pub async fn get<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, DbError> + Send + 'static,
    {
        match self.readers.try_take() {
            Some(conn) => {
                let result = f(&conn);
                self.readers.give_back(conn);
                result.map_err(StoreError::from)
            }
            None => self.read(f).await,
        }
    }

    /// Run `f` on a read-only connection in the blocking pool (listings and scans,
    /// which may take long enough to hold up other tasks): it sees every write whose
    /// `call` has returned, and does not wait for writes in progress.
    pub async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, DbError> + Send + 'static,
    {
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let conn = readers.take();
            let result = f(&conn);
            readers.give_back(conn);
            result
        })
        .await
        .map_err(|e| StoreError::Backend(format!("database read failed: {e}")))?
        .map_err(StoreError::from)
    }
}

/// Now, in unix milliseconds (the writer's own bookkeeping, not the clock port's).
pub(super) fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Start the database's thread named `entrega-sqlite-<role>`.
fn spawn(role: &str, run: impl FnOnce() + Send + 'static) -> Result<(), rusqlite::Error> {
    std::thread::Builder::new()
        .name(format!("entrega-sqlite-{role}"))
        .spawn(run)
        .map(drop)
        .map_err(|e| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(format!("cannot start the {role} thread: {e}")),
            )
        })
}

/// The checkpointer thread: every [`CHECKPOINT_EVERY`], copy what the log holds back
/// into the database (a passive checkpoint: it never blocks the writer or a reader),
/// off the writer's thread, so a commit never waits for a checkpoint. Ends when the
/// last handle on the database is dropped.
fn checkpoint_loop(conn: Connection, alive: std::sync::Weak<()>) {
    while alive.strong_count() > 0 {
        std::thread::sleep(CHECKPOINT_EVERY);
        if let Err(e) = conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
            tracing::debug!(error = %e, "a checkpoint failed; the next one retries");
        }
    }
}

#[cfg(test)]
#[path = "db_tests.rs"]
mod tests;
