//! The pool of read-only connections: WAL lets each see the last commit while the
//! writer runs, so reads never queue behind writes; a reader is used by one blocking
//! task at a time.

use std::sync::{Condvar, Mutex};

use rusqlite::Connection;

/// Read-only connections, each used by one blocking task at a time.
pub(super) struct Readers {
    idle: Mutex<Vec<Connection>>,
    freed: Condvar,
}

impl Readers {
    pub(super) fn new(connections: Vec<Connection>) -> Self {
        Self {
            idle: Mutex::new(connections),
            freed: Condvar::new(),
        }
    }

    /// An idle connection, if there is one, without waiting.
    pub(super) fn try_take(&self) -> Option<Connection> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    pub(super) fn take(&self) -> Connection {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(conn) = idle.pop() {
                return conn;
            }
            idle = self.freed.wait(idle).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(super) fn give_back(&self, conn: Connection) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conn);
        self.freed.notify_one();
    }
}
