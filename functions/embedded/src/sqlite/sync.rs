//! When a durable caller hears "done": the sync thread syncs the database's log after
//! the writer's commits and answers the callers whose work those commits hold (see
//! [`sync_loop`] for why that is as durable as `synchronous=FULL`, and what a failed
//! sync does).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use rusqlite::Connection;

use super::writer::WriteJob;

/// Committed groups waiting for the sync thread at most; past it the writer waits
/// (the callers in them are waiting too, so this bounds nothing that grows by itself).
pub(super) const SYNC_QUEUE: usize = 1_024;

/// The longest the writer holds its next commit back for a sync under way (see
/// [`Answers::wait_for_sync`]): a sync takes about a millisecond here, but a disk
/// that stalls must not hold up the writes nobody waits on the disk for (a lease,
/// a fan-out) for as long as it stalls.
pub(super) const LONGEST_HOLD: Duration = Duration::from_millis(100);

/// Whether a sync is under way, told by the sync thread to the writer.
#[derive(Default)]
pub(super) struct SyncGate {
    /// Set by the writer before it hands committed work over, cleared by the sync
    /// thread once it has nothing left to sync. (In that order, it is never left set
    /// with the sync thread idle: whatever the writer hands over after setting it, the
    /// sync thread receives, syncs, and then clears it.)
    syncing: AtomicBool,
    /// The writer's thread, woken when the flag is cleared.
    writer: OnceLock<Thread>,
}

impl SyncGate {
    /// The sync thread has nothing left to sync: wake the writer if it waits for that.
    fn idle(&self) {
        self.syncing.store(false, Ordering::Release);
        if let Some(writer) = self.writer.get() {
            writer.unpark();
        }
    }
}

/// Where the writer hands committed work: straight back to its callers, or, for
/// callers who must not hear "done" before their work is on disk, to the sync thread.
pub(super) struct Answers {
    /// The sync thread's queue; `None` when no commit waits for the disk
    /// (`Durability::Normal`).
    to_sync: Option<std::sync::mpsc::SyncSender<Vec<Box<dyn WriteJob>>>>,
    /// Shared with the sync thread.
    gate: Arc<SyncGate>,
    /// This group's jobs that wait for the next sync.
    waiting: Vec<Box<dyn WriteJob>>,
}

impl Answers {
    pub fn new(
        to_sync: Option<std::sync::mpsc::SyncSender<Vec<Box<dyn WriteJob>>>>,
        gate: Arc<SyncGate>,
    ) -> Self {
        Self {
            to_sync,
            gate,
            waiting: Vec::new(),
        }
    }

    /// Called on the writer's thread before its first commit.
    pub(super) fn on_writer_thread(&self) {
        let _ = self.gate.writer.set(std::thread::current());
    }

    /// If a sync is under way, wait (at most [`LONGEST_HOLD`]) until it is over;
    /// whether one was.
    ///
    /// Why the writer holds its next commit back meanwhile: its durable callers cannot
    /// hear "done" before the sync after this one, which starts only once this one is
    /// over, so committing now gains them nothing; and a commit writes each page its
    /// group changed, once per commit. Under load the writer committed a few jobs at a
    /// time, several times a sync, and wrote about three log pages a delivery; one
    /// commit a sync writes the pages the deliveries share once. Writes nobody waits
    /// on the disk for (a lease, a fan-out beside its publish) wait up to one sync
    /// longer to be committed.
    pub(super) fn wait_for_sync(&self) -> bool {
        if self.to_sync.is_none() || !self.gate.syncing.load(Ordering::Acquire) {
            return false;
        }
        let until = std::time::Instant::now() + LONGEST_HOLD;
        while self.gate.syncing.load(Ordering::Acquire) {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::park_timeout(left);
        }
        true
    }

    /// `job`'s transaction ended: answer it now, or once the log is on disk.
    pub(super) fn give(&mut self, job: Box<dyn WriteJob>, committed: Result<(), String>) {
        if committed.is_ok() && job.durable() && self.to_sync.is_some() {
            self.waiting.push(job);
        } else {
            job.finish(committed);
        }
    }

    /// Hand this group's waiting jobs to the sync thread (after their commit).
    pub(super) fn hand_over(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let jobs = std::mem::take(&mut self.waiting);
        let Some(to_sync) = &self.to_sync else { return };
        self.gate.syncing.store(true, Ordering::Release);
        if let Err(std::sync::mpsc::SendError(jobs)) = to_sync.send(jobs) {
            for job in jobs {
                job.finish(Err("the database's sync thread has stopped".to_owned()));
            }
        }
    }
}

/// The sync thread: sync the log whenever committed work waits for it, then answer
/// every job that was committed before the sync began. Jobs that arrive during a
/// sync wait for the next one: their commit may have come after the sync started.
///
/// Why this is as durable as `synchronous=FULL`: in WAL mode a commit is the log's
/// frames written in order, and after a power loss SQLite keeps the frames up to the
/// last whole commit whose checksums hold. A sync of the log file once a commit has
/// been written puts that commit, and every one before it, on disk. SQLite itself
/// still syncs what `synchronous=NORMAL` syncs: the log's header whenever the log is
/// reused after a checkpoint (so old frames are never taken for new ones), and the log
/// before a checkpoint copies it into the database.
///
/// A failed sync breaks the database until the process restarts (`broken`): the jobs
/// waiting for it, and every write after it, fail. Why not carry on: the kernel may
/// have dropped the log pages it could not write and reported them clean, so a later
/// sync that succeeds proves nothing about them, and after a power loss SQLite would
/// stop reading the log at the lost frames, taking every later commit with it, each
/// of which had been confirmed. A restart reads the log back from what is really on
/// disk (as PostgreSQL, which stops on a failed fsync, does).
pub(super) fn sync_loop(
    waiting: std::sync::mpsc::Receiver<Vec<Box<dyn WriteJob>>>,
    mut sync: impl FnMut() -> std::io::Result<()>,
    gate: &SyncGate,
    failing: &std::sync::atomic::AtomicI64,
    broken: &std::sync::OnceLock<String>,
) {
    let _idle_at_exit = IdleOnDrop(gate);
    loop {
        let mut jobs = match waiting.try_recv() {
            Ok(jobs) => jobs,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                gate.idle();
                match waiting.recv() {
                    Ok(jobs) => jobs,
                    Err(_) => return,
                }
            }
        };
        while let Ok(more) = waiting.try_recv() {
            jobs.extend(more);
        }
        let synced = match broken.get() {
            Some(why) => Err(why.clone()),
            None => sync().map_err(|e| {
                let why = format!(
                    "the database's log could not be synced to disk ({e}): writes are refused \
                     until Entrega is restarted; the last ones may or may not be stored \
                     (publish again with the same event id)"
                );
                tracing::error!(reason = %why, "the database is broken");
                broken.get_or_init(|| why).clone()
            }),
        };
        if synced.is_err() {
            // The work is committed (readers may see it) but maybe not on disk: its
            // callers hear it failed, as for a failed commit.
            failing.store(super::db::unix_ms(), std::sync::atomic::Ordering::Relaxed);
        }
        for job in jobs {
            job.finish(synced.clone());
        }
    }
}

/// Clears the gate when the sync thread ends (its queue closed, or a panic), so the
/// writer never waits for a sync that will not come.
struct IdleOnDrop<'a>(&'a SyncGate);

impl Drop for IdleOnDrop<'_> {
    fn drop(&mut self) {
        self.0.idle();
    }
}

/// The log file `conn` writes, opened once to be synced (`File::sync_data`,
/// `fdatasync`: its data and size). A sync covers whatever was written to the file
/// through any descriptor. Opened once, not by name at each sync: SQLite keeps the
/// same log file open as long as a connection is, and by name a log deleted by hand
/// would fail every sync while SQLite goes on writing the file it holds.
pub(super) fn open_log(conn: &Connection) -> Result<std::fs::File, rusqlite::Error> {
    // SQLite names the log after the database's full path, symlinks resolved, which is
    // what `path()` gives; the log exists once the schema has been written.
    let path = format!("{}-wal", conn.path().unwrap_or_default());
    std::fs::File::open(&path).map_err(|e| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("cannot open the database's log {path}: {e}")),
        )
    })
}
