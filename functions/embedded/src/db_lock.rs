//! The database file's claim at start: one process per database, and never a database
//! opened by a name other than the one its unfinished log was left under.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::serve::BoxError;

/// Most entries of the database's directory looked at for another name of it: a
/// bound on start-up work in a crowded directory (`/tmp`); only a file with several
/// names is looked for at all.
const NAMES_LOOKED_AT: usize = 10_000;

/// SQLite names the log after the path the database was opened by.
const LOG_SUFFIX: &str = "-wal";

/// One process per database: the lock is what makes releasing the previous process's
/// leases at start-up safe. It is taken on the database file itself (an OS lock on
/// its inode), not on a name: a second server reaching the same file through a
/// symlink or a hard link finds it taken. The OS drops it when the process dies, even
/// by `kill -9`. (`flock` locks are apart from the POSIX locks SQLite takes.)
pub fn lock_database(db: &Path) -> Result<File, BoxError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(db)
        .map_err(|e| {
            format!(
                "cannot open the database {}: {e}; choose a writable location with --db",
                db.display()
            )
        })?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(format!(
                "another entrega process is using the database {} (possibly through a link \
                 to the same file); stop it, or give this one its own --db",
                db.display()
            )
            .into())
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(format!("cannot lock the database {}: {e}", db.display()).into())
        }
    }
    refuse_a_log_left_under_another_name(db, &file)?;
    Ok(file)
}

/// A server stopped by a crash leaves its last commits in the log beside the name it
/// used (`a.db-wal`), to be copied into the file by the next open *of that name*. Opened
/// through a hard link (`b.db`), SQLite finds no log and reads the file without them (a
/// hostile test: 241 of 500 deliveries, and no warning), then writes pages the old log
/// would later copy over. So such a start is refused, naming the name to use. Only the
/// database's own directory is looked at; a link elsewhere is not found.
fn refuse_a_log_left_under_another_name(db: &Path, file: &File) -> Result<(), BoxError> {
    let ours = file.metadata()?;
    if ours.nlink() < 2 {
        return Ok(());
    }
    // Through a symlink, SQLite opens (and names the log after) the file it points to.
    let db = std::fs::canonicalize(db)?;
    let (Some(dir), Some(own_name)) = (db.parent(), db.file_name()) else {
        return Ok(());
    };
    for entry in std::fs::read_dir(dir)?.take(NAMES_LOOKED_AT).flatten() {
        let name = entry.file_name();
        let Some(base) = name.to_str().and_then(|n| n.strip_suffix(LOG_SUFFIX)) else {
            continue;
        };
        if base == own_name || entry.metadata().map_or(true, |log| log.len() == 0) {
            continue;
        }
        let other = dir.join(base);
        let same_file =
            std::fs::metadata(&other).is_ok_and(|m| m.dev() == ours.dev() && m.ino() == ours.ino());
        if same_file {
            return Err(format!(
                "the database {} is the same file as {}, whose log {}{LOG_SUFFIX} may hold \
                 its last writes (a server using that name did not stop cleanly); serve it \
                 once with --db {} so they are kept",
                db.display(),
                other.display(),
                other.display(),
                other.display()
            )
            .into());
        }
    }
    Ok(())
}
