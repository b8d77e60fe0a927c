//! The operator CLI end to end against a running `entrega serve`.

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

fn entrega(server: &Server, key: &str, args: &[&str]) -> Output {
    Command::new(entrega_bin())
        .args(args)
        .args(["--url", &server.base])
        .env("ENTREGA_API_KEY", key)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_lists_shows_resends_and_acknowledges() {
    let dir = TempDir::new("cli");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::start(vec![Reply::status(500)], Reply::status(200)).await;
    let ep = acme
        .endpoint(json!({"url": receiver.url("/"), "retry": "none"}))
        .await;
    let ep_id = ep["id"].as_str().unwrap().to_owned();
    let id = acme.publish("order.placed", json!({"n": 1})).await;
    let dlv = eventually(Duration::from_secs(10), "exhausted", || async {
        let d = acme.deliveries_of(&id).await;
        d.first()
            .filter(|d| d["status"] == "exhausted")
            .map(|d| d["id"].as_str().unwrap().to_owned())
    })
    .await;

    let listed = entrega(
        &server,
        &acme.key,
        &["deliveries", "list", "--status", "exhausted"],
    );
    assert!(listed.status.success(), "{listed:?}");
    let table = stdout(&listed);
    assert!(
        table.starts_with("ID") && table.contains(&dlv) && table.contains("exhausted"),
        "{table}"
    );

    let json_out = entrega(
        &server,
        &acme.key,
        &["deliveries", "show", &dlv, "--output", "json"],
    );
    let shown: Value = serde_json::from_slice(&json_out.stdout).unwrap();
    assert_eq!(shown["attempts"].as_array().unwrap().len(), 1);

    // The failure handler records the failure just after the delivery is exhausted.
    let fid = eventually(Duration::from_secs(10), "the failure record", || async {
        let out = entrega(
            &server,
            &acme.key,
            &["failures", "list", "--output", "json"],
        );
        let failures: Value = serde_json::from_slice(&out.stdout).unwrap();
        failures["data"][0]["id"].as_str().map(str::to_owned)
    })
    .await;
    let acked = entrega(
        &server,
        &acme.key,
        &["failures", "ack", &fid, "--note", "looked at it"],
    );
    assert!(acked.status.success() && stdout(&acked).contains(&fid));

    let resent = entrega(&server, &acme.key, &["resend", &dlv]);
    assert!(resent.status.success(), "{resent:?}");
    eventually(Duration::from_secs(10), "redelivered", || async {
        (receiver.count() == 2).then_some(())
    })
    .await;
    // Attempts are numbered per generation: the original's 1.1, the resend's 2.1.
    let shown = eventually(Duration::from_secs(10), "the resend's attempt", || async {
        let out = stdout(&entrega(&server, &acme.key, &["deliveries", "show", &dlv]));
        out.lines().any(|l| l.starts_with("2.1 ")).then_some(out)
    })
    .await;
    assert!(
        shown.lines().any(|l| l.starts_with("1.1 ")) && shown.contains("GEN"),
        "{shown}"
    );

    // A window resend with a summary; the delivery is delivered now, so filter on it.
    let since = (chrono::Utc::now() - chrono::Duration::minutes(5)).to_rfc3339();
    let until = (chrono::Utc::now() + chrono::Duration::minutes(1)).to_rfc3339();
    let batch = entrega(
        &server,
        &acme.key,
        &[
            "resend",
            "--endpoint",
            &ep_id,
            "--since",
            &since,
            "--until",
            &until,
        ],
    );
    assert!(batch.status.success(), "{batch:?}");
    assert!(
        stdout(&batch).contains("1 deliveries queued"),
        "{}",
        stdout(&batch)
    );
    // Sent before the failure's resend below counts what arrives after it: one still
    // on its way then made the count jump by two between two looks.
    eventually(Duration::from_secs(10), "the window's resend", || async {
        (receiver.count() == 3).then_some(())
    })
    .await;

    let endpoints = entrega(&server, &acme.key, &["endpoints", "list"]);
    assert!(stdout(&endpoints).contains(&ep_id));
    let stats = entrega(
        &server,
        &acme.key,
        &["endpoints", "stats", &ep_id, "--output", "json"],
    );
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert!(stats["attempts"].as_u64().unwrap() >= 2);

    // Errors: the problem's title and detail, and a non-zero exit.
    let missing = entrega(&server, &acme.key, &["deliveries", "show", "dlv_nope"]);
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("Not found") && err.contains("dlv_nope"),
        "{err}"
    );
    let unauthorized = entrega(&server, "ent_wrong", &["endpoints", "list"]);
    assert!(!unauthorized.status.success());
    assert!(String::from_utf8_lossy(&unauthorized.stderr).contains("Unauthorized"));

    // The failure's own resend: the delivery it names goes out again.
    let before = receiver.count();
    let again = entrega(&server, &acme.key, &["failures", "resend", &fid]);
    assert!(again.status.success(), "{again:?}");
    assert!(stdout(&again).contains(&dlv), "{}", stdout(&again));
    eventually(Duration::from_secs(10), "sent once more", || async {
        (receiver.count() == before + 1).then_some(())
    })
    .await;
}

/// Every list pages with the `--cursor` it prints.
#[tokio::test(flavor = "multi_thread")]
async fn every_list_pages_with_the_cursor_it_prints() {
    let dir = TempDir::new("cli-cursor");
    let server = Server::start(&dir);
    let (_, acme) = server.admin().tenant("Acme").await;
    let receiver = Receiver::answering(200).await;
    for path in ["/a", "/b"] {
        acme.endpoint(json!({"url": receiver.url(path)})).await;
    }
    acme.publish("order.placed", json!({"n": 1})).await;
    eventually(Duration::from_secs(10), "two deliveries", || async {
        (receiver.count() == 2).then_some(())
    })
    .await;
    for list in [&["deliveries", "list"][..], &["endpoints", "list"][..]] {
        let first = stdout(&entrega(
            &server,
            &acme.key,
            &[list, &["--limit", "1"]].concat(),
        ));
        let cursor = first
            .split("(more: --cursor ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap_or_else(|| panic!("{list:?} printed no cursor: {first}"))
            .to_owned();
        let next = entrega(
            &server,
            &acme.key,
            &[list, &["--limit", "1", "--cursor", &cursor]].concat(),
        );
        assert!(next.status.success(), "{list:?}: {next:?}");
        let second = stdout(&next);
        assert!(
            !second.contains("(more:"),
            "{list:?} has two rows: {second}"
        );
        assert_ne!(first.lines().nth(1), second.lines().nth(1), "{list:?}");
    }
}

/// `entrega tenants create|list|show`: the key is printed once, the admin lists and
/// pages, a tenant sees only itself, and the refusals say why.
#[tokio::test(flavor = "multi_thread")]
async fn tenants_are_created_listed_and_shown() {
    let dir = TempDir::new("cli-tenants");
    let server = Server::start(&dir);
    let created = entrega(
        &server,
        ADMIN_KEY,
        &[
            "tenants",
            "create",
            "--name",
            "Acme CRM",
            "--owner-email",
            "ops@acme.example",
            "--output",
            "json",
        ],
    );
    assert!(created.status.success(), "{created:?}");
    let created: Value = serde_json::from_slice(&created.stdout).unwrap();
    let (id, key) = (
        created["tenant"]["id"].as_str().unwrap(),
        created["api_key"].as_str().unwrap(),
    );
    let table = entrega(
        &server,
        ADMIN_KEY,
        &[
            "tenants",
            "create",
            "--name",
            "Beta",
            "--owner-email",
            "b@beta.example",
        ],
    );
    let table = stdout(&table);
    assert!(
        table.starts_with("ID") && table.contains("Beta") && table.contains("api key (shown once"),
        "{table}"
    );

    let first = stdout(&entrega(
        &server,
        ADMIN_KEY,
        &["tenants", "list", "--limit", "1"],
    ));
    assert!(first.contains("Beta") && !first.contains("Acme"), "{first}");
    let cursor = first
        .split("(more: --cursor ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no cursor: {first}"));
    let second = stdout(&entrega(
        &server,
        ADMIN_KEY,
        &["tenants", "list", "--limit", "1", "--cursor", cursor],
    ));
    assert!(
        second.contains("Acme CRM") && second.contains(id),
        "{second}"
    );

    let own = entrega(&server, key, &["tenants", "show", id]);
    assert!(stdout(&own).contains("ops@acme.example"), "{own:?}");
    let traversal = entrega(&server, key, &["tenants", "show", "../endpoints"]);
    assert!(!traversal.status.success(), "an id is one path segment");
    let bad_time = entrega(
        &server,
        key,
        &["deliveries", "list", "--since", "2026-11-29"],
    );
    assert!(
        String::from_utf8_lossy(&bad_time.stderr).contains("RFC 3339"),
        "{bad_time:?}"
    );
    let wrong_key = entrega(&server, "ent_wrong", &["tenants", "list"]);
    assert!(
        String::from_utf8_lossy(&wrong_key.stderr).contains("--api-key"),
        "{wrong_key:?}"
    );
    let refused = entrega(&server, key, &["tenants", "list"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("admin key"),
        "{refused:?}"
    );
}

/// A RUST_LOG the server cannot read is named in its log, not silently replaced.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_rust_log_is_reported() {
    let dir = entrega_testkit::TempDir::new("e2e-rust-log");
    let mut server = Server::start_env(&dir, &[], &[("RUST_LOG", "entrega_core=loudly")]);
    let log = std::fs::read_to_string(&server.log).unwrap();
    server.stop();
    assert!(
        log.contains("RUST_LOG could not be read") && log.contains("entrega_core=loudly"),
        "{log}"
    );
}

/// `entrega args…` against `url`, with `key`; given up on after 30 s.
fn entrega_against(url: &str, key: &str, args: &[&str]) -> Output {
    let mut command = Command::new(entrega_bin());
    command
        .args(args)
        .args(["--url", url])
        .env("ENTREGA_API_KEY", key);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(command.output().unwrap()));
    finished
        .recv_timeout(Duration::from_secs(30))
        .expect("the CLI gives up on its own")
}

/// A loopback server that answers every request with `reply` (or, if `None`, accepts
/// and never answers).
fn other_server(reply: Option<&'static str>) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut stream in listener.incoming().flatten() {
            if let Some(reply) = reply {
                let _ = stream.read(&mut [0; 4096]);
                let _ = stream.write_all(reply.as_bytes());
            } else {
                held.push(stream);
            }
        }
    });
    url
}

/// The CLI pointed at something that is not Entrega's API: it says so and fails,
/// never hangs, never prints a web page as an empty result, and never echoes a
/// password from the URL or a control character from the answer.
#[test]
fn the_cli_says_when_the_server_is_not_entregas() {
    let silent = other_server(None);
    let out = entrega_against(&silent, "k", &["deliveries", "list", "--timeout", "2"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("no answer within 2s"),
        "{said}"
    );

    let page = other_server(Some(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 30\r\n\r\n<html>\u{1b}[2J a login page</html>",
    ));
    for output in ["table", "json"] {
        let out = entrega_against(&page, "k", &["deliveries", "list", "--output", output]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{output}: {out:?}");
        assert!(said.contains("not as Entrega's API does"), "{said}");
        assert!(
            !said.contains('\u{1b}'),
            "no control character reaches the terminal"
        );
        assert!(
            out.stdout.is_empty(),
            "{output}: nothing printed as a result"
        );
    }

    let closed = format!("http://127.0.0.1:{}", free_port());
    for url in [&page, &closed] {
        let with_password = url.replace("http://", "http://ops:hunter2@");
        let out = entrega_against(&with_password, "k", &["deliveries", "list"]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && !said.contains("hunter2"), "{said}");
    }
    let said =
        String::from_utf8_lossy(&entrega_against(&closed, "k", &["deliveries", "list"]).stderr)
            .into_owned();
    assert!(
        said.contains("Connection refused"),
        "the cause is named: {said}"
    );

    let out = entrega_against(&page, "key\nwith a line break", &["deliveries", "list"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("API key"), "{said}");

    // JSON of another shape: no made-up row either.
    let other_json = other_server(Some(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 35\r\n\r\n{\"data\":\"notalist\",\"next_cursor\":5}",
    ));
    for output in ["table", "json"] {
        let out = entrega_against(
            &other_json,
            "k",
            &["deliveries", "list", "--output", output],
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains("not shaped as Entrega's API"),
            "{said}"
        );
        assert!(
            out.stdout.is_empty(),
            "{output}: nothing printed as a result"
        );
    }

    // A URL that does not parse is not echoed either: it may hold a password.
    let out = entrega_against(
        "http://ops:hunter2@127.0.0.1:99999",
        "k",
        &["deliveries", "list"],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !said.contains("hunter2"), "{said}");

    // A redirect is another server: not followed (a resend would be sent there).
    let redirect = other_server(Some(
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:1/\r\ncontent-length: 0\r\n\r\n",
    ));
    let out = entrega_against(&redirect, "k", &["deliveries", "list"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("307"), "{said}");
    assert!(out.stdout.is_empty());
}

/// An answer without end is cut off at the CLI's limit, not read into memory until
/// `--timeout` (it grew by hundreds of MB a second).
#[test]
fn the_cli_reads_no_answer_past_its_limit() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.read(&mut [0; 4096]);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
            let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, "[".repeat(1 << 20));
            while stream.write_all(chunk.as_bytes()).is_ok() {}
        }
    });
    let out = entrega_against(&url, "k", &["deliveries", "list", "--timeout", "20"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("more than 32 MiB"),
        "{said}"
    );
}

/// A loopback server answering its `n`th connection with `replies[n]` (each closes
/// its connection), and what each request sent; past the replies, connections are
/// closed unanswered.
fn scripted_server(replies: Vec<String>) -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (sent, requests) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut replies = replies.into_iter();
        for mut stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = sent.send(read_request(&mut stream));
            if let Some(reply) = replies.next() {
                let _ = stream.write_all(reply.as_bytes());
            }
        }
    });
    (url, requests)
}

/// One HTTP/1.1 request, head and body (as long as its `content-length` says).
fn read_request(stream: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    let mut got = Vec::new();
    let mut chunk = [0; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let length = text[..head_end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if got.len() >= head_end + 4 + length {
                return text;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return text,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
}

fn json_reply(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A window's resend that fails part-way says what it queued and how to go on, and
/// `--cursor` goes on from there.
#[test]
fn a_window_resend_that_fails_part_way_says_where_to_go_on() {
    let cursor = format!("dlv_{}", "0".repeat(31) + "1");
    let window = [
        "resend",
        "--since",
        "2026-11-29T00:00:00Z",
        "--until",
        "2026-11-30T00:00:00Z",
    ];
    let (url, _) = scripted_server(vec![
        json_reply(
            "200 OK",
            &json!({"queued": 200, "next_cursor": cursor}).to_string(),
        ),
        json_reply(
            "503 Service Unavailable",
            r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"the store is busy"}"#,
        ),
    ]);
    let out = entrega_against(&url, "k", &window);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("200 deliveries were queued for resend in 1 request(s)")
            && said.contains(&format!("--cursor {cursor}")),
        "{said}"
    );

    let (url, requests) = scripted_server(vec![json_reply(
        "200 OK",
        r#"{"queued": 5, "next_cursor": null}"#,
    )]);
    let out = entrega_against(&url, "k", &[&window[..], &["--cursor", &cursor]].concat());
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("5 deliveries queued"), "{out:?}");
    let request = requests.recv().unwrap();
    assert!(
        request.contains(&format!(r#""cursor":"{cursor}""#)),
        "the walk goes on from the cursor: {request}"
    );
}
