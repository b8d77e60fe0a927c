//! `entrega provision --backend aws` and `entrega serve --backend aws` against a local
//! AWS emulator: the same binary, API and handlers, on DynamoDB and SQS.

use std::process::Command;
use std::time::Duration;

use entrega_testkit::Moto;
use serde_json::json;

use crate::harness::*;

/// The emulator's address and test credentials, for a child `entrega`.
pub(crate) fn aws_env(moto: &Moto) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", moto.endpoint.clone()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_on_the_aws_backend_delivers_through_dynamodb_and_sqs() {
    let moto = Moto::start();
    let env = aws_env(&moto);
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let provision = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_entrega"))
            .args(args)
            .envs(env_refs.iter().copied())
            .output()
            .unwrap()
    };
    let out = provision(&["provision", "--backend", "aws", "--aws-prefix", "e2e"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains("table e2e-outbox") && listing.contains("queue e2e-deliveries"),
        "{listing}"
    );
    let again = provision(&["provision", "--backend", "aws", "--aws-prefix", "e2e"]);
    assert!(again.status.success(), "provisioning twice is fine");
    let refused = provision(&["provision", "--aws-prefix", "e2e"]);
    assert!(
        !refused.status.success(),
        "provision without --backend aws is refused"
    );

    let dir = TempDir::new("aws-serve");
    let server = Server::start_env(
        &dir,
        &[
            "--backend",
            "aws",
            "--aws-prefix",
            "e2e",
            "--allow-target",
            "127.0.0.0/8",
            "--allow-http",
        ],
        &env_refs,
    );
    let (_, acme) = server.admin().tenant("Acme on AWS").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/aws")})).await;
    let id = acme.publish("lead.created", json!({"lead": 1})).await;
    eventually(
        Duration::from_secs(30),
        "the webhook via DynamoDB and SQS",
        || async { (receiver.count() == 1).then_some(()) },
    )
    .await;
    assert_eq!(receiver.got()[0].header("webhook-id"), id);
    let row = eventually(Duration::from_secs(10), "the delivered row", || async {
        let d = acme.deliveries_of(&id).await;
        (d.first().is_some_and(|d| d["status"] == "delivered")).then(|| d[0].clone())
    })
    .await;
    assert_eq!(row["attempt_count"], 1);
    let (_, page) = acme.get("/v1/deliveries?status=delivered").await;
    assert_eq!(
        page["data"].as_array().unwrap().len(),
        1,
        "the log query on DynamoDB"
    );

    // A second admin key minted by the operator command works against the same stack.
    let minted = provision(&["admin-key", "--backend", "aws", "--aws-prefix", "e2e"]);
    assert!(minted.status.success());
    let key = String::from_utf8_lossy(&minted.stdout).trim().to_owned();
    let (status, _) = server.api(&key).get("/v1/endpoints").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn resend_and_failures_on_the_aws_backend() {
    let moto = Moto::start();
    let env = aws_env(&moto);
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    entrega_succeeds(
        &["provision", "--backend", "aws", "--aws-prefix", "sup"],
        &env_refs,
    );
    let dir = TempDir::new("aws-support");
    let server = Server::start_env(
        &dir,
        &[
            "--backend",
            "aws",
            "--aws-prefix",
            "sup",
            "--allow-target",
            "127.0.0.0/8",
            "--allow-http",
        ],
        &env_refs,
    );
    let (_, acme) = server.admin().tenant("Acme").await;
    let (_, other) = server.admin().tenant("Other").await;
    let receiver = Receiver::start(vec![Reply::status(500)], Reply::status(200)).await;
    let ep = acme
        .endpoint(json!({"url": receiver.url("/"), "retry": "none"}))
        .await;
    let id = acme.publish("a.b", json!({"x": 1})).await;

    let failure = eventually(Duration::from_secs(30), "a failure in DynamoDB", || async {
        let (_, page) = acme.get("/v1/failures").await;
        page["data"].as_array().and_then(|d| d.first().cloned())
    })
    .await;
    let fid = failure["id"].as_str().unwrap();
    assert_eq!(failure["event_id"].as_str(), Some(id.as_str()));
    assert!(
        failure.get("payload").is_none(),
        "a list carries no payloads"
    );
    let (_, one) = acme.get(&format!("/v1/failures/{fid}")).await;
    assert_eq!(
        one["payload"],
        json!({"x": 1}),
        "one failure carries its payload"
    );
    assert_eq!(other.get(&format!("/v1/failures/{fid}")).await.0, 404);
    let (status, acked) = acme
        .post(&format!("/v1/failures/{fid}/ack"), json!({"note": "on it"}))
        .await;
    assert_eq!((status, acked["ack_note"].as_str()), (200, Some("on it")));
    let (_, open) = acme.get("/v1/failures?acknowledged=false").await;
    assert!(open["data"].as_array().unwrap().is_empty());

    let (status, _) = acme
        .post(&format!("/v1/failures/{fid}/resend"), json!({}))
        .await;
    assert_eq!(status, 202);
    eventually(
        Duration::from_secs(30),
        "redelivered through SQS",
        || async { (receiver.count() == 2).then_some(()) },
    )
    .await;
    let dlv = eventually(Duration::from_secs(10), "delivered", || async {
        let d = acme.deliveries_of(&id).await;
        d.first()
            .filter(|d| d["status"] == "delivered")
            .map(|d| d["id"].as_str().unwrap().to_owned())
    })
    .await;

    // Single and batch resend of a delivered one: a new generation each, same webhook-id.
    assert_eq!(
        other
            .post(&format!("/v1/deliveries/{dlv}/resend"), json!({}))
            .await
            .0,
        404
    );
    let (status, _) = acme
        .post(&format!("/v1/deliveries/{dlv}/resend"), json!({}))
        .await;
    assert_eq!(status, 202);
    eventually(Duration::from_secs(30), "the third attempt", || async {
        (receiver.count() == 3).then_some(())
    })
    .await;
    let (_, batch) = acme
        .post("/v1/deliveries/resend", json!({"ids": [dlv]}))
        .await;
    assert_eq!(batch["queued"], 1);
    eventually(Duration::from_secs(30), "the fourth attempt", || async {
        (receiver.count() == 4).then_some(())
    })
    .await;
    assert!(receiver.got().iter().all(|r| r.header("webhook-id") == id));
    let (_, stats) = acme
        .get(&format!(
            "/v1/endpoints/{}/stats",
            ep["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(stats["attempts"], 4, "{stats}");
}
