//! Test support shared by the end-to-end suites: scripted webhook receivers on
//! loopback, temporary directories, polling until a condition holds, and a moto server
//! (the local AWS emulator) started and stopped by the test that needs it.

pub mod conformance;
pub mod postgres;
pub mod sim;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "entrega-{tag}-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free loopback port (bound, then released for a child process to take).
pub fn free_loopback_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a loopback port")
        .port()
}

/// The `http://…` address a started `entrega serve` announces on the first line of
/// its standard output (taken from the child); the line itself if it has none.
pub fn served_address(child: &mut std::process::Child) -> Result<String, String> {
    use std::io::BufRead;
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or_else(String::new)?;
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    line.split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(|addr| format!("http://{addr}"))
        .ok_or(line)
}

/// How a receiver answers one request.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub delay: Duration,
    pub headers: Vec<(&'static str, String)>,
    /// What the response says; a fixed greeting when `None`.
    pub body: Option<String>,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            delay: Duration::ZERO,
            headers: vec![],
            body: None,
        }
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    pub fn body(mut self, body: &str) -> Self {
        self.body = Some(body.to_owned());
        self
    }
}

/// One request a receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: String,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

#[derive(Default)]
struct ReceiverState {
    script: VecDeque<Reply>,
    fallback: Option<Reply>,
    got: Vec<Received>,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: usize,
    peak_in_flight: usize,
}

/// A webhook receiver on loopback answering from a script (then with a fallback).
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<Mutex<ReceiverState>>,
}

impl Receiver {
    pub async fn start(script: Vec<Reply>, fallback: Reply) -> Self {
        let state = Arc::new(Mutex::new(ReceiverState {
            script: script.into(),
            fallback: Some(fallback),
            ..Default::default()
        }));
        let shared = state.clone();
        let app = axum::Router::new().fallback(
            move |uri: axum::http::Uri, headers: HeaderMap, body: Bytes| {
                let shared = shared.clone();
                async move {
                    let reply = {
                        let mut s = shared.lock().unwrap();
                        s.got.push(Received {
                            path: uri.path().to_owned(),
                            headers,
                            body: String::from_utf8_lossy(&body).into_owned(),
                            at: Instant::now(),
                        });
                        s.in_flight += 1;
                        s.peak_in_flight = s.peak_in_flight.max(s.in_flight);
                        s.script.pop_front().or_else(|| s.fallback.clone()).unwrap()
                    };
                    tokio::time::sleep(reply.delay).await;
                    shared.lock().unwrap().in_flight -= 1;
                    let mut resp = (
                        StatusCode::from_u16(reply.status).unwrap(),
                        reply.body.unwrap_or_else(|| "receiver says hi".to_owned()),
                    )
                        .into_response();
                    for (name, value) in reply.headers {
                        resp.headers_mut().insert(name, value.parse().unwrap());
                    }
                    resp
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { addr, state }
    }

    /// Always answers `status`.
    pub async fn answering(status: u16) -> Self {
        Self::start(vec![], Reply::status(status)).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// From now on, answer every request with `reply` (what is left of the script is
    /// dropped): a receiver that is fixed, or breaks, mid-test.
    pub fn answer_from_now(&self, reply: Reply) {
        let mut s = self.state.lock().unwrap();
        s.script.clear();
        s.fallback = Some(reply);
    }

    pub fn got(&self) -> Vec<Received> {
        self.state.lock().unwrap().got.clone()
    }

    /// The most requests it was answering at one moment.
    pub fn peak_in_flight(&self) -> usize {
        self.state.lock().unwrap().peak_in_flight
    }

    pub fn count(&self) -> usize {
        self.state.lock().unwrap().got.len()
    }

    /// The distinct `webhook-id`s received, sorted: as many as `count()` when nothing
    /// arrived twice.
    pub fn distinct_webhook_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .got()
            .iter()
            .map(|r| r.header("webhook-id").to_owned())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

/// Poll `check` until it returns `Some`, or panic after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long moto may take to start on a busy machine.
const MOTO_START_LIMIT: Duration = Duration::from_secs(60);

/// The workspace's root directory.
fn workspace() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("functions/testkit lies two levels under the workspace root")
}

/// The Python that runs moto: `ENTREGA_PYTHON` if set (scripts/test sets it), else
/// the workspace's virtual environment `.venv/bin/python` if there is one (made by
/// scripts/python-tools), else `python3` from the PATH.
pub fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("ENTREGA_PYTHON").filter(|p| !p.is_empty()) {
        return python.into();
    }
    let venv = workspace().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// A moto server (the local AWS emulator) on a free loopback port, stopped on drop:
/// `scripts/moto_server.py`, which serves DynamoDB requests one at a time, as atomic
/// and isolated as DynamoDB's own (moto alone lets two transactions both pass a
/// condition only one may).
pub struct Moto {
    child: Child,
    pub endpoint: String,
}

/// Ports tried before giving up.
const MOTO_PORT_TRIES: usize = 5;

impl Moto {
    pub fn start() -> Self {
        for _ in 0..MOTO_PORT_TRIES {
            if let Some(moto) = Self::try_start() {
                return moto;
            }
        }
        panic!("moto did not start; is moto[server] installed? scripts/test installs it");
    }

    /// Start on a free port; `None` if the port was taken meanwhile.
    fn try_start() -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let python = python();
        let child = Command::new(&python)
            .arg(workspace().join("scripts/moto_server.py"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{} does not run ({e}); scripts/python-tools makes .venv with moto[server], \
                     or set ENTREGA_PYTHON to a Python that has it",
                    python.display()
                )
            });
        let mut moto = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        // The port accepting connections proves nothing: another test's server may
        // have taken it between our probe and moto's bind, and this moto then exits
        // after a slow start while the test talks to the other one. Only moto's own
        // "Running on …:PORT" line (printed once *it* is bound) says the port is ours.
        let stderr = moto.child.stderr.take().expect("stderr is piped");
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let banner = format!("127.0.0.1:{port}");
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut bound = Some(bound_tx);
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("Running on") && line.contains(&banner) {
                    if let Some(tx) = bound.take() {
                        let _ = tx.send(());
                    }
                }
                // Keep draining, so a chatty server never blocks on a full pipe.
            }
        });
        match bound_rx.recv_timeout(MOTO_START_LIMIT) {
            Ok(()) => {}
            Err(_) => return None,
        }
        // Bound by this process; wait until it serves.
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(_)) = moto.child.try_wait() {
                return None;
            }
            assert!(started.elapsed() < MOTO_START_LIMIT, "moto did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        match moto.child.try_wait() {
            Ok(None) => Some(moto),
            _ => None,
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal SMTP server on loopback that accepts every message and keeps it (just
/// enough of RFC 5321 for a client: greeting, EHLO, MAIL, RCPT, DATA, QUIT).
#[derive(Clone)]
pub struct SmtpSink {
    pub addr: SocketAddr,
    messages: Arc<Mutex<Vec<String>>>,
}

impl SmtpSink {
    pub async fn start() -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let messages: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = messages.clone();
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let kept = kept.clone();
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut lines = BufReader::new(read).lines();
                    let _ = write.write_all(b"220 sink ESMTP\r\n").await;
                    while let Ok(Some(line)) = lines.next_line().await {
                        let verb = line
                            .split_whitespace()
                            .next()
                            .unwrap_or("")
                            .to_ascii_uppercase();
                        let reply: &[u8] = match verb.as_str() {
                            "EHLO" | "HELO" => b"250 sink\r\n",
                            "DATA" => {
                                let _ = write.write_all(b"354 end with .\r\n").await;
                                let mut message = String::new();
                                while let Ok(Some(l)) = lines.next_line().await {
                                    if l == "." {
                                        break;
                                    }
                                    message.push_str(&l);
                                    message.push('\n');
                                }
                                kept.lock().unwrap().push(message);
                                b"250 queued\r\n"
                            }
                            "QUIT" => {
                                let _ = write.write_all(b"221 bye\r\n").await;
                                return;
                            }
                            _ => b"250 ok\r\n",
                        };
                        let _ = write.write_all(reply).await;
                    }
                });
            }
        });
        Self { addr, messages }
    }

    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    pub fn messages(&self) -> Vec<String> {
        self.messages.lock().unwrap().clone()
    }
}
