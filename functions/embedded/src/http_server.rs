//! The API's HTTP server, with the limits a production server needs: a connection
//! cap, hyper's header-read timeout (which also bounds an idle keep-alive
//! connection), tower-http's body-read and request timeouts, and a graceful stop.
//!
//! A client that opens connections and never finishes a request (slowloris) would
//! otherwise hold file descriptors until the process can accept nothing, `/healthz`
//! included. At the cap, a new connection evicts the connection that has been idle or
//! stuck the longest: mid-headers, or with every request it has still waiting for its
//! body (nothing has been done for such a request yet; see `arriving_body`). Only
//! when every connection is busy or just opened is the new one refused. So a flood of
//! half-open connections costs each of them its slot, never the server its service.
//! "Just opened" is short for a connection that has not sent one request's headers
//! ([`SILENT_EVICTABLE_AFTER`]): new connections that never speak, opened faster than
//! the cap each second, locked every other client out when that took a second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tower::ServiceExt;

use crate::arriving_body::ArrivingBody;

/// Connections served at once (see `--max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// A request's headers must arrive within this; an idle keep-alive connection is
/// closed after it too.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The read buffer's limit: a request's head that has not ended when the buffer
/// reaches it gets a 431 (one last read can take the buffer to about twice this, so
/// a head up to about 64 KiB may pass), and a body is read in pieces no larger.
/// hyper's default, about 400 KiB, let every connection at the cap hold that much in
/// headers alone (1.6 GB at 4 096 connections); this holds them to about 256 MiB. No
/// request of the API needs more: a key, an `Idempotency-Key` of 200 characters.
/// nginx allows 32 KiB of headers.
pub const READ_BUFFER_MAX: usize = 32 * 1024;
/// A request body must arrive whole within this (not per chunk: a byte every few
/// seconds does not keep a request alive).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A request is answered within this (a batch resend is the slowest route).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// A connection idle at least this long may be evicted for a new one at the cap.
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(1);
/// The same for a connection that has not yet sent a request's headers. A client's
/// first request follows its connection within half a round trip, so this spares
/// clients up to a 500 ms round trip, where a flood must now open four times the cap
/// each second to keep every place too young to take.
pub const SILENT_EVICTABLE_AFTER: Duration = Duration::from_millis(250);
/// How long a stop waits for open connections to finish their requests.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// Pause after a failed accept (out of file descriptors): the error repeats at once
/// otherwise.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What the server tracks of one connection.
struct Connection {
    /// Requests running now.
    busy: Arc<AtomicUsize>,
    /// Of those, the ones waiting for their body to arrive now.
    awaiting_body: Arc<AtomicUsize>,
    /// When it last finished a request, or was opened (ms since the server started).
    idle_since: Arc<AtomicU64>,
    /// Whether a request's headers have come over it.
    spoke: Arc<AtomicBool>,
    evict: Option<oneshot::Sender<()>>,
}

#[derive(Default)]
struct Connections {
    open: Mutex<HashMap<u64, Connection>>,
}

impl Connections {
    fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Evict the connection idle longest (at least [`EVICTABLE_AFTER`], or
    /// [`SILENT_EVICTABLE_AFTER`] if it never sent a request), counting a connection
    /// whose every running request still waits for its body as idle since its last
    /// request started; `false` if none may go.
    fn evict_one(&self, now_ms: u64) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let victim = open
            .iter()
            .filter(|(_, c)| {
                c.busy.load(Ordering::Acquire) <= c.awaiting_body.load(Ordering::Acquire)
            })
            .filter_map(|(id, c)| {
                let after = if c.spoke.load(Ordering::Acquire) {
                    EVICTABLE_AFTER
                } else {
                    SILENT_EVICTABLE_AFTER
                };
                let since = c.idle_since.load(Ordering::Acquire);
                (now_ms.saturating_sub(since) >= after.as_millis() as u64).then_some((*id, since))
            })
            .min_by_key(|(_, since)| *since)
            .map(|(id, _)| id);
        match victim.and_then(|id| open.remove(&id)) {
            Some(mut c) => {
                if let Some(evict) = c.evict.take() {
                    let _ = evict.send(());
                }
                true
            }
            None => false,
        }
    }
}

/// Serve `app` on `listener` until `shutdown` turns true, then let open requests
/// finish (bounded) and return.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    max_connections: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = app.layer(tower_http::timeout::TimeoutLayer::with_status_code(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        REQUEST_TIMEOUT,
    ));
    let max_connections = connection_cap(max_connections);
    tracing::debug!(max_connections, "connection cap");
    let connections = Arc::new(Connections::default());
    let started = Instant::now();
    let mut next_id = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
        };
        while tasks.try_join_next().is_some() {}
        let (stream, _) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let now_ms = started.elapsed().as_millis() as u64;
        if connections.len() >= max_connections && !connections.evict_one(now_ms) {
            // Every slot is busy or just opened: refuse this one, keep the others.
            drop(stream);
            continue;
        }
        next_id += 1;
        let id = next_id;
        let busy = Arc::new(AtomicUsize::new(0));
        let awaiting_body = Arc::new(AtomicUsize::new(0));
        let idle_since = Arc::new(AtomicU64::new(now_ms));
        let spoke = Arc::new(AtomicBool::new(false));
        let (evict_tx, evict_rx) = oneshot::channel();
        connections
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id,
                Connection {
                    busy: busy.clone(),
                    awaiting_body: awaiting_body.clone(),
                    idle_since: idle_since.clone(),
                    spoke: spoke.clone(),
                    evict: Some(evict_tx),
                },
            );
        let service = hyper::service::service_fn({
            let app = app.clone();
            move |request: Request<Incoming>| {
                let (app, busy, idle_since) = (app.clone(), busy.clone(), idle_since.clone());
                let awaiting_body = awaiting_body.clone();
                spoke.store(true, Ordering::Release);
                async move {
                    let request =
                        request.map(|b| ArrivingBody::new(b, BODY_READ_TIMEOUT, &awaiting_body));
                    idle_since.store(started.elapsed().as_millis() as u64, Ordering::Release);
                    busy.fetch_add(1, Ordering::AcqRel);
                    let response = app.oneshot(request.map(axum::body::Body::new)).await;
                    idle_since.store(started.elapsed().as_millis() as u64, Ordering::Release);
                    busy.fetch_sub(1, Ordering::AcqRel);
                    response
                }
            }
        });
        let connections = connections.clone();
        let mut stop = shutdown.clone();
        tasks.spawn(async move {
            let builder = {
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .max_buf_size(READ_BUFFER_MAX)
                    .keep_alive(true);
                b
            };
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = evict_rx => {}
                _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(DRAIN_LIMIT, conn.as_mut()).await;
                }
            }
            connections
                .open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    }
    let _ = tokio::time::timeout(DRAIN_LIMIT, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
}

/// File descriptors kept for everything but API connections: the database and its
/// WAL, the SMTP relay, and one outgoing webhook connection per attempt in flight.
const FILES_RESERVED: u64 = 128
    + (crate::runtime::WORKER_SLOTS + crate::runtime::SLOW_SLOTS + crate::runtime::KEPT_SLOT_MOVES)
        as u64;

/// The connection cap that fits the open-file limit: `wanted`, or fewer when the
/// process may not open that many files (then accept would fail for everyone with
/// "too many open files" instead of evicting the idle).
pub fn connection_cap(wanted: usize) -> usize {
    let files = open_file_limit().unwrap_or(u64::MAX);
    let room = files.saturating_sub(FILES_RESERVED).max(16);
    wanted.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// The soft limit on open files, where the OS tells it.
fn open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    // SAFETY: getrlimit only writes the struct passed in.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            return Some(limit.rlim_cur);
        }
    }
    None
}

/// Raise the soft limit on open files to the hard limit: each connection is one, and
/// the connection cap, not the OS default of 1024, should be what bounds them.
pub fn raise_file_limit() {
    #[cfg(unix)]
    // SAFETY: getrlimit/setrlimit only read and write the struct passed in.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
