//! The connection to a producer's PostgreSQL outbox: TLS verified, and an outbox out
//! of reach reported in the health check without stopping the server.

use std::time::Duration;

use entrega_testkit::postgres::PgCluster;
use serde_json::json;

use crate::harness::*;
use crate::pg_outbox::*;

/// TLS: the drain verifies the server's certificate. Untrusted, nothing is drained,
/// `/healthz` says why, and the rows wait; trusted (`SSL_CERT_FILE`), they are
/// delivered over `sslmode=require`.
#[tokio::test(flavor = "multi_thread")]
async fn tls_to_the_outbox_is_verified() {
    let pg = PgCluster::start_with_tls();
    let cert = pg.certificate.clone().unwrap();
    let trusted = [("SSL_CERT_FILE", cert.to_str().unwrap())];
    let mut db = outbox_ready(&pg, &trusted).await;
    let url = format!("{}?sslmode=require", pg.url_as(DRAIN_ROLE));
    let dir = TempDir::new("pg-tls");

    let mut untrusting = Server::start_loopback(&dir, &["--outbox", &url]);
    let (tenant, acme) = untrusting.admin().tenant("Acme CRM").await;
    let receiver = Receiver::answering(200).await;
    acme.endpoint(json!({"url": receiver.url("/hooks")})).await;
    let id = create_lead(&mut db, &tenant, "Ada", true).await;
    let health = degraded_health(&untrusting).await;
    assert!(health.contains("certificate"), "{health}");
    assert_eq!(outbox_rows(&db).await, 1, "the row waits");
    untrusting.stop();

    let flags = [&LOOPBACK[..], &["--outbox", &url]].concat();
    let _trusting = Server::start_env(&dir, &flags, &trusted);
    all_delivered(&receiver, &[id], Duration::from_secs(20)).await;
    assert_eq!(outbox_rows(&db).await, 0);
}

/// A database that is not there is a condition, not a crash: `/healthz` names it (never
/// its password), the API keeps working, and the drain retries with backoff.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_outbox_is_reported_not_fatal() {
    let port = free_port();
    let url = format!("postgres://{DRAIN_ROLE}:hunter2@127.0.0.1:{port}/crm");
    let dir = TempDir::new("pg-down");
    let server = Server::start_loopback(&dir, &["--outbox", &url]);
    let health = degraded_health(&server).await;
    assert!(
        health.contains(&format!("postgres 127.0.0.1:{port}/crm")),
        "{health}"
    );
    assert!(!health.contains("hunter2"), "{health}");
    let (status, _) = server.admin().get("/v1/tenants").await;
    assert_eq!(status, 200, "the API works meanwhile");
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains("hunter2"), "no password in the log");

    // A URL that does not parse is refused without being echoed; so is the driver's
    // `key=value` form, which the variable's spaces would cut into several drains.
    for bad in [
        "postgres://u:hunter2@127.0.0.1:notaport/db",
        "host=127.0.0.1 password=hunter2 dbname=crm",
    ] {
        for (flag, command) in [("--outbox", "serve"), ("--postgres", "outbox")] {
            let mut args = vec![command];
            if command == "outbox" {
                args.push("init");
            }
            args.extend([flag, bad]);
            let said = entrega_fails(&args);
            assert!(
                said.contains(flag) && !said.contains("hunter2"),
                "{bad}: {said}"
            );
        }
    }
}

/// A server that accepts and never answers (a hung proxy, a paused host) is reported
/// once connecting has taken too long, by the drain and by `outbox init` alike: the
/// driver's own timeout covered only the TCP connect, and the drain waited for good
/// with `/healthz` saying all was well.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_that_never_answers_is_reported() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        // Accept and hold every connection, answering nothing.
        let held: Vec<_> = silent.incoming().take(8).collect();
        std::thread::sleep(Duration::from_secs(120));
        drop(held);
    });
    let url = format!("postgres://{DRAIN_ROLE}@127.0.0.1:{port}/crm");
    let dir = TempDir::new("pg-silent");
    let server = Server::start_loopback(&dir, &["--outbox", &url]);
    let health = degraded_health_within(&server, Duration::from_secs(30)).await;
    assert!(health.contains("no answer"), "{health}");

    let said = entrega_fails(&["outbox", "init", "--postgres", &url]);
    assert!(said.contains("no answer"), "{said}");
    drop(held);
}

/// Two outboxes in one database (two roles here) keep a health record each: one that
/// drains does not clear the other's failure, so `/healthz` stays degraded.
#[tokio::test(flavor = "multi_thread")]
async fn two_outboxes_of_one_database_are_reported_apart() {
    let (pg, _db) = producer_database().await;
    let good = pg.url_as(DRAIN_ROLE);
    let no_such_role = pg.url_as("nobody_here");
    let dir = TempDir::new("pg-apart");
    let server = Server::start_loopback(&dir, &["--outbox", &good, "--outbox", &no_such_role]);
    let health = degraded_health(&server).await;
    assert!(health.contains("#2"), "{health}");
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let resp = reqwest::get(format!("{}/healthz", server.base))
            .await
            .unwrap();
        assert_eq!(resp.status(), 503, "the failing outbox stays reported");
    }
}
