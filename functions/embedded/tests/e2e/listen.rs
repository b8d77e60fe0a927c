//! `entrega listen` end to end: a real server delivers to it; it verifies the
//! signature with the endpoint's secret, prints the webhook, and answers the status
//! it was given (a failure rehearsed shows up in the delivery log).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::harness::*;

/// Start `entrega listen` and wait for its first line.
fn start_listen(args: &[&str]) -> Child {
    let mut child = Command::new(entrega_bin())
        .arg("listen")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("receiving on http://127.0.0.1:"), "{first}");
    child
}

fn finish(mut child: Child) -> String {
    let status = child.wait().unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "{out}");
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn listen_verifies_prints_and_answers_as_told() {
    let dir = TempDir::new("listen");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;

    // A webhook verified with the endpoint's secret, printed with its body.
    let port = free_port();
    let ep = acme
        .endpoint(
            json!({"url": format!("http://127.0.0.1:{port}/hooks"), "event_types": ["lead.*"]}),
        )
        .await;
    let secret = ep["secret"].as_str().unwrap().to_owned();
    let child = start_listen(&[
        "--port",
        &port.to_string(),
        "--secret",
        &secret,
        "--count",
        "1",
    ]);
    let id = acme
        .publish("lead.stage_changed", json!({"lead": 42, "stage": "won"}))
        .await;
    let out = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert!(out.contains(&id), "{out}");
    assert!(out.contains("lead.stage_changed"), "{out}");
    assert!(out.contains("✓ verified"), "{out}");
    assert!(out.contains("\"stage\": \"won\""), "pretty printed: {out}");
    assert!(out.contains("→ answered 200"), "{out}");

    // The wrong secret says so; a rehearsed failure is what the log records.
    let port = free_port();
    let ep = acme
        .endpoint(json!({"url": format!("http://127.0.0.1:{port}/"), "event_types": ["order.*"], "retry": "none"}))
        .await;
    let wrong = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let child = start_listen(&[
        "--port",
        &port.to_string(),
        "--secret",
        wrong,
        "--status",
        "500",
        "--count",
        "1",
    ]);
    let id = acme.publish("order.placed", json!({"n": 1})).await;
    let out = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert!(out.contains("✗ no signature matches"), "{out}");
    assert!(out.contains("→ answered 500"), "{out}");
    let delivery = eventually(Duration::from_secs(10), "the failure recorded", || async {
        acme.deliveries_of(&id)
            .await
            .into_iter()
            .find(|d| d["endpoint_id"] == ep["id"] && d["status"] == "exhausted")
    })
    .await;
    assert_eq!(delivery["last_status_code"], 500);
}
