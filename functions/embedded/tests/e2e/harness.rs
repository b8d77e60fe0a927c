//! The e2e harness: a real `entrega serve` process on a temp database and a free
//! port, scripted webhook receivers on loopback, and a small API client.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{json, Value};

pub const ADMIN_KEY: &str = "admin_key_for_tests_0123456789abcdef";

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

/// A running `entrega serve`.
pub struct Server {
    child: Child,
    pub base: String,
    pub log: PathBuf,
}

impl Server {
    /// Start on `dir/entrega.db` with loopback receivers allowed.
    pub fn start(dir: &TempDir) -> Self {
        Self::start_with(dir, &["--allow-target", "127.0.0.0/8", "--allow-http"])
    }

    pub fn start_with(dir: &TempDir, extra: &[&str]) -> Self {
        let db = dir.0.join("entrega.db");
        let log = dir.0.join(format!("serve-{}.log", rand::random::<u32>()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_entrega"))
            .args(["serve", "--listen", "127.0.0.1:0", "--db"])
            .arg(&db)
            .args(extra)
            .env("ENTREGA_ADMIN_KEY", ADMIN_KEY)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the entrega binary starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| {
                panic!(
                    "no listen line, got {line:?}; log: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        Self {
            child,
            base: format!("http://{addr}"),

            log,
        }
    }

    /// `kill -9`: no chance to finish anything.
    pub fn kill_hard(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap()
    }

    pub fn api(&self, key: &str) -> Api {
        Api {
            base: self.base.clone(),
            key: key.to_owned(),
            client: reqwest::Client::new(),
        }
    }

    pub fn admin(&self) -> Api {
        self.api(ADMIN_KEY)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal API client.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub key: String,
    pub client: reqwest::Client,
}

impl Api {
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("the API answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, Some(body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None).await
    }

    /// Create a tenant (as admin) and return an API client acting for it.
    pub async fn tenant(&self, name: &str) -> (String, Api) {
        let (status, body) = self
            .post(
                "/v1/tenants",
                json!({"name": name, "owner_email": "owner@example.com"}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let api = Api {
            key: body["api_key"].as_str().unwrap().to_owned(),
            ..self.clone()
        };
        (body["tenant"]["id"].as_str().unwrap().to_owned(), api)
    }

    /// Create an endpoint; returns its JSON.
    pub async fn endpoint(&self, body: Value) -> Value {
        let (status, body) = self.post("/v1/endpoints", body).await;
        assert_eq!(status, 201, "{body}");
        body
    }

    pub async fn publish(&self, event_type: &str, data: Value) -> String {
        let (status, body) = self
            .post("/v1/events", json!({"type": event_type, "data": data}))
            .await;
        assert_eq!(status, 202, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// The deliveries of an event, from `GET /v1/events/{id}`.
    pub async fn deliveries_of(&self, event_id: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/v1/events/{event_id}")).await;
        assert_eq!(status, 200, "{body}");
        body["deliveries"].as_array().unwrap().clone()
    }
}

/// How a receiver answers one request.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub delay: Duration,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            delay: Duration::ZERO,
            headers: vec![],
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
            got: vec![],
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
                        s.script.pop_front().or_else(|| s.fallback.clone()).unwrap()
                    };
                    tokio::time::sleep(reply.delay).await;
                    let mut resp = (
                        StatusCode::from_u16(reply.status).unwrap(),
                        "receiver says hi",
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

    pub fn got(&self) -> Vec<Received> {
        self.state.lock().unwrap().got.clone()
    }

    pub fn count(&self) -> usize {
        self.state.lock().unwrap().got.len()
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
