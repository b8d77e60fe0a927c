//! The hostile test's findings about input and configuration, each a regression test:
//! requests, headers and flags that used to be accepted or answered unclearly.

use serde_json::{json, Value};

use crate::harness::*;

/// Input that used to be accepted, or answered unclearly.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_input_gets_clear_errors() {
    let dir = TempDir::new("hostile-input");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;

    // Reserved types.
    let (status, problem) = acme
        .post(
            "/v1/events",
            json!({"type": "entrega.endpoint.recovered", "data": {}}),
        )
        .await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (422, Some("type")),
        "{problem}"
    );

    // The same id: identical body 202, different body 409.
    let body = json!({"type": "a.b", "data": {"x": 1, "y": [1, 2]}, "id": "dup-1"});
    assert_eq!(acme.post("/v1/events", body.clone()).await.0, 202);
    let reordered = json!({"type": "a.b", "data": {"y": [1, 2], "x": 1}, "id": "dup-1"});
    assert_eq!(acme.post("/v1/events", reordered).await.0, 202);
    let changed = json!({"type": "a.b", "data": {"x": 2}, "id": "dup-1"});
    let (status, problem) = acme.post("/v1/events", changed).await;
    assert_eq!(status, 409, "{problem}");

    // URLs: control characters, spaces, length, port 0 refused; what is stored is
    // what is delivered to.
    let long = format!("{}/{}", receiver.url(""), "a".repeat(70_000));
    for url in [
        format!("{}\r\nX: y", receiver.url("/a")),
        format!(" {} ", receiver.url("/a")),
        long,
        "http://127.0.0.1:0/".to_owned(),
    ] {
        let (status, problem) = acme.post("/v1/endpoints", json!({"url": url})).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (422, Some("url")),
            "{problem}"
        );
    }
    let ep = acme
        .endpoint(json!({"url": format!("http://{}/a/../b?q=1", receiver.addr)}))
        .await;
    assert_eq!(ep["url"], format!("http://{}/b?q=1", receiver.addr));

    // A refused target names the flag that allows it.
    let (status, problem) = acme
        .post("/v1/endpoints", json!({"url": "http://10.1.2.3/hooks"}))
        .await;
    assert_eq!(status, 422);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("--allow-target"),
        "{problem}"
    );

    // Trailing data after the JSON value.
    let raw = acme
        .client
        .post(format!("{}/v1/events", acme.base))
        .bearer_auth(&acme.key)
        .header("content-type", "application/json")
        .body(r#"{"type":"a.b","data":{}}{"type":"a.b","data":{}} garbage"#)
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);

    // Nulls name their field; a bad retry spec says what is allowed.
    for (body, field) in [
        (json!({"url": receiver.url("/"), "mode": null}), "mode"),
        (json!({"url": receiver.url("/"), "retry": null}), "retry"),
        (
            json!({"url": receiver.url("/"), "tenant_id": null}),
            "tenant_id",
        ),
        (
            json!({"url": receiver.url("/"), "retry": "sometimes"}),
            "retry",
        ),
        // Parsed leniently, this would be stored as http://x/.
        (json!({"url": "http:///x"}), "url"),
    ] {
        let (status, problem) = acme.post("/v1/endpoints", body.clone()).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (422, Some(field)),
            "{body}: {problem}"
        );
        assert!(
            !problem["detail"].as_str().unwrap().contains("untagged"),
            "{problem}"
        );
    }
    let (_, problem) = acme
        .post(
            "/v1/endpoints",
            json!({"url": receiver.url("/"), "retry": "sometimes"}),
        )
        .await;
    assert!(
        problem["detail"].as_str().unwrap().contains("persistent"),
        "{problem}"
    );

    // PATCH description null clears it.
    let path = format!("/v1/endpoints/{}", ep["id"].as_str().unwrap());
    acme.call("PATCH", &path, Some(json!({"description": "hi"})))
        .await;
    let (status, after) = acme
        .call("PATCH", &path, Some(json!({"description": null})))
        .await;
    assert_eq!(status, 200);
    assert_eq!(after["description"], Value::Null);

    // Cursors that this list never handed out.
    for cursor in ["zzzz", ""] {
        for list in ["/v1/deliveries", "/v1/endpoints", "/v1/failures"] {
            let (status, problem) = acme.get(&format!("{list}?cursor={cursor}")).await;
            assert_eq!(
                (status, problem["field"].as_str()),
                (400, Some("cursor")),
                "{list}: {problem}"
            );
        }
    }
}

/// A database that cannot be created names its path and the flag that moves it.
#[test]
fn an_unwritable_database_location_names_the_path_and_the_flag() {
    let db = "/proc/entrega-cannot-live-here/entrega.db";
    let out = std::process::Command::new(entrega_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--db", db])
        .env("ENTREGA_ADMIN_KEY", ADMIN_KEY)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(db) && err.contains("--db"), "{err}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("admin API key"),
        "no key is minted for a server that cannot start"
    );
}

/// Two `Authorization` headers are refused, whichever comes first, by the API and by
/// `/metrics`: the first was taken, so a tenant's key then the admin's acted as the
/// tenant, the other order as the admin.
#[tokio::test(flavor = "multi_thread")]
async fn two_authorization_headers_are_refused() {
    let dir = TempDir::new("two-keys");
    let server = Server::start(&dir);
    let admin = server.admin();
    let (_, acme) = admin.tenant("Acme").await;
    let routes = ["/v1/endpoints", "/metrics"];
    for (keys, route) in [[&acme.key, &admin.key], [&admin.key, &acme.key]]
        .into_iter()
        .flat_map(|keys| routes.map(|route| (keys, route)))
    {
        let resp = acme
            .client
            .get(format!("{}{route}", acme.base))
            .header("authorization", format!("Bearer {}", keys[0]))
            .header("authorization", format!("Bearer {}", keys[1]))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{route}");
        let problem: Value = resp.json().await.unwrap();
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("Authorization"),
            "{problem}"
        );
    }
}

/// A retention period past a century is refused before anything starts, naming the
/// flag and its range (its date arithmetic would overflow).
#[test]
fn a_retention_period_past_a_century_is_refused() {
    // Were the flag taken, the database here could not be opened either: the server
    // stops, and the message names the database instead.
    let out = std::process::Command::new(entrega_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--retention-days",
            "99999",
        ])
        .args(["--db", "/proc/entrega-cannot-live-here/entrega.db"])
        .env("ENTREGA_ADMIN_KEY", ADMIN_KEY)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--retention-days") && err.contains("0..=36500"),
        "{err}"
    );
}

/// `admin-key` against a file that does not exist refuses, names `--db`, and
/// creates nothing (a key in a new empty file is one no server knows).
#[test]
fn admin_key_refuses_a_database_that_does_not_exist() {
    let dir = TempDir::new("admin-key");
    let db = dir.0.join("not-there.db");
    let out = std::process::Command::new(entrega_bin())
        .args(["admin-key", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--db") && err.contains("not-there.db"),
        "{err}"
    );
    assert!(!db.exists(), "no database was created");
}

/// A PATCH that changes nothing writes nothing: `updated_at` stays (it said the
/// endpoint was edited), while one that changes a field moves it.
#[tokio::test(flavor = "multi_thread")]
async fn a_patch_that_changes_nothing_writes_nothing() {
    let dir = TempDir::new("no-op-patch");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let created = acme
        .endpoint(json!({"url": "https://hooks.example.com/", "timeout_ms": 5000}))
        .await;
    let path = format!("/v1/endpoints/{}", created["id"].as_str().unwrap());
    for same in [
        json!({}),
        json!({"disabled": false, "timeout_ms": 5000}),
        json!({"url": "https://hooks.example.com/"}),
    ] {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let (status, patched) = acme.call("PATCH", &path, Some(same.clone())).await;
        assert_eq!(status, 200, "{same}: {patched}");
        assert_eq!(patched["updated_at"], created["updated_at"], "{same}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let (status, patched) = acme
        .call("PATCH", &path, Some(json!({"timeout_ms": 6000})))
        .await;
    assert_eq!(status, 200, "{patched}");
    assert_ne!(patched["updated_at"], created["updated_at"]);
}
