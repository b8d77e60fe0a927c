//! Schemathesis over `/openapi.json` against a real `entrega serve`, with a tenant key
//! and with the admin key: no 5xx, no response that breaks its documented schema,
//! status or headers, invalid input refused. `ENTREGA_FUZZ_EXAMPLES` raises the
//! examples per operation (default [`DEFAULT_EXAMPLES`]) for a longer hunt.
//!
//! One check is left out, on purpose: `positive_data_acceptance` expects every
//! schema-valid request to succeed, but whether a request is acceptable here depends on
//! what no JSON Schema can say — which tenant a key acts for, the SSRF policy of the
//! target URL, that `until` follows `since`, which ids exist. Those answers are 4xx
//! problems naming the field, which the other checks do verify.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::harness::*;

/// Examples per operation and phase in the test command.
const DEFAULT_EXAMPLES: u32 = 15;
/// The same seed every run: a failure found is a failure reproduced.
const SEED: &str = "20261130";

fn schemathesis() -> PathBuf {
    let python = entrega_testkit::python();
    match python.parent() {
        Some(dir) if dir.join("schemathesis").exists() => dir.join("schemathesis"),
        _ => PathBuf::from("schemathesis"),
    }
}

fn run(server: &Server, key: &str, dir: &TempDir, examples: u32) {
    let out = Command::new(schemathesis())
        .current_dir(&dir.0)
        .args(["run", &format!("{}/openapi.json", server.base)])
        .args(["--url", &server.base])
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .args([
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
        ])
        .args(["--max-examples", &examples.to_string(), "--seed", SEED])
        .args(["--workers", "1", "--no-color"])
        .env("SCHEMATHESIS_HOOKS", "")
        .output()
        .expect("schemathesis runs (scripts/python-tools installs it in .venv)");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{report}"
    );
    let summary = report
        .lines()
        .filter(|l| l.contains("generated") || l.contains("passed"))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("schemathesis: {summary}");
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let dir = TempDir::new("fuzz");
    let server = Server::start(&dir);
    let (tenant_id, acme) = server.admin().tenant("Acme").await;
    // Data for the lists and reads to return: a delivered event and a failure.
    let ok = Receiver::answering(200).await;
    let broken = Receiver::answering(500).await;
    acme.endpoint(json!({"url": ok.url("/"), "event_types": ["good.x"]}))
        .await;
    acme.endpoint(json!({"url": broken.url("/"), "event_types": ["bad.x"], "retry": "none"}))
        .await;
    acme.publish("good.x", json!({"n": 1})).await;
    acme.publish("bad.x", json!({"n": 2})).await;
    eventually(Duration::from_secs(10), "a failure record", || async {
        let (_, failures) = acme.get("/v1/failures").await;
        (!failures["data"].as_array()?.is_empty()).then_some(())
    })
    .await;
    let examples = std::env::var("ENTREGA_FUZZ_EXAMPLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_EXAMPLES);
    run(&server, &acme.key, &dir, examples);
    run(&server, ADMIN_KEY, &dir, examples);
    // The server is still itself afterwards.
    let (status, health) = server.admin().get("/healthz").await;
    assert_eq!(status, 200, "{health}");
    let (status, _) = acme
        .get(&format!("/v1/endpoints?tenant_id={tenant_id}"))
        .await;
    assert_eq!(status, 200);
}
