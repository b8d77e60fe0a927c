//! The support console in a real browser: headless Chromium (Debian's, unpacked by
//! `scripts/browser-tools` when the machine lacks it) driven by Playwright through
//! `console/walkthrough.cjs`, against a real `entrega serve` and a loopback receiver.
//! This side owns the receiver; the script asks it for what a browser cannot do.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::harness::*;

/// What the receiver answers while it is broken: a 500 whose body tries to run script
/// wherever the console shows a response excerpt.
const HOSTILE_EXCERPT: &str =
    r#"<script>window.__pwned=3</script>"><img src=x onerror="window.__pwned=4">"#;
/// The longest the whole walkthrough may take (it normally takes seconds).
const WALKTHROUGH_LIMIT: Duration = Duration::from_secs(240);

/// `NAME=value` lines of `scripts/browser-tools`, which finds or unpacks the browser
/// and Playwright (idempotent; quick once done).
fn browser_tools() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(root.join("scripts/browser-tools"))
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/browser-tools runs");
    assert!(out.status.success(), "scripts/browser-tools failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Where the screenshots go: kept after the run, beside the build.
fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts/console");
    std::fs::create_dir_all(&dir).unwrap();
    for shot in ["log.png", "delivery.png", "endpoints.png"] {
        let _ = std::fs::remove_file(dir.join(shot));
    }
    dir
}

/// How many requests of `event_type` the receiver got.
fn received(receiver: &Receiver, event_type: &str) -> usize {
    let needle = format!("\"type\":\"{event_type}\"");
    receiver
        .got()
        .iter()
        .filter(|r| r.body.contains(&needle))
        .count()
}

/// Answer one `@need` of the script.
async fn answer(need: &Value, receiver: &Receiver) -> Value {
    let event_type = need["event_type"].as_str().unwrap_or_default();
    match need["what"].as_str() {
        Some("healthy") => {
            receiver.answer_from_now(Reply::status(204));
            json!({})
        }
        Some("received") => {
            // A moment for anything sent twice to arrive too.
            tokio::time::sleep(Duration::from_millis(500)).await;
            json!({ "count": received(receiver, event_type) })
        }
        Some("arrived") => {
            let want = need["at_least"].as_u64().unwrap() as usize;
            eventually(
                Duration::from_secs(30),
                "the resent deliveries arrive",
                || async { (received(receiver, event_type) >= want).then_some(()) },
            )
            .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            json!({ "count": received(receiver, event_type) })
        }
        other => panic!("the walkthrough asked for {other:?}"),
    }
}

/// Every delivery of `api`'s tenant exhausted (one attempt each: `retry: none`).
async fn all_exhausted(api: &Api, count: usize) {
    eventually(
        Duration::from_secs(30),
        "every delivery exhausted",
        || async {
            let (_, page) = api.get("/v1/deliveries?status=exhausted&limit=200").await;
            (page["data"].as_array().map_or(0, Vec::len) == count).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn support_staff_find_fix_and_resend_in_the_console() {
    let tools = browser_tools();
    let dir = TempDir::new("console");
    let server = Server::start(&dir);
    let receiver = Receiver::start(vec![], Reply::status(500).body(HOSTILE_EXCERPT)).await;
    let (_, a) = server.admin().tenant("Acme").await;
    let (_, b) = server.admin().tenant("Globex").await;
    for (api, path) in [(&a, "/acme"), (&b, "/globex")] {
        api.endpoint(json!({"url": receiver.url(path), "retry": "none"}))
            .await;
    }
    a.publish(
        "invoice.paid",
        json!({"note": r#"<script>window.__pwned=1</script>"><img src=x onerror=window.__pwned=2>"#}),
    )
    .await;
    for n in 0..5 {
        a.publish("order.shipped", json!({ "order": n })).await;
    }
    // Never resent: the failures page still has one to acknowledge.
    a.publish("audit.logged", json!({})).await;
    b.publish("b.only", json!({})).await;
    all_exhausted(&a, 7).await;
    all_exhausted(&b, 1).await;

    let artifacts = artifacts();
    let mut script = tokio::process::Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/console/walkthrough.cjs"))
        .envs(tools.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env(
            "NODE_PATH",
            &tools
                .iter()
                .find(|(k, _)| k == "ENTREGA_NODE_MODULES")
                .unwrap()
                .1,
        )
        .env("CONSOLE_URL", &server.base)
        .env("TENANT_A_KEY", &a.key)
        .env("TENANT_B_KEY", &b.key)
        .env("ADMIN_KEY", ADMIN_KEY)
        .env("ARTIFACTS", &artifacts)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let mut to_script = script.stdin.take().unwrap();
    let mut lines = BufReader::new(script.stdout.take().unwrap()).lines();
    let mut done = false;
    let walk = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            println!("walkthrough: {line}");
            if let Some(need) = line.strip_prefix("@need ") {
                let reply = answer(&serde_json::from_str(need).unwrap(), &receiver).await;
                to_script
                    .write_all(format!("{reply}\n").as_bytes())
                    .await
                    .unwrap();
            } else if line == "@done" {
                done = true;
            }
        }
        script.wait().await.unwrap()
    };
    let status = tokio::time::timeout(WALKTHROUGH_LIMIT, walk)
        .await
        .expect("the walkthrough finishes");
    assert!(status.success() && done, "the walkthrough failed: {status}");
    for shot in ["log.png", "delivery.png", "endpoints.png"] {
        let size = std::fs::metadata(artifacts.join(shot)).map_or(0, |m| m.len());
        assert!(size > 10_000, "{shot} is saved ({size} bytes)");
    }
}
