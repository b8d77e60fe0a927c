//! A real `entrega serve` for the benches: a fresh database, loopback receivers
//! allowed, limits lifted so the bench measures the runtime, not its guards.

use std::process::{Child, Command, Stdio};

use entrega_testkit::{served_address, TempDir};
use serde_json::{json, Value};

pub const ADMIN_KEY: &str = "admin_key_for_bench_0123456789abcdef";

pub struct Server {
    pub child: Child,
    pub base: String,
    _dir: TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_server(extra: &[String]) -> Server {
    let dir = TempDir::new("bench");
    let mut child = Command::new(env!("CARGO_BIN_EXE_entrega"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.0.join("entrega.db"))
        .args(["--allow-target", "127.0.0.0/8", "--allow-http"])
        .args(["--api-rate-limit", "10000000", "--max-backlog", "10000000"])
        .args(extra)
        .env("ENTREGA_ADMIN_KEY", ADMIN_KEY)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the entrega binary starts");
    let base = served_address(&mut child).expect("a listen line");
    Server {
        child,
        base,
        _dir: dir,
    }
}

pub async fn post(client: &reqwest::Client, url: String, key: &str, body: &Value) -> (u16, Value) {
    let resp = client
        .post(url)
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A tenant with one endpoint at `url`; its API key.
pub async fn set_up(server: &Server, url: &str, max_concurrency: u32) -> String {
    set_up_tenant(server, url, max_concurrency).await.1
}

/// A tenant with one endpoint at `url`; its id and API key.
pub async fn set_up_tenant(server: &Server, url: &str, max_concurrency: u32) -> (String, String) {
    let client = reqwest::Client::new();
    let (status, tenant) = post(
        &client,
        format!("{}/v1/tenants", server.base),
        ADMIN_KEY,
        &json!({"name": "Bench", "owner_email": "owner@example.com"}),
    )
    .await;
    assert_eq!(status, 201, "{tenant}");
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let (status, endpoint) = post(
        &client,
        format!("{}/v1/endpoints", server.base),
        &key,
        &json!({"url": url, "max_concurrency": max_concurrency}),
    )
    .await;
    assert_eq!(status, 201, "{endpoint}");
    (tenant["tenant"]["id"].as_str().unwrap().to_owned(), key)
}
