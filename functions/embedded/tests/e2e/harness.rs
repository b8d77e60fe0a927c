//! The e2e harness: a real `entrega serve` process on a temp database and a free
//! port, scripted webhook receivers on loopback, and a small API client.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

pub use entrega_testkit::{eventually, Receiver, Reply, TempDir};
use serde_json::{json, Value};

pub const ADMIN_KEY: &str = "admin_key_for_tests_0123456789abcdef";

/// The binary under test: this build's, or `ENTREGA_BIN` (to run the suite against a
/// release build, or an older one to show a regression test fails there).
pub fn entrega_bin() -> PathBuf {
    std::env::var_os("ENTREGA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_entrega")))
}

/// Run `entrega args…` with `env` to completion; it must succeed (else its stderr is
/// the failure).
pub fn entrega_succeeds(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let out = Command::new(entrega_bin())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the entrega binary runs");
    assert!(
        out.status.success(),
        "entrega {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `entrega args…` to completion; it must fail. Its stderr.
pub fn entrega_fails(args: &[&str]) -> String {
    let out = Command::new(entrega_bin())
        .args(args)
        .output()
        .expect("the entrega binary runs");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "entrega {args:?} succeeded: {said}");
    said
}

/// A free loopback port (bound, then released for a child process to take).
pub use entrega_testkit::free_loopback_port as free_port;

/// A running `entrega serve`.
pub struct Server {
    child: Child,
    pub base: String,
    pub log: PathBuf,
}

/// What lets the server deliver to receivers on this machine.
pub const LOOPBACK: [&str; 3] = ["--allow-target", "127.0.0.0/8", "--allow-http"];

impl Server {
    /// Start on `dir/entrega.db` with loopback receivers allowed.
    pub fn start(dir: &TempDir) -> Self {
        Self::start_with(dir, &LOOPBACK)
    }

    /// Start with loopback receivers allowed, and `extra` flags.
    pub fn start_loopback(dir: &TempDir, extra: &[&str]) -> Self {
        Self::start_with(dir, &[&LOOPBACK[..], extra].concat())
    }

    /// `GET /metrics` with `key` as the bearer token: status and body.
    pub async fn metrics(&self, key: &str) -> (u16, String) {
        let resp = reqwest::Client::new()
            .get(format!("{}/metrics", self.base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    pub fn start_with(dir: &TempDir, extra: &[&str]) -> Self {
        Self::start_env(dir, extra, &[])
    }

    /// Start with extra arguments and environment variables.
    pub fn start_env(dir: &TempDir, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(dir, extra, env, None)
    }

    /// Start with the process's open-file limit (soft and hard) set to `files`, as a
    /// small machine or a container would have it.
    pub fn start_with_file_limit(dir: &TempDir, extra: &[&str], files: u32) -> Self {
        Self::spawn(dir, extra, &[], Some(files))
    }

    fn spawn(dir: &TempDir, extra: &[&str], env: &[(&str, &str)], files: Option<u32>) -> Self {
        let db = dir.0.join("entrega.db");
        let log = dir.0.join(format!("serve-{}.log", rand::random::<u32>()));
        // Load tests publish hundreds of events a second with one key: lift the API
        // rate limit unless the test is about it.
        let limit: &[&str] = if extra.contains(&"--api-rate-limit") {
            &[]
        } else {
            &["--api-rate-limit", "100000"]
        };
        let mut command = match files {
            None => Command::new(entrega_bin()),
            Some(n) => {
                let mut c = Command::new("bash");
                c.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\"")])
                    .arg(entrega_bin());
                c
            }
        };
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0", "--db"])
            .arg(&db)
            .args(extra)
            .args(limit)
            .env("ENTREGA_ADMIN_KEY", ADMIN_KEY)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the entrega binary starts");
        let base = entrega_testkit::served_address(&mut child).unwrap_or_else(|line| {
            panic!(
                "no listen line, got {line:?}; log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        Self { child, base, log }
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
        self.send(method, path, body, None).await
    }

    /// A POST under an `Idempotency-Key`.
    pub async fn post_keyed(&self, path: &str, body: Value, key: &str) -> (u16, Value) {
        self.send("POST", path, Some(body), Some(key)).await
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        idempotency_key: Option<&str>,
    ) -> (u16, Value) {
        let body = body.map(|b| b.to_string());
        let (status, text) = self.send_text(method, path, body, idempotency_key).await;
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// A request whose JSON body, if any, is `body` as written; the answer's text.
    async fn send_text(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        idempotency_key: Option<&str>,
    ) -> (u16, String) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(key) = idempotency_key {
            req = req.header("idempotency-key", key);
        }
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        let resp = req.send().await.expect("the API answers");
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap())
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, Some(body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None).await
    }

    /// POST `body` as it is written (what a `Value` cannot hold: a field given twice,
    /// a number past 64 bits).
    pub async fn post_text(&self, path: &str, body: String) -> (u16, Value) {
        let (status, text) = self.send_text("POST", path, Some(body), None).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// GET the answer's text as it was written (what a `Value` would round).
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        self.send_text("GET", path, None, None).await
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

    /// Publish an event to the tenant's one endpoint, wait for `receiver` to get its
    /// first request, and resend the delivery while that attempt runs; its id.
    pub async fn resend_during_the_first_attempt(&self, receiver: &Receiver) -> String {
        let evt = self.publish("a.b", json!({})).await;
        eventually(
            std::time::Duration::from_secs(5),
            "the first request out",
            || async { (receiver.count() == 1).then_some(()) },
        )
        .await;
        let dlv = self.deliveries_of(&evt).await[0]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (status, body) = self
            .post(&format!("/v1/deliveries/{dlv}/resend"), json!({}))
            .await;
        assert_eq!(status, 202, "{body}");
        dlv
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

    /// Re-enable an endpoint (`PATCH` with `disabled: false`); the API must accept it.
    pub async fn enable_endpoint(&self, id: &str) {
        let (status, body) = self
            .call(
                "PATCH",
                &format!("/v1/endpoints/{id}"),
                Some(json!({"disabled": false})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    /// The deliveries of an event, from `GET /v1/events/{id}`.
    pub async fn deliveries_of(&self, event_id: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/v1/events/{event_id}")).await;
        assert_eq!(status, 200, "{body}");
        body["deliveries"].as_array().unwrap().clone()
    }
}

/// Wait until `receiver` has seen every event id in `ids` (by `webhook-id`).
pub async fn all_delivered(receiver: &Receiver, ids: &[String], limit: std::time::Duration) {
    let want: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    eventually(limit, "every accepted event delivered", || async {
        let got = receiver.got();
        let seen: std::collections::HashSet<&str> =
            got.iter().map(|r| r.header("webhook-id")).collect();
        want.is_subset(&seen).then_some(())
    })
    .await;
}
